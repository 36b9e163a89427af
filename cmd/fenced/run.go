package main

import (
	"context"
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
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/supervise"
)

type runFlags struct {
	ttl, wait, grace time.Duration
	maxHold          time.Duration
	minFence         string
}

func newRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [flags] KEY [--] COMMAND [ARGS...]",
		Short: "Run COMMAND while holding a lease on KEY; stop it if the lease is lost",
		Long: `Run acquires a lease on KEY, runs COMMAND while renewing the lease, and releases
it when COMMAND and every process it started have ended. Everything after KEY is
COMMAND and its arguments; flags go before KEY, or between KEY and a "--".

COMMAND's environment:
  FENCED_KEY    KEY
  FENCED_FENCE  the lease's fencing token: send it with every write, so the resource
                refuses writes from a holder that lost the lease while paused
  FENCED_OWNER  the owner digest that fence.From sends with the fence (never the
                secret owner token); resources use it to refuse an equal fence from
                another grant
  FENCED_STORE  the store URL with any password redacted: the lease is fenced's,
                COMMAND needs no credentials of the store

The default store (sqlite:) is a file in the invoking user's state directory,
$XDG_STATE_HOME/fenced/fenced.db or ~/.local/state/fenced/fenced.db: runs by
another user, or with another HOME or XDG_STATE_HOME (cron, sudo, systemd), use
another file and never exclude each other. Share a --store (or FENCED_STORE) to
exclude across users and hosts. -v prints the store actually used.

COMMAND runs in a process group of its own, and fenced owns all of it: fenced is a
child subreaper, so processes that leave the group or lose their parent stay
fenced's, and the lease is released only when no process COMMAND started is left.
  - Signals sent to fenced (INT, TERM, HUP, QUIT, USR1, USR2) go to the group.
  - If the lease is lost (renewal refused, broken by an admin, or not confirmed
    before local validity ran out), every process gets SIGTERM, then SIGKILL after
    --grace, whether or not COMMAND itself has exited; fenced exits 77 when none
    is left.
  - When COMMAND exits, the processes it left behind get SIGTERM, then SIGKILL
    after --grace, before the lease is released.
  - If fenced dies (even kill -9), COMMAND gets SIGKILL (Pdeathsig) and a guard
    process sends SIGKILL to its group.

Stopping: fenced and COMMAND's group stop and continue together. If fenced gets
SIGTSTP, SIGTTIN or SIGTTOU (Ctrl-Z), or COMMAND stops (job control, or SIGSTOP),
fenced stops the group, and any process of COMMAND's that left it, with SIGSTOP,
then stops itself, so the shell sees the job stopped. A stopped fenced renews
nothing: a job left stopped loses its lease after at most --ttl, and another
holder may take the key. When fenced is continued (fg, bg, SIGCONT), it continues
the group only if the lease is still valid; otherwise it kills the still stopped
group with SIGKILL, so it never runs again, and exits 77. SIGSTOP sent to fenced
itself cannot be caught: then COMMAND keeps running unrenewed, and only the fence
protects the resource.

Terminal: when stdin is the terminal and fenced runs in its foreground, COMMAND's
group gets the terminal while it runs (so it can read it and gets Ctrl-C and
Ctrl-Z itself), and fenced takes it back when COMMAND stops or exits.

Exit codes:
  child's code  COMMAND ran and ended under a valid lease (128+N if signal N killed it)
  75            KEY was held and --wait ran out: nothing ran
  77            the lease was lost, or could not be confirmed, before the last process
                of COMMAND ended; the work may be incomplete or may have overlapped
                another holder's
  69            the store was unavailable: nothing ran
  64            usage error
  127           COMMAND could not be started
  1             another error of fenced
fenced's own codes always come with a last line on stderr that starts with
"fenced: " and ends with "(exit N)"; when fenced passes COMMAND's code on it prints
no such line. So a 77 without that line is COMMAND's own.`,
		Example: `  # run the nightly report unless another host is already running it
  fenced run report:nightly ./generate-report.sh

  # must-happen work: wait up to 5 minutes for the key
  fenced run --wait 5m --ttl 1m invoice:inv_72 -- ./send-invoice inv_72

  # a shell pipeline as COMMAND
  fenced run job:x sh -c 'pg_dump app | gzip > app.sql.gz'

  # on PostgreSQL instead of the embedded store
  FENCED_STORE=postgres://app@db/app fenced run migrate -- ./migrate up`,
		Args: cobra.ArbitraryArgs, // parsed by splitRunArgs: after KEY everything is COMMAND
		RunE: func(cmd *cobra.Command, args []string) error {
			key, argv, err := splitRunArgs(cmd, args)
			if err != nil || key == "" && argv == nil {
				return err
			}
			return runUnderLease(cmd.Context(), g, f, key, argv)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", 30*time.Second, "lease time to live, positive; renewed every third of it")
	fl.DurationVar(&f.wait, "wait", 0, "how long to wait for a held KEY (0: exit 75 at once if held)")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "after SIGTERM on lease loss, how long before SIGKILL")
	fl.DurationVar(&f.maxHold, "max-hold", 0, "stop renewing after this long; the lease then expires (0: no cap)")
	fl.StringVar(&f.minFence, "min-fence", "strict", "weakest fence the lease accepts: strict; repeatable (can repeat after a failover: single-node Redis); "+
		"none (no fence: Redlock without a fence source, or work whose duplicates only waste effort; the resource must then be protected otherwise)")
	fl.SetInterspersed(false) // after KEY, everything is COMMAND (see splitRunArgs)
	return cmd
}

