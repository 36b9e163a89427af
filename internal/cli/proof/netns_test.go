package proof

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// netPartition places worker w on hosts[w%len(hosts)] of a testenv.Net.
type netPartition struct{ hosts []*testenv.NetHost }

func (p netPartition) host(w int) *testenv.NetHost { return p.hosts[w%len(p.hosts)] }

func (p netPartition) Place(w int, cmd *exec.Cmd) { p.host(w).Wrap(cmd) }
func (p netPartition) Cut(w int) error            { return p.host(w).Cut() }
func (p netPartition) Heal(w int) error           { return p.host(w).Heal() }
func (p netPartition) Lose(w, percent int) error  { return p.host(w).Lose(percent) }
func (p netPartition) TxPackets(w, pid int) (uint64, error) {
	return p.host(w).TxPackets(pid)
}

// netRow is one packet-level scenario: a backend started on a Net, the
// fault, and the Partition that places its workers.
type netRow struct {
	backend string
	fault   Fault
	start   func(t *testing.T, n *testenv.Net) (store string, p netPartition)
	// fence is the backend's declared fence strength (zero: strict); long
	// rows run only with FENCED_PROOF_NETNS_LONG=1, to keep CI short.
	fence fenced.FenceStrength
	long  bool
}

// netRows are the packet-level rows: M4, M9 and M11 with the workers on
// hosts of their own and the authority on another (instead of behind
// per-worker proxies), and P1 on 3-member etcd and ZooKeeper ensembles.
// M11 is ZooKeeper's session loss; on the other stores M4 is the cut.
var netRows = []netRow{
	{backend: "etcd (netns)", fault: CutHolder, start: netEtcd(1)},
	{backend: "etcd (netns)", fault: PauseMidAcquire, start: netEtcd(1)},
	{backend: "zookeeper (netns)", fault: CutHolder, start: netZK(1)},
	{backend: "zookeeper (netns)", fault: PauseMidAcquire, start: netZK(1)},
	{backend: "zookeeper (netns)", fault: PartitionPastSession, start: netZK(1)},
	{backend: "etcd (3 members, netns)", fault: PartitionMinority, start: netEtcd(3)},
	{backend: "zookeeper (3 servers, netns)", fault: PartitionMinority, start: netZK(3)},
	{backend: "redis (netns)", fault: CutHolder, start: netServer(netRedis), fence: fenced.FenceRepeatable},
	{backend: "redis (netns)", fault: PauseMidAcquire, start: netServer(netRedis), fence: fenced.FenceRepeatable, long: true},
	{backend: "postgres (netns)", fault: CutHolder, start: netServer(netPostgres), long: true},
	{backend: "postgres (netns)", fault: PauseMidAcquire, start: netServer(netPostgres), long: true},
	{backend: "mysql (netns)", fault: CutHolder, start: netServer(netMySQL), long: true},
	{backend: "mysql (netns)", fault: PauseMidAcquire, start: netServer(netMySQL), long: true},
	{backend: "dynamodb (netns)", fault: CutHolder, start: netServer(netDynalite), long: true},
	{backend: "dynamodb (netns)", fault: PauseMidAcquire, start: netServer(netDynalite), long: true},
	{backend: "etcd (netns)", fault: LoseHolderPackets, start: netEtcd(1)},
	{backend: "zookeeper (netns)", fault: LoseHolderPackets, start: netZK(1), long: true},
	{backend: "redis (netns)", fault: LoseHolderPackets, start: netServer(netRedis), fence: fenced.FenceRepeatable, long: true},
	{backend: "postgres (netns)", fault: LoseHolderPackets, start: netServer(netPostgres), long: true},
	{backend: "redlock (3 nodes, netns)", fault: CutHolder, start: netRedlock(3), long: true},
	{backend: "redlock (3 nodes, netns)", fault: LoseHolderPackets, start: netRedlock(3), long: true},
	{backend: "redlock (3 nodes, netns)", fault: PauseMidAcquire, start: netRedlock(3), long: true},
}

// netServer runs a one-process store on a host of its own (start starts
// it there and returns its URL) and the workers on three others.
func netServer(start func(t *testing.T, h *testenv.NetHost) string) func(t *testing.T, n *testenv.Net) (string, netPartition) {
	return func(t *testing.T, n *testenv.Net) (string, netPartition) {
		store := start(t, n.Host("srv"))
		return store, netPartition{netHosts(n, "w", 3)}
	}
}

func netRedis(t *testing.T, h *testenv.NetHost) string {
	return testenv.StartRedis(t, testenv.RedisConfig{Host: h}).URL()
}

