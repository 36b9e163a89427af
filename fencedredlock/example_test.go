package fencedredlock_test

import (
	"context"
	"fmt"
	"log"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredlock"
	"github.com/redis/go-redis/v9"
)

// Redlock without a fence source serves leases that need no fence.
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "redlock://:pw@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379/0", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(ctx, "cache:rebuild", &fenced.LeaseOptions{MinFence: fenced.FenceNone}, func(ctx context.Context, l *fenced.Lease) error {
		fmt.Println("rebuilding; Redlock's fence is", l.Fence())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A correctness lease over Redlock takes its fence from a strict store.
func ExampleNew() {
	ctx := context.Background()
	strict, err := fenced.Open(ctx, "postgres://app@db/app", nil) // needs the postgres backend linked in
	if err != nil {
		log.Fatal(err)
	}
	var nodes []redis.UniversalClient
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"} {
		nodes = append(nodes, redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true}))
	}
	drv, err := fencedredlock.New(nodes, &fencedredlock.Options{Fence: fencedredlock.ClientFence(strict)})
	if err != nil {
		log.Fatal(err)
	}
	client := fenced.NewClient(drv, nil)
	defer client.Close()
	fmt.Println(client.Capabilities().Fence)
}
