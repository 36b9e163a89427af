package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/cli/supervise"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
	"github.com/fenced-dev/fenced/recipe"
)

type runFlags struct {
	ttl, wait, grace time.Duration
	maxHold, minHold time.Duration
	minFence         string
	permits          int
}

func newRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:     "run [flags] KEY [KEY...] [--] COMMAND [ARGS...]",
		Short:   "Run COMMAND while holding a lease on KEY (or on several keys, or one of N permits); stop it if a lease is lost",
		Long:    runLong,
		Example: runExample,
		Args:    cobra.ArbitraryArgs, // parsed by splitRunArgs: after KEY everything is COMMAND
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, argv, err := splitRunArgs(cmd, args)
			if err != nil || keys == nil && argv == nil {
				return err
			}
			return runUnderLease(cmd.Context(), g, f, keys, argv)
		},
	}
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		c.Long = strings.TrimSuffix(c.Long, supervisionHelp(false)) + supervisionHelp(true)
		c.Root().HelpFunc()(c, args)
	})
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", 30*time.Second, "lease time to live, positive; renewed every third of it")
	fl.DurationVar(&f.wait, "wait", 0, "how long to wait for a held KEY, and for a busy store first (0: exit 75 at once if held)")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "after SIGTERM on lease loss, how long before SIGKILL")
	fl.DurationVar(&f.maxHold, "max-hold", 0, "stop renewing after this long; the lease then expires (0: no cap)")
	fl.DurationVar(&f.minHold, "min-hold", 0,
		"keep the lease after COMMAND ends until this long after the grant (cron: skip a late duplicate)")
	fl.IntVarP(&f.permits, "permits", "n", 0,
		"semaphore: up to N holders of KEY at once, each with a lease on one permit (0: a plain lease)")
	fl.StringVar(&f.minFence, "min-fence", "strict",
		"weakest fence the lease accepts: strict; repeatable (can repeat after a failover: single-node Redis); "+
			"none (no fence: Redlock without a fence source, or work whose duplicates only waste effort; "+
			"the resource must then be protected otherwise)")
	fl.SetInterspersed(false) // after KEY, everything is COMMAND (see splitRunArgs)
	return cmd
}

