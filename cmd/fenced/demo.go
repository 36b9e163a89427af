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
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/supervise"
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
reproduced).

The demo always runs on its own temporary store: --store is refused (exit 64),
and FENCED_STORE is not used. To run faults against your store, see fenced proof.`,
		Example: `  fenced demo
  fenced demo --no-fence`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.storeFlag != nil && g.storeFlag() {
				return withCode(exitUsage, fmt.Errorf("demo: --store %s: the demo runs on a temporary SQLite store of its own (it freezes and kills its workers and leaves nothing behind); to run faults against your store, use fenced proof", driver.Redact(g.store)))
			}
			if os.Getenv("FENCED_STORE") != "" && !g.quiet {
				fmt.Fprintln(g.stderr, "fenced: demo: FENCED_STORE is not used; the demo runs on a temporary store of its own")
			}
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

// scenarioEvent is one step of the billing scenario, printed by fenced demo
// and drawn by the dashboard's timeline.
type scenarioEvent struct {
	// At is the time since the scenario started.
	At time.Duration
	// Worker is worker-N, or "demo" for the freeze and the resume.
	Worker string
	// Kind is wait, acquired, render, sending, freeze, resume, or an
	// outcome: sent, refused, nothing, not_sending, gave_up, error, log.
	Kind  string
	Fence uint64
	Text  string
}

// scenarioSend is an invoice the resource recorded as sent.
type scenarioSend struct {
	Worker string
	Fence  uint64
}

// scenarioOutcome is what the resource holds after the scenario.
type scenarioOutcome struct {
	Sends       []scenarioSend
	Frozen      string
	FrozenFence uint64
	// Verdict says what happened, in one line; Err is set when an
	// invariant broke (or, without the fence, the hazard did not show).
	Verdict string
	Err     error
}

func runDemo(ctx context.Context, g *globals, noFence, keep bool) error {
	mode := "with the fence guard"
	if noFence {
		mode = "WITHOUT the fence guard (--no-fence)"
	}
	fmt.Fprintf(g.stdout, "fenced demo: 3 workers compete for %s (TTL %v), %s\n", demoKey, demoTTL, mode)
	out, err := runScenario(ctx, noFence, keep, func(dir string) {
		if keep {
			fmt.Fprintf(g.stdout, "files kept in %s\n", dir)
		}
		fmt.Fprintf(g.stdout, "  lease store: sqlite:%s\n  resource:    invoice_jobs in %s\n\n", filepath.Join(dir, "leases.db"), filepath.Join(dir, "billing.db"))
	}, func(e scenarioEvent) {
		fmt.Fprintf(g.stdout, "%+8.3fs  %-9s %s\n", e.At.Seconds(), e.Worker, e.Text)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "\ninvoices sent for %s: %d\n", demoInvoice, len(out.Sends))
	for _, s := range out.Sends {
		fmt.Fprintf(g.stdout, "  by %s with fence %d\n", s.Worker, s.Fence)
	}
	if out.Err != nil {
		return out.Err
	}
	fmt.Fprintln(g.stdout, out.Verdict)
	return nil
}

// runScenario runs the billing scenario in a new temporary directory
// (removed afterwards unless keep), telling where first and then every
// event as it happens, and judges the outcome from the resource's tables.
// err reports a scenario that could not run; outcome.Err one that ran
// and broke its invariants.
func runScenario(ctx context.Context, noFence, keep bool, where func(dir string), emit func(scenarioEvent)) (scenarioOutcome, error) {
	dir, err := os.MkdirTemp("", "fenced-demo-")
	if err != nil {
		return scenarioOutcome{}, err
	}
	if !keep {
		defer os.RemoveAll(dir)
	}
	where(dir)
	leases, billing := filepath.Join(dir, "leases.db"), filepath.Join(dir, "billing.db")
	if err := setupBilling(ctx, billing); err != nil {
		return scenarioOutcome{}, fmt.Errorf("demo: set up invoice_jobs: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return scenarioOutcome{}, err
	}

	start := time.Now()
	events := make(chan scenarioEvent, 64)
	workers := map[string]*exec.Cmd{}
	var wg sync.WaitGroup
	exited := make(chan string, 3)
	// Workers die with the demo (Pdeathsig), which needs the forking thread
	// to live as long as they do.
	launcher := supervise.NewLauncher()
	defer launcher.Close()
	defer func() {
		for _, c := range workers {
			_ = c.Process.Signal(syscall.SIGCONT)
			_ = c.Process.Kill()
		}
	}()
	for i := 1; i <= 3; i++ {
		name := "worker-" + strconv.Itoa(i)
		args := []string{"demo-worker", name, leases, billing}
		if noFence {
			args = append(args, "--no-fence")
		}
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return scenarioOutcome{}, err
		}
		if err := launcher.Start(cmd); err != nil {
			return scenarioOutcome{}, fmt.Errorf("demo: start %s: %w", name, err)
		}
		workers[name] = cmd
		wg.Add(1)
		go func() {
			defer wg.Done()
			readEvents(name, out, events, start)
			cmd.Wait()
			exited <- name
		}()
	}

	say := func(who, kind string, fence uint64, text string) {
		emit(scenarioEvent{At: time.Since(start), Worker: who, Kind: kind, Fence: fence, Text: text})
	}
	var frozen string
	var frozenFence uint64
	running := 3
	deadline := time.After(30 * time.Second)
	resumeAt := (<-chan time.Time)(nil)
	for running > 0 {
		select {
		case e := <-events:
			emit(e)
			if e.Kind == "sending" && frozen == "" {
				frozen, frozenFence = e.Worker, e.Fence
				if err := workers[frozen].Process.Signal(syscall.SIGSTOP); err != nil {
					return scenarioOutcome{}, fmt.Errorf("demo: SIGSTOP %s: %w", frozen, err)
				}
				say("demo", "freeze", frozenFence, fmt.Sprintf("SIGSTOP %s: frozen after checking its lease, before its write lands", frozen))
			}
		case name := <-exited:
			running--
			if running == 1 && frozen != "" && name != frozen {
				// Both other workers are done: wake the frozen one.
				resumeAt = time.After(100 * time.Millisecond)
			}
		case <-resumeAt:
			resumeAt = nil
			say("demo", "resume", frozenFence, fmt.Sprintf("SIGCONT %s: it resumes, unaware that its lease expired, and its write goes out", frozen))
			if err := workers[frozen].Process.Signal(syscall.SIGCONT); err != nil {
				return scenarioOutcome{}, err
			}
		case <-deadline:
			return scenarioOutcome{}, errors.New("demo: workers did not finish within 30s")
		case <-ctx.Done():
			return scenarioOutcome{}, context.Cause(ctx)
		}
	}
	wg.Wait()
	for len(events) > 0 {
		emit(<-events)
	}
	return judgeScenario(ctx, billing, noFence, frozen, frozenFence)
}

func readEvents(name string, r io.Reader, events chan<- scenarioEvent, start time.Time) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var e demoEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			e = demoEvent{Worker: name, Kind: "log", Text: sc.Text()}
		}
		events <- scenarioEvent{At: time.Since(start), Worker: e.Worker, Kind: e.Kind, Fence: e.Fence, Text: e.Text}
	}
}

// judgeScenario reads the resource and checks the invariants.
func judgeScenario(ctx context.Context, billing string, noFence bool, frozen string, frozenFence uint64) (scenarioOutcome, error) {
	out := scenarioOutcome{Frozen: frozen, FrozenFence: frozenFence}
	db, err := openBilling(billing)
	if err != nil {
		return out, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT worker, fence FROM sent_invoices WHERE invoice = ? ORDER BY seq`, demoInvoice)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var s scenarioSend
		if err := rows.Scan(&s.Worker, &s.Fence); err != nil {
			return out, err
		}
		out.Sends = append(out.Sends, s)
	}
	if err := rows.Err(); err != nil {
		return out, err
	}
	if frozen == "" {
		out.Err = errors.New("demo: no worker reached the send step; nothing was demonstrated")
		return out, nil
	}
	frozenSent := false
	for _, s := range out.Sends {
		if s.Worker == frozen {
			frozenSent = true
		}
	}
	switch {
	case noFence && len(out.Sends) == 2 && frozenSent:
		out.Verdict = fmt.Sprintf("HAZARD REPRODUCED: %s's late write (fence %d) was accepted and the customer got two invoices.\nRun without --no-fence to see the fence refuse it.", frozen, frozenFence)
	case noFence:
		out.Err = fmt.Errorf("demo: expected the unguarded run to send two invoices, got %d", len(out.Sends))
	case len(out.Sends) != 1:
		out.Err = fmt.Errorf("demo: INVARIANT BROKEN: %d invoices sent, want exactly 1", len(out.Sends))
	case frozenSent || out.Sends[0].Fence <= frozenFence:
		out.Err = fmt.Errorf("demo: INVARIANT BROKEN: the invoice was sent by %s with fence %d, not by a newer holder", out.Sends[0].Worker, out.Sends[0].Fence)
	default:
		out.Verdict = fmt.Sprintf("OK: exactly one invoice sent, by %s (fence %d); %s's late write with fence %d was refused.", out.Sends[0].Worker, out.Sends[0].Fence, frozen, frozenFence)
	}
	return out, nil
}

