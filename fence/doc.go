// Package fence makes protected resources refuse writes from stale lease
// holders.
//
// A holder paused past its lease wakes up believing it still holds it. So
// every write carries the lease's token (its key, fence and owner digest),
// and the resource checks it atomically with the write. The guards:
//
//   - SQL: a table's rows, through database/sql (SQLite, PostgreSQL,
//     MySQL/MariaDB) or native pgx (package fence/pgxfence).
//   - Packages fence/redisfence and fence/etcdfence: Redis hashes and etcd
//     keys.
//   - Object: objects in an ObjectStore, such as S3 (package fence/s3fence).
//   - Transport and Middleware: HTTP requests, with the fences kept in a
//     MemoryStore or a SQLStore. TokenFromEnv reads the token `fenced run`
//     gives its command.
//
// A resource that recorded (fence F, owner O) accepts (f, o) when f > F, or
// f == F and o == O. A refusal is Stale (with the newer fence) or
// PreconditionFailed. Each Stale one is reported as an EventStaleWrite. A
// token for another lease key than the resource's is refused with
// ErrWrongKey.
//
// Tokens are not authenticated. Where not every writer is trusted, give the
// guard a Checker. A Verifier takes tokens signed by a Signer. A Sequencer
// takes the fence the store grants now.
//
// # The safe sequence
//
// Claim the row and read it (ClaimAndRead), work outside any transaction,
// then write in a statement of its own (Update). Tested against PostgreSQL
// with a real SIGSTOP:
//
//	// issueInvoice issues invoice id at most once, whatever pauses or crashes.
//	func issueInvoice(ctx context.Context, leases *fenced.Client, guard *fence.SQL, id string,
//		opts *fenced.LeaseOptions) (issued bool, err error) {
//		err = leases.Do(ctx, "invoice:"+id, opts, func(ctx context.Context, lease *fenced.Lease) error {
//			// ctx ends the moment the lease is lost.
//			tok := fence.From(lease)
//			// 1. Claim the row and read the state it inherits: one short
//			//    transaction, committed before any work starts.
//			var status string
//			claim, err := guard.ClaimAndRead(ctx, id, tok, func(ctx context.Context, tx *sql.Tx) error {
//				return tx.QueryRowContext(ctx, `SELECT status FROM invoices WHERE id = $1`, id).Scan(&status)
//			})
//			if err != nil {
//				return err
//			}
//			if !claim.Applied() {
//				return claim.Err() // a newer holder has claimed the row
//			}
//			if status != "due" {
//				return nil // an earlier holder issued it
//			}
//			// 2. The slow work, outside any transaction.
//			pdf, err := render(ctx, id)
//			if err != nil {
//				return err
//			}
//			// 3. The guarded write, a statement of its own: it applies only if
//			//    no newer holder has claimed the row since.
//			res, err := guard.Update(ctx, nil, id, tok, fence.Write{
//				Set: "status = $1, pdf = $2", SetArgs: []any{"issued", pdf},
//				Where: "status = $3", WhereArgs: []any{"due"},
//			})
//			if err != nil {
//				return err
//			}
//			issued = res.Applied()
//			return res.Err() // nil, fenced.ErrStaleFence or fence.ErrPrecondition
//		})
//		return issued, err
//	}
//
// and its setup and outcome handling:
//
//	leases, err := fenced.Open(ctx, dbURL, nil)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer leases.Close()
//	db, err := sql.Open("pgx", dbURL)
//	if err != nil {
//		log.Fatal(err)
//	}
//	guard, err := fence.NewSQL(db, fence.Postgres, fence.Table{
//		Name: "invoices", Key: "id",
//		LeaseKey: func(id any) string { return fmt.Sprint("invoice:", id) },
//	}, &fence.SQLOptions{Hook: leases.Options().Hook}) // Timeout: 5 s, below a third of the TTL
//	if err != nil {
//		log.Fatal(err)
//	}
//	if err := guard.EnsureColumns(ctx); err != nil { // adds fence, fence_owner, fence_key
//		log.Fatal(err)
//	}
//
//	issued, err := issueInvoice(ctx, leases, guard, "inv_72",
//		&fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: time.Minute})
//	switch {
//	case issued && err != nil:
//		log.Printf("issued; the lease was lost afterwards: %v", err) // the write counted
//	case issued:
//		log.Print("issued")
//	case err == nil:
//		log.Print("already issued by an earlier holder")
//	case errors.Is(err, fenced.ErrHeld):
//		log.Print("another worker has it")
//	case errors.Is(err, fenced.ErrStaleFence):
//		log.Printf("a newer holder took over; nothing of ours was written: %v", err)
//	case errors.Is(err, fence.ErrPrecondition):
//		log.Print("issued meanwhile by another holder")
//	case fenced.IsLost(err):
//		log.Printf("lease lost before the write; nothing was written, try again later: %v", err)
//	default:
//		log.Print(err)
//	}
//
// A fence cannot reach a payment provider or a mail server: use package
// intent. docs/guards.md explains each step, and when a lock-free pattern
// does without a lease.
package fence
