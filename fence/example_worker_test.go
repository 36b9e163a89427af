package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
)

// render stands for the slow work of the canonical worker (rendering the
// invoice's PDF). Tests replace it.
var render = func(ctx context.Context, id string) ([]byte, error) {
	return []byte("%PDF " + id), ctx.Err()
}

// The canonical worker. The text between the canonical markers is copied
// verbatim into the package documentation, README.md and docs/guards.md;
// TestCanonicalSnippetInSync keeps them identical.

// canonical:worker
// issueInvoice issues invoice id at most once, whatever pauses or crashes.
func issueInvoice(ctx context.Context, leases *fenced.Client, guard *fence.SQL, id string,
	opts *fenced.LeaseOptions) (issued bool, err error) {
	err = leases.Do(ctx, "invoice:"+id, opts, func(ctx context.Context, lease *fenced.Lease) error {
		// ctx ends the moment the lease is lost.
		tok := fence.From(lease)
		// 1. Claim the row and read the state it inherits: one short
		//    transaction, committed before any work starts.
		var status string
		claim, err := guard.ClaimAndRead(ctx, id, tok, func(ctx context.Context, tx *sql.Tx) error {
			return tx.QueryRowContext(ctx, `SELECT status FROM invoices WHERE id = $1`, id).Scan(&status)
		})
		if err != nil {
			return err
		}
		if !claim.Applied() {
			return claim.Err() // a newer holder has claimed the row
		}
		if status != "due" {
			return nil // an earlier holder issued it
		}
		// 2. The slow work, outside any transaction.
		pdf, err := render(ctx, id)
		if err != nil {
			return err
		}
		// 3. The guarded write, a statement of its own: it applies only if
		//    no newer holder has claimed the row since.
		res, err := guard.Update(ctx, nil, id, tok, fence.Write{
			Set: "status = $1, pdf = $2", SetArgs: []any{"issued", pdf},
			Where: "status = $3", WhereArgs: []any{"due"},
		})
		if err != nil {
			return err
		}
		issued = res.Applied()
		return res.Err() // nil, fenced.ErrStaleFence or fence.ErrPrecondition
	})
	return issued, err
}

// canonical:end

// Example_worker is the canonical worker of a PostgreSQL billing service:
// the lease and the guarded invoices table live in one database. It runs
// for real in TestCanonicalWorkerPostgres.
func Example_worker() {
	ctx := context.Background()
	dbURL := os.Getenv("DATABASE_URL") // postgres://user:password@host/billing
	// canonical:setup
	leases, err := fenced.Open(ctx, dbURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer leases.Close()
	db, err := sql.Open("pgx", dbURL)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := fence.NewSQL(db, fence.Postgres, fence.Table{
		Name: "invoices", Key: "id",
		LeaseKey: func(id any) string { return fmt.Sprint("invoice:", id) },
	}, &fence.SQLOptions{Hook: leases.Options().Hook}) // Timeout: 5 s, below a third of the TTL
	if err != nil {
		log.Fatal(err)
	}
	if err := guard.EnsureColumns(ctx); err != nil { // adds fence, fence_owner, fence_key
		log.Fatal(err)
	}

	issued, err := issueInvoice(ctx, leases, guard, "inv_72",
		&fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: time.Minute})
	switch {
	case issued && err != nil:
		log.Printf("issued; the lease was lost afterwards: %v", err) // the write counted
	case issued:
		log.Print("issued")
	case err == nil:
		log.Print("already issued by an earlier holder")
	case errors.Is(err, fenced.ErrHeld):
		log.Print("another worker has it")
	case errors.Is(err, fenced.ErrStaleFence):
		log.Printf("a newer holder took over; nothing of ours was written: %v", err)
	case errors.Is(err, fence.ErrPrecondition):
		log.Print("issued meanwhile by another holder")
	case fenced.IsLost(err):
		log.Printf("lease lost before the write; nothing was written, try again later: %v", err)
	default:
		log.Print(err)
	}
	// canonical:end
}