// runLong is the long help of fenced run: the modes, the environment,
// supervision and the exit codes.
const runLong = `Run acquires a lease on KEY, runs COMMAND while renewing the lease, and releases
it when COMMAND and every process it started have ended. Everything after KEY is
COMMAND and its arguments; flags go before KEY, or between KEY and a "--". When
COMMAND's own arguments contain a lone "--", write one after KEY too:
fenced run KEY -- COMMAND ARGS... (otherwise the words before it are taken as keys).

Several keys: fenced run KEY1 KEY2 ... -- COMMAND (the "--" is required) takes a
lease on every key, all or nothing, in one canonical (sorted) order whatever order
they are given in, so two runs that need overlapping keys never deadlock; --wait
bounds the whole acquisition, and the keys taken are released if one cannot be.
Losing any one lease stops COMMAND.

Semaphore: fenced run -n N NAME -- COMMAND lets up to N COMMANDs run at once (as
consul lock -n). Each holds a lease of its own on one permit, the key NAME#SLOT for
a SLOT in 0..N-1, with its own fence; a holder that dies frees its permit when its
lease's TTL runs out. Every run on NAME must use the same N.

Cron: --min-hold D keeps the lease after COMMAND ends until D has passed since it
was granted (ShedLock's lockAtLeastFor), so the same job started a little later on
another host (its cron fired late, or its clock is behind) finds KEY held and exits
75 instead of running again. Treat 75 as success in the cron wrapper.

COMMAND's environment:
  FENCED_KEY    KEY
  FENCED_FENCE  the lease's fencing token: send it with every write, so the resource
                refuses writes from a holder that lost the lease while paused
  FENCED_OWNER  the owner digest that fence.From sends with the fence (never the
                secret owner token); resources use it to refuse an equal fence from
                another grant
  FENCED_STORE  the store URL with any password redacted: the lease is fenced's,
                COMMAND needs no credentials of the store
  FENCED_SLOT   with -n: the permit's slot (FENCED_KEY is then NAME#SLOT)
  FENCED_FENCES with several keys: a JSON object from each key to its fence (and
  FENCED_OWNERS FENCED_OWNERS from each key to its owner digest); FENCED_KEY,
                FENCED_FENCE and FENCED_OWNER are then not set

The default store (sqlite:) is a file in the invoking user's state directory,
$XDG_STATE_HOME/fenced/fenced.db or ~/.local/state/fenced/fenced.db: runs by
another user, or with another HOME or XDG_STATE_HOME (cron, sudo, systemd), use
another file and never exclude each other. Share a --store (or FENCED_STORE) to
exclude across users and hosts. -v prints the store actually used.

COMMAND runs in a process group of its own, and fenced owns all of it: fenced is a
child subreaper, so processes that leave the group or lose their parent stay
fenced's, and the lease is released only when no process COMMAND started is left.
Where the system allows it (cgroup v2, and permission to make a child of fenced's
own cgroup), COMMAND also runs in a cgroup of its own: it is killed, frozen and
counted as one, so no setsid, double fork or exited main thread leaves it, even
when fenced is killed with kill -9. Otherwise fenced walks /proc for COMMAND's
processes (the "process tree" mode): then a process that left the group survives
a kill -9 of fenced. -v and the end of this help say which mode is in effect
(FENCED_SUPERVISE_MODE=proctree forces the process tree; it is meant for tests).
  - Signals sent to fenced (INT, TERM, HUP, QUIT, USR1, USR2) go to the group.
  - If the lease is lost (renewal refused, broken by an admin, or not confirmed
    before local validity ran out), every process gets SIGTERM, then SIGKILL after
    --grace, whether or not COMMAND itself has exited; fenced exits 77 when none
    is left. A lease whose renewal is not confirmed does not wait for the loss:
    its processes get SIGTERM, and SIGKILL --grace later but at the latest a
    quarter of the validity (at most 500ms, more on a machine fenced measures to
    be slow) before its local validity ends, so that none is left, and none
    writes with the old fence, once another holder may be granted the key.
  - When COMMAND exits, the processes it left behind get SIGTERM, then SIGKILL
    after --grace, before the lease is released.
  - If fenced dies (even kill -9), COMMAND gets SIGKILL (Pdeathsig) and a guard
    process kills its cgroup (in process-tree mode: its group). The guard also
    kills it when fenced would have killed an unrenewed tree, should fenced not
    run by then (stopped, starved, or dying): fenced tells it that moment before
    COMMAND starts and after every renewal.

Stopping: fenced and COMMAND's group stop and continue together. If fenced gets
SIGTSTP, SIGTTIN or SIGTTOU (Ctrl-Z), or COMMAND stops (job control, or SIGSTOP),
fenced stops the group, and any process of COMMAND's that left it, with SIGSTOP,
then stops itself, so the shell sees the job stopped. A stopped fenced renews
nothing: a job left stopped loses its lease after at most --ttl, and another
holder may take the key. When fenced is continued (fg, bg, SIGCONT), it continues
the group only if the lease is still valid; otherwise it kills the still stopped
group with SIGKILL, so it never runs again, and exits 77. SIGSTOP sent to fenced
itself cannot be caught: COMMAND keeps running, unrenewed, until the guard kills
it (processes that left the group, in process-tree mode: until fenced is
continued, kills the tree at once and exits 77).

What each mode promises (docs/supervision.md has the whole table, and the tests):
  fault                          cgroup               process tree
  lease not renewed (cut off)    none after           none after, unless fenced
                                                      itself is starved: it says so
  lease broken, renewal refused  ended                ended
  Ctrl-Z, COMMAND stopped        none after           none after
  SIGSTOP of fenced alone        none after           group: none after; processes
                                                      that left it: fence only
  kill -9 of fenced              none after           group: none after; processes
                                                      that left it: fence only
  escapes: setsid, double fork, exited main thread, SIGTERM ignored, stopping
  itself, moving to another cgroup: as the fault's row (a kill -9 or SIGSTOP of
  fenced within 250ms of a cgroup move misses the mover). "none after": no write with
  the old fence is attempted once another holder may be granted the key; "ended":
  SIGTERM, SIGKILL after --grace, but the store may have granted the key already;
  "fence only": COMMAND may run on, and only the resource's fence check protects.

Terminal: when stdin is the terminal and fenced runs in its foreground, COMMAND's
group gets the terminal while it runs (so it can read it and gets Ctrl-C and
Ctrl-Z itself), and fenced takes it back when COMMAND stops or exits.

Exit codes:
  child's code  COMMAND ran and ended under a valid lease (128+N if signal N killed it)
  75            KEY (a key, or all N permits) was held and --wait ran out: nothing ran
  77            the lease was lost, or could not be confirmed, before the last process
                of COMMAND ended; the work may be incomplete or may have overlapped
                another holder's
  69            the store was unavailable: nothing ran
  64            usage error
  127           COMMAND could not be started
  1             another error of fenced
fenced's own codes always come with a last line on stderr that starts with
"fenced: " and ends with "(exit N)"; when fenced passes COMMAND's code on it prints
no such line. So a 77 without that line is COMMAND's own.`

// runExample is the examples section of fenced run's help.
const runExample = `  # run the nightly report unless another host is already running it
  fenced run report:nightly ./generate-report.sh

  # must-happen work: wait up to 5 minutes for the key
  fenced run --wait 5m --ttl 1m invoice:inv_72 -- ./send-invoice inv_72

  # at most 3 encoders at once across the hosts sharing the store
  fenced run -n 3 --wait 1h encoders -- ./encode "$FILE"

  # both accounts, in any order on the command line, without deadlock
  fenced run --wait 1m account:17 account:4 -- ./transfer 4 17 100

  # cron on every host at 02:00: run once, even if a clock is a minute behind
  fenced run --min-hold 5m --store postgres://app@db/app report:daily -- ./report || [ $? -eq 75 ]

  # a shell pipeline as COMMAND
  fenced run job:x sh -c 'pg_dump app | gzip > app.sql.gz'

  # on PostgreSQL instead of the embedded store
  FENCED_STORE=postgres://app@db/app fenced run migrate -- ./migrate up`

var probed string

// supervisionHelp is the last paragraph of run --help: the supervision
// mode in effect on this system (probed once, by making a cgroup).
func supervisionHelp(probe bool) string {
	if probe && probed == "" {
		probed = "\n\nSupervision on this system: " + supervise.Probe() + "."
	}
	return probed
}

