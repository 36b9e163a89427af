package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/supervise"
	"github.com/fenced-dev/fenced/sqlite"
)

// The demo is the billing scenario of the design notes, run for real: three
// worker processes compete for invoice:inv_72 on an embedded lease store;
// the winner is frozen with SIGSTOP after its last check of the lease and
// before its write lands; the lease expires, another worker takes over with
// a higher fence and sends the invoice; the frozen worker resumes and its
// late write reaches the resource, which refuses it by its fence.

const (
	demoKey     = "invoice:inv_72"
	demoInvoice = "inv_72"
	demoTTL     = time.Second
)

// demoEvent is one line a demo worker prints on stdout.
type demoEvent struct {
	Worker string `json:"worker"`
	Kind   string `json:"kind"`
	Fence  uint64 `json:"fence,omitempty"`
	Text   string `json:"text"`
}

func newDemoCmd(g *globals) *cobra.Command {
	var noFence, keep bool
	cmd := &cobra.Command{
		Use:   "demo [--no-fence]",
		Short: "Run the billing scenario: a paused worker's late write is refused by its fence",
		Long: `Demo runs the billing scenario for real, in a temporary directory: an embedded
SQLite lease store and a SQLite "invoice_jobs" table guarded by the fence.

Three worker processes compete for invoice:inv_72 (TTL 1s). The winner checks that
its lease is valid and starts sending the invoice; the demo freezes it right then
with SIGSTOP, the way a GC pause or a VM migration would. Its lease expires, a
second worker takes over with a higher fence and sends the invoice, a third finds
it sent. Then the demo resumes the frozen worker, whose write arrives late.

With the fence the resource refuses the late write and exactly one invoice is sent.
With --no-fence the same run writes without the guard and the customer gets two.
The demo checks its invariants from the resource's tables and exits 0 only when
they held: one invoice with the fence (or, with --no-fence, the double send
reproduced).`,
		Example: `  fenced demo
  fenced demo --no-fence`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDemo(cmd.Context(), g, noFence, keep)
		},
	}
	cmd.Flags().BoolVar(&noFence, "no-fence", false, "write without the fence guard, to see the double send")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the temporary directory with the store and the invoice database")
	worker := &cobra.Command{
		Use:    "demo-worker",
		Hidden: true,
		Args:   cobra.ExactArgs(3), // name, lease file, billing file
		RunE: func(cmd *cobra.Command, args []string) error {
			return demoWorker(cmd.Context(), args[0], args[1], args[2], noFence)
		},
	}
	worker.Flags().BoolVar(&noFence, "no-fence", false, "")
	g.extra = append(g.extra, worker)
	return cmd
}

func openBilling(path string) (*sql.DB, error) {
	return sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_txlock=immediate")
}

func billingGuard(db *sql.DB) (*fence.SQL, error) {
	return fence.NewSQL(db, fence.SQLite, fence.Table{Name: "invoice_jobs", Key: "id"}, nil)
}

