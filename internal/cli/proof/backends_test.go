package proof

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
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

// env is a started store and the handles the nemesis faults it through
// (nil where the backend has none).
type env struct {
	store    string
	server   Server
	failover Failover
	clock    Clock
}

// config returns a run's Config on e.
func (e env) config() Config {
	return Config{Store: e.store, Server: e.server, Failover: e.failover, Clock: e.clock}
}

// backend starts one store for the matrix; with clock, on a
// testenv.WallClock the nemesis can step (where the backend has a wall
// clock to step; TestMatrixCI runs without, as before M8 and M12).
type backend struct {
	name     string
	minFence fenced.FenceStrength
	start    func(t *testing.T, clock bool) env
}

// wallClock returns a new testenv.WallClock if want, else nil.
func wallClock(t *testing.T, want bool) *testenv.WallClock {
	if !want {
		return nil
	}
	return testenv.NewWallClock(t)
}

// clockOf returns c as a Clock, nil (not a nil *WallClock) if c is nil.
func clockOf(c *testenv.WallClock) Clock {
	if c == nil {
		return nil
	}
	return c
}

// topologyFaults are the faults that run only on a backend built for them
// (by name), and the only faults such a backend runs; TestMatrixCI skips
// these backends.
var topologyFaults = map[string][]Fault{
	"etcd (3 members)":          {CrashLeader},
	"redis (primary + replica)": {FailoverReplica},
	"redlock (5 nodes)":         {StepNodeClock},
}

// redlockEnv starts n redis-servers (node 0 on a clock of its own if
// withClock) as one Redlock store; the nemesis faults node 0.
func redlockEnv(t *testing.T, n int, withClock bool) env {
	clock := wallClock(t, withClock)
	var hosts []string
	var nodes []*testenv.Redis
	for i := range n {
		cfg := testenv.RedisConfig{}
		if i == 0 {
			cfg.WallClock = clock
		}
		nodes = append(nodes, testenv.StartRedis(t, cfg))
		hosts = append(hosts, nodes[i].Addr())
	}
	// Redlock has no fence of its own; a SQLite counter is its fence
	// source.
	src := "sqlite://" + filepath.Join(t.TempDir(), "fence.db")
	node := nodes[0]
	return env{
		store:  "redlock://" + strings.Join(hosts, ",") + "/0?fence=" + url.QueryEscape(src),
		server: procServer{func() *testenv.Process { return node.Process }, func() error { node = node.Restart(t); return nil }},
		clock:  clockOf(clock),
	}
}