// leaseOptions turns the flags into explicit lease options: every field is
// set, so nothing is left to a default by accident (--wait 0 does not wait,
// --max-hold 0 is no cap).
func (f *runFlags) leaseOptions() (*fenced.LeaseOptions, error) {
	if f.wait < 0 {
		return nil, fmt.Errorf("run: --wait %v is negative", f.wait)
	}
	if f.maxHold < 0 {
		return nil, fmt.Errorf("run: --max-hold %v is negative", f.maxHold)
	}
	minFence, err := parseFenceStrength(f.minFence)
	if err != nil {
		return nil, fmt.Errorf("run: --min-fence: %w", err)
	}
	o := &fenced.LeaseOptions{TTL: f.ttl, MaxWait: f.wait, MaxHold: f.maxHold, MinFence: minFence, FailOpen: false}
	return o, nil
}

// minFenceHint tells the user of command (run, elect, proof) which
// --min-fence accepts the store's fence.
func minFenceHint(command string, g driver.Capabilities) string {
	if g.Fence >= fenced.FenceRepeatable {
		return "with fenced " + command +
			": --min-fence=repeatable accepts a fence that can repeat after a failover; --min-fence=none marks work that needs no fence"
	}
	return "with fenced " + command +
		": --min-fence=none accepts a store without a fence, for work that needs none or whose resource is protected otherwise"
}

// runUsage is the one-line usage of run, for errors.
const runUsage = "want KEY -- COMMAND [ARGS...] (the -- may be left out) or KEY1 KEY2 ... -- COMMAND [ARGS...]"

// splitRunArgs splits run's arguments into keys and COMMAND. Flags are
// parsed up to KEY; after KEY everything is COMMAND, so "fenced run k sh -c
// 'x'" needs no "--", unless words that are not flags come before a "--":
// "fenced run a b -- cmd" takes keys a and b. The older form "fenced run k
// --ttl 1s -- cmd" still works: when the first word after KEY is a flag,
// the words up to "--" are flags. It returns nil keys and argv when it
// printed help.
func splitRunArgs(cmd *cobra.Command, args []string) (keys, argv []string, err error) {
	if len(args) == 0 {
		return nil, nil, withCode(exitUsage, errors.New("run: no KEY: "+runUsage))
	}
	key, rest := args[0], args[1:]
	keys = []string{key}
	if dash := slices.Index(rest, "--"); dash > 0 && !slices.ContainsFunc(rest[:dash], isFlag) {
		keys = append(keys, rest[:dash]...)
		rest = rest[dash:]
	}
	rest, helped, err := commandAfter(cmd, "KEY", key, rest)
	if err != nil || helped {
		return nil, nil, err
	}
	if len(rest) == 0 {
		return nil, nil, withCode(exitUsage, errors.New("run: no COMMAND: "+runUsage))
	}
	return keys, rest, nil
}

// commandAfter returns COMMAND [ARGS...] from rest, the words after the
// noun (KEY, NAME) of `fenced run` or `elect`: after a "--", or after the
// flags given there and their "--". helped is true when -h among those
// flags printed the help instead.
func commandAfter(cmd *cobra.Command, noun, name string, rest []string) (argv []string, helped bool, err error) {
	verb := cmd.Name()
	if len(rest) > 0 && rest[0] == "--" {
		return rest[1:], false, nil
	}
	if len(rest) == 0 || !isFlag(rest[0]) {
		return rest, false, nil
	}
	dash := slices.Index(rest, "--")
	if dash < 0 && (rest[0] == "-h" || rest[0] == "--help") {
		return nil, true, cmd.Help()
	}
	if dash < 0 {
		return nil, false, withCode(exitUsage,
			fmt.Errorf("%s: %q after %s %q: flags after %s need a -- before COMMAND: fenced %s [FLAGS] %s [FLAGS --] COMMAND [ARGS...]",
				verb, rest[0], noun, name, noun, verb, noun))
	}
	if err := cmd.Flags().Parse(rest[:dash]); err != nil {
		return nil, false, withCode(exitUsage, fmt.Errorf("%s: %w", verb, err))
	}
	if n := cmd.Flags().NArg(); n > 0 {
		return nil, false, withCode(exitUsage,
			fmt.Errorf("%s: want one %s before flags and --, got %d arguments; for several: "+
				"fenced %s [FLAGS] %s... -- COMMAND", verb, noun, n+1, verb, noun))
	}
	if help, _ := cmd.Flags().GetBool("help"); help {
		return nil, true, cmd.Help()
	}
	return rest[dash+1:], false, nil
}

// isFlag reports whether word looks like a flag.
func isFlag(word string) bool { return strings.HasPrefix(word, "-") && word != "-" }

var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