// leaseOptions turns the flags into explicit lease options: every field is
// set, so nothing is left to a default by accident (--wait 0 is NoWait,
// --max-hold 0 is HoldForever).
func (f *runFlags) leaseOptions() (*fenced.LeaseOptions, error) {
	if f.ttl <= 0 {
		return nil, fmt.Errorf("run: --ttl %v: the lease TTL must be positive", f.ttl)
	}
	if f.wait < 0 {
		return nil, fmt.Errorf("run: --wait %v is negative", f.wait)
	}
	if f.maxHold < 0 {
		return nil, fmt.Errorf("run: --max-hold %v is negative", f.maxHold)
	}
	minFence, err := fenced.ParseFenceStrength(f.minFence)
	if err != nil {
		return nil, fmt.Errorf("run: --min-fence: %w", err)
	}
	o := &fenced.LeaseOptions{TTL: f.ttl, MaxWait: f.wait, MaxHold: f.maxHold, MinFence: minFence, FailOpen: fenced.Off}
	if f.wait == 0 {
		o.MaxWait = fenced.NoWait
	}
	if f.maxHold == 0 {
		o.MaxHold = fenced.HoldForever
	}
	return o, nil
}

// minFenceHint tells the user which --min-fence accepts the store's fence.
func minFenceHint(g fenced.Guarantees) string {
	if g.Fence >= fenced.FenceRepeatable {
		return "with fenced run: --min-fence=repeatable accepts a fence that can repeat after a failover; --min-fence=none marks work that needs no fence"
	}
	return "with fenced run: --min-fence=none accepts a store without a fence, for work that needs none or whose resource is protected otherwise"
}

// runUsage is the one-line usage of run, for errors.
const runUsage = "want KEY -- COMMAND [ARGS...] (the -- may be left out)"

// splitRunArgs splits run's arguments into KEY and COMMAND. Flags are parsed
// up to KEY; after KEY everything is COMMAND, so "fenced run k sh -c 'x'"
// needs no "--". The older form "fenced run k --ttl 1s -- cmd" still works:
// when the first word after KEY is a flag, the words up to "--" are flags.
// It returns an empty key and nil argv when it printed help.
func splitRunArgs(cmd *cobra.Command, args []string) (key string, argv []string, err error) {
	if len(args) == 0 {
		return "", nil, withCode(exitUsage, errors.New("run: no KEY: "+runUsage))
	}
	key, rest := args[0], args[1:]
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	} else if len(rest) > 0 && strings.HasPrefix(rest[0], "-") && rest[0] != "-" {
		dash := slices.Index(rest, "--")
		if dash < 0 && (rest[0] == "-h" || rest[0] == "--help") {
			return "", nil, cmd.Help()
		}
		if dash < 0 {
			return "", nil, withCode(exitUsage, fmt.Errorf("run: %q after KEY %q: flags after KEY need a -- before COMMAND: fenced run [FLAGS] KEY [FLAGS --] COMMAND [ARGS...]", rest[0], key))
		}
		if err := cmd.Flags().Parse(rest[:dash]); err != nil {
			return "", nil, withCode(exitUsage, fmt.Errorf("run: %w", err))
		}
		if n := cmd.Flags().NArg(); n > 0 {
			return "", nil, withCode(exitUsage, fmt.Errorf("run: want exactly one KEY before --, got %d arguments", n+1))
		}
		if help, _ := cmd.Flags().GetBool("help"); help {
			return "", nil, cmd.Help()
		}
		rest = rest[dash+1:]
	}
	if len(rest) == 0 {
		return "", nil, withCode(exitUsage, errors.New("run: no COMMAND: "+runUsage))
	}
	return key, rest, nil
}