func setupBilling(ctx context.Context, path string) error {
	db, err := openBilling(path)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, s := range []string{
		`CREATE TABLE invoice_jobs (id TEXT PRIMARY KEY, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL, status TEXT NOT NULL)`,
		`CREATE TABLE sent_invoices (seq INTEGER PRIMARY KEY AUTOINCREMENT, invoice TEXT NOT NULL, worker TEXT NOT NULL, fence INTEGER NOT NULL)`,
		`INSERT INTO invoice_jobs (id, customer, amount_cents, status) VALUES ('inv_72', 'ACME Corp', 129900, 'due')`,
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	guard, err := billingGuard(db)
	if err != nil {
		return err
	}
	return guard.EnsureColumns(ctx)
}

func runDemo(ctx context.Context, g *globals, noFence, keep bool) error {
	dir, err := os.MkdirTemp("", "fenced-demo-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Fprintf(g.stdout, "files kept in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	leases, billing := filepath.Join(dir, "leases.db"), filepath.Join(dir, "billing.db")
	if err := setupBilling(ctx, billing); err != nil {
		return fmt.Errorf("demo: set up invoice_jobs: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	mode := "with the fence guard"
	if noFence {
		mode = "WITHOUT the fence guard (--no-fence)"
	}
	fmt.Fprintf(g.stdout, "fenced demo: 3 workers compete for %s (TTL %v), %s\n", demoKey, demoTTL, mode)
	fmt.Fprintf(g.stdout, "  lease store: sqlite:%s\n  resource:    invoice_jobs in %s\n\n", leases, billing)

	start := time.Now()
	events := make(chan demoEvent, 64)
	workers := map[string]*exec.Cmd{}
	var wg sync.WaitGroup
	exited := make(chan string, 3)
	// Workers die with the demo (Pdeathsig), which needs the forking thread
	// to live as long as they do.
	launcher := supervise.NewLauncher()
	defer launcher.Close()
	for i := 1; i <= 3; i++ {
		name := "worker-" + strconv.Itoa(i)
		args := []string{"demo-worker", name, leases, billing}
		if noFence {
			args = append(args, "--no-fence")
		}
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Stderr = g.stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := launcher.Start(cmd); err != nil {
			return fmt.Errorf("demo: start %s: %w", name, err)
		}
		workers[name] = cmd
		wg.Add(1)
		go func() {
			defer wg.Done()
			readEvents(name, out, events)
			cmd.Wait()
			exited <- name
		}()
	}
	defer func() {
		for _, c := range workers {
			_ = c.Process.Signal(syscall.SIGCONT)
			_ = c.Process.Kill()
		}
	}()

	say := func(who, text string) {
		fmt.Fprintf(g.stdout, "%+8.3fs  %-9s %s\n", time.Since(start).Seconds(), who, text)
	}
	var frozen string
	var frozenFence uint64
	outcome := map[string]string{}
	running := 3
	deadline := time.After(30 * time.Second)
	resumeAt := (<-chan time.Time)(nil)
	for running > 0 {
		select {
		case e := <-events:
			say(e.Worker, e.Text)
			if e.Kind == "sending" && frozen == "" {
				frozen, frozenFence = e.Worker, e.Fence
				if err := workers[frozen].Process.Signal(syscall.SIGSTOP); err != nil {
					return fmt.Errorf("demo: SIGSTOP %s: %w", frozen, err)
				}
				say("demo", fmt.Sprintf("SIGSTOP %s: frozen after checking its lease, before its write lands", frozen))
			}
			if e.Kind == "outcome" {
				outcome[e.Worker] = e.Text
			}
		case name := <-exited:
			running--
			if running == 1 && frozen != "" && name != frozen {
				// Both other workers are done: wake the frozen one.
				resumeAt = time.After(100 * time.Millisecond)
			}
		case <-resumeAt:
			resumeAt = nil
			say("demo", fmt.Sprintf("SIGCONT %s: it resumes, unaware that its lease expired, and its write goes out", frozen))
			if err := workers[frozen].Process.Signal(syscall.SIGCONT); err != nil {
				return err
			}
		case <-deadline:
			return errors.New("demo: workers did not finish within 30s")
		}
	}
	wg.Wait()
	for len(events) > 0 {
		e := <-events
		say(e.Worker, e.Text)
	}
	return checkDemo(ctx, g, billing, noFence, frozen, frozenFence)
}

func readEvents(name string, r io.Reader, events chan<- demoEvent) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e demoEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			e = demoEvent{Worker: name, Kind: "log", Text: sc.Text()}
		}
		events <- e
	}
}

// checkDemo reads the resource and checks the invariants.
func checkDemo(ctx context.Context, g *globals, billing string, noFence bool, frozen string, frozenFence uint64) error {
	db, err := openBilling(billing)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT worker, fence FROM sent_invoices WHERE invoice = ? ORDER BY seq`, demoInvoice)
	if err != nil {
		return err
	}
	defer rows.Close()
	type send struct {
		worker string
		fence  uint64
	}
	var sends []send
	for rows.Next() {
		var s send
		if err := rows.Scan(&s.worker, &s.fence); err != nil {
			return err
		}
		sends = append(sends, s)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "\ninvoices sent for %s: %d\n", demoInvoice, len(sends))
	for _, s := range sends {
		fmt.Fprintf(g.stdout, "  by %s with fence %d\n", s.worker, s.fence)
	}
	if frozen == "" {
		return errors.New("demo: no worker reached the send step; nothing was demonstrated")
	}
	frozenSent := false
	for _, s := range sends {
		if s.worker == frozen {
			frozenSent = true
		}
	}
	if noFence {
		if len(sends) == 2 && frozenSent {
			fmt.Fprintf(g.stdout, "HAZARD REPRODUCED: %s's late write (fence %d) was accepted and the customer got two invoices.\nRun without --no-fence to see the fence refuse it.\n", frozen, frozenFence)
			return nil
		}
		return fmt.Errorf("demo: expected the unguarded run to send two invoices, got %d", len(sends))
	}
	if len(sends) != 1 {
		return fmt.Errorf("demo: INVARIANT BROKEN: %d invoices sent, want exactly 1", len(sends))
	}
	if frozenSent || sends[0].fence <= frozenFence {
		return fmt.Errorf("demo: INVARIANT BROKEN: the invoice was sent by %s with fence %d, not by a newer holder", sends[0].worker, sends[0].fence)
	}
	fmt.Fprintf(g.stdout, "OK: exactly one invoice sent, by %s (fence %d); %s's late write with fence %d was refused.\n", sends[0].worker, sends[0].fence, frozen, frozenFence)
	return nil
}

// demoWorker is one worker process: it competes for the invoice lease and
// sends the invoice if it is still due.
func demoWorker(ctx context.Context, name, leases, billing string, noFence bool) error {
	enc := json.NewEncoder(os.Stdout)
	emit := func(kind string, f uint64, format string, a ...any) {
		_ = enc.Encode(demoEvent{Worker: name, Kind: kind, Fence: f, Text: fmt.Sprintf(format, a...)})
	}
	drv, err := sqlite.OpenFile(ctx, leases, nil)
	if err != nil {
		return err
	}
	client := fenced.NewClient(drv, &fenced.Options{MaxBackoff: 150 * time.Millisecond})
	defer client.Close()
	db, err := openBilling(billing)
	if err != nil {
		return err
	}
	defer db.Close()
	guard, err := billingGuard(db)
	if err != nil {
		return err
	}

	emit("wait", 0, "wants %s", demoKey)
	// The work (about 0.6s) fits in the TTL, so the worker does not renew.
	// That also keeps the freeze away from a write in flight: a process
	// stopped inside an SQLite write holds the file's write lock and would
	// stall the other workers until it is continued.
	lease, err := client.Acquire(ctx, demoKey, &fenced.LeaseOptions{TTL: demoTTL, MaxWait: 20 * time.Second, AutoRenew: fenced.Off})
	if err != nil {
		emit("outcome", 0, "gave up: %v", err)
		return nil
	}
	f := lease.Fence()
	tok := fence.From(lease)
	emit("acquired", f, "acquired %s with fence %d", demoKey, f)
	defer lease.Release(context.WithoutCancel(ctx))

	// Read the job. With the fence, claim the row first in the same short
	// transaction (committed before the work), so that a stale holder is
	// refused even before our first real write.
	readStatus := func(ctx context.Context, q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) (status string, err error) {
		err = q.QueryRowContext(ctx, `SELECT status FROM invoice_jobs WHERE id = ?`, demoInvoice).Scan(&status)
		return status, err
	}
	var status string
	if noFence {
		status, err = readStatus(ctx, db)
	} else {
		var res fence.Result
		res, err = guard.ClaimAndRead(ctx, demoInvoice, tok, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			status, err = readStatus(ctx, tx)
			return err
		})
		if err == nil && res.Outcome == fence.Stale {
			err = fmt.Errorf("claim refused: the row already carries fence %d", res.Current)
		}
	}
	if err != nil {
		emit("outcome", f, "error: %v", err)
		return err
	}
	if status != "due" {
		emit("outcome", f, "invoice is already %s: nothing to do", status)
		return nil
	}
	emit("render", f, "invoice is due; rendering it (300ms)")
	time.Sleep(300 * time.Millisecond)
	if err := lease.Err(); err != nil {
		emit("outcome", f, "lease ended before sending (%v): not sending", err)
		return nil
	}
	emit("sending", f, "lease still valid (%v left): sending the invoice", lease.Remaining().Round(time.Millisecond))
	// The request is on its way; a pause here cannot be seen by any check
	// the worker makes.
	time.Sleep(250 * time.Millisecond)

	tx, err := db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if noFence {
		if _, err := tx.ExecContext(ctx, `UPDATE invoice_jobs SET status = 'sent' WHERE id = ?`, demoInvoice); err != nil {
			return err
		}
	} else {
		res, err := guard.Update(ctx, tx, demoInvoice, tok, fence.Write{Set: "status = ?", SetArgs: []any{"sent"}, Where: "status = ?", WhereArgs: []any{"due"}})
		if err != nil {
			return err
		}
		switch res.Outcome {
		case fence.Stale:
			emit("outcome", f, "write REFUSED by the resource: stale fence %d, the row carries %d", f, res.Current)
			return nil
		case fence.PreconditionFailed:
			emit("outcome", f, "invoice no longer due: nothing sent")
			return nil
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO sent_invoices (invoice, worker, fence) VALUES (?, ?, ?)`, demoInvoice, name, int64(f)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	emit("outcome", f, "invoice SENT with fence %d", f)
	return nil
}
