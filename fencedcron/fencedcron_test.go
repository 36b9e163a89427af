package fencedcron_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedcron"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func TestMain(m *testing.M) {
	childproc.Main(m, map[string]func() int{"leasejob": childLeaseJob})
}

// TestThreeCronsRunEachTickOnce: three crons, each with its own client on
// one SQLite file, run a job due every second once per second between them.
// Each run is counted under the second its tick fired in (an outer wrapper
// reads the clock before SkipIfHeld's grant), so a grant that took long is
// not counted under the next tick.
func TestThreeCronsRunEachTickOnce(t *testing.T) {
	store := "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
	var (
		mu    sync.Mutex
		runs  = map[int64]int{}
		worst time.Duration // the longest grant or refusal the clients saw
	)
	hook := func(e fenced.Event) {
		if e.Kind == fenced.EventAcquire {
			mu.Lock()
			worst = max(worst, e.Duration)
			mu.Unlock()
		}
	}
	late := testenv.SampleLateness()
	defer late.Stop()
	for range 3 {
		c, err := fenced.Open(context.Background(), store, &fenced.Options{Hook: hook})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		skip, err := fencedcron.SkipIfHeld(c, "every-second", &fencedcron.Options{
			OnError: func(err error) { t.Errorf("run: %v", err) },
		})
		if err != nil {
			t.Fatal(err)
		}
		cr := cron.New(cron.WithSeconds())
		job := cron.FuncJob(func() {
			tick := time.Now().Unix()
			skip(cron.FuncJob(func() {
				mu.Lock()
				runs[tick]++
				mu.Unlock()
			})).Run()
		})
		if _, err := cr.AddJob("* * * * * *", job); err != nil {
			t.Fatal(err)
		}
		cr.Start()
		t.Cleanup(func() { <-cr.Stop().Done() })
	}
	// Liveness: want seconds with a run. A run holds the key for
	// DefaultMinHold after a grant that took up to worst, and its release
	// takes up to worst as well (a write like the grant), and the next
	// tick's try fires up to the worst timer lateness late: the next
	// tick's run can come only once that is over, so at most every
	// ⌈(2·worst + DefaultMinHold + lateness) / 1 s⌉ seconds, which is
	// every second on a quiet machine (3 runs in 4 s, as before). The
	// bound is re-read as the run goes. The run lasts runFor at least, so
	// that the safety check below covers as many ticks as it did.
	const want, runFor = 3, 4 * time.Second
	bound := func() (time.Duration, string) {
		mu.Lock()
		w := worst
		mu.Unlock()
		every := max(1, (2*w+fencedcron.DefaultMinHold+late.Max()+time.Second-1)/time.Second)
		return time.Duration(want*every+1) * time.Second, fmt.Sprintf("a run every %d s at most: worst grant %v, worst timer lateness %v",
			every, w.Round(time.Millisecond), late.Max().Round(time.Millisecond))
	}
	start := time.Now()
	for {
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n >= want && time.Since(start) >= runFor {
			break
		}
		if b, why := bound(); time.Since(start) > b {
			t.Errorf("%d seconds had a run in %v, want %d within %v (%s)", n, time.Since(start).Round(time.Millisecond), want, b, why)
			break
		}
	}
	b, why := bound()
	t.Logf("%d seconds had a run in %v (bound %v: %s)", len(runs), time.Since(start).Round(time.Millisecond), b, why)
	mu.Lock()
	defer mu.Unlock()
	// Safety, whatever the machine: no tick ran twice.
	for sec, n := range runs {
		if n != 1 {
			t.Errorf("second %d: %d runs, want 1", sec, n)
		}
	}
}
