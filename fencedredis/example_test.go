package fencedredis_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/redis/go-redis/v9"
)

// Open a store by URL. Redis's fence can repeat after a failover, so a
// lease must accept that explicitly with MinFence.
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "redis://:password@127.0.0.1:6379/0?wait_replicas=1", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(ctx, "invoice:inv_72", &fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: time.Minute, MinFence: fenced.FenceRepeatable},
		func(ctx context.Context, l *fenced.Lease) error {
			fmt.Println("charging with fence", l.Fence())
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
}

// Use an existing go-redis client.
func ExampleNew() {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	drv, err := fencedredis.New(rc, &fencedredis.Options{Prefix: "myapp:leases:"})
	if err != nil {
		log.Fatal(err)
	}
	client := fenced.NewClient(drv, &fenced.Options{MinFence: fenced.FenceNone})
	defer client.Close()
	fmt.Println(client.Capabilities().Fence)
}
