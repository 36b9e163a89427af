package fencedzookeeper_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedzookeeper"
)

// Open a store by URL and run work under a lease. A Curator
// InterProcessMutex on "/app/locks/invoice:inv_72" excludes this worker and
// vice versa.
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "zk://10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181/app/locks", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Do(ctx, "invoice:inv_72", &fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: time.Minute},
		func(ctx context.Context, l *fenced.Lease) error {
			fmt.Println("send invoice with fence", l.Fence())
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
}

// Open a driver from settings instead of a URL.
func ExampleNew() {
	ctx := context.Background()
	d, err := fencedzookeeper.New(ctx, &fencedzookeeper.Options{Servers: []string{"127.0.0.1:2181"}, Root: "/app/locks"})
	if err != nil {
		log.Fatal(err)
	}
	client := fenced.NewClient(d, nil)
	defer client.Close()
	fmt.Println(d.LockPath("invoice:inv_72")) // the path Curator takes
}
