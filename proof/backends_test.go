package proof

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// procServer faults a server through its process group.
type procServer struct {
	proc    func() *testenv.Process
	restart func() error
}

func (s procServer) Pause() error  { return s.proc().Signal(syscall.SIGSTOP) }
func (s procServer) Resume() error { return s.proc().Signal(syscall.SIGCONT) }
func (s procServer) Crash() error  { s.proc().Kill(); return nil }
func (s procServer) Restart() error {
	return s.restart()
}

// backend starts one store for the matrix.
type backend struct {
	name     string
	minFence fenced.FenceStrength
	start    func(t *testing.T) (store string, srv Server)
}

// topologyFaults are the faults that run only on a backend built for them
// (by name), and the only faults such a backend runs; TestMatrixCI skips
// these backends.
var topologyFaults = map[string][]Fault{
	"etcd (3 members)": {M10},
}

func backends() []backend {
	return []backend{
		{"sqlite", fenced.FenceStrict, func(t *testing.T) (string, Server) {
			return "sqlite://" + filepath.Join(t.TempDir(), "leases.db"), nil
		}},
		{"postgres", fenced.FenceStrict, func(t *testing.T) (string, Server) {
			pg := testenv.StartPostgres(t)
			return pg.URL(), procServer{pg.Process, func() error { pg.StartAgain(t); return nil }}
		}},
		{"mysql", fenced.FenceStrict, func(t *testing.T) (string, Server) {
			m := testenv.StartMySQL(t)
			return m.URL(), procServer{m.Process, func() error { m.StartAgain(t); return nil }}
		}},
		{"redis", fenced.FenceRepeatable, func(t *testing.T) (string, Server) {
			r := testenv.StartRedis(t, testenv.RedisConfig{})
			return r.URL(), procServer{func() *testenv.Process { return r.Process }, func() error { r = r.Restart(t); return nil }}
		}},
		{"redlock", fenced.FenceStrict, func(t *testing.T) (string, Server) {
			var hosts string
			var nodes []*testenv.Redis
			for i := range 3 {
				n := testenv.StartRedis(t, testenv.RedisConfig{})
				nodes = append(nodes, n)
				if i > 0 {
					hosts += ","
				}
				hosts += n.Addr()
			}
			// Redlock has no fence of its own; a SQLite counter is its
			// fence source. The nemesis faults one node of three.
			src := "sqlite://" + filepath.Join(t.TempDir(), "fence.db")
			n := nodes[0]
			return "redlock://" + hosts + "/0?fence=" + url.QueryEscape(src),
				procServer{func() *testenv.Process { return n.Process }, func() error { n = n.Restart(t); return nil }}
		}},
		{"etcd", fenced.FenceStrict, func(t *testing.T) (string, Server) {
			c := testenv.StartEtcd(t)
			m := c.Members[0]
			return c.URL(""), procServer{m.Process, func() error { m.Start(); m.WaitReady(); return nil }}
		}},
		{"zookeeper", fenced.FenceStrict, func(t *testing.T) (string, Server) {
			e := testenv.StartZooKeeper(t)
			n := e.Nodes[0]
			return e.URL("/fenced-proof", ""), procServer{n.Process, func() error { n.Start(); n.WaitReady(); return nil }}
		}},
		{"dynamodb", fenced.FenceStrict, func(t *testing.T) (string, Server) {
			// On disk, so a crashed and restarted server keeps its counters.
			d := testenv.StartDynalite(t, testenv.DynaliteConfig{Persistent: true})
			return d.URL("fenced_proof", "create=1"), procServer{func() *testenv.Process { return d.Process }, func() error { d.StartAgain(t); return nil }}
		}},
		{"etcd (3 members)", fenced.FenceStrict, func(t *testing.T) (string, Server) {
			c := testenv.StartEtcdCluster(t, 3)
			return c.URL(""), &etcdLeaderServer{t: t, cluster: c}
		}},
	}
}

