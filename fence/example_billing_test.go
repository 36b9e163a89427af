package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedsqlite"
)

// billingWorker is the guarded invoice send: take the lease (skip if
// another instance has it), claim the job and read its state in one short
// transaction, then send with a guarded update of its own. pause stands
// for a GC pause or a frozen VM between the decision and the write.
func billingWorker(ctx context.Context, name string, leases *fenced.Client, db *sql.DB, guard *fence.SQL, opts *fenced.LeaseOptions, pause func()) string {
	lease, err := leases.Acquire(ctx, "invoice:inv_72", opts)
	if errors.Is(err, fenced.ErrHeld) {
		return name + ": skipped, another instance holds the lease"
	}
	if err != nil {
		return name + ": " + err.Error()
	}
	defer lease.Release(context.Background())
	tok := fence.From(lease)

	var status string
	claim, err := guard.ClaimAndRead(ctx, "inv_72", tok, func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, "SELECT status FROM invoice_jobs WHERE job_id = ?", "inv_72").Scan(&status)
	})
	if err != nil {
		return name + ": " + err.Error()
	}
	if claim.Outcome == fence.Stale {
		return name + ": abandoned, a newer holder exists"
	}
	if status != "PENDING" {
		return name + ": nothing to do, invoice is " + status
	}

	pause() // the lease may run out here, unnoticed

	// Sending the invoice is the guarded transition PENDING -> SENT.
	res, err := guard.Update(ctx, nil, "inv_72", tok, fence.Write{
		Set: "status = ?, sends = sends + 1", SetArgs: []any{"SENT"},
		Where: "status = ?", WhereArgs: []any{"PENDING"},
	})
	if err != nil {
		return name + ": " + err.Error()
	}
	switch res.Outcome {
	case fence.Stale:
		return fmt.Sprintf("%s: abandoned, the resource refused fence %d (it has %d)", name, tok.Fence, res.Current)
	case fence.PreconditionFailed:
		return name + ": nothing to do, already sent"
	}
	return fmt.Sprintf("%s: sent invoice inv_72 with fence %d", name, tok.Fence)
}

// The billing service from the design notes: three instances notice that
// invoice inv_72 is due. Instance A wins the lease, decides to send, and
// stalls past its lease; B finds the lease held and skips; C takes the
// lease once it expired and sends. When A resumes, its send reaches the
// resource, which refuses it by its fence: the customer gets one invoice.
func Example_billing() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "billing-")
	defer os.RemoveAll(dir)
	drv, err := fencedsqlite.OpenFile(ctx, filepath.Join(dir, "billing.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	leases := fenced.NewClient(drv, nil)
	defer leases.Close()
	db := drv.DB() // the same file holds the leases and the invoices
	db.Exec(`CREATE TABLE invoice_jobs (job_id TEXT PRIMARY KEY, status TEXT NOT NULL, sends INTEGER NOT NULL DEFAULT 0)`)
	db.Exec(`INSERT INTO invoice_jobs (job_id, status) VALUES ('inv_72', 'PENDING')`)
	guard, err := fence.NewSQL(db, fence.SQLite, fence.Table{Name: "invoice_jobs", Key: "job_id",
		LeaseKey: func(id any) string { return fmt.Sprint("invoice:", id) }}, &fence.SQLOptions{
		Hook: func(e fenced.Event) {
			if e.Kind == fenced.EventStaleWrite {
				fmt.Printf("stale write caught on %s: fence %d < %d\n", e.Resource, e.Fence, e.Current)
			}
		},
	})
	if err == nil {
		err = guard.EnsureColumns(ctx)
	}
	if err != nil {
		fmt.Println(err)
		return
	}

	aDecided, aResume, aDone := make(chan struct{}), make(chan struct{}), make(chan string)
	go func() {
		// A's lease is not renewed while it stalls.
		aDone <- billingWorker(ctx, "A", leases, db, guard, &fenced.LeaseOptions{TTL: time.Second, ManualRenew: true},
			func() { close(aDecided); <-aResume })
	}()
	<-aDecided
	fmt.Println(billingWorker(ctx, "B", leases, db, guard, nil, func() {}))
	fmt.Println(billingWorker(ctx, "C", leases, db, guard, &fenced.LeaseOptions{MaxWait: 10 * time.Second}, func() {}))
	close(aResume)
	fmt.Println(<-aDone)

	var sends int
	db.QueryRow(`SELECT sends FROM invoice_jobs WHERE job_id = 'inv_72'`).Scan(&sends)
	fmt.Println("invoices sent:", sends)
	// Output:
	// B: skipped, another instance holds the lease
	// C: sent invoice inv_72 with fence 2
	// stale write caught on invoice_jobs: fence 1 < 2
	// A: abandoned, the resource refused fence 1 (it has 2)
	// invoices sent: 1
}