var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

func runUnderLease(ctx context.Context, g *globals, f *runFlags, key string, argv []string) error {
	if f.grace < 0 {
		return withCode(exitUsage, fmt.Errorf("run: --grace %v is negative", f.grace))
	}
	opts, err := f.leaseOptions()
	if err != nil {
		return withCode(exitUsage, err)
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	c, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()

	// A signal while waiting for the key stops the wait; nothing runs.
	acqCtx, stopWait := context.WithCancelCause(ctx)
	waitDone := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			stopWait(fmt.Errorf("interrupted by %v while waiting for %s", s, key))
		case <-waitDone:
		}
	}()
	lease, err := c.Acquire(acqCtx, key, opts)
	close(waitDone)
	if err != nil {
		if errors.Is(err, fenced.ErrHeld) {
			return withCode(exitHeld, fmt.Errorf("%w; nothing ran", err))
		}
		if errors.Is(err, fenced.ErrNoFence) {
			return withCode(exitUsage, fmt.Errorf("%w\n(%s)", err, minFenceHint(c.Guarantees())))
		}
		return err
	}

	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	child.Env = childEnv(os.Environ(), lease, g.store)
	signal.Notify(sigs, stopSignals...) // from here on fenced stops the group first
	grp, err := supervise.Start(child)
	if err != nil {
		lease.Release(context.WithoutCancel(ctx))
		if errors.Is(err, supervise.ErrSetup) {
			return fmt.Errorf("run: %w; nothing ran", err)
		}
		return withCode(127, fmt.Errorf("run: start %s: %w", argv[0], err))
	}
	defer grp.Close()
	s := &supervision{g: g, f: f, key: key, name: argv[0], lease: lease, grp: grp}
	return s.run(ctx, sigs)
}

// stopSignals are the job-control signals on which fenced stops the whole
// group before stopping itself.
var stopSignals = []os.Signal{syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU}

// childEnv returns COMMAND's environment: env without any FENCED_ variable
// it inherited, plus the lease's key, fence and owner digest, and the store
// URL with its password redacted.
func childEnv(env []string, lease *fenced.Lease, store string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, "FENCED_")
	})
	return append(out,
		"FENCED_KEY="+lease.Key(),
		"FENCED_FENCE="+strconv.FormatUint(lease.Fence(), 10),
		"FENCED_OWNER="+fence.OwnerDigest(lease.Owner()),
		"FENCED_STORE="+fenced.Redact(store),
	)
}

// supervision is one COMMAND running under one lease.
type supervision struct {
	g     *globals
	f     *runFlags
	key   string
	name  string // COMMAND's name, for messages
	lease *fenced.Lease
	grp   *supervise.Group

	code      int   // COMMAND's exit code, once it exited
	exited    bool  // COMMAND (the group's leader) has exited
	lost      error // why the lease was lost while something ran, if it was
	ending    bool  // the tree has been told to end (SIGTERM sent)
	killTimer <-chan time.Time
	killAgain *time.Ticker // SIGKILL again until the tree is gone
}

