package fencedcron_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/robfig/cron/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedcron"
)

// Run a report on one instance of many, with the run's lease: its context
// ends when the lease is lost, and its fence goes with every write
// (fence.From(l) for the guards of package fence). Here the store is a
// fresh SQLite file and the job is due every second and stops the example
// after its first run; in an application the store is the instances'
// shared one and the schedule, say, "@every 1h".
func ExampleSkipIfHeld() {
	dir, err := os.MkdirTemp("", "fencedcron")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	client, err := fenced.Open(context.Background(), "sqlite://"+filepath.Join(dir, "leases.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	skip, err := fencedcron.SkipIfHeld(client, "report", &fencedcron.Options{
		OnError: func(err error) { log.Print(err) },
	})
	if err != nil {
		log.Fatal(err)
	}
	// SkipIfHeld comes last in the chain, nearest the job.
	c := cron.New(cron.WithSeconds(), cron.WithChain(cron.Recover(cron.DefaultLogger), skip))
	ran := make(chan struct{})
	_, err = c.AddJob("* * * * * *", fencedcron.LeaseFunc(func(ctx context.Context, l *fenced.Lease) error {
		select {
		case <-ran:
			return nil // the example prints one run only
		default:
		}
		// Write with fence.From(l); stop when ctx ends.
		fmt.Printf("report under lease %s, fence %d, context live: %t\n", l.Key(), l.Fence(), ctx.Err() == nil)
		close(ran)
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	c.Start()
	<-ran
	<-c.Stop().Done()
	// Output:
	// report under lease report, fence 1, context live: true
}
