package fencedpostgres_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedpostgres"
)

// Open a PostgreSQL lease table by URL and run work under a lease, passing
// its fence to the protected write. (The tests set DATABASE_URL to the
// server they started.)
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, os.Getenv("DATABASE_URL")+"&table=example_leases", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	caps := client.Capabilities()
	fmt.Println("notified waiters:", caps.Subscribe || caps.Queue)

	err = client.Do(ctx, "invoice:inv_72", &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: 10 * time.Second},
		func(ctx context.Context, l *fenced.Lease) error {
			// Every write to the protected resource carries l.Fence(), for
			// example: UPDATE invoices SET status = 'SENT', last_fence = $1
			// WHERE id = $2 AND last_fence <= $1.
			fmt.Println("holding with a fence:", l.Fence() > 0)
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// notified waiters: true
	// holding with a fence: true
}

// Build a driver over a pool the application already has.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	drv, err := fencedpostgres.New(ctx, pool, &fencedpostgres.Options{Table: "example_leases"})
	if err != nil {
		log.Fatal(err)
	}
	client := fenced.NewClient(drv, nil)
	defer client.Close()
	l, err := client.TryAcquire(ctx, "report:daily", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	fmt.Println("fence strength:", client.Capabilities().Fence)
	// Output: fence strength: strict
}

// Run a job at most once at a time when everything it writes lives in the
// same database: the advisory lock and the writes share one transaction.
func ExampleWithAdvisoryLock() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	err = fencedpostgres.WithAdvisoryLock(ctx, pool, "billing:monthly-run", nil, func(ctx context.Context, tx pgx.Tx) error {
		// Writes through tx commit together with the lock's release.
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	})
	switch {
	case errors.Is(err, fenced.ErrHeld):
		fmt.Println("skipped: another worker is running it")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("ran")
	}
	// Output: ran
}