func netPostgres(t *testing.T, h *testenv.NetHost) string {
	return testenv.StartPostgresOn(t, h).URL()
}

func netMySQL(t *testing.T, h *testenv.NetHost) string { return testenv.StartMySQLOn(t, h).URL() }

func netDynalite(t *testing.T, h *testenv.NetHost) string {
	return testenv.StartDynalite(t, testenv.DynaliteConfig{Host: h}).URL("fenced_proof", "create=1")
}

// netRedlock starts a Redlock store of nodes redis-servers, each on a
// host of its own, and the workers on three others: a cut of a worker's
// host cuts it off from every node at once. The fence source is a SQLite
// file, as in the proxy rows (Redlock has no fence of its own); the
// workers reach it through the file system, not the network.
func netRedlock(nodes int) func(t *testing.T, n *testenv.Net) (string, netPartition) {
	return func(t *testing.T, n *testenv.Net) (string, netPartition) {
		var addrs []string
		for _, h := range netHosts(n, "redis", nodes) {
			addrs = append(addrs, testenv.StartRedis(t, testenv.RedisConfig{Host: h}).Addr())
		}
		src := "sqlite://" + filepath.Join(t.TempDir(), "fence.db")
		return "redlock://" + strings.Join(addrs, ",") + "/0?fence=" + url.QueryEscape(src), netPartition{netHosts(n, "w", 3)}
	}
}

// netHosts adds n hosts named prefix0.. to the Net.
func netHosts(n *testenv.Net, prefix string, count int) []*testenv.NetHost {
	var hs []*testenv.NetHost
	for i := range count {
		hs = append(hs, n.Host(fmt.Sprintf("%s%d", prefix, i)))
	}
	return hs
}

// netEtcd starts etcd with members members; with one, the workers have
// hosts of their own, with more, worker w shares member w's host (so a
// cut of its host partitions member and worker from the majority).
func netEtcd(members int) func(t *testing.T, n *testenv.Net) (string, netPartition) {
	return func(t *testing.T, n *testenv.Net) (string, netPartition) {
		hs := netHosts(n, "etcd", members)
		c := testenv.StartEtcdClusterOn(t, hs...)
		if members == 1 {
			return c.URL(""), netPartition{netHosts(n, "w", 3)}
		}
		return c.URL(""), netPartition{hs}
	}
}

// netZK is netEtcd for ZooKeeper.
func netZK(servers int) func(t *testing.T, n *testenv.Net) (string, netPartition) {
	return func(t *testing.T, n *testenv.Net) (string, netPartition) {
		hs := netHosts(n, "zk", servers)
		e := testenv.StartZooKeeperWith(t, testenv.ZKConfig{Nodes: servers, Hosts: hs})
		if servers == 1 {
			return e.URL("/fenced-proof", ""), netPartition{netHosts(n, "w", 3)}
		}
		return e.URL("/fenced-proof", ""), netPartition{hs}
	}
}

// runNetRow runs one packet-level row and checks it as the matrix does,
// and P1 further (checkMinority). Namespaces that cannot be made fail the
// test: they can here (root, iproute2), and a proxy fallback would hide
// that the packet-level rows did not run.
func runNetRow(t *testing.T, r netRow, fencing bool, injections int) Row {
	n, err := testenv.NewNet(t)
	if err != nil {
		t.Fatalf("%s: no network namespaces (%v); the proxy rows (M4, M9, M11) are the fallback", r.backend, err)
	}
	store, part := r.start(t, n)
	declared := r.fence
	if declared == 0 {
		declared = fenced.FenceStrict
	}
	cfg := Config{Store: store, Fault: r.fault, Fencing: fencing, MinFence: declared, TTL: time.Second, Injections: injections,
		Partition: part, Declared: &declared, Command: testCommand, Logf: t.Logf,
		Dir: historyDir(t, fmt.Sprintf("netns-%s-%s-%v-%d", strings.Fields(r.backend)[0], r.fault, fencing, time.Now().UnixNano()))}
	cfg.Keys = []string{fmt.Sprintf("fenced-proof:netns:%s:%s:%v:%d", strings.Fields(r.backend)[0], r.fault, fencing, time.Now().UnixNano())}
	res, err := Run(t.Context(), cfg)
	row := Row{Backend: r.backend, Fault: r.fault, Fencing: fencing, Ordering: ClaimFirst}
	if err != nil {
		t.Errorf("%s %s: %v", r.backend, r.fault, err)
		row.NA = "run failed: " + strings.ReplaceAll(err.Error(), "|", "/")
		return row
	}
	rep := res.Report
	row.Report = &rep
	t.Logf("%s %s fencing=%v: %+v", r.backend, r.fault, fencing, rep)
	checkScenario(t, r.backend, r.fault, fencing, rep)
	if r.fault == PartitionMinority && fencing {
		checkMinority(t, r.backend, res.Events, injections)
	}
	return row
}