// TestMatrixCI is the bounded slice of the proof matrix that runs with the
// suite: every backend under M1 (fencing on and off), M3, M13 and one
// authority fault (M5, except on SQLite, whose authority is a file), with
// 1s leases and one injection each. The full matrix is scripts/proof.sh.
func TestMatrixCI(t *testing.T) {
	if testing.Short() {
		t.Skip("the proof matrix starts servers and worker processes")
	}
	type scenario struct {
		fault   Fault
		fencing bool
	}
	for _, b := range backends() {
		if topologyFaults[b.name] != nil {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			store, srv := b.start(t)
			scenarios := []scenario{{M1, true}, {M1, false}, {M3, true}, {M13, true}}
			if srv != nil {
				scenarios = append(scenarios, scenario{M5, true})
			}
			for _, sc := range scenarios {
				key := fmt.Sprintf("fenced-proof:ci:%s:%s:%v:%d", b.name, sc.fault, sc.fencing, time.Now().UnixNano())
				rep := runScenario(t, store, Config{Fault: sc.fault, Fencing: sc.fencing, MinFence: b.minFence, Server: srv, Keys: []string{key}, TTL: time.Second})
				checkScenario(t, b.name, sc.fault, sc.fencing, rep)
			}
		})
	}
}

// checkScenario asserts the promise: with fencing, nothing stale is
// accepted, no invoice is sent twice, the ledger is linearizable and fences
// never go backwards; without, the pause fault is seen.
func checkScenario(t *testing.T, backend string, f Fault, fencing bool, rep Report) {
	t.Helper()
	if fencing {
		if rep.StaleAccepted != 0 || rep.DuplicateEffects != 0 || !rep.Linearizable || rep.FenceRegressions != 0 {
			t.Errorf("%s %s fencing on: %+v; want no stale write accepted, no duplicate effect, linearizable, no fence regression", backend, f, rep)
		}
		return
	}
	if f == M1 && !rep.HazardSeen {
		t.Errorf("%s M1 fencing off: %+v; the checker must see the hazard", backend, rep)
	}
}

// etcdLeaderServer faults the leader of an etcd cluster (M10): Crash kills
// whichever member leads at that moment, Restart starts it again on its
// data.
type etcdLeaderServer struct {
	t       *testing.T
	cluster *testenv.EtcdCluster
	crashed *testenv.EtcdMember
}

// leader returns the member that every reachable member names as leader.
func (s *etcdLeaderServer) leader() (*testenv.EtcdMember, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range s.cluster.Members {
		st, err := cli.Status(ctx, m.Endpoint)
		if err != nil {
			continue
		}
		if st.Header.MemberId == st.Leader {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no etcd member is the leader")
}

func (s *etcdLeaderServer) Pause() error {
	m, err := s.leader()
	if err != nil {
		return err
	}
	s.crashed = m
	return m.Process().Signal(syscall.SIGSTOP)
}

func (s *etcdLeaderServer) Resume() error { return s.crashed.Process().Signal(syscall.SIGCONT) }

func (s *etcdLeaderServer) Crash() error {
	m, err := s.leader()
	if err != nil {
		return err
	}
	s.crashed = m
	m.Kill()
	return nil
}

func (s *etcdLeaderServer) Restart() error {
	s.crashed.Start()
	s.crashed.WaitReady()
	return nil
}

// TestM10EtcdLeaderKill kills the leader of a 3-member etcd cluster under
// load: with fencing on, nothing stale is accepted and the ledger stays
// linearizable.
func TestM10EtcdLeaderKill(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	rep := runScenario(t, c.URL(""), Config{Fault: M10, Fencing: true, TTL: time.Second, Server: &etcdLeaderServer{t: t, cluster: c}})
	if rep.Injections == 0 || rep.StaleAccepted != 0 || rep.DuplicateEffects != 0 || !rep.Linearizable || rep.FenceRegressions != 0 || len(rep.Problems) > 0 {
		t.Fatalf("fencing on under M10: %+v", rep)
	}
}
