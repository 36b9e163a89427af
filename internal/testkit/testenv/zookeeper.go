package testenv

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ZooKeeperJars is the classpath of Debian's ZooKeeper server (package
// zookeeper); the jar's manifest names its dependencies.
const ZooKeeperJars = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-nop.jar"

// ZKNode is one ZooKeeper server started for a test.
type ZKNode struct {
	ID      int
	Addr    string // 127.0.0.1:clientPort
	Dir     string
	cfgPath string
	t       testing.TB
	proc    *Process
	host    *NetHost // nil: loopback
}

// ZKEnsemble is a standalone ZooKeeper server or a quorum of them.
type ZKEnsemble struct {
	Nodes []*ZKNode
	// TickTime is the server's tick; sessions may time out between
	// MinSessionTimeout (2*TickTime) and MaxSessionTimeout.
	TickTime          time.Duration
	MinSessionTimeout time.Duration
	MaxSessionTimeout time.Duration
}

// Servers returns the nodes' client addresses.
func (e *ZKEnsemble) Servers() []string {
	var s []string
	for _, n := range e.Nodes {
		s = append(s, n.Addr)
	}
	return s
}

// URL returns a zk:// store URL naming every node, with chroot (which may be
// empty) and query (which may be empty).
func (e *ZKEnsemble) URL(chroot, query string) string {
	u := "zk://" + strings.Join(e.Servers(), ",") + chroot
	if query != "" {
		u += "?" + query
	}
	return u
}

// StartZooKeeper starts a standalone ZooKeeper (Debian package zookeeper,
// run with java) on a free loopback port.
func StartZooKeeper(t testing.TB) *ZKEnsemble { return StartZooKeeperEnsemble(t, 1) }

// StartZooKeeperEnsemble starts n ZooKeeper servers forming one quorum (a
// standalone server when n is 1). The tick is 100ms, so sessions may be as
// short as 200ms; the longest session allowed is two minutes.
func StartZooKeeperEnsemble(t testing.TB, n int) *ZKEnsemble {
	t.Helper()
	return StartZooKeeperWith(t, ZKConfig{Nodes: n})
}

// ZKConfig configures the servers StartZooKeeperWith starts.
type ZKConfig struct {
	// Nodes is how many servers form the quorum; 0 or 1 starts one
	// standalone server.
	Nodes int
	// TickTime is the servers' tickTime, rounded to milliseconds; default
	// 100ms. The shortest session allowed is two ticks (ZooKeeper's
	// default minSessionTimeout), the longest two minutes.
	TickTime time.Duration
	// Prepare, if set, is called with each server's data directory before
	// the server first starts, to seed its data (for example with a
	// snapshot written by ZooKeeper's own classes).
	Prepare func(t testing.TB, dataDir string)
	// Hosts, if set, puts server i on Hosts[i] of a Net (one per node),
	// for partitions at the packet level (NetHost.Cut); only processes on
	// the Net's hosts can reach them.
	Hosts []*NetHost
}