// demoWorker is one worker process: it competes for the invoice lease and
// sends the invoice if it is still due.
func demoWorker(ctx context.Context, name, leases, billing string, noFence bool) error {
	enc := json.NewEncoder(os.Stdout)
	emit := func(kind string, f uint64, format string, a ...any) {
		_ = enc.Encode(demoEvent{Worker: name, Kind: kind, Fence: f, Text: fmt.Sprintf(format, a...)})
	}
	drv, err := fencedsqlite.OpenFile(ctx, leases, nil)
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
	lease, err := client.Acquire(ctx, demoKey, &fenced.LeaseOptions{TTL: demoTTL, MaxWait: 20 * time.Second, ManualRenew: true})
	if err != nil {
		emit("gave_up", 0, "gave up: %v", err)
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
		emit("error", f, "error: %v", err)
		return err
	}
	if status != "due" {
		emit("nothing", f, "invoice is already %s: nothing to do", status)
		return nil
	}
	emit("render", f, "invoice is due; rendering it (300ms)")
	time.Sleep(300 * time.Millisecond)
	if err := lease.Err(); err != nil {
		emit("not_sending", f, "lease ended before sending (%v): not sending", err)
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
			emit("refused", f, "write REFUSED by the resource: stale fence %d, the row carries %d", f, res.Current)
			return nil
		case fence.PreconditionFailed:
			emit("nothing", f, "invoice no longer due: nothing sent")
			return nil
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO sent_invoices (invoice, worker, fence) VALUES (?, ?, ?)`, demoInvoice, name, int64(f)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	emit("sent", f, "invoice SENT with fence %d", f)
	return nil
}
