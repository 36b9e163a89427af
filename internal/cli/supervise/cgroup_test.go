package supervise

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestNewCgroupSkipsATakenName: a cgroup left behind by a fenced killed
// with -9, whose process ID this process now has, does not send the
// supervisor to the weaker process-tree mode.
func TestNewCgroupSkipsATakenName(t *testing.T) {
	parent := cgroupParent(t)
	taken := filepath.Join(parent, fmt.Sprintf("fenced-%d-%d", os.Getpid(), cgroupSeq.Load()+1))
	if err := os.Mkdir(taken, 0o755); err != nil {
		t.Fatalf("cgroup v2 must be writable here (the cgroup mode's tests need it): %v", err)
	}
	t.Cleanup(func() { os.Remove(taken) })
	c, err := newCgroup()
	if err != nil {
		t.Fatalf("newCgroup with %s taken: %v", taken, err)
	}
	defer os.Remove(c.dir)
	if c.dir == taken {
		t.Fatalf("newCgroup returned the taken cgroup %s", taken)
	}
}