func backends() []backend {
	return []backend{
		{"sqlite", fenced.FenceStrict, func(t *testing.T, withClock bool) env {
			return env{store: "sqlite://" + filepath.Join(t.TempDir(), "leases.db")}
		}},
		{"postgres", fenced.FenceStrict, func(t *testing.T, withClock bool) env {
			clock := wallClock(t, withClock)
			pg := testenv.StartPostgresOnClock(t, clock)
			return env{store: pg.URL(), server: procServer{pg.Process, func() error { pg.StartAgain(t); return nil }}, clock: clockOf(clock)}
		}},
		{"mysql", fenced.FenceStrict, func(t *testing.T, withClock bool) env {
			clock := wallClock(t, withClock)
			m := testenv.StartMySQLOnClock(t, clock)
			return env{store: m.URL(), server: procServer{m.Process, func() error { m.StartAgain(t); return nil }}, clock: clockOf(clock)}
		}},
		{"redis", fenced.FenceRepeatable, func(t *testing.T, withClock bool) env {
			clock := wallClock(t, withClock)
			r := testenv.StartRedis(t, testenv.RedisConfig{WallClock: clock})
			return env{store: r.URL(), server: procServer{func() *testenv.Process { return r.Process }, func() error { r = r.Restart(t); return nil }}, clock: clockOf(clock)}
		}},
		{"redlock", fenced.FenceStrict, func(t *testing.T, _ bool) env { return redlockEnv(t, 3, false) }},
		{"etcd", fenced.FenceStrict, func(t *testing.T, withClock bool) env {
			c := testenv.StartEtcd(t)
			m := c.Members[0]
			return env{store: c.URL(""), server: procServer{m.Process, func() error { m.Start(); m.WaitReady(); return nil }}}
		}},
		{"zookeeper", fenced.FenceStrict, func(t *testing.T, withClock bool) env {
			e := testenv.StartZooKeeper(t)
			n := e.Nodes[0]
			return env{store: e.URL("/fenced-proof", ""), server: procServer{n.Process, func() error { n.Start(); n.WaitReady(); return nil }}}
		}},
		{"dynamodb", fenced.FenceStrict, func(t *testing.T, withClock bool) env {
			// On disk, so a crashed and restarted server keeps its counters.
			d := testenv.StartDynalite(t, testenv.DynaliteConfig{Persistent: true})
			return env{store: d.URL("fenced_proof", "create=1"), server: procServer{func() *testenv.Process { return d.Process }, func() error { d.StartAgain(t); return nil }}}
		}},
		{"etcd (3 members)", fenced.FenceStrict, func(t *testing.T, withClock bool) env {
			c := testenv.StartEtcdCluster(t, 3)
			return env{store: c.URL(""), server: &etcdLeaderServer{t: t, cluster: c}}
		}},
		{"redis (primary + replica)", fenced.FenceRepeatable, func(t *testing.T, withClock bool) env {
			f := testenv.StartRedisFailover(t)
			return env{store: f.URL(), failover: f}
		}},
		{"redlock (5 nodes)", fenced.FenceStrict, func(t *testing.T, withClock bool) env { return redlockEnv(t, 5, withClock) }},
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
	parallelRow(t)
	type scenario struct {
		fault   Fault
		fencing bool
	}
	for _, b := range backends() {
		if topologyFaults[b.name] != nil {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			e := b.start(t, false)
			ttl := storeTTL(t, e.store)
			scenarios := []scenario{{PauseHolder, true}, {PauseHolder, false}, {KillHolder, true}, {ReorderWrites, true}}
			if e.server != nil {
				scenarios = append(scenarios, scenario{PauseAuthority, true})
			}
			for _, sc := range scenarios {
				cfg := e.config()
				cfg.Fault, cfg.Fencing, cfg.MinFence, cfg.TTL = sc.fault, sc.fencing, b.minFence, ttl
				cfg.Keys = []string{fmt.Sprintf("fenced-proof:ci:%s:%s:%v:%d", b.name, sc.fault, sc.fencing, time.Now().UnixNano())}
				rep := runScenario(t, e.store, cfg)
				checkScenario(t, b.name, sc.fault, sc.fencing, rep)
			}
		})
	}
}

// storeTTL is the workers' TTL on store: 1 s, or more where the machine
// is slow to grant. Under load (hog a3) dynalite's round trips took about
// a second, so each lease ran out as it was granted and nothing was
// written.
func storeTTL(t *testing.T, store string) time.Duration {
	t.Helper()
	return drivertest.StoreTTL(t, store, 3, time.Second)
}

// checkScenario asserts the promise: with fencing, nothing stale is
// accepted, no invoice is sent twice, the ledger is linearizable and fences
// never go backwards (and, under M7, the declared repeat happens); without,
// the pause (M1) and failover (M7) hazards are seen.
func checkScenario(t *testing.T, backend string, f Fault, fencing bool, rep Report) {
	t.Helper()
	if fencing {
		if rep.StaleAccepted != 0 || rep.DuplicateEffects != 0 || !rep.Linearizable || rep.FenceRegressions != 0 {
			t.Errorf("%s %s fencing on: %+v; want no stale write accepted, no duplicate effect, linearizable, no fence regression", backend, f, rep)
		}
		if f == FailoverReplica && rep.FenceRepeats == 0 {
			t.Errorf("%s M7 fencing on: %+v; the promoted replica must repeat the fence (the declared hazard the owner rule is there for)", backend, rep)
		}
		return
	}
	if (f == PauseHolder || f == FailoverReplica) && !rep.HazardSeen {
		t.Errorf("%s %s fencing off: %+v; the checker must see the hazard", backend, f, rep)
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

// TestCrashLeaderEtcd kills the leader of a 3-member etcd cluster under
// load: with fencing on, nothing stale is accepted and the ledger stays
// linearizable.
func TestCrashLeaderEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("long: kills the leader of a 3-member etcd cluster; run without -short")
	}
	c := testenv.StartEtcdCluster(t, 3)
	rep := runScenario(t, c.URL(""), Config{Fault: CrashLeader, Fencing: true, TTL: time.Second, Server: &etcdLeaderServer{t: t, cluster: c}})
	if rep.Injections == 0 || rep.StaleAccepted != 0 || rep.DuplicateEffects != 0 || !rep.Linearizable || rep.FenceRegressions != 0 || len(rep.Problems) > 0 {
		t.Fatalf("fencing on under M10: %+v", rep)
	}
}
