//go:build linux

package supervise

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// In process-tree mode, Stop scans /proc until the scan is stable, so a
// process that forks and exits (leaving the session each time) while the
// scan runs is stopped in its new form. The hopper here hops every 50 ms
// (a single scan missed it in most of 20 stops; at 20 ms even the rescan
// lost it now and then on a loaded 2-core machine);
// one that hops faster than a walk of /proc takes can outrun any walk
// (the cgroup mode has no such limit, see TestStopHoldsAHopper).
func TestStopRescansForAHopper(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a process hopping out of the session for seconds; run without -short")
	}
	t.Setenv(ModeEnv, "proctree")
	t.Logf("supervision mode: %s", Probe())
	bin := buildC(t, "hopper")
	out := filepath.Join(t.TempDir(), "out")
	g := start(t, exec.Command(bin, out, "50000"))
	// Runs before start's cleanup: a hopper that escaped exits by itself.
	t.Cleanup(func() { os.WriteFile(out+".stop", nil, 0o644) })
	if !growing(out, 5*time.Second) {
		t.Fatal("the hopper does not run")
	}
	for i := range 20 {
		time.Sleep(time.Duration(i%7) * time.Millisecond) // stop at another point of the hop
		g.Stop()
		if growing(out, 150*time.Millisecond) {
			t.Fatalf("stop %d: the hopper runs on while the Group is stopped", i)
		}
		g.Continue()
		if !growing(out, 5*time.Second) {
			t.Fatalf("continue %d: the hopper was not continued", i)
		}
	}
}
