package fencedgocron_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedgocron"
)

// TestElectorHandsOver: of two electors on one SQLite store exactly one
// leads; when its campaign ends it resigns and the other leads, with a
// higher epoch.
func TestElectorHandsOver(t *testing.T) {
	store := "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
	var electors [2]*fencedgocron.Elector
	var stops [2]context.CancelFunc
	for i := range electors {
		c, err := fenced.Open(context.Background(), store, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ctx, stop := context.WithCancel(context.Background())
		t.Cleanup(stop)
		stops[i] = stop
		electors[i], err = fencedgocron.NewElector(ctx, c, "jobs", &fencedgocron.Options{Lease: fenced.LeaseOptions{TTL: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
	}
	leader := func() int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			var leads []int
			for i, e := range electors {
				if e != nil && e.IsLeader(context.Background()) == nil {
					leads = append(leads, i)
				}
			}
			if len(leads) > 1 {
				t.Fatalf("electors %v lead together", leads)
			}
			if len(leads) == 1 {
				return leads[0]
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("no leader")
		return -1
	}
	first := leader()
	epoch := electors[first].Epoch()
	other := 1 - first
	if err := electors[other].IsLeader(context.Background()); !errors.Is(err, fencedgocron.ErrNotLeader) {
		t.Fatalf("follower's IsLeader: %v, want ErrNotLeader", err)
	}
	stops[first]()
	<-electors[first].Done()
	electors[first] = nil
	if next := leader(); next != other {
		t.Fatalf("leader %d after handover, want %d", next, other)
	}
	if e := electors[other].Epoch(); e <= epoch {
		t.Fatalf("epoch %d after handover, not above %d", e, epoch)
	}
}
