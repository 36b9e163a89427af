package proof

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
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
func (p netPartition) TxPackets(w, pid int) (uint64, error) {
	return p.host(w).TxPackets(pid)
}

// netRow is one packet-level scenario: a backend started on a Net, the
// fault, and the Partition that places its workers.
type netRow struct {
	backend string
	fault   Fault
	start   func(t *testing.T, n *testenv.Net) (store string, p netPartition)
}

// netRows are the packet-level rows: M4, M9 and M11 with the workers on
// hosts of their own and the authority on another (instead of behind
// per-worker proxies), and P1 on 3-member etcd and ZooKeeper ensembles.
var netRows = []netRow{
	{"etcd (netns)", CutHolder, netEtcd(1)},
	{"etcd (netns)", PauseMidAcquire, netEtcd(1)},
	{"zookeeper (netns)", CutHolder, netZK(1)},
	{"zookeeper (netns)", PauseMidAcquire, netZK(1)},
	{"zookeeper (netns)", PartitionPastSession, netZK(1)},
	{"etcd (3 members, netns)", PartitionMinority, netEtcd(3)},
	{"zookeeper (3 servers, netns)", PartitionMinority, netZK(3)},
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
	strict := fenced.FenceStrict
	cfg := Config{Store: store, Fault: r.fault, Fencing: fencing, MinFence: fenced.FenceStrict, TTL: time.Second, Injections: injections,
		Partition: part, Declared: &strict, Command: testCommand, Dir: t.TempDir(), Logf: t.Logf}
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
// level, and P1 (minority/majority) on 3-member etcd and ZooKeeper, fencing
// on, one injection each. FENCED_PROOF_NETNS_OUT, if set, names a file the
// rows are written to (JSON, for the report); FENCED_PROOF_NETNS_LONG=1
// runs two injections per row and each row with fencing off as well.
func TestPacketPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers in network namespaces")
	}
	injections, fencings := 1, []bool{true}
	if os.Getenv("FENCED_PROOF_NETNS_LONG") == "1" {
		injections, fencings = 2, []bool{true, false}
	}
	var rows []Row
	for _, r := range netRows {
		for _, fencing := range fencings {
			t.Run(fmt.Sprintf("%s/%s/fencing=%v", r.backend, r.fault, fencing), func(t *testing.T) {
				rows = append(rows, runNetRow(t, r, fencing, injections))
			})
		}
	}
	if out := os.Getenv("FENCED_PROOF_NETNS_OUT"); out != "" {
		if err := WriteRows(out, rows); err != nil {
			t.Fatal(err)
		}
	}
}

// writePacketRows writes the packet-level section from the rows
// TestPacketPartitions left in file (FENCED_PROOF_NETNS_OUT), or says it
// was not run.
func writePacketRows(md *bytes.Buffer, file string) error {
	md.WriteString("\n## Partitions at the packet level\n\n")
	md.WriteString(packetPreamble)
	rows, err := ReadRows(file)
	switch {
	case errors.Is(err, os.ErrNotExist):
		md.WriteString("Not run yet (scripts/proof.sh runs TestPacketPartitions as root).\n")
		return nil
	case err != nil:
		return err
	}
	WriteMarkdownTable(md, rows)
	return nil
}

const packetPreamble = `The same workload with the links cut in the kernel instead of in a
userspace proxy: every worker and server process runs in a network namespace
of its own (ip netns exec), joined to a bridge by a veth pair, with addresses
that exist only inside those namespaces; a cut is a blackhole qdisc on both
ends of a host's veth (this kernel has no netem), so packets are dropped and
connections see silence. M4 cuts a holder's host for 3 TTLs; M9 stops a
worker with SIGSTOP as soon as its host's packet counter moves after its
release (its next acquire's request has left the link); M11 cuts a held
holder from ZooKeeper past its session. P1 runs a 3-member etcd or ZooKeeper
ensemble, each worker on the host of one member, and cuts a held holder's
host, member and all, from the other two: a minority/majority partition with
the holder on the minority side (Hazelcast 3.8.3's finding). P1 is also
checked to end the minority holder's lease (Lost) before the majority grants
the key again, and to refuse its late write.

`