func runUnderLease(ctx context.Context, g *globals, f *runFlags, keys, argv []string) error {
	if f.grace < 0 {
		return withCode(exitUsage, fmt.Errorf("run: --grace %v is negative", f.grace))
	}
	opts, err := f.leaseOptions()
	if err != nil {
		return withCode(exitUsage, err)
	}
	switch {
	case f.permits < 0 || f.permits > limits.MaxPermits:
		return withCode(exitUsage, fmt.Errorf("run: -n %d: want 1 to %d permits", f.permits, limits.MaxPermits))
	case f.permits > 0 && len(keys) > 1:
		return withCode(exitUsage, fmt.Errorf("run: -n takes one NAME, got %d keys %q", len(keys), keys))
	case f.minHold < 0:
		return withCode(exitUsage, fmt.Errorf("run: --min-hold %v is negative", f.minHold))
	case f.maxHold > 0 && f.minHold > f.maxHold:
		return withCode(exitUsage,
			fmt.Errorf("run: --min-hold %v is longer than --max-hold %v, after which the lease expires", f.minHold, f.maxHold))
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	c, err := openForRun(ctx, g, f, opts, sigs)
	if err != nil {
		return err
	}
	var held *hold
	defer func() { closeClient(c, held) }()
	if err := checkTTL(c, "run", f.ttl, opts); err != nil {
		return err
	}

	what := "the lease" // the error names the keys already
	if len(keys) > 1 {
		what = "the leases"
	}
	h, err := acquireOrInterrupt(ctx, sigs, what, func(acqCtx context.Context) (*hold, error) {
		stopStatus := showWaitStatus(acqCtx, g.stderr, c, keys, f.wait) // a live line on a terminal
		defer stopStatus()
		return acquireHold(acqCtx, c, f, keys, opts, g.store)
	})
	if err != nil {
		if errors.Is(err, fenced.ErrHeld) {
			return withCode(exitHeld, fmt.Errorf("%w; nothing ran", err))
		}
		if errors.Is(err, fenced.ErrNoFence) {
			return noFenceError("run", opts.MinFence, c.Capabilities())
		}
		return err
	}
	h.grace, h.minHold = f.grace, f.minHold
	held = h
	return superviseCommand(ctx, g, h, argv, sigs)
}

// closeClient closes c once the work under h (nil if none ran) is over.
// If h was lost rather than released, it does not wait for the store,
// which may be why: a renewal still waiting for it would hold Close for
// its whole CloseTimeout. The lease has ended locally already, and its
// grant expires at the store by itself.
func closeClient(c *fenced.Client, h *hold) {
	if h != nil {
		if err := h.lease.Err(); err != nil && !errors.Is(err, fenced.ErrReleased) {
			go c.Close()
			return
		}
	}
	c.Close()
}

// interruptible returns a context for waiting for a lease that a signal
// from sigs cancels: a signal while waiting stops the wait, and nothing
// runs. Call stop once the wait is over, before reading sigs again; it
// returns the signal that came meanwhile, if one did. A signal that came
// as the grant landed (the wait succeeded all the same) is the caller's
// to act on: it must release what it got and run nothing.
func interruptible(ctx context.Context, sigs <-chan os.Signal, what string) (context.Context, func() os.Signal) {
	acqCtx, stopWait := context.WithCancelCause(ctx)
	waitDone := make(chan struct{})
	exited := make(chan struct{})
	var got os.Signal
	go func() {
		defer close(exited)
		select {
		case s := <-sigs:
			got = s
			stopWait(fmt.Errorf("interrupted by %v while waiting for %s", s, what))
		case <-waitDone:
		}
	}()
	return acqCtx, func() os.Signal {
		close(waitDone)
		<-exited
		return got
	}
}

// acquireOrInterrupt runs acquire under a context that a signal from sigs
// cancels (see interruptible). If a signal comes as the grant lands, the
// hold is released at once and nothing runs.
func acquireOrInterrupt(ctx context.Context, sigs <-chan os.Signal, what string,
	acquire func(context.Context) (*hold, error)) (*hold, error) {
	acqCtx, stopWait := interruptible(ctx, sigs, what)
	h, err := acquire(acqCtx)
	sig := stopWait()
	if err != nil || sig == nil {
		return h, err
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_ = h.lease.Release(relCtx)
	return nil, fmt.Errorf("interrupted by %v as %s was granted; released it, nothing ran", sig, h.desc)
}

// leaseHold adapts a lease or a lease set to hold.lease: it is done when
// its context is.
type leaseHold struct{ contextHold }

// contextHold is what a lease and a lease set have in common.
type contextHold interface {
	Context() context.Context
	Err() error
	Remaining() time.Duration
	Release(ctx context.Context) error
}

func (l leaseHold) Done() <-chan struct{} { return l.Context().Done() }

// releaseTimeout bounds the release of a lease that is still valid.
const releaseTimeout = 5 * time.Second

// hold is what COMMAND runs under: one lease, a semaphore permit, the
// leases on several keys, or a leadership. It ends (Done) when any lease
// of it ends.
type hold struct {
	lease interface {
		Done() <-chan struct{}
		Err() error
		Remaining() time.Duration
		Release(ctx context.Context) error
	}
	leases  []*fenced.Lease // every lease of the hold, for confirm
	desc    string          // "the lease on k (fence 5)", for messages
	env     []string        // COMMAND's environment
	granted time.Time
	grace   time.Duration // SIGTERM to SIGKILL on loss
	minHold time.Duration // keep the lease this long after granted
	// pause, if not nil, pauses the renewals of the hold's client until
	// the resume it returns is called (rootaccess.PauseRenewals).
	pause func() (resume func())
	// dead, if not nil, is closed when whatever keeps the hold alive has
	// died (a partitions member killed with kill -9): nobody renews it
	// and nobody will tell why it ends, so the tree gets SIGKILL at once,
	// without --grace.
	dead <-chan struct{}
}

// acquireHold takes the lease (or permit, or leases) run's arguments ask
// for and prepares COMMAND's environment.
func acquireHold(ctx context.Context, c *fenced.Client, f *runFlags, keys []string, opts *fenced.LeaseOptions,
	store string) (*hold, error) {
	switch {
	case f.permits > 0:
		sem, err := recipe.NewSemaphore(c, keys[0], f.permits, opts)
		if err != nil {
			return nil, err
		}
		p, err := sem.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		env := append(childEnv(os.Environ(), p.Lease, store), "FENCED_SLOT="+strconv.Itoa(p.Slot()))
		return &hold{lease: leaseHold{p.Lease}, leases: []*fenced.Lease{p.Lease}, env: env, granted: time.Now(), pause: pauserOf(c),
			desc: fmt.Sprintf("the lease on permit %s of %d (fence %d)", p.Key(), f.permits, p.Fence())}, nil
	case len(keys) > 1:
		set, err := recipe.AcquireAll(ctx, c, keys, opts)
		if err != nil {
			return nil, err
		}
		return &hold{lease: leaseHold{set}, leases: set.Leases(), env: setEnv(os.Environ(), set, store), granted: time.Now(),
			pause: pauserOf(c), desc: fmt.Sprintf("the leases on %s (fences %s)", strings.Join(setKeys(set), ", "), fencesDesc(set))}, nil
	}
	l, err := c.Acquire(ctx, keys[0], opts)
	if err != nil {
		return nil, err
	}
	return &hold{lease: leaseHold{l}, leases: []*fenced.Lease{l}, env: childEnv(os.Environ(), l, store), granted: time.Now(),
		pause: pauserOf(c), desc: fmt.Sprintf("the lease on %s (fence %d)", l.Key(), l.Fence())}, nil
}

// setKeys returns set's keys in its canonical order.
func setKeys(set *recipe.LeaseSet) []string {
	var keys []string
	for _, l := range set.Leases() {
		keys = append(keys, l.Key())
	}
	return keys
}

// fencesDesc lists a set's fences in key order.
func fencesDesc(set *recipe.LeaseSet) string {
	var parts []string
	for _, l := range set.Leases() {
		parts = append(parts, strconv.FormatUint(l.Fence(), 10))
	}
	return strings.Join(parts, ", ")
}

// superviseCommand starts argv under h and supervises it until no process
// of it is left; see run --help. It releases h in every case.
func superviseCommand(ctx context.Context, g *globals, h *hold, argv []string, sigs chan os.Signal) error {
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.Env = h.env
	signal.Notify(sigs, stopSignals...) // from here on fenced stops the group first
	// The guard kills the tree when fenced would kill it unrenewed, from
	// before COMMAND runs (see tellGuard): a fenced stopped right after
	// the start is covered too.
	left := h.lease.Remaining()
	grp, err := supervise.StartKillBy(child, time.Now().Add(left-killLeadFor(left)))
	if err != nil {
		h.lease.Release(context.WithoutCancel(ctx))
		if errors.Is(err, supervise.ErrSetup) {
			return fmt.Errorf("run: %w; nothing ran", err)
		}
		return withCode(127, fmt.Errorf("run: start %s: %w", argv[0], err))
	}
	defer grp.Close() // before Gone (a panic), it kills the tree
	if g.verbose {
		fmt.Fprintf(g.stderr, "fenced: supervision: %s\n", grp.Mode())
	}
	s := &supervision{g: g, h: h, name: argv[0], grp: grp}
	return s.run(ctx, sigs)
}

// pauserOf returns a hold's pause for the leases of c.
func pauserOf(c *fenced.Client) func() (resume func()) {
	return func() func() { return rootaccess.PauseRenewals(c) }
}

// stopSignals are the job-control signals on which fenced stops the whole
// group before stopping itself.
var stopSignals = []os.Signal{syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU}

// childEnv returns COMMAND's environment: env without any FENCED_ variable
// it inherited, plus the lease's key, fence and owner digest, and the store
// URL with its password redacted.
func childEnv(env []string, lease *fenced.Lease, store string) []string {
	return append(cleanEnv(env),
		"FENCED_KEY="+lease.Key(),
		"FENCED_FENCE="+strconv.FormatUint(lease.Fence(), 10),
		"FENCED_OWNER="+fence.OwnerDigest(lease.Owner()),
		"FENCED_STORE="+storeurl.Redact(store),
	)
}

// cleanEnv returns env without any FENCED_ variable it inherited.
func cleanEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, "FENCED_")
	})
}

