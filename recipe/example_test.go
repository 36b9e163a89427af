package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	_ "github.com/fenced-dev/fenced/mem"
	"github.com/fenced-dev/fenced/recipe"
)

// A leader sends its epoch with every command; the resource refuses an
// epoch older than the newest it has seen, so a deposed leader (paused
// past its lease, say) cannot act after its successor has.
func ExampleElection() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "mem://example-election", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	election, err := recipe.NewElection(client, "scheduler", &fenced.LeaseOptions{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	resource := fence.NewMemoryStore() // stands in for a fenced follower or database
	command := func(l *recipe.Leadership) string {
		res, done, err := resource.Admit(ctx, fence.From(l.Lease))
		if err != nil {
			return err.Error()
		}
		if !res.Applied() {
			return fmt.Sprintf("refused: epoch %d is older than %d", l.Fence(), res.Current)
		}
		done()
		return fmt.Sprintf("applied with epoch %d", l.Fence())
	}

	first, err := election.Campaign(ctx, "10.0.0.7:8080")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(command(first))
	leader, _ := election.Leader(ctx)
	fmt.Println("observed:", leader)

	// The first leader's term ends (here it resigns; a lost lease is the
	// same for the resource) and another process leads.
	first.Release(ctx)
	second, err := election.Campaign(ctx, "10.0.0.8:8080")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(command(second))
	fmt.Println(command(first)) // the deposed leader, too late
	second.Release(ctx)
	// Output:
	// applied with epoch 1
	// observed: leader epoch 1 value "10.0.0.7:8080"
	// applied with epoch 2
	// refused: epoch 1 is older than 2
}

// Observe reports every leader, and "no leader" whenever nobody leads.
func ExampleElection_Observe() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, err := fenced.Open(ctx, "mem://example-observe", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	election, _ := recipe.NewElection(client, "api", nil)
	changes := election.Observe(ctx)
	fmt.Println(<-changes)
	l, _ := election.Campaign(ctx, "a")
	fmt.Println(<-changes)
	l.SetValue(ctx, "b")
	fmt.Println(<-changes)
	l.Release(ctx)
	fmt.Println(<-changes)
	// Output:
	// no leader (last epoch 0)
	// leader epoch 1 value "a"
	// leader epoch 1 value "b"
	// no leader (last epoch 1)
}

// Run is the client-go-style form: OnStoppedLeading runs only after a term
// that started, and the term's context is cancelled the moment it is lost.
func ExampleElection_Run() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "mem://example-run", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	election, _ := recipe.NewElection(client, "reconciler", nil)
	err = election.Run(ctx, "", recipe.Callbacks{
		OnStartedLeading: func(ctx context.Context, l *recipe.Leadership) {
			fmt.Println("leading with epoch", l.Fence())
			// Lead until ctx is cancelled; here the work is short and
			// returning resigns.
		},
		OnStoppedLeading: func(cause error) {
			fmt.Println("stopped leading:", errors.Is(cause, fenced.ErrReleased))
		},
	})
	fmt.Println("Run returned", err)
	// Output:
	// leading with epoch 1
	// stopped leading: true
	// Run returned <nil>
}

// Each permit is a lease of its own, with its own fence: a holder that
// dies frees its permit when its TTL runs out.
func ExampleSemaphore() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "mem://example-semaphore", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	sem, err := recipe.NewSemaphore(client, "encoders", 2, &fenced.LeaseOptions{MaxWait: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	a, _ := sem.Acquire(ctx)
	b, _ := sem.Acquire(ctx)
	fmt.Println("two holders on distinct permits:", a.Slot() != b.Slot())
	_, err = sem.TryAcquire(ctx)
	fmt.Println("third refused:", errors.Is(err, fenced.ErrHeld))
	a.Release(ctx)
	c, _ := sem.Acquire(ctx)
	fmt.Println("third got the freed permit:", c.Slot() == a.Slot(), c.Fence() > a.Fence())
	b.Release(ctx)
	c.Release(ctx)
	// Output:
	// two holders on distinct permits: true
	// third refused: true
	// third got the freed permit: true true
}

// AcquireAll takes the keys in one canonical order, so callers naming them
// in any order never deadlock, and gives each key its own fence.
func ExampleAcquireAll() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "mem://example-acquire-all", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	set, err := recipe.AcquireAll(ctx, client, []string{"account:17", "account:4"}, &fenced.LeaseOptions{MaxWait: time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range set.Leases() {
		fmt.Println(l.Key(), "fence", l.Fence())
	}
	// Do the transfer under set.Context(), which is cancelled if either
	// lease is lost; send each account's write its own fence.
	set.Release(ctx)

	// All or nothing: with account:4 held elsewhere, nothing is taken.
	other, _ := client.TryAcquire(ctx, "account:4", nil)
	_, err = recipe.AcquireAll(ctx, client, []string{"account:4", "account:17"}, nil)
	info, _ := client.Inspect(ctx, "account:17")
	fmt.Println(errors.Is(err, fenced.ErrHeld), "account:17 held:", info.Held)
	other.Release(ctx)
	// Output:
	// account:17 fence 1
	// account:4 fence 1
	// true account:17 held: false
}
