package fencedk8s_test

import (
	"context"
	"log"
	"os"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedk8s"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
)

// Elect a controller's leader on PostgreSQL with client-go's elector, and
// pass the epoch to what the leader writes.
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "postgres://app@db/app", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	host, _ := os.Hostname()
	// The lock must know the elector's RenewDeadline and RetryPeriod.
	lock, err := fencedk8s.New(client, "my-controller", host, &fencedk8s.Options{
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				// Work under the context that also ends with the lease.
				ctx, l := lock.LeaderContext(ctx)
				if l == nil {
					return // the term is over already
				}
				log.Printf("leading with epoch %d", l.Fence())
				<-ctx.Done()
				log.Printf("term over: %v", context.Cause(ctx))
			},
			OnStoppedLeading: func() { log.Print("stopped leading") },
			OnNewLeader:      func(id string) { log.Printf("leader: %s", id) },
		},
	})
}
