package fencedetcd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedetcd"
)

// Open a store by URL and run work under a lease. The fence goes with every
// write to the protected resource; `etcdctl lock fenced/invoice:inv_72`
// excludes this worker and vice versa.
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379", nil)
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

// Wrap an etcd client the application already has.
func ExampleNew() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	d, err := fencedetcd.New(cli, &fencedetcd.Options{Prefix: "locks/"})
	if err != nil {
		log.Fatal(err)
	}
	client := fenced.NewClient(d, nil)
	defer client.Close()
	fmt.Println(d.LockName("invoice:inv_72")) // the name etcdctl lock takes
}
