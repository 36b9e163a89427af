package proof

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// slots are a row's worker processes by slot: the nemesis holds, ends and
// starts them; one that exits by itself is started again (revive).
type slots struct {
	workers
	n    int    // slots 0..n-1
	name string // a slot's process in log lines: "member", "scheduler"
	seed uint64
	logf func(string, ...any)
	// restart starts slot i again; quiet reports an exit code the row
	// expects, which needs no log line.
	restart func(i int) error
	quiet   func(code int) bool

	mu        sync.Mutex
	held      map[int]bool // slots the nemesis has in hand
	lastStart map[int]time.Time
	exits     map[int]int // exits by themselves, by exit code
}

func newSlots(dir string, n int, name string, seed uint64, logf func(string, ...any)) slots {
	return slots{
		workers: newWorkers(dir), n: n, name: name, seed: seed, logf: logf,
		quiet: func(int) bool { return false },
		held:  map[int]bool{}, lastStart: map[int]time.Time{}, exits: map[int]int{},
	}
}

// started notes that slot i was started now.
func (s *slots) started(i int) {
	s.mu.Lock()
	s.lastStart[i] = time.Now()
	s.mu.Unlock()
}

// hold marks slot i as in the nemesis's hand (on) or not: revive leaves
// a held slot alone.
func (s *slots) hold(i int, on bool) {
	s.mu.Lock()
	s.held[i] = on
	s.mu.Unlock()
}

// exitCounts returns the exits by exit code so far.
func (s *slots) exitCounts() map[int]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]int, len(s.exits))
	for code, n := range s.exits {
		out[code] = n
	}
	return out
}

// exited reports whether slot i's process has exited.
func (s *slots) exited(i int) bool {
	_, done := s.worker(i)
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// revive starts again every process that exited by itself (not one the
// nemesis holds), at most every 200ms.
func (s *slots) revive() error {
	for i := range s.n {
		s.mu.Lock()
		skip := s.held[i] || time.Since(s.lastStart[i]) < 200*time.Millisecond
		s.mu.Unlock()
		if skip || !s.exited(i) {
			continue
		}
		cmd, _ := s.worker(i)
		code := cmd.ProcessState.ExitCode()
		s.mu.Lock()
		s.exits[code]++
		s.mu.Unlock()
		if !s.quiet(code) {
			s.logf("seed %d: %s %d exited by itself with code %d (see worker-%d.log); its log ends: %s",
				s.seed, s.name, i, code, i, s.logTail(i, 600))
		}
		if err := s.restart(i); err != nil {
			return err
		}
	}
	return nil
}

// sleep sleeps d, reviving processes every 50ms.
func (s *slots) sleep(ctx context.Context, d time.Duration) error {
	for end := time.Now().Add(d); ; {
		if err := s.revive(); err != nil {
			return err
		}
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(left, 50*time.Millisecond)):
		}
	}
}

// end ends slot i's process: a leave (SIGTERM, waited for up to 10s, then
// -9) or a kill -9.
func (s *slots) end(i int, kill bool) {
	cmd, done := s.worker(i)
	endProcess(cmd, done, kill, func() {
		s.logf("seed %d: %s %d did not leave within 10s of SIGTERM; killed", s.seed, s.name, i)
	})
}

// stopAll holds every slot, continues its process and makes it leave
// (SIGTERM, -9 after 10s), all at once, then waits for them.
func (s *slots) stopAll() {
	for i := range s.n {
		s.hold(i, true)
	}
	var wg sync.WaitGroup
	for i := range s.n {
		cmd, _ := s.worker(i)
		if cmd == nil {
			continue
		}
		cmd.Process.Signal(syscall.SIGCONT)
		wg.Add(1)
		go func() { defer wg.Done(); s.end(i, false) }()
	}
	wg.Wait()
	s.wg.Wait()
}

// endProcess ends a row's child process cmd, whose exit closes done: with
// SIGTERM, waited for up to 10s (then slow is called and it is killed),
// or at once with SIGKILL when kill is set.
func endProcess(cmd *exec.Cmd, done <-chan struct{}, kill bool, slow func()) {
	if !kill {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			return
		case <-time.After(10 * time.Second):
			slow()
		}
	}
	cmd.Process.Kill()
	<-done
}

// logTail returns the last n bytes of slot i's log, for a line that must
// say why it exited after the run's directory is gone.
func (s *slots) logTail(i, n int) string {
	b, err := os.ReadFile(filepath.Join(s.dir, fmt.Sprintf("worker-%d.log", i)))
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b[max(0, len(b)-n):]))
}