// setEnv returns COMMAND's environment under several leases: FENCED_FENCES
// and FENCED_OWNERS, JSON objects keyed by key, and the redacted store.
func setEnv(env []string, set *recipe.LeaseSet, store string) []string {
	owners, fences := map[string]string{}, map[string]uint64{}
	for _, l := range set.Leases() {
		owners[l.Key()] = fence.OwnerDigest(l.Owner())
		fences[l.Key()] = l.Fence()
	}
	fj, _ := json.Marshal(fences)
	oj, _ := json.Marshal(owners)
	return append(cleanEnv(env),
		"FENCED_FENCES="+string(fj),
		"FENCED_OWNERS="+string(oj),
		"FENCED_STORE="+storeurl.Redact(store),
	)
}

// supervision is one COMMAND running under one hold.
type supervision struct {
	g    *globals
	h    *hold
	name string // COMMAND's name, for messages
	grp  *supervise.Group

	heldOn    bool  // the lease was kept after COMMAND for --min-hold
	code      int   // COMMAND's exit code, once it exited
	exited    bool  // COMMAND (the group's leader) has exited
	lost      error // why the lease was lost while something ran, if it was
	ending    bool  // the tree has been told to end (SIGTERM sent)
	killTimer <-chan time.Time
	killAgain *time.Ticker  // SIGKILL again until the tree is gone
	unrenewed bool          // the tree was ended before an unrenewed lease ran out
	validity  time.Duration // the hold's validity when supervision began
	killLead  time.Duration // SIGKILL goes out at least this long before the validity ends (see endingWindow)
	cost      time.Duration // what a round of signals to the tree has been seen to cost (see measure)
	window    time.Duration // how long before the validity ends an unrenewed tree gets SIGTERM
	endDue    time.Time     // when the ending check is due, to measure how late it runs
	validEnd  time.Time     // when the validity seen at the last check ends (see killDelay)
	guardAt   time.Time     // when the supervisor's guard kills the tree unless told again (see tellGuard)
}

