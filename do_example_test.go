package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/mem"
)

// When the lease ends while the work runs, Do says whether the work
// finished. Here a fake clock stands for a process that stalls past its
// lease: first after its guarded commit, then before it.
func ExampleLeaseEndedError() {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(0, 0))
	client := fenced.NewClient(mem.New(&mem.Options{Clock: clk}), &fenced.Options{Clock: clk})
	defer client.Close()
	opts := &fenced.LeaseOptions{TTL: 10 * time.Second, ManualRenew: true}

	report := func(err error) {
		var ended *fenced.LeaseEndedError
		switch {
		case errors.As(err, &ended) && ended.WorkErr == nil:
			fmt.Println("committed, then lost the lease; lost:", fenced.IsLost(err))
		case fenced.IsLost(err):
			fmt.Println("lost the lease before the work was done; retry")
		case err != nil:
			log.Fatal(err)
		}
	}
	report(client.Do(ctx, "invoice:inv_72", opts, func(ctx context.Context, l *fenced.Lease) error {
		// ... the guarded update with fence.From(l) commits here ...
		clk.Advance(time.Minute) // then the process stalls past its lease
		<-ctx.Done()
		return nil
	}))
	report(client.Do(ctx, "invoice:inv_72", opts, func(ctx context.Context, l *fenced.Lease) error {
		clk.Advance(time.Minute) // stalls before writing
		<-ctx.Done()
		return context.Cause(ctx) // the write was never sent
	}))
	// Output:
	// committed, then lost the lease; lost: true
	// lost the lease before the work was done; retry
}
