package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestNetCutHeal starts etcd on one host of a Net and checks, from another,
// that Cut silences it (a connect times out instead of being refused) and
// Heal brings it back at once (no failed ARP entry outlives the cut), and
// that every namespace is gone when the test ends.
func TestNetCutHeal(t *testing.T) {
	if testing.Short() {
		t.Skip("long: cuts and heals a network namespace link; run without -short")
	}
	var names []string
	t.Run("net", func(t *testing.T) {
		n, err := NewNet(t)
		if err != nil {
			t.Fatal(err)
		}
		a, b := n.Host("a"), n.Host("b")
		names = []string{n.sw, a.NS, b.NS}
		c := StartEtcdClusterOn(t, a)
		if _, err := b.Exchange(c.Members[0].Endpoint, ""); err != nil {
			t.Fatalf("b cannot reach etcd on a before the cut: %v", err)
		}
		if err := a.Cut(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := b.Exchange(c.Members[0].Endpoint, ""); err == nil {
			t.Fatal("b reached etcd on a through the cut")
		}
		if d := time.Since(start); d < 2*time.Second {
			t.Errorf("a connect through the cut failed after %v: refused, not silenced", d)
		}
		if err := a.Heal(); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Exchange(c.Members[0].Endpoint, ""); err != nil {
			t.Fatalf("b cannot reach etcd on a after the heal: %v", err)
		}
		if tx, err := a.TxPackets(c.Members[0].Process().Cmd.Process.Pid); err != nil || tx == 0 {
			t.Errorf("TxPackets on a = %d, %v; want > 0", tx, err)
		}
	})
	for _, name := range names {
		if _, err := os.Stat("/run/netns/" + name); err == nil {
			t.Errorf("namespace %s left behind", name)
		}
	}
	if t.Failed() {
		return
	}
	out, _ := os.ReadFile("/proc/net/dev")
	if strings.Contains(string(out), "br0") {
		t.Errorf("a bridge appeared in the test's own namespace:\n%s", out)
	}
}

// TestServersOnNetHost starts Redis, PostgreSQL, MariaDB and dynalite on a
// host of a Net and checks that each runs inside that host's namespace
// (its process sees the host's link), serves on the host's address to
// another host (a client there logs in) and does not listen on the controller's loopback (the cut
// itself is TestNetCutHeal's).
func TestServersOnNetHost(t *testing.T) {
	if testing.Short() {
		t.Skip("long: four servers in a network namespace; run without -short")
	}
	n, err := NewNet(t)
	if err != nil {
		t.Fatal(err)
	}
	b := n.Host("client")
	for _, s := range []struct {
		name string
		// start starts the server on h and returns it, its port and a
		// client command that logs in and runs one request (nil: the TCP
		// exchange is the check).
		start func(h *NetHost) (p *Process, port int, client *exec.Cmd)
	}{
		{"redis", func(h *NetHost) (*Process, int, *exec.Cmd) {
			r := StartRedis(t, RedisConfig{Host: h})
			return r.Process, r.Port, exec.Command("redis-cli", "-h", h.IP, "-p", strconv.Itoa(r.Port), "ping")
		}},
		{"postgres", func(h *NetHost) (*Process, int, *exec.Cmd) {
			p := StartPostgresOn(t, h)
			return p.Process(), p.Port, exec.Command("psql", p.URL(), "-tAc", "select 1")
		}},
		{"mysql", func(h *NetHost) (*Process, int, *exec.Cmd) {
			m := StartMySQLOn(t, h)
			return m.Process(), m.Port, exec.Command("mariadb", "-h", h.IP, "-P", strconv.Itoa(m.Port), "-u", m.User, "-p"+m.Password, "-e", "select 1", m.Database)
		}},
		{"dynalite", func(h *NetHost) (*Process, int, *exec.Cmd) {
			d := StartDynalite(t, DynaliteConfig{Host: h})
			return d.Process, d.Port, nil
		}},
	} {
		t.Run(s.name, func(t *testing.T) {
			h := n.Host(s.name)
			p, port, client := s.start(h)
			if !inNS(t, p.Cmd.Process.Pid, h.NS) {
				t.Errorf("%s (pid %d) does not run in %s's namespace %s", s.name, p.Cmd.Process.Pid, h.Name, h.NS)
			}
			if _, err := b.Exchange(h.Addr(port), ""); err != nil {
				t.Errorf("%s on %s: not reachable from another host: %v", s.name, h.Addr(port), err)
			}
			if client != nil {
				b.Wrap(client)
				if out, err := client.CombinedOutput(); err != nil {
					t.Errorf("%s: a client on another host cannot log in: %v\n%s", s.name, err, out)
				}
			}
			if c, err := net.DialTimeout("tcp", Addr(port), time.Second); err == nil {
				c.Close()
				t.Errorf("%s listens on the controller's loopback %s: not placed on the host", s.name, Addr(port))
			}
		})
	}
}

// inNS reports whether process pid's network namespace is the named one.
func inNS(t *testing.T, pid int, ns string) bool {
	t.Helper()
	a, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Stat("/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(a, b)
}

// TestNetLose sends 2 000 UDP datagrams from one host of a Net to another
// and counts what arrives: with Lose(30) on the sender, about 70 %; after
// Lose(0), all of them.
func TestNetLose(t *testing.T) {
	n, err := NewNet(t)
	if err != nil {
		t.Fatal(err)
	}
	a, b := n.Host("a"), n.Host("b")
	const sent = 2000
	received := func() float64 {
		t.Helper()
		before := rxPackets(t, b)
		script := fmt.Sprintf(`for i in $(seq %d); do printf x >/dev/udp/%s/9; done`, sent, b.IP)
		if out, err := exec.Command(ipBin, "netns", "exec", a.NS, "bash", "-c", script).CombinedOutput(); err != nil {
			t.Fatalf("send from a: %v: %s", err, out)
		}
		return float64(rxPackets(t, b)-before) / sent
	}
	if got := received(); got < 0.99 {
		t.Fatalf("before Lose: %.3f of the datagrams arrived; want all", got)
	}
	if err := a.Lose(30); err != nil {
		t.Fatal(err)
	}
	if err := a.Cut(); err == nil {
		t.Error("Cut of a lossy host succeeded; want an error")
	}
	if got := received(); got < 0.62 || got > 0.78 {
		t.Errorf("with Lose(30): %.3f of the datagrams arrived; want about 0.70", got)
	} else {
		t.Logf("with Lose(30): %.3f arrived", got)
	}
	if err := a.Lose(0); err != nil {
		t.Fatal(err)
	}
	if got := received(); got < 0.99 {
		t.Errorf("after Lose(0): %.3f of the datagrams arrived; want all", got)
	}
}

// rxPackets returns how many packets h's link has received.
func rxPackets(t *testing.T, h *NetHost) uint64 {
	t.Helper()
	out, err := exec.Command(ipBin, "-n", h.NS, "-s", "-o", "link", "show", "eth0").Output()
	if err != nil {
		t.Fatalf("ip -s link show in %s: %v", h.NS, err)
	}
	// One line (-o): "... RX: bytes packets errors ... \ BYTES PACKETS ...".
	f := strings.Fields(strings.ReplaceAll(string(out), `\`, " "))
	for i := range f {
		if f[i] != "RX:" {
			continue
		}
		for j := i + 1; j+1 < len(f); j++ {
			if _, err := strconv.ParseUint(f[j], 10, 64); err == nil {
				if p, err := strconv.ParseUint(f[j+1], 10, 64); err == nil {
					return p
				}
				break
			}
		}
	}
	t.Fatalf("ip -s link: no RX counters in %q", out)
	return 0
}
