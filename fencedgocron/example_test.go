package fencedgocron_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedgocron"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
)

// Run a job every minute on whichever of the application's instances gets
// its lease first; the others skip that run.
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "sqlite:///var/lib/app/leases.db", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close() // after s.Shutdown: frees leases kept for their MinHold
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
	defer s.Shutdown()
	_, err = s.NewJob(gocron.CronJob("* * * * *", false), gocron.NewTask(func() {
		fmt.Println("send the report")
	}), gocron.WithName("report"))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
}

// Let one instance, the leader, run every job.
func ExampleNewElector() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	client, err := fenced.Open(ctx, "postgres://app@db/app", nil)
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
	defer s.Shutdown()
	s.Start()
}
