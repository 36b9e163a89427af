package supervise

import "testing"

// TestGuardOrdersAllocateNothing checks that the orders a guard reads
// while it waits (kill-by, group) allocate nothing: its garbage
// collector is off then (stopCollecting).
func TestGuardOrdersAllocateNothing(t *testing.T) {
	var o guardOrders
	killBy, group := []byte("kill-by 1234567890123"), []byte("group 4321")
	if n := testing.AllocsPerRun(100, func() { o.apply(killBy); o.apply(group) }); n != 0 {
		t.Errorf("an order allocates %v times, want 0", n)
	}
	if o.killBy != 1234567890123 || o.group != 4321 {
		t.Errorf("orders read as kill-by %d, group %d", o.killBy, o.group)
	}
}

// TestGuardOrdersKeepLastOnBadInput checks that a malformed number leaves
// the last order standing, and that "done" ends the wait.
func TestGuardOrdersKeepLastOnBadInput(t *testing.T) {
	o := guardOrders{killBy: 7, group: 3}
	for _, line := range []string{"kill-by ", "kill-by -5", "kill-by 12x", "kill-by 1234567890123456789", "group x", "group "} {
		if !o.apply([]byte(line)) {
			t.Errorf("%q ended the wait", line)
		}
	}
	if o.killBy != 7 || o.group != 3 {
		t.Errorf("bad orders changed kill-by to %d, group to %d", o.killBy, o.group)
	}
	if o.apply([]byte("done")) {
		t.Error(`"done" did not end the wait`)
	}
}
