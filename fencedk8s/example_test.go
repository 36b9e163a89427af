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
	lock, err := fencedk8s.New(client, "my-controller", host, nil)
	if err != nil {
		log.Fatal(err)
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: 15 * time.Second,
		RenewDeadline: 10 * time.Second,
		RetryPeriod:   2 * time.Second,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				l := lock.Lease()
				if l == nil {
					return // the term is over already
				}
				log.Printf("leading with epoch %d", l.Fence())
				select { // work until either says the term ended
				case <-ctx.Done():
				case <-l.Context().Done():
				}
			},
			OnStoppedLeading: func() { log.Print("stopped leading") },
		},
	})
}