// checkMinority checks each P1 injection: the holder cut off with a
// minority learnt its lease had ended (Lost) before the majority granted
// the key to another worker, and its late write was not accepted.
func checkMinority(t *testing.T, backend string, evs []Event, injections int) {
	t.Helper()
	seen := 0
	for i, e := range evs {
		if e.Kind != FaultStart || e.Fault != string(PartitionMinority) {
			continue
		}
		seen++
		var grant Event
		for j := i - 1; j >= 0; j-- {
			if evs[j].Worker == e.Worker && evs[j].Kind == AcquireOK {
				grant = evs[j]
				break
			}
		}
		var lost, next, write *Event
		for j := i + 1; j < len(evs); j++ {
			f := &evs[j]
			switch {
			case lost == nil && f.Worker == e.Worker && f.Kind == Lost && f.Key == grant.Key && f.Fence == grant.Fence:
				lost = f
			case next == nil && f.Worker != e.Worker && f.Kind == AcquireOK && f.Key == grant.Key:
				next = f
			case write == nil && f.Worker == e.Worker && f.Fence == grant.Fence && (f.Kind == WriteOK || f.Kind == WriteRefused || f.Kind == WriteFail):
				write = f
			}
		}
		switch {
		case next == nil || write == nil || write.T < next.T:
			t.Errorf("%s P1 #%d: the majority did not grant the key while worker %d was cut off with a minority (in 16 TTLs): the injection proved nothing (next grant %v, its write %v)", backend, seen, e.Worker, next, write)
			continue
		case lost == nil || lost.T > next.T:
			t.Errorf("%s P1 #%d: worker %d (fence %d) did not learn its lease had ended before the majority granted fence %d (lost %v)", backend, seen, e.Worker, grant.Fence, next.Fence, lost)
		default:
			t.Logf("%s P1 #%d: minority holder's lease ended %v before the majority's grant (fence %d -> %d)", backend, seen, time.Duration(next.T-lost.T), grant.Fence, next.Fence)
		}
		if write.Kind == WriteOK {
			t.Errorf("%s P1 #%d: worker %d's write with fence %d after the partition: %v; want refused", backend, seen, e.Worker, grant.Fence, write)
		}
	}
	if seen != injections {
		t.Errorf("%s P1: %d injections in the history, want %d", backend, seen, injections)
	}
}