// StartZooKeeperWith starts the servers cfg describes and waits until they
// serve requests.
func StartZooKeeperWith(t testing.TB, cfg ZKConfig) *ZKEnsemble {
	t.Helper()
	RequireBinary(t, "default-jre-headless", "java")
	if _, err := os.Stat("/usr/share/java/zookeeper.jar"); err != nil {
		t.Fatal("ZooKeeper server jar /usr/share/java/zookeeper.jar not found; install the Debian package \"zookeeper\" " +
			"(the README's test command does)")
	}
	n := max(cfg.Nodes, 1)
	if cfg.Hosts != nil && len(cfg.Hosts) != n {
		t.Fatalf("testenv: %d ZooKeeper servers on %d hosts", n, len(cfg.Hosts))
	}
	ip := func(i int) string {
		if cfg.Hosts != nil {
			return cfg.Hosts[i].IP
		}
		return "127.0.0.1"
	}
	tick := cfg.TickTime.Round(time.Millisecond)
	if tick <= 0 {
		tick = 100 * time.Millisecond
	}
	dir := TempDir(t, "zk")
	e := &ZKEnsemble{TickTime: tick, MinSessionTimeout: 2 * tick, MaxSessionTimeout: 2 * time.Minute}
	type ports struct{ client, peer, election int }
	ps := make([]ports, n)
	for i := range ps {
		ps[i] = ports{FreePort(t), FreePort(t), FreePort(t)}
	}
	for i := 0; i < n; i++ {
		nd := &ZKNode{ID: i + 1, Addr: net.JoinHostPort(ip(i), fmt.Sprint(ps[i].client)), Dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			t: t}
		if cfg.Hosts != nil {
			nd.host = cfg.Hosts[i]
		}
		if err := os.MkdirAll(nd.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		conf := []string{
			fmt.Sprintf("tickTime=%d", tick.Milliseconds()),
			"initLimit=50",
			"syncLimit=20",
			fmt.Sprintf("minSessionTimeout=%d", e.MinSessionTimeout.Milliseconds()),
			fmt.Sprintf("maxSessionTimeout=%d", e.MaxSessionTimeout.Milliseconds()),
			"dataDir=" + nd.Dir,
			fmt.Sprintf("clientPort=%d", ps[i].client),
			"clientPortAddress=" + ip(i),
			"admin.enableServer=false",
			"4lw.commands.whitelist=*",
			"maxClientCnxns=0",
		}
		if n > 1 {
			for j := 0; j < n; j++ {
				conf = append(conf, fmt.Sprintf("server.%d=%s:%d:%d", j+1, ip(j), ps[j].peer, ps[j].election))
			}
			if err := os.WriteFile(filepath.Join(nd.Dir, "myid"), []byte(fmt.Sprint(i+1)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		nd.cfgPath = filepath.Join(nd.Dir, "zoo.cfg")
		if err := os.WriteFile(nd.cfgPath, []byte(strings.Join(conf, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if cfg.Prepare != nil {
			cfg.Prepare(t, nd.Dir)
		}
		e.Nodes = append(e.Nodes, nd)
	}
	for _, nd := range e.Nodes {
		nd.Start()
	}
	for _, nd := range e.Nodes {
		nd.WaitReady()
	}
	return e
}

// Start starts (or restarts, with its data) the node. Its heap may grow to
// 1 GiB. With 256 MiB, a server holding 100 000 leases ran out of memory
// and died. That is two znodes and a watch each, as the renewal benchmark
// makes.
func (n *ZKNode) Start() {
	n.t.Helper()
	cmd := exec.Command("java", "-Xmx1g", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
		"-Dzookeeper.jmx.log4j.disable=true", "-cp", ZooKeeperJars,
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", n.cfgPath)
	cmd.Dir = n.Dir
	if n.host != nil {
		n.proc = StartOn(n.t, n.host, fmt.Sprintf("zookeeper %d", n.ID), cmd)
		return
	}
	n.proc = Start(n.t, fmt.Sprintf("zookeeper %d", n.ID), cmd)
}

// WaitReady waits until the node serves requests (it has joined a quorum,
// or runs standalone).
func (n *ZKNode) WaitReady() {
	n.t.Helper()
	n.proc.WaitPort(n.t, n.Addr, 60*time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := n.Mode(); ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.t.Fatalf("testenv: zookeeper %d at %s never started serving:\n%s", n.ID, n.Addr, tail(n.proc.Log.String(), 4000))
}

// Mode asks the node (four-letter word srvr) whether it serves requests and
// as what: "leader", "follower" or "standalone".
func (n *ZKNode) Mode() (string, bool) {
	var b []byte
	if n.host != nil {
		b, _ = n.host.Exchange(n.Addr, "srvr")
	} else {
		c, err := net.DialTimeout("tcp", n.Addr, time.Second)
		if err != nil {
			return "", false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("srvr")); err != nil {
			return "", false
		}
		b, _ = io.ReadAll(c)
	}
	for _, l := range Lines(string(b)) {
		if m, ok := strings.CutPrefix(l, "Mode: "); ok {
			return strings.TrimSpace(m), true
		}
	}
	return "", false
}

// Kill kills the node with SIGKILL.
func (n *ZKNode) Kill() { n.proc.Kill() }

// Process returns the node's running process.
func (n *ZKNode) Process() *Process { return n.proc }
