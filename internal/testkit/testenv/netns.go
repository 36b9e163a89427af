package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Net is a private network for one test. It is a "switch" network namespace
// holding a bridge, and one namespace per host, each joined to the bridge
// by a veth pair. Hosts have addresses 10.201.0.N/24 that exist only inside
// these namespaces. Nothing is routed out of them, so no packet leaves
// them. Processes run on a host through Wrap (ip netns exec). Cut drops
// every packet to and from a host at its link, as a partition does. It puts
// a blackhole qdisc on both ends of the host's veth pair. Connections stay
// open and see silence, not errors. Every namespace is deleted when the
// test ends, even if it fails.
type Net struct {
	t      testing.TB
	prefix string
	sw     string

	mu    sync.Mutex
	hosts []*NetHost
}

// NetHost is one host (network namespace) of a Net.
type NetHost struct {
	// Name is the host's name in the test; NS the namespace's.
	Name, NS string
	// IP is the host's address, reachable from every host of the Net.
	IP  string
	mac string
	// port is the host's veth end in the switch namespace.
	port string
	net  *Net

	mu   sync.Mutex
	cut  bool
	loss int // percent of packets Lose drops
}

var netSeq struct {
	sync.Mutex
	n int
}

// ipBin is iproute2's ip; tcBin its tc.
const (
	ipBin = "/usr/sbin/ip"
	tcBin = "/usr/sbin/tc"
)

// NewNet makes the switch namespace of a new Net. Or it says why network
// namespaces cannot be made here: not root, no iproute2, or no bridge or
// blackhole qdisc in the kernel. Callers fall back and say so.
func NewNet(t testing.TB) (*Net, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("testenv: network namespaces need root")
	}
	for _, b := range []string{ipBin, tcBin} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("testenv: %s not found (Debian package iproute2)", b)
		}
	}
	netSeq.Lock()
	netSeq.n++
	k := netSeq.n
	netSeq.Unlock()
	n := &Net{t: t, prefix: fmt.Sprintf("fenced-%d-%d", os.Getpid(), k)}
	n.sw = n.prefix + "-sw"
	if err := n.addNS(n.sw); err != nil {
		return nil, err
	}
	if err := ip("-n", n.sw, "link", "add", "br0", "type", "bridge"); err != nil {
		return nil, err
	}
	if err := ip("-n", n.sw, "link", "set", "br0", "up"); err != nil {
		return nil, err
	}
	return n, nil
}

// addNS makes namespace name and deletes it when the test ends.
func (n *Net) addNS(name string) error {
	if err := ip("netns", "add", name); err != nil {
		return err
	}
	n.t.Cleanup(func() {
		if err := ip("netns", "del", name); err != nil {
			n.t.Errorf("testenv: %v", err)
		}
	})
	return ip("-n", name, "link", "set", "lo", "up")
}

// Host adds a host named name to the network, failing t if it cannot.
func (n *Net) Host(name string) *NetHost {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	k := len(n.hosts) + 1
	h := &NetHost{Name: name, NS: fmt.Sprintf("%s-h%d", n.prefix, k), IP: fmt.Sprintf("10.201.0.%d", k), port: fmt.Sprintf("p%d", k),
		net: n}
	steps := [][]string{
		{"link", "add", "eth0", "netns", h.NS, "type", "veth", "peer", "name", h.port, "netns", n.sw},
		{"-n", n.sw, "link", "set", h.port, "master", "br0", "up"},
		{"-n", h.NS, "addr", "add", h.IP + "/24", "dev", "eth0"},
		{"-n", h.NS, "link", "set", "eth0", "up"},
	}
	if err := n.addNS(h.NS); err != nil {
		n.t.Fatal(err)
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			n.t.Fatal(err)
		}
	}
	out, err := exec.Command(ipBin, "-n", h.NS, "-o", "link", "show", "eth0").Output()
	if err != nil {
		n.t.Fatalf("testenv: ip link show in %s: %v", h.NS, err)
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "link/ether" && i+1 < len(f) {
			h.mac = f[i+1]
		}
	}
	if h.mac == "" {
		n.t.Fatalf("testenv: no MAC address for eth0 in %s: %s", h.NS, out)
	}
	// Permanent neighbour entries both ways: a cut must not leave a
	// failed ARP entry behind that outlives it ("no route to host").
	for _, o := range n.hosts {
		for _, s := range [][]string{
			{"-n", o.NS, "neigh", "replace", h.IP, "lladdr", h.mac, "dev", "eth0", "nud", "permanent"},
			{"-n", h.NS, "neigh", "replace", o.IP, "lladdr", o.mac, "dev", "eth0", "nud", "permanent"},
		} {
			if err := ip(s...); err != nil {
				n.t.Fatal(err)
			}
		}
	}
	n.hosts = append(n.hosts, h)
	return h
}

