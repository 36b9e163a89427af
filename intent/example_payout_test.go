package intent_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/intent"
	"github.com/fenced-dev/fenced/internal/testkit/payprovider"
)

// The payout scheduler from the design notes: worker A's lease runs out
// while its call to the payment provider is in flight (the provider pays at
// once but answers only after two seconds, and A's call is cancelled with its
// lease). Worker B then legitimately acquires the lease and retries. With
// the intent's stable idempotency key the provider recognises the retry and
// exactly one payout happens; without the key it pays twice.
func Example_payout() {
	for _, withKey := range []bool{true, false} {
		payouts, it, err := payoutScenario(withKey)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		if withKey {
			fmt.Printf("with the idempotency key: %d payout; intent %s, ref %s, %d attempts\n", payouts, it.State, it.Ref, it.Attempts)
		} else {
			fmt.Printf("without it: %d payouts\n", payouts)
		}
	}
	// Output:
	// with the idempotency key: 1 payout; intent submitted, ref pay_1, 2 attempts
	// without it: 2 payouts
}

func payoutScenario(withKey bool) (int, intent.Intent, error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "payout-")
	if err != nil {
		return 0, intent.Intent{}, err
	}
	defer os.RemoveAll(dir)

	// One SQLite file holds the leases and the intents.
	drv, err := fencedsqlite.OpenFile(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		return 0, intent.Intent{}, err
	}
	leases := fenced.NewClient(drv, nil)
	defer leases.Close()
	store, err := intent.New(drv.DB(), fence.SQLite, nil)
	if err != nil {
		return 0, intent.Intent{}, err
	}
	if err := store.EnsureTable(ctx); err != nil {
		return 0, intent.Intent{}, err
	}
	if _, _, err := store.Create(ctx, "po_1", `{"amount_cents":500}`); err != nil {
		return 0, intent.Intent{}, err
	}

	provider := payprovider.Start()
	defer provider.Close()
	provider.RespondAfter = func(n int) time.Duration {
		if n == 1 {
			return 2 * time.Second // the first payout's answer comes too late
		}
		return 0
	}
	pay := &payprovider.Client{URL: provider.URL()}

	// attempt is one scheduler run for payout po_1.
	attempt := func(opts *fenced.LeaseOptions, acquired chan<- struct{}) error {
		lease, err := leases.Acquire(ctx, "payout:po_1", opts)
		if err != nil {
			return err
		}
		defer lease.Release(context.Background())
		if acquired != nil {
			close(acquired)
		}
		tok := fence.From(lease)
		it, err := store.Begin(ctx, "po_1", tok)
		if errors.Is(err, intent.ErrResolved) {
			return nil
		}
		if err != nil {
			return err
		}
		key := it.IdempotencyKey
		if !withKey {
			key = ""
		}
		// The call runs under the lease's context: when the lease runs out
		// the call is cancelled, but the provider may already have paid.
		ref, err := pay.Pay(lease.Context(), key, it.ID, 500)
		if err != nil {
			return nil // outcome unknown: the intent stays submitting
		}
		return store.Complete(ctx, "po_1", tok, ref)
	}

	var wg sync.WaitGroup
	errs := make([]error, 2)
	aHolds := make(chan struct{})
	wg.Add(2)
	go func() { // A: a lease that is not renewed (its process stalls)
		defer wg.Done()
		errs[0] = attempt(&fenced.LeaseOptions{TTL: time.Second, ManualRenew: true}, aHolds)
	}()
	go func() { // B: waits for the lease and retries the payout
		defer wg.Done()
		<-aHolds
		errs[1] = attempt(&fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: 10 * time.Second}, nil)
	}()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, intent.Intent{}, err
	}
	it, err := store.Get(ctx, "po_1")
	return len(provider.Payouts()), it, err
}