// run supervises until no process of COMMAND is left, then releases the
// lease and returns COMMAND's exit code, or 77 if the lease did not hold
// until the end.
func (s *supervision) run(ctx context.Context, sigs <-chan os.Signal) error {
	var reaped int
	var killAgain <-chan time.Time
	leaseDone, dead := s.h.lease.Done(), s.h.dead
	ending := s.endingWindow()
	guard := time.NewTicker(guardEvery(s.validity))
	defer guard.Stop()
loop:
	for {
		if s.killAgain != nil {
			killAgain = s.killAgain.C
		}
		select {
		case <-guard.C:
			s.tellGuard()
		case sig := <-sigs:
			if slices.Contains(stopSignals, sig) {
				if !s.ending {
					s.suspend("fenced got " + unix.SignalName(sig.(syscall.Signal)))
				}
				continue
			}
			_ = s.grp.Signal(sig.(syscall.Signal))
		case ev := <-s.grp.Events():
			switch ev.Kind {
			case supervise.Stopped:
				// A stop fenced caused itself (SIGSTOP to the group) is
				// reported too, and may arrive after the group has been
				// continued: act only on a leader that is stopped now.
				if !s.ending && s.grp.LeaderStopped() {
					s.suspend(fmt.Sprintf("%s was stopped by %s", s.name, unix.SignalName(ev.Signal)))
				}
			case supervise.Exited:
				s.exited, s.code = true, ev.Code
				s.grp.TakeTerminal()
				if !s.ending && !s.guardAt.IsZero() && !time.Now().Before(s.guardAt) {
					// Past the moment the guard was told: fenced did not
					// run in time, and the guard ended the tree for the
					// unrenewed lease, as endUnrenewed would have. What
					// it could not reach (left the group) gets SIGKILL
					// at once: no SIGTERM round, no --grace.
					s.unrenewed, s.ending, s.killTimer = true, true, nil
					s.lost = fmt.Errorf("%w: no renewal confirmed in time; fenced's guard ended the tree", fenced.ErrLost)
					s.kill("outlived the lease's local validity")
				}
				if !s.ending {
					if n := s.terminate(); n > 0 {
						fmt.Fprintf(s.g.stderr, "fenced: %s exited and left %d processes; sending them SIGTERM, SIGKILL in %v\n", s.name, n,
							s.h.grace)
					}
				}
			case supervise.Gone:
				reaped = ev.Reaped
				break loop
			}
		case <-ending:
			ending = s.endUnrenewed()
		case <-dead:
			dead = nil
			s.killNow()
		case <-leaseDone:
			leaseDone = nil
			select {
			case <-dead:
				// The holder died (its link closes dead before done):
				// SIGKILL at once, with no round of SIGTERM first.
				dead = nil
				s.killNow()
			default:
				s.lose(s.h.lease.Err())
			}
		case <-s.killTimer:
			s.killTimer = nil
			s.kill("still running after SIGTERM")
		case <-killAgain:
			s.grp.SignalAll(syscall.SIGKILL) // processes forked while the last SIGKILL went out
		}
	}
	if s.killAgain != nil {
		s.killAgain.Stop()
	}
	s.grp.TakeTerminal()
	if s.g.verbose && reaped > 0 {
		fmt.Fprintf(s.g.stderr, "fenced: reaped %d processes of %s that had lost their parent\n", reaped, s.name)
	}
	return s.finish(ctx, sigs)
}

// terminate sends SIGTERM to every process of COMMAND, and SIGCONT so that
// stopped ones can act on it, and arms SIGKILL after --grace, or sooner
// if the lease's local validity ends before (see killDelay). It returns
// how many processes it found.
func (s *supervision) terminate() int {
	n := s.sigterm()
	if n > 0 {
		d := s.killDelay()
		s.killTimer = time.After(d)
		if at := time.Now().Add(d); at.After(s.guardAt) {
			// --grace after a loss: the guard waits for it too.
			s.grp.KillBy(at)
			s.guardAt = at
		}
	} else {
		s.killAgain = time.NewTicker(100 * time.Millisecond) // in case one was forking
	}
	return n
}

