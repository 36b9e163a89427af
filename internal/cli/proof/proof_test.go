package proof

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	MaybeRunWorker()
	os.Exit(m.Run())
}

// testCommand re-executes the test binary as a worker.
func testCommand() *exec.Cmd { return exec.Command(os.Args[0], "-test.run=^$") }

// runScenario runs one scenario against store and logs its report.
func runScenario(t *testing.T, store string, cfg Config) Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg.Store = store
	cfg.Command = testCommand
	if cfg.Dir == "" {
		cfg.Dir = historyDir(t, fmt.Sprintf("%s-%s-%v-%d", t.Name(), cfg.Fault, cfg.Fencing, time.Now().UnixNano()))
	}
	if len(cfg.Keys) == 0 {
		cfg.Keys = []string{fmt.Sprintf("fenced-proof:test:%d", time.Now().UnixNano())}
	}
	cfg.Logf = t.Logf
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run %s fencing=%v: %v (history in %s)", cfg.Fault, cfg.Fencing, err, cfg.Dir)
	}
	t.Logf("%s fencing=%v %s: %+v", cfg.Fault, cfg.Fencing, cfg.Ordering, res.Report)
	if len(res.Report.Problems) > 0 {
		t.Errorf("checker problems: %v", res.Report.Problems)
	}
	return res.Report
}

func sqliteStore(t *testing.T) string {
	return "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
}

// TestCheckerSeesHazardWithFencingOff is what makes the checker believable:
// with the resource ignoring fences, a holder paused past its TTL (M1)
// writes after the next holder, and the checker must see it.
func TestCheckerSeesHazardWithFencingOff(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP of a holder past its TTL with fencing off; run without -short")
	}
	rep := runScenario(t, sqliteStore(t), Config{Fault: PauseHolder, Fencing: false, TTL: time.Second})
	if rep.StaleAccepted == 0 || rep.DuplicateEffects == 0 || rep.Linearizable || !rep.HazardSeen {
		t.Fatalf("fencing off under M1: %+v; want a stale write accepted, a duplicate effect and a non-linearizable history", rep)
	}
}

func TestPauseHolderFencingOnSQLite(t *testing.T) {
	if testing.Short() {
		t.Skip("long: SIGSTOP of a holder past its TTL; run without -short")
	}
	rep := runScenario(t, sqliteStore(t), Config{Fault: PauseHolder, Fencing: true, TTL: time.Second})
	if rep.StaleAccepted != 0 || rep.DuplicateEffects != 0 || !rep.Linearizable || rep.StaleRefused == 0 {
		t.Fatalf("fencing on under M1: %+v", rep)
	}
}
