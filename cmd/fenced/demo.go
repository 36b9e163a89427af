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
	"github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
	"github.com/fenced-dev/fenced/internal/pdeath"
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
	// demoTries is how many times the demo runs at most, its TTL doubled
	// each time no worker (or none after the frozen one) reached the send
	// step before its lease ran out (a machine too busy for the TTL: ci13
	// took 970 ms for one read).
	demoTries = 3
)

// errNothingDemonstrated says that no worker reached the send step, or
// none after the frozen one.
var errNothingDemonstrated = errors.New("demo: no worker, or none after the frozen one, reached the send step; nothing was demonstrated")

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
reproduced). On a machine too busy for a 1s TTL (every lease ran out before its
worker reached the send step) it says so and runs again with the TTL doubled, up
to 3 runs in all.

The demo always runs on its own temporary store: --store is refused (exit 64),
and FENCED_STORE is not used. To run faults against your store, see fenced proof.`,
		Example: `  fenced demo
  fenced demo --no-fence`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.storeFlag != nil && g.storeFlag() {
				return withCode(exitUsage,
					fmt.Errorf("demo: --store %s: the demo runs on a temporary SQLite store of its own; "+
						"for faults against your store, use fenced proof", storeurl.Redact(g.store)))
			}
			if os.Getenv("FENCED_STORE") != "" && !g.quiet {
				fmt.Fprintln(g.stderr, "fenced: demo: FENCED_STORE is not used; the demo runs on a temporary store of its own")
			}
			return runDemo(cmd.Context(), g, noFence, keep)
		},
	}
	cmd.Flags().BoolVar(&noFence, "no-fence", false, "write without the fence guard, to see the double send")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the temporary directory with the store and the invoice database")
	var workerTTL time.Duration
	worker := &cobra.Command{
		Use:    "demo-worker",
		Hidden: true,
		Args:   cobra.ExactArgs(3), // name, lease file, billing file
		RunE: func(cmd *cobra.Command, args []string) error {
			return demoWorker(cmd.Context(), args[0], args[1], args[2], workerTTL, noFence)
		},
	}
	worker.Flags().BoolVar(&noFence, "no-fence", false, "")
	worker.Flags().DurationVar(&workerTTL, "ttl", demoTTL, "")
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
		`CREATE TABLE sent_invoices (seq INTEGER PRIMARY KEY AUTOINCREMENT, invoice TEXT NOT NULL, worker TEXT NOT NULL, ` +
			`fence INTEGER NOT NULL)`,
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
	return untilDemonstrated(func(ttl time.Duration) error {
		fmt.Fprintf(g.stdout, "fenced demo: 3 workers compete for %s (TTL %v), %s\n", demoKey, ttl, mode)
		return runDemoOnce(ctx, g, ttl, noFence, keep)
	}, func(ttl time.Duration) {
		fmt.Fprintf(g.stdout, "\nthis machine was too busy for a TTL of %v: the leases ran out before their workers "+
			"reached the send step, and no holder after the frozen one sent. Again with %v.\n\n", ttl, 2*ttl)
	})
}

// untilDemonstrated runs once at demoTTL, and again with the TTL doubled
// while a run demonstrated nothing (the machine too busy for the TTL),
// demoTries runs at most; busy is told before each new run. It returns
// the last run's error.
func untilDemonstrated(once func(ttl time.Duration) error, busy func(ttl time.Duration)) error {
	ttl := demoTTL
	for try := 1; ; try++ {
		err := once(ttl)
		if !errors.Is(err, errNothingDemonstrated) || try == demoTries {
			return err
		}
		busy(ttl)
		ttl *= 2
	}
}

// runDemoOnce runs and prints the billing scenario once, at ttl.
func runDemoOnce(ctx context.Context, g *globals, ttl time.Duration, noFence, keep bool) error {
	out, err := runScenario(ctx, ttl, noFence, keep, func(dir string) {
		if keep {
			fmt.Fprintf(g.stdout, "files kept in %s\n", dir)
		}
		fmt.Fprintf(g.stdout, "  lease store: sqlite:%s\n  resource:    invoice_jobs in %s\n\n", filepath.Join(dir, "leases.db"),
			filepath.Join(dir, "billing.db"))
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
func runScenario(ctx context.Context, ttl time.Duration, noFence, keep bool, where func(dir string),
	emit func(scenarioEvent)) (scenarioOutcome, error) {
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

	s := &demoScenario{
		start:   time.Now(),
		emit:    emit,
		events:  make(chan scenarioEvent, 64),
		workers: map[string]*exec.Cmd{},
		exited:  make(chan string, 3),
	}
	// Workers die with the demo (Pdeathsig), which needs the forking thread
	// to live as long as they do.
	launcher := pdeath.NewLauncher()
	defer launcher.Close()
	defer s.killWorkers()
	if err := s.startWorkers(ctx, launcher, self, leases, billing, ttl, noFence); err != nil {
		return scenarioOutcome{}, err
	}
	if err := s.drive(ctx); err != nil {
		return scenarioOutcome{}, err
	}
	s.wg.Wait()
	for len(s.events) > 0 {
		emit(<-s.events)
	}
	return judgeScenario(ctx, billing, noFence, s.frozen, s.frozenFence)
}

// demoScenario is one run of the billing scenario: three worker processes,
// the first to send frozen (SIGSTOP) until the others are done.
type demoScenario struct {
	start       time.Time
	emit        func(scenarioEvent)
	events      chan scenarioEvent
	workers     map[string]*exec.Cmd
	exited      chan string // the names of the workers that exited
	wg          sync.WaitGroup
	frozen      string // the frozen worker's name ("": none yet)
	frozenFence uint64
}

// startWorkers starts the three workers through launcher, each reading
// its events into s.events.
func (s *demoScenario) startWorkers(ctx context.Context, launcher *pdeath.Launcher, self, leases, billing string,
	ttl time.Duration, noFence bool) error {
	for i := 1; i <= 3; i++ {
		name := "worker-" + strconv.Itoa(i)
		args := []string{"demo-worker", name, leases, billing, "--ttl", ttl.String()}
		if noFence {
			args = append(args, "--no-fence")
		}
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := launcher.Start(cmd); err != nil {
			return fmt.Errorf("demo: start %s: %w", name, err)
		}
		s.workers[name] = cmd
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			readEvents(name, out, s.events, s.start)
			cmd.Wait()
			s.exited <- name
		}()
	}
	return nil
}

// killWorkers kills every worker started, stopped or not.
func (s *demoScenario) killWorkers() {
	for _, c := range s.workers {
		_ = c.Process.Signal(syscall.SIGCONT)
		_ = c.Process.Kill()
	}
}

// say emits an event of the demo itself.
func (s *demoScenario) say(who, kind string, fence uint64, text string) {
	s.emit(scenarioEvent{At: time.Since(s.start), Worker: who, Kind: kind, Fence: fence, Text: text})
}

// drive passes the workers' events on until all have exited. It freezes
// the first worker about to send, and resumes it once the others are done.
func (s *demoScenario) drive(ctx context.Context) error {
	running := 3
	deadline := time.After(30 * time.Second)
	resumeAt := (<-chan time.Time)(nil)
	for running > 0 {
		select {
		case e := <-s.events:
			s.emit(e)
			if e.Kind == "sending" && s.frozen == "" {
				s.frozen, s.frozenFence = e.Worker, e.Fence
				if err := s.workers[s.frozen].Process.Signal(syscall.SIGSTOP); err != nil {
					return fmt.Errorf("demo: SIGSTOP %s: %w", s.frozen, err)
				}
				s.say("demo", "freeze", s.frozenFence,
					fmt.Sprintf("SIGSTOP %s: frozen after checking its lease, before its write lands", s.frozen))
			}
		case name := <-s.exited:
			running--
			if running == 1 && s.frozen != "" && name != s.frozen {
				// Both other workers are done: wake the frozen one.
				resumeAt = time.After(100 * time.Millisecond)
			}
		case <-resumeAt:
			resumeAt = nil
			s.say("demo", "resume", s.frozenFence,
				fmt.Sprintf("SIGCONT %s: it resumes, unaware that its lease expired, and its write goes out", s.frozen))
			if err := s.workers[s.frozen].Process.Signal(syscall.SIGCONT); err != nil {
				return err
			}
		case <-deadline:
			return errors.New("demo: workers did not finish within 30s")
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return nil
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
		out.Err = errNothingDemonstrated
		return out, nil
	}
	frozenSent, newerSent := false, false
	for _, s := range out.Sends {
		frozenSent = frozenSent || s.Worker == frozen
		newerSent = newerSent || s.Fence > frozenFence
	}
	switch {
	case !newerSent:
		// No holder after the frozen one sent (on a machine too busy for
		// the TTL, their leases ran out first): whatever the frozen
		// worker's write met, no newer write was there to protect.
		out.Err = errNothingDemonstrated
	case noFence && len(out.Sends) == 2 && frozenSent:
		out.Verdict = fmt.Sprintf("HAZARD REPRODUCED: %s's late write (fence %d) was accepted and the customer got two invoices.\n"+
			"Run without --no-fence to see the fence refuse it.", frozen, frozenFence)
	case noFence:
		out.Err = fmt.Errorf("demo: expected the unguarded run to send two invoices, got %d", len(out.Sends))
	case len(out.Sends) != 1:
		out.Err = fmt.Errorf("demo: INVARIANT BROKEN: %d invoices sent, want exactly 1", len(out.Sends))
	case frozenSent || out.Sends[0].Fence <= frozenFence:
		out.Err = fmt.Errorf("demo: INVARIANT BROKEN: the invoice was sent by %s with fence %d, not by a newer holder", out.Sends[0].Worker,
			out.Sends[0].Fence)
	default:
		out.Verdict = fmt.Sprintf("OK: exactly one invoice sent, by %s (fence %d); %s's late write with fence %d was refused.",
			out.Sends[0].Worker, out.Sends[0].Fence, frozen, frozenFence)
	}
	return out, nil
}

// demoWorker is one worker process: it competes for the invoice lease and
// sends the invoice if it is still due.
func demoWorker(ctx context.Context, name, leases, billing string, ttl time.Duration, noFence bool) error {
	w := &demoWork{name: name, noFence: noFence, enc: json.NewEncoder(os.Stdout)}
	drv, err := fencedsqlite.OpenFile(ctx, leases, nil)
	if err != nil {
		return err
	}
	client := fenced.NewClient(drv, &fenced.Options{MaxBackoff: 150 * time.Millisecond})
	defer client.Close()
	if w.db, err = openBilling(billing); err != nil {
		return err
	}
	defer w.db.Close()
	if w.guard, err = billingGuard(w.db); err != nil {
		return err
	}

	w.emit("wait", 0, "wants %s", demoKey)
	// The work (about 0.6s) fits in the TTL, so the worker does not renew.
	// That also keeps the freeze away from a write in flight: a process
	// stopped inside an SQLite write holds the file's write lock and would
	// stall the other workers until it is continued.
	lease, err := client.Acquire(ctx, demoKey, &fenced.LeaseOptions{TTL: ttl, MaxWait: 20 * time.Second, ManualRenew: true})
	if err != nil {
		w.emit("gave_up", 0, "gave up: %v", err)
		return nil
	}
	w.leaseFence, w.tok = lease.Fence(), fence.From(lease)
	f := w.leaseFence
	w.emit("acquired", f, "acquired %s with fence %d", demoKey, f)
	defer lease.Release(context.WithoutCancel(ctx))

	status, err := w.readJob(ctx)
	if err != nil {
		w.emit("error", f, "error: %v", err)
		return err
	}
	if status != "due" {
		w.emit("nothing", f, "invoice is already %s: nothing to do", status)
		return nil
	}
	w.emit("render", f, "invoice is due; rendering it (300ms)")
	time.Sleep(300 * time.Millisecond)
	if err := lease.Err(); err != nil {
		w.emit("not_sending", f, "lease ended before sending (%v): not sending", err)
		return nil
	}
	w.emit("sending", f, "lease still valid (%v left): sending the invoice", lease.Remaining().Round(time.Millisecond))
	// The request is on its way; a pause here cannot be seen by any check
	// the worker makes.
	time.Sleep(250 * time.Millisecond)
	return w.send(ctx)
}

// demoWork is one demo worker's go at the invoice job.
type demoWork struct {
	name       string
	noFence    bool
	enc        *json.Encoder
	db         *sql.DB
	guard      *fence.SQL
	leaseFence uint64      // the lease's fence, once acquired
	tok        fence.Token // the lease's token, once acquired
}

// emit prints one event of the worker, as JSON, for fenced demo.
func (w *demoWork) emit(kind string, f uint64, format string, a ...any) {
	_ = w.enc.Encode(demoEvent{Worker: w.name, Kind: kind, Fence: f, Text: fmt.Sprintf(format, a...)})
}

// readStatus reads the job's status through q, a database or a transaction.
func readStatus(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (status string, err error) {
	err = q.QueryRowContext(ctx, `SELECT status FROM invoice_jobs WHERE id = ?`, demoInvoice).Scan(&status)
	return status, err
}

// readJob reads the job's status. With the fence, it claims the row first
// in the same short transaction (committed before the work), so that a
// stale holder is refused even before our first real write.
func (w *demoWork) readJob(ctx context.Context) (string, error) {
	if w.noFence {
		return readStatus(ctx, w.db)
	}
	var status string
	res, err := w.guard.ClaimAndRead(ctx, demoInvoice, w.tok, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		status, err = readStatus(ctx, tx)
		return err
	})
	if err == nil && res.Outcome == fence.Stale {
		err = fmt.Errorf("claim refused: the row already carries fence %d", res.Current)
	}
	return status, err
}

// send marks the job sent and records the invoice, in one transaction.
// With the fence, the resource refuses it from a stale holder.
func (w *demoWork) send(ctx context.Context) error {
	f := w.leaseFence
	tx, err := w.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if w.noFence {
		if _, err := tx.ExecContext(ctx, `UPDATE invoice_jobs SET status = 'sent' WHERE id = ?`, demoInvoice); err != nil {
			return err
		}
	} else {
		res, err := w.guard.Update(ctx, tx, demoInvoice, w.tok,
			fence.Write{Set: "status = ?", SetArgs: []any{"sent"}, Where: "status = ?", WhereArgs: []any{"due"}})
		if err != nil {
			return err
		}
		switch res.Outcome {
		case fence.Stale:
			w.emit("refused", f, "write REFUSED by the resource: stale fence %d, the row carries %d", f, res.Current)
			return nil
		case fence.PreconditionFailed:
			w.emit("nothing", f, "invoice no longer due: nothing sent")
			return nil
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO sent_invoices (invoice, worker, fence) VALUES (?, ?, ?)`, demoInvoice, w.name,
		int64(f)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	w.emit("sent", f, "invoice SENT with fence %d", f)
	return nil
}
