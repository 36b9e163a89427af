package testenv

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestSignalStopWaitsForTheWholeGroup: Signal(SIGSTOP) returns only once
// every process of the group is stopped, children included (a PostgreSQL
// server is a postmaster and its backends), even ones busy on a CPU.
func TestSignalStopWaitsForTheWholeGroup(t *testing.T) {
	p := Start(t, "spinners", exec.Command("sh", "-c", "while :; do :; done & while :; do :; done & wait"))
	pgid := p.Cmd.Process.Pid
	// Wait for both children to run.
	for deadline := time.Now().Add(5 * time.Second); groupSize(pgid) < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the group has %d processes, want 3", groupSize(pgid))
		}
	}
	for round := range 20 {
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if !groupStopped(pgid) {
			t.Fatalf("round %d: Signal(SIGSTOP) returned with a process of the group still running", round)
		}
		if err := p.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
