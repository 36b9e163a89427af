package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
)

type runFlags struct {
	ttl, wait, grace time.Duration
	maxHold          time.Duration
	minFence         string
}

func newRunCmd(g *globals) *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run KEY -- COMMAND [ARGS...]",
		Short: "Run COMMAND while holding a lease on KEY; stop it if the lease is lost",
		Long: `Run acquires a lease on KEY, runs COMMAND while renewing the lease, and releases
it when COMMAND exits. COMMAND gets FENCED_KEY, FENCED_FENCE and FENCED_STORE in its
environment: pass FENCED_FENCE with every write so the resource can refuse writes
from a holder that lost the lease while paused.

COMMAND runs in its own process group. Signals sent to fenced (INT, TERM, HUP, QUIT,
USR1, USR2) are forwarded to that group. If the lease is lost while COMMAND runs
(renewal refused, broken by an admin, or not confirmed before local validity ran
out), the group gets SIGTERM, then SIGKILL after --grace.

Exit codes:
  child's code  COMMAND ran under the lease (128+N if it died of signal N)
  75            KEY was held and --wait ran out: nothing ran
  77            the lease was lost while COMMAND ran (COMMAND was stopped)
  69            the store was unavailable: nothing ran
  64            usage error
  127           COMMAND could not be started`,
		Example: `  # run the nightly report unless another host is already running it
  fenced run report:nightly -- ./generate-report.sh

  # must-happen work: wait up to 5 minutes for the key
  fenced run --wait 5m --ttl 1m invoice:inv_72 -- ./send-invoice inv_72

  # on PostgreSQL instead of the embedded store
  FENCED_STORE=postgres://app@db/app fenced run migrate -- ./migrate up`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return withCode(exitUsage, errors.New("run: want KEY -- COMMAND [ARGS...]"))
			}
			if dash := cmd.ArgsLenAtDash(); dash != -1 && dash != 1 {
				return withCode(exitUsage, fmt.Errorf("run: want exactly one KEY before --, got %d arguments", dash))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return runUnderLease(cmd.Context(), g, f, args[0], args[1:])
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", 30*time.Second, "lease time to live, positive; renewed every third of it")
	fl.DurationVar(&f.wait, "wait", 0, "how long to wait for a held KEY (0: exit 75 at once if held)")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "after SIGTERM on lease loss, how long before SIGKILL")
	fl.DurationVar(&f.maxHold, "max-hold", 0, "stop renewing after this long; the lease then expires (0: no cap)")
	fl.StringVar(&f.minFence, "min-fence", "strict", "weakest fence the lease accepts: strict; repeatable (can repeat after a failover: single-node Redis); "+
		"none (no fence: Redlock without a fence source, or work whose duplicates only waste effort; the resource must then be protected otherwise)")
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
	child.Env = append(os.Environ(),
		"FENCED_KEY="+key,
		"FENCED_FENCE="+strconv.FormatUint(lease.Fence(), 10),
		"FENCED_STORE="+g.store,
	)
	child.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := child.Start(); err != nil {
		lease.Release(context.WithoutCancel(ctx))
		return withCode(127, fmt.Errorf("run: start %s: %w", argv[0], err))
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	group := -child.Process.Pid

	var lostCause error
	var killTimer <-chan time.Time
	var waitErr error
loop:
	for {
		select {
		case s := <-sigs:
			_ = syscall.Kill(group, s.(syscall.Signal))
		case <-lease.Done():
			if lostCause == nil && !errors.Is(lease.Err(), fenced.ErrReleased) {
				lostCause = lease.Err()
				fmt.Fprintf(g.stderr, "fenced: lease on %s (fence %d) lost: %v; sending SIGTERM to %s, SIGKILL in %v\n", key, lease.Fence(), lostCause, argv[0], f.grace)
				_ = syscall.Kill(group, syscall.SIGTERM)
				killTimer = time.After(f.grace)
			}
		case <-killTimer:
			fmt.Fprintf(g.stderr, "fenced: %s still running %v after SIGTERM; sending SIGKILL\n", argv[0], f.grace)
			_ = syscall.Kill(group, syscall.SIGKILL)
			killTimer = nil
		case waitErr = <-exited:
			break loop
		}
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	relErr := lease.Release(relCtx)
	if lostCause != nil {
		return withCode(exitLost, fmt.Errorf("run %s: the lease was lost while %s ran; its work may be incomplete: %w", key, argv[0], lostCause))
	}
	code := exitCode(child, waitErr)
	if relErr != nil && !errors.Is(relErr, fenced.ErrNotHeld) {
		fmt.Fprintf(g.stderr, "fenced: %v (the lease will expire by itself)\n", relErr)
	}
	if code != 0 {
		return withCode(code, nil)
	}
	return nil
}

func exitCode(cmd *exec.Cmd, err error) int {
	if cmd.ProcessState == nil {
		return exitError
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return cmd.ProcessState.ExitCode()
}