// sigterm sends SIGTERM, then SIGCONT, to every process of COMMAND and
// marks the tree as ending. It returns how many processes it found.
func (s *supervision) sigterm() int {
	s.ending = true
	n := s.grp.SignalAll(syscall.SIGTERM)
	s.grp.SignalAll(syscall.SIGCONT)
	return n
}

// kill sends SIGKILL to every process of COMMAND (its group first, which
// takes no walk of /proc), then again every 100ms until the tree is gone;
// why says, for the message, why now.
func (s *supervision) kill(why string) {
	start := time.Now()
	_ = s.grp.Signal(syscall.SIGKILL)
	n := s.grp.SignalAll(syscall.SIGKILL)
	took := time.Since(start)
	if n > 0 {
		fmt.Fprintf(s.g.stderr, "fenced: %d processes of %s %s; sent SIGKILL%s\n", n, s.name, why, s.validityNote(took))
	}
	if s.killAgain == nil {
		s.killAgain = time.NewTicker(100 * time.Millisecond)
	}
}

// killNow ends the tree with SIGKILL at once, without --grace: the hold's
// keeper died (hold.dead), so nobody renews the lease or will say when it
// ends.
func (s *supervision) killNow() {
	if s.lost == nil || isPlannedEnd(s.lost) {
		// A hand-off whose member died before the tree had ended is no
		// orderly end any more.
		s.lost = fmt.Errorf("%w: the holder of %s died", fenced.ErrLost, s.h.desc)
	}
	s.ending, s.killTimer = true, nil
	s.kill("run unrenewed: the holder of " + s.h.desc + " died")
}

// lose records that the lease was lost and ends the tree, unless it ended
// by release (which happens only after the tree is gone).
func (s *supervision) lose(cause error) {
	if s.lost != nil || errors.Is(cause, fenced.ErrReleased) {
		return
	}
	s.lost = cause
	if errors.Is(cause, fenced.ErrExpired) && !s.ending {
		// The validity ran out before the ending window (endUnrenewed)
		// ended the tree: fenced did not run meanwhile (SIGSTOP, or a
		// starved machine), and the tree may have run past it already.
		// A partition's supervisor hears of it from its member.
		s.unrenewed, s.ending = true, true
		fmt.Fprintf(s.g.stderr, "fenced: %s lost: %v, before fenced could end %s; sending SIGKILL at once\n", s.h.desc, errText(cause),
			s.name)
		s.kill("ran past the lease's local validity")
		return
	}
	verb := " lost" // a planned end says what it is by itself
	if isPlannedEnd(cause) {
		verb = ""
	}
	if s.ending {
		fmt.Fprintf(s.g.stderr, "fenced: %s%s: %v; processes of %s are already being ended\n", s.h.desc, verb, cause, s.name)
		return
	}
	fmt.Fprintf(s.g.stderr, "fenced: %s%s: %v; sending SIGTERM to %s and its processes, SIGKILL in %v\n", s.h.desc, verb, cause, s.name,
		s.killDelay().Round(time.Millisecond))
	s.terminate()
}

// leaseValid reports whether the lease is held and within its local
// validity now, reading the clock rather than waiting for the lease's
// timers, which may not have run yet after a stop.
func (s *supervision) leaseValid() bool {
	return s.h.lease.Err() == nil && s.h.lease.Remaining() > 0
}

// suspend stops COMMAND's group, then fenced itself; once fenced is
// continued it continues the group if the lease is still valid, and
// otherwise kills the group, which never runs again.
func (s *supervision) suspend(why string) {
	s.grp.Stop()
	fmt.Fprintf(s.g.stderr, "fenced: %s; stopping %s and fenced (%s is not renewed while stopped and ends in %v)\n",
		why, s.name, s.h.desc, s.h.lease.Remaining().Round(time.Millisecond))
	// A renewal in flight when fenced stops would stay open until it is
	// continued, and on SQLite keep the file's write lock from everyone.
	resume := func() {}
	if s.h.pause != nil {
		resume = s.h.pause()
	}
	supervise.StopSelf()
	resume()
	if s.leaseValid() {
		if s.g.verbose {
			fmt.Fprintf(s.g.stderr, "fenced: continued; %s is still valid (%v left): continuing %s\n", s.h.desc,
				s.h.lease.Remaining().Round(time.Millisecond), s.name)
		}
		s.grp.Continue()
		return
	}
	cause := s.h.lease.Err()
	if cause == nil {
		cause = fmt.Errorf("%w: local validity ran out while stopped", fenced.ErrExpired)
	}
	s.lost = cause
	s.ending = true
	fmt.Fprintf(s.g.stderr, "fenced: continued after %s ended (%v); killing the stopped %s without continuing it\n", s.h.desc, cause,
		s.name)
	s.grp.SignalAll(syscall.SIGKILL)
	s.killAgain = time.NewTicker(100 * time.Millisecond)
}