// TestPacketPartitions runs M4, M9 and M11 with the links cut at the packet
// level, M15 (a lossy link), and P1 (minority/majority) on 3-member etcd and ZooKeeper, fencing
// on, one injection each. FENCED_PROOF_NETNS_OUT, if set, names a file the
// rows are written to (JSON, for the report); FENCED_PROOF_NETNS_LONG=1
// runs two injections per row and each row with fencing off as well, and
// the long rows; FENCED_PROOF_NETNS_ROWS=redis,postgres runs only the rows
// of those backends, FENCED_PROOF_NETNS_FAULTS=M4,M15 only those faults
// (either merged into the rows file).
func TestPacketPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers in network namespaces")
	}
	parallelRow(t)
	long := os.Getenv("FENCED_PROOF_NETNS_LONG") == "1"
	injections, fencings := 1, []bool{true}
	if long {
		injections, fencings = 2, []bool{true, false}
	}
	only := os.Getenv("FENCED_PROOF_NETNS_ROWS")
	faults := os.Getenv("FENCED_PROOF_NETNS_FAULTS")
	var rows []Row
	for _, r := range netRows {
		if (r.long && !long) || (only != "" && !strings.Contains(","+only+",", ","+strings.Fields(r.backend)[0]+",")) ||
			(faults != "" && !strings.Contains(","+faults+",", ","+r.fault.ID()+",")) {
			continue
		}
		for _, fencing := range fencings {
			t.Run(fmt.Sprintf("%s/%s/fencing=%v", r.backend, r.fault, fencing), func(t *testing.T) {
				rows = append(rows, runNetRow(t, r, fencing, injections))
			})
		}
	}
	if out := os.Getenv("FENCED_PROOF_NETNS_OUT"); out != "" {
		if only != "" || faults != "" {
			rows = mergeRows(t, out, rows)
		}
		if err := WriteRows(out, rows); err != nil {
			t.Fatal(err)
		}
		// With the report's directory too, rewrite its packet-level
		// section in place (the full matrix need not run again).
		if docs := os.Getenv("FENCED_PROOF_OUT"); docs != "" {
			var sec bytes.Buffer
			if err := writePacketRows(&sec, out); err != nil {
				t.Fatal(err)
			}
			if err := updateSection(filepath.Join(docs, "proof.md"), packetBegin, packetEnd, "## The incumbents, side by side", bytes.TrimPrefix(sec.Bytes(), []byte("\n"))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// mergeRows returns the rows kept in file with those of rows put in
// place of the ones for the same backend, fault and fencing (and added
// after them if new), so a run of some rows (FENCED_PROOF_NETNS_ROWS)
// keeps the others.
func mergeRows(t *testing.T, file string, rows []Row) []Row {
	kept, err := ReadRows(file)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	same := func(a, b Row) bool { return a.Backend == b.Backend && a.Fault == b.Fault && a.Fencing == b.Fencing }
	for _, r := range rows {
		i := slices.IndexFunc(kept, func(k Row) bool { return same(k, r) })
		if i >= 0 {
			kept[i] = r
		} else {
			kept = append(kept, r)
		}
	}
	return kept
}

// writePacketRows writes the packet-level section from the rows
// TestPacketPartitions left in file (FENCED_PROOF_NETNS_OUT), or says it
// was not run.
func writePacketRows(md *bytes.Buffer, file string) error {
	md.WriteString("\n" + packetBegin + "\n## Partitions at the packet level\n\n")
	md.WriteString(packetPreamble)
	rows, err := ReadRows(file)
	switch {
	case errors.Is(err, os.ErrNotExist):
		md.WriteString("Not run yet (scripts/proof.sh runs TestPacketPartitions as root).\n")
	case err != nil:
		return err
	default:
		WriteMarkdownTable(md, rows)
	}
	md.WriteString(packetEnd + "\n")
	return nil
}

const (
	packetBegin = "<!-- packet-level: begin -->"
	packetEnd   = "<!-- packet-level: end -->"
)

const packetPreamble = `The same workload with the links cut in the kernel instead of in a
userspace proxy: every worker and server process runs in a network namespace
of its own (ip netns exec), joined to a bridge by a veth pair, with addresses
that exist only inside those namespaces; a cut is a blackhole qdisc on both
ends of a host's veth (this kernel has no netem), so packets are dropped and
connections see silence. The servers run on hosts of their own
(Redis, PostgreSQL, MariaDB and dynalite through testenv's host option:
listening on the host's address, started with ip netns exec, dropping to
"nobody" inside it). M4 cuts a holder's host for 3 TTLs; M9 stops a
worker with SIGSTOP as soon as its host's packet counter moves after its
release (its next acquire's request has left the link); M11 cuts a held
holder from ZooKeeper past its session. P1 runs a 3-member etcd or ZooKeeper
ensemble, each worker on the host of one member, and cuts a held holder's
host, member and all, from the other two: a minority/majority partition with
the holder on the minority side (Hazelcast 3.8.3's finding). P1 is also
checked to end the minority holder's lease (Lost) before the majority grants
the key again, and to refuse its late write. M11 is ZooKeeper's session
loss; on the other stores M4 is the cut. M15 holds a holder before its write
while its link is lossy instead of cut: 40 % of the packets each way,
chosen at random, are dropped (without netem or the gact action, an htb
qdisc whose classic BPF filter reads the kernel's per-packet random number
sends that share to a blackhole class) until another worker has written or
8 TTLs have passed, so renewals arrive late, after TCP's retransmissions,
or not at all, and the lease is kept or lost. Redlock runs 3 redis-servers, each on
a host of its own, with a SQLite file as its fence source; a cut of a
worker's host cuts it from all three. Its M9 overlaps are a paused
holder's: a Redlock acquire takes about 2 ms here, and the stop, sent once
the host's packet counter moved, came 40 ms after the release, when the
next grant had already been confirmed (history kept with PROOF_KEEP). The
worker was stopped holding, its lease ran out meanwhile while others held
the key in turn (each overlap is one of their grants), and it learnt of
the loss (Lost) on resuming, before any write. Run by
FENCED_PROOF_NETNS_LONG=1 FENCED_PROOF_NETNS_OUT=docs/proof/netns.json
FENCED_PROOF_OUT=docs go test -run '^TestPacketPartitions$' ./internal/cli/proof/
(scripts/proof.sh; as root), 2 injections per row.

`
