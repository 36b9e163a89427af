package fencedgocron_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedgocron"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
)

// Run a job on whichever of the application's instances gets its lease
// first (the others skip that run), with the lease: its context ends when
// the lease is lost, and its fence goes with every write (fence.From(l) for
// the guards of package fence). Here the store is a fresh SQLite file and
// the job runs once, at once; in an application it is the instances'
// shared store and a schedule such as gocron.CronJob("0 * * * *", false).
func Example() {
	dir, err := os.MkdirTemp("", "fencedgocron")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	client, err := fenced.Open(context.Background(), "sqlite://"+filepath.Join(dir, "leases.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close() // after s.Shutdown; locker.Wait first would keep the last MinHold
	locker, err := fencedgocron.NewLocker(client, &fencedgocron.Options{
		Lease: fenced.LeaseOptions{TTL: 30 * time.Second, MinHold: 5 * time.Second},
	})
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan struct{})
	_, err = s.NewJob(
		gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		locker.Task(func(ctx context.Context, l *fenced.Lease) error {
			defer close(ran)
			// Write with fence.From(l); stop when ctx ends.
			fmt.Printf("report under lease %s, fence %d, context live: %t\n", l.Key(), l.Fence(), ctx.Err() == nil)
			return nil
		}),
		gocron.WithName("report"), // the lease key is "gocron:report"
	)
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-ran
	if err := s.Shutdown(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// report under lease gocron:report, fence 1, context live: true
}

// Let one instance, the leader, run every job, with the lease of its term:
// its context ends when the term does, and its fence (the term's epoch)
// goes with every write.
func ExampleElector_Task() {
	dir, err := os.MkdirTemp("", "fencedgocron")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	client, err := fenced.Open(ctx, "sqlite://"+filepath.Join(dir, "leases.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	elector, err := fencedgocron.NewElector(ctx, client, "scheduler:leader", nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan struct{})
	_, err = s.NewJob(
		gocron.DurationJob(100*time.Millisecond), // runs are skipped until this instance leads
		elector.Task(func(ctx context.Context, l *fenced.Lease) error {
			fmt.Printf("report by the leader, epoch %d\n", l.Fence())
			close(ran)
			return nil
		}),
		gocron.WithName("report"),
		gocron.WithLimitedRuns(1),
	)
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-ran
	if err := s.Shutdown(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// report by the leader, epoch 1
}
