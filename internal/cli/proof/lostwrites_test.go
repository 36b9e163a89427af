package proof

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// redisLostWrites is a Redis whose crash loses its newest writes, as a
// server with appendfsync no or everysec does: every snapshotEvery it
// copies its data directory aside, and Restart starts it on the copy
// taken before the crash (up to snapshotEvery old), not on what it wrote
// last.
type redisLostWrites struct {
	t    *testing.T
	r    *testenv.Redis
	mu   sync.Mutex
	snap string // the last complete copy
	n    int
	stop chan struct{}
	done sync.WaitGroup
}

const snapshotEvery = time.Second

func startRedisLostWrites(t *testing.T) *redisLostWrites {
	s := &redisLostWrites{t: t, r: testenv.StartRedis(t, testenv.RedisConfig{}), stop: make(chan struct{})}
	s.snapshot()
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(snapshotEvery):
				s.snapshot()
			}
		}
	}()
	t.Cleanup(func() { close(s.stop); s.done.Wait() })
	return s
}

// snapshot copies the data directory aside.
func (s *redisLostWrites) snapshot() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	dst := filepath.Join(s.t.TempDir(), "snap")
	if err := copyDir(s.r.Config.Dir, dst); err != nil {
		s.t.Logf("redis snapshot: %v", err)
		return
	}
	s.snap = dst
}

func (s *redisLostWrites) Pause() error  { return s.r.Signal(syscall.SIGSTOP) }
func (s *redisLostWrites) Resume() error { return s.r.Signal(syscall.SIGCONT) }

// Crash kills the server; the snapshots stop until it is restarted.
func (s *redisLostWrites) Crash() error {
	s.mu.Lock()
	s.r.Kill()
	return nil
}

// Restart puts the last copy in place of the data directory and starts
// the server on it.
func (s *redisLostWrites) Restart() error {
	defer s.mu.Unlock()
	dir := s.r.Config.Dir
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := copyDir(s.snap, dir); err != nil {
		return err
	}
	s.r = s.r.Restart(s.t)
	return nil
}

// copyDir copies the regular files of src into dst, creating dst.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// TestRedisLostWrites is the Redis row of Jepsen's lost-writes finding: a
// store that loses its newest writes on a crash (Redis with appendfsync no
// or everysec; here a restart on a copy of the data directory taken up to
// a second before the crash). The fence counter rolls back, so grants
// repeat fences (Redis declares FenceRepeatable) — the run must show that
// repeat, or it proves nothing — and with fencing the resource still
// accepts nothing stale: the owner rule refuses the second owner of a
// fence.
func TestRedisLostWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and worker processes")
	}
	s := startRedisLostWrites(t)
	var rep Report
	for attempt := 0; attempt < 3; attempt++ {
		rep = runScenario(t, s.r.URL(), Config{Fault: CrashAuthority, Fencing: true, TTL: time.Second, Injections: 2, Server: s, MinFence: fenced.FenceRepeatable})
		checkScenario(t, "redis (restart from an older copy)", CrashAuthority, true, rep)
		if rep.FenceRepeats > 0 {
			break
		}
		t.Logf("attempt %d: no grant fell in the lost second; again", attempt+1)
	}
	if rep.FenceRepeats == 0 {
		t.Fatalf("no fence repeated in 3 runs: %+v; the lost writes never took a grant with them", rep)
	}
}