// run supervises until no process of COMMAND is left, then releases the
// lease and returns COMMAND's exit code, or 77 if the lease did not hold
// until the end.
func (s *supervision) run(ctx context.Context, sigs <-chan os.Signal) error {
	var reaped int
	var killAgain <-chan time.Time
	leaseDone := s.lease.Done()
loop:
	for {
		if s.killAgain != nil {
			killAgain = s.killAgain.C
		}
		select {
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
				if !s.ending {
					if n := s.terminate(); n > 0 {
						fmt.Fprintf(s.g.stderr, "fenced: %s exited and left %d processes; sending them SIGTERM, SIGKILL in %v\n", s.name, n, s.f.grace)
					}
				}
			case supervise.Gone:
				reaped = ev.Reaped
				break loop
			}
		case <-leaseDone:
			leaseDone = nil
			s.lose(s.lease.Err())
		case <-s.killTimer:
			s.killTimer = nil
			if n := s.grp.SignalAll(syscall.SIGKILL); n > 0 {
				fmt.Fprintf(s.g.stderr, "fenced: %d processes of %s still running %v after SIGTERM; sending SIGKILL\n", n, s.name, s.f.grace)
			}
			s.killAgain = time.NewTicker(100 * time.Millisecond)
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
	return s.finish(ctx)
}

// terminate sends SIGTERM to every process of COMMAND, and SIGCONT so that
// stopped ones can act on it, and arms SIGKILL after --grace. It returns
// how many processes it found.
func (s *supervision) terminate() int {
	s.ending = true
	n := s.grp.SignalAll(syscall.SIGTERM)
	s.grp.SignalAll(syscall.SIGCONT)
	if n > 0 {
		s.killTimer = time.After(s.f.grace)
	} else {
		s.killAgain = time.NewTicker(100 * time.Millisecond) // in case one was forking
	}
	return n
}

// lose records that the lease was lost and ends the tree, unless it ended
// by release (which happens only after the tree is gone).
func (s *supervision) lose(cause error) {
	if s.lost != nil || errors.Is(cause, fenced.ErrReleased) {
		return
	}
	s.lost = cause
	if s.ending {
		fmt.Fprintf(s.g.stderr, "fenced: lease on %s (fence %d) lost: %v; processes of %s are already being ended\n", s.key, s.lease.Fence(), cause, s.name)
		return
	}
	fmt.Fprintf(s.g.stderr, "fenced: lease on %s (fence %d) lost: %v; sending SIGTERM to %s and its processes, SIGKILL in %v\n", s.key, s.lease.Fence(), cause, s.name, s.f.grace)
	s.terminate()
}

// leaseValid reports whether the lease is held and within its local
// validity now, reading the clock rather than waiting for the lease's
// timers, which may not have run yet after a stop.
func (s *supervision) leaseValid() bool {
	return s.lease.Err() == nil && s.lease.Remaining() > 0
}

// suspend stops COMMAND's group, then fenced itself; once fenced is
// continued it continues the group if the lease is still valid, and
// otherwise kills the group, which never runs again.
func (s *supervision) suspend(why string) {
	s.grp.Stop()
	fmt.Fprintf(s.g.stderr, "fenced: %s; stopping %s and fenced (the lease on %s is not renewed while stopped and ends in %v)\n",
		why, s.name, s.key, s.lease.Remaining().Round(time.Millisecond))
	supervise.StopSelf()
	if s.leaseValid() {
		if s.g.verbose {
			fmt.Fprintf(s.g.stderr, "fenced: continued; the lease on %s is still valid (%v left): continuing %s\n", s.key, s.lease.Remaining().Round(time.Millisecond), s.name)
		}
		s.grp.Continue()
		return
	}
	cause := s.lease.Err()
	if cause == nil {
		cause = fmt.Errorf("%w: local validity ran out while stopped", fenced.ErrExpired)
	}
	s.lost = cause
	s.ending = true
	fmt.Fprintf(s.g.stderr, "fenced: continued after the lease on %s ended (%v); killing the stopped %s without continuing it\n", s.key, cause, s.name)
	s.grp.SignalAll(syscall.SIGKILL)
	s.killAgain = time.NewTicker(100 * time.Millisecond)
}

// finish releases the lease once the tree is gone and picks the exit code.
// The release doubles as the final check: a store that no longer has the
// grant (broken, or expired and perhaps granted again) refuses it, and the
// work is then reported as lost even if fenced had not noticed yet.
func (s *supervision) finish(ctx context.Context) error {
	validAtEnd := s.leaseValid()
	left := s.lease.Remaining()
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	relErr := s.lease.Release(relCtx)
	lost := s.lost
	switch {
	case lost != nil:
	case !validAtEnd:
		lost = s.lease.Err()
		if lost == nil || errors.Is(lost, fenced.ErrReleased) {
			lost = fmt.Errorf("%w: local validity ran out", fenced.ErrExpired)
		}
	case errors.Is(relErr, fenced.ErrNotHeld):
		lost = fmt.Errorf("the store no longer had the grant when %s ended (broken, or expired): %w", s.name, relErr)
	case relErr != nil:
		// The store could not be asked; the lease was valid by the local
		// clock (started before the grant was sent, minus the safety
		// margin) when the last process ended, which is the contract.
		fmt.Fprintf(s.g.stderr, "fenced: %v (the lease was valid for %v more when %s ended; it will expire by itself)\n", relErr, left.Round(time.Millisecond), s.name)
	}
	if lost != nil {
		what := "ran"
		if s.exited {
			what = fmt.Sprintf("ran (it exited %d)", s.code)
		}
		return withCode(exitLost, fmt.Errorf("run %s: the lease (fence %d) was lost before %s and its processes ended; %s %s, and its work may be incomplete or overlap another holder's: %w",
			s.key, s.lease.Fence(), s.name, s.name, what, lost))
	}
	if s.code != 0 {
		return withCode(s.code, nil)
	}
	return nil
}