// holdAtLeast keeps the lease, renewed, until --min-hold has passed since
// the grant, so that a late duplicate of the job finds the key held. A
// signal (INT, TERM, ...) or the lease's end cuts it short; the work is
// done, and was confirmed under the lease, either way.
func (s *supervision) holdAtLeast(sigs <-chan os.Signal) {
	left := s.h.minHold - time.Since(s.h.granted)
	if left <= 0 {
		return
	}
	s.heldOn = true
	if s.g.verbose {
		fmt.Fprintf(s.g.stderr, "fenced: %s ended; keeping %s for %v more (--min-hold %v)\n", s.name, s.h.desc,
			left.Round(time.Millisecond), s.h.minHold)
	}
	t := time.NewTimer(left)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return
		case <-s.h.lease.Done():
			fmt.Fprintf(s.g.stderr,
				"fenced: %s ended while kept for --min-hold, after %s and its processes had ended under it (confirmed by the store): %v\n",
				s.h.desc, s.name, errText(s.h.lease.Err()))
			return
		case sig := <-sigs:
			if slices.Contains(stopSignals, sig) {
				continue // nothing runs; the hold is all that is left
			}
			fmt.Fprintf(s.g.stderr, "fenced: %v while keeping %s for --min-hold; releasing it now\n", sig, s.h.desc)
			return
		}
	}
}

// confirm asks the store whether it still has every grant of the hold, by
// renewing each. It returns an error matching fenced.ErrNotHeld if one is
// gone (broken, or expired and perhaps granted again).
func (s *supervision) confirm(ctx context.Context) error {
	for _, l := range s.h.leases {
		if err := l.Renew(ctx); err != nil {
			return err
		}
	}
	return nil
}

// errText is err's message without the "fenced: " that library errors
// start with, for lines that start with it already.
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.TrimPrefix(err.Error(), "fenced: ")
}

// finish releases the lease once the tree is gone and picks the exit code.
//
// The work is reported as lost (77) if the lease was lost while anything
// ran, if its local validity had run out when the last process ended, or
// if the store no longer had the grant then. The release doubles as that
// last check; with --min-hold, the lease is kept on after the work, so the
// check is made first, by a renewal, before the hold: a loss is never
// hidden behind the hold. A lease already lost is ended locally without
// waiting for the store, which may be the reason it was lost.
func (s *supervision) finish(ctx context.Context, sigs <-chan os.Signal) error {
	validAtEnd := s.leaseValid()
	left := s.h.lease.Remaining()
	lost := s.lost
	if lost == nil && !validAtEnd {
		lost = s.h.lease.Err()
		if lost == nil || errors.Is(lost, fenced.ErrReleased) {
			lost = fmt.Errorf("%w: local validity ran out", fenced.ErrExpired)
		}
	}
	if lost == nil && s.h.minHold > time.Since(s.h.granted) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(left, releaseTimeout))
		err := s.confirm(cctx)
		cancel()
		switch {
		case errors.Is(err, fenced.ErrNotHeld) || errors.Is(err, fenced.ErrLost):
			lost = fmt.Errorf("the store no longer had the grant when %s ended (broken, or expired): %w", s.name, err)
		case err != nil:
			fmt.Fprintf(s.g.stderr, "fenced: could not confirm %s when %s ended: %s (it was valid for %v more by the local clock)\n",
				s.h.desc, s.name, errText(err), left.Round(time.Millisecond))
		}
		if lost == nil {
			s.holdAtLeast(sigs)
		}
	}
	if lost == nil && s.h.lease.Err() == nil {
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		relErr := s.h.lease.Release(relCtx)
		cancel()
		switch {
		case errors.Is(relErr, fenced.ErrNotHeld) && !s.heldOn:
			lost = fmt.Errorf("the store no longer had the grant when %s ended (broken, or expired): %w", s.name, relErr)
		case relErr != nil:
			// The store could not be asked; the lease was valid by the local
			// clock (started before the grant was sent, minus the safety
			// margin) when the last process ended, which is the contract.
			fmt.Fprintf(s.g.stderr, "fenced: %s (the lease was valid for %v more when %s ended; it will expire by itself)\n",
				errText(relErr), left.Round(time.Millisecond), s.name)
		}
	} else {
		// Lost, or ended during the hold: end it here (its context is
		// cancelled already) without waiting for a store that may be why.
		// A lease whose tree was ended unrenewed (endUnrenewed) is let run
		// out first, so no renewal is left in flight.
		s.awaitEnd()
		relCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		cancel()
		_ = s.h.lease.Release(relCtx)
	}
	if isPlannedEnd(lost) {
		// A hand-off or leave: the member releases the lease only now
		// that the tree is gone, so nothing overlapped.
		fmt.Fprintf(s.g.stderr, "fenced: %s: %v; %s and its processes have ended, before the lease is released\n", s.h.desc, lost, s.name)
		return nil
	}
	if lost != nil {
		what := "ran"
		if s.exited {
			what = fmt.Sprintf("ran (it exited %d)", s.code)
		}
		return withCode(exitLost,
			fmt.Errorf("%s was lost before %s and its processes ended; %s %s, and its work may be incomplete or overlap another "+
				"holder's: %w",
				s.h.desc, s.name, s.name, what, lost))
	}
	if s.code != 0 {
		return withCode(s.code, nil)
	}
	return nil
}
