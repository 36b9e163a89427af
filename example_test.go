package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	_ "github.com/fenced-dev/fenced/mem"
)

func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "fenced-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	// The embedded default: one SQLite file shared by the processes of a host.
	client, err := fenced.Open(ctx, "sqlite://"+filepath.Join(dir, "leases.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	g := client.Capabilities()
	fmt.Println("fence:", g.Fence, "server clock:", g.ServerClock)

	// Unknown schemes and malformed URLs are refused with fenced.ErrInvalidURL.
	_, err = fenced.Open(ctx, "nosuch://host", nil)
	fmt.Println(errors.Is(err, fenced.ErrInvalidURL))
	// Output:
	// fence: strict server clock: true
	// true
}

func ExampleClient_Acquire() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "mem://example-acquire", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	lease, err := client.Acquire(ctx, "invoice:inv_72", &fenced.LeaseOptions{
		TTL:     30 * time.Second,
		MaxWait: 10 * time.Second, // wait up to 10s if another worker holds it
	})
	if err != nil {
		log.Fatal(err)
	}
	// Send lease.Fence() with every write; do the work under lease.Context(),
	// which is cancelled the moment the lease is lost.
	fmt.Println("fence", lease.Fence(), "valid:", lease.Err() == nil)

	// Someone else trying now is refused at once.
	_, err = client.TryAcquire(ctx, "invoice:inv_72", nil)
	fmt.Println("second holder refused:", errors.Is(err, fenced.ErrHeld))

	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after release:", context.Cause(lease.Context()))

	// The fence counter survives the release.
	next, _ := client.TryAcquire(ctx, "invoice:inv_72", nil)
	defer next.Release(ctx)
	fmt.Println("next fence", next.Fence())
	// Output:
	// fence 1 valid: true
	// second holder refused: true
	// after release: lease released
	// next fence 2
}

func ExampleClient_Do() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "mem://example-do", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// Periodic work: skip if another worker is already doing it (MaxWait 0).
	err = client.Do(ctx, "report:nightly", nil, func(ctx context.Context, l *fenced.Lease) error {
		fmt.Println("generating the report with fence", l.Fence())
		return nil
	})
	if errors.Is(err, fenced.ErrHeld) {
		fmt.Println("another worker has it; skipped")
	} else if err != nil {
		log.Fatal(err)
	}

	// Must-happen work: wait up to a minute for the key.
	err = client.Do(ctx, "invoice:inv_72", &fenced.LeaseOptions{MaxWait: time.Minute},
		func(ctx context.Context, l *fenced.Lease) error {
			fmt.Println("sending the invoice with fence", l.Fence())
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// generating the report with fence 1
	// sending the invoice with fence 1
}

func ExampleLeaseOptions_minFence() {
	ctx := context.Background()
	client, _ := fenced.Open(ctx, "mem://example-min-fence", nil)
	defer client.Close()

	// Work whose duplicates only waste effort accepts any store and may run
	// without a lease when the store is down. Failing open is only possible
	// for a lease that accepts no fence, so asking for it alone is refused.
	_, err := client.TryAcquire(ctx, "cache:warm", &fenced.LeaseOptions{FailOpen: true})
	fmt.Println(err)

	l, err := client.TryAcquire(ctx, "cache:warm", &fenced.LeaseOptions{MinFence: fenced.FenceNone, FailOpen: true})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	fmt.Println("min fence:", l.Options().MinFence, "fail open:", l.Options().FailOpen)
	// Output:
	// fenced: acquire "cache:warm": invalid lease options: FailOpen: it needs MinFence FenceNone, since a lease that fails open has no fence, but MinFence is strict (package default)
	// min fence: none fail open: true
}

func ExampleClient_Resolve() {
	ctx := context.Background()
	// A client for cache work accepts any store.
	client, _ := fenced.Open(ctx, "mem://example-resolve", &fenced.Options{MinFence: fenced.FenceNone})
	defer client.Close()

	// A lease that says what it needs gets exactly that: a strict fence
	// beats the client's MinFence, and the zero MaxWait does not wait.
	opts, err := client.Resolve(&fenced.LeaseOptions{MinFence: fenced.FenceStrict})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("min fence:", opts.MinFence, "fail open:", opts.FailOpen, "no wait:", opts.MaxWait == 0)
	// Output:
	// min fence: strict fail open: false no wait: true
}

// One hook receives every Event; Kind says which fields are set.
func ExampleEvent() {
	ctx := context.Background()
	hook := func(e fenced.Event) {
		switch e.Kind {
		case fenced.EventAcquire:
			fmt.Printf("acquire %s: fence %d, held by another: %v\n", e.Key, e.Fence, errors.Is(e.Err, fenced.ErrHeld))
		case fenced.EventRelease:
			fmt.Printf("release %s: end cause %v\n", e.Key, e.Lease.Err())
		}
	}
	client, err := fenced.Open(ctx, "mem://example-event", &fenced.Options{Hook: hook})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	l, err := client.TryAcquire(ctx, "report:daily", nil)
	if err != nil {
		log.Fatal(err)
	}
	client.TryAcquire(ctx, "report:daily", nil) // held: refused
	l.Release(ctx)
	// Output:
	// acquire report:daily: fence 1, held by another: false
	// acquire report:daily: fence 0, held by another: true
	// release report:daily: end cause lease released
}