// Addr joins the host's IP and port.
func (h *NetHost) Addr(port int) string { return h.IP + ":" + strconv.Itoa(port) }

// Wrap makes cmd run inside the host's namespace (ip netns exec, which
// execs the command: its process id is cmd's).
func (h *NetHost) Wrap(cmd *exec.Cmd) {
	path := cmd.Path
	if cmd.Err != nil && len(cmd.Args) > 0 {
		path = cmd.Args[0] // not found on PATH here; let ip look it up
	}
	cmd.Args = append([]string{ipBin, "netns", "exec", h.NS, path}, cmd.Args[1:]...)
	cmd.Path, cmd.Err = ipBin, nil
}

// Cut drops every packet to and from the host at both ends of its link,
// until Heal.
func (h *NetHost) Cut() error { return h.setCut(true) }

// Heal undoes Cut.
func (h *NetHost) Heal() error { return h.setCut(false) }

// IsCut reports whether the host is cut off.
func (h *NetHost) IsCut() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cut
}

func (h *NetHost) setCut(cut bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cut == cut {
		return nil
	}
	if h.loss > 0 {
		return fmt.Errorf("testenv: host %s loses %d%% of its packets; end that (Lose(0)) before a cut", h.Name, h.loss)
	}
	op := "add"
	if !cut {
		op = "del"
	}
	for _, end := range [][2]string{{h.NS, "eth0"}, {h.net.sw, h.port}} {
		args := []string{"-n", end[0], "qdisc", op, "dev", end[1], "root"}
		if cut {
			args = append(args, "blackhole")
		}
		if out, err := exec.Command(tcBin, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("testenv: tc %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	h.cut = cut
	return nil
}

// Lose drops percent of the packets to and from the host, each at random,
// at both ends of its link, until Lose(0). That makes a lossy link, on
// which TCP retransmits and replies come late or not at all. This kernel
// has neither netem nor the gact action. So each end gets an htb qdisc
// whose filter sends percent of the packets to a class whose qdisc is a
// blackhole. The filter is a classic BPF program that reads the kernel's
// per-packet random number. A host that is Cut cannot also lose.
func (h *NetHost) Lose(percent int) error {
	if percent < 0 || percent > 100 {
		return fmt.Errorf("testenv: Lose(%d): want a percentage from 0 to 100", percent)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cut {
		return fmt.Errorf("testenv: host %s is cut; heal it before Lose", h.Name)
	}
	if h.loss == percent {
		return nil
	}
	// BPF: A = random u32; if A >= threshold, no match (the default
	// class, which passes); else the filter's class (the blackhole).
	threshold := uint64(percent) << 32 / 100
	prog := fmt.Sprintf("4,32 0 0 %d,53 1 0 %d,6 0 0 4294967295,6 0 0 0", uint32(0xfffff000+56), threshold)
	for _, end := range [][2]string{{h.NS, "eth0"}, {h.net.sw, h.port}} {
		tc := func(args ...string) error {
			args = append([]string{"-n", end[0]}, args...)
			if out, err := exec.Command(tcBin, args...).CombinedOutput(); err != nil {
				return fmt.Errorf("testenv: tc %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
			}
			return nil
		}
		if h.loss > 0 {
			if err := tc("qdisc", "del", "dev", end[1], "root"); err != nil {
				return err
			}
		}
		if percent == 0 {
			continue
		}
		steps := [][]string{
			{"qdisc", "add", "dev", end[1], "root", "handle", "1:", "htb", "default", "1"},
			{"class", "add", "dev", end[1], "parent", "1:", "classid", "1:1", "htb", "rate", "10gbit", "quantum", "60000"},
			{"class", "add", "dev", end[1], "parent", "1:", "classid", "1:2", "htb", "rate", "10gbit", "quantum", "60000"},
			{"qdisc", "add", "dev", end[1], "parent", "1:2", "handle", "20:", "blackhole"},
			{"filter", "add", "dev", end[1], "parent", "1:", "protocol", "all", "prio", "1", "bpf", "bytecode", prog, "classid", "1:2"},
		}
		for _, s := range steps {
			if err := tc(s...); err != nil {
				return err
			}
		}
	}
	h.loss = percent
	return nil
}

// TxPackets returns how many packets the host has sent on its link. It
// reads them from the /proc of a process running on it (pid), so it costs
// no process start.
func (h *NetHost) TxPackets(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(name) != "eth0" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 10 {
			break
		}
		return strconv.ParseUint(f[9], 10, 64)
	}
	return 0, fmt.Errorf("testenv: no eth0 in /proc/%d/net/dev: pid %d is not on host %s", pid, pid, h.Name)
}

func ip(args ...string) error {
	if out, err := exec.Command(ipBin, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// StartOn is Start for a server that runs on host h: cmd is wrapped to run
// there, and WaitPort probes from inside h's namespace.
func StartOn(t testing.TB, h *NetHost, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	h.Wrap(cmd)
	p := Start(t, name, cmd)
	p.host = h
	return p
}

// Exchange connects from inside the host's namespace to addr and sends req.
// It returns what the peer sends back until it closes (at most 2s). It uses
// bash's /dev/tcp, so it needs no helper binary.
func (h *NetHost) Exchange(addr, req string) ([]byte, error) {
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		return nil, fmt.Errorf("testenv: address %q has no port", addr)
	}
	script := fmt.Sprintf(`exec 3<>/dev/tcp/%s/%s || exit 1; printf %%s "$1" >&3; [ -z "$1" ] || timeout 2 cat <&3`, host, port)
	return exec.Command(ipBin, "netns", "exec", h.NS, "timeout", "3", "bash", "-c", script, "x", req).Output()
}

// setprivBin is util-linux's setpriv.
const setprivBin = "/usr/bin/setpriv"

// startServer starts cmd as a server process named name, on host h (nil:
// this host, on loopback). On a host, a credential set with RunAsNobody
// is dropped inside the namespace instead (setpriv), since ip netns exec
// itself must run as root.
func startServer(t testing.TB, h *NetHost, name string, cmd *exec.Cmd) *Process {
	t.Helper()
	if h == nil {
		return Start(t, name, cmd)
	}
	if a := cmd.SysProcAttr; a != nil && a.Credential != nil {
		c := a.Credential
		cmd.Args = append([]string{setprivBin, fmt.Sprintf("--reuid=%d", c.Uid), fmt.Sprintf("--regid=%d", c.Gid), "--clear-groups",
			cmd.Path}, cmd.Args[1:]...)
		cmd.Path = setprivBin
		a.Credential = nil
	}
	return StartOn(t, h, name, cmd)
}

// hostIP is the address a server on h listens on: h's, or 127.0.0.1 for
// nil.
func hostIP(h *NetHost) string {
	if h == nil {
		return "127.0.0.1"
	}
	return h.IP
}

// hostAddr joins hostIP(h) and port.
func hostAddr(h *NetHost, port int) string {
	if h == nil {
		return Addr(port)
	}
	return h.Addr(port)
}
