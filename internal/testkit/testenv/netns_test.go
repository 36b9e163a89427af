package testenv

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestNetCutHeal starts etcd on one host of a Net and checks, from another,
// that Cut silences it (a connect times out instead of being refused) and
// Heal brings it back at once (no failed ARP entry outlives the cut), and
// that every namespace is gone when the test ends.
func TestNetCutHeal(t *testing.T) {
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
