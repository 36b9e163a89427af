package fencedcron_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedcron"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/testkit/childproc"
)

func TestMain(m *testing.M) {
	childproc.Main(m, map[string]func() int{"leasejob": childLeaseJob})
}

// TestThreeCronsRunEachTickOnce: three crons, each with its own client on
// one SQLite file, run a job due every second once per second between them.
func TestThreeCronsRunEachTickOnce(t *testing.T) {
	store := "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
	var (
		mu   sync.Mutex
		runs = map[int64]int{}
	)
	const runFor = 4 * time.Second
	for range 3 {
		c, err := fenced.Open(context.Background(), store, nil)
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
		job := cron.NewChain(skip).Then(cron.FuncJob(func() {
			mu.Lock()
			runs[time.Now().Unix()]++
			mu.Unlock()
		}))
		if _, err := cr.AddJob("* * * * * *", job); err != nil {
			t.Fatal(err)
		}
		cr.Start()
		t.Cleanup(func() { <-cr.Stop().Done() })
	}
	time.Sleep(runFor)
	mu.Lock()
	defer mu.Unlock()
	for sec, n := range runs {
		if n != 1 {
			t.Errorf("second %d: %d runs, want 1", sec, n)
		}
	}
	if len(runs) < int(runFor/time.Second)-1 {
		t.Errorf("%d seconds had a run in %v", len(runs), runFor)
	}
}
