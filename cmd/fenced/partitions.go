package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/cli/supervise"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"github.com/fenced-dev/fenced/recipe"
)

// newPartitionsCmd is `fenced partitions`: run, ls, and the hidden
// per-partition supervisor.
func newPartitionsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "partitions",
		Short: "Share P partitions among the live members of a group, one owner each, and run a command per owned partition",
	}
	cmd.AddCommand(newPartitionsRunCmd(g), newPartitionsLsCmd(g), newPartitionSuperviseCmd(g))
	return cmd
}

type partitionsFlags struct {
	partitions int
	ttl        time.Duration
	grace      time.Duration
	id         string
	minFence   string
	// The rebalancing knobs, as recipe.PartitionsOptions names them.
	weight          int
	threshold       float64
	dampening       float64
	maxInTransition int
}

func newPartitionsRunCmd(g *globals) *cobra.Command {
	f := &partitionsFlags{}
	cmd := &cobra.Command{
		Use:   "run GROUP -p P [flags] -- COMMAND [ARGS...]",
		Short: "Join GROUP and run COMMAND once for every partition this member owns",
		Long: `Run makes this process a member of GROUP, a group of P partitions (0 to P-1) shared
among its live members so that every partition has exactly one owner: each member
owns P/N of them, within one, and a partition moves only when a member joins,
leaves or dies. Every partition is a lease on GROUP/p/<i>; its fence rises with
every change of owner, so a resource that checks it refuses a previous owner.

For every partition it owns, run starts COMMAND with:
  FENCED_PARTITION  the partition's number
  FENCED_PARTITIONS P
  FENCED_FENCE      the partition lease's fence; send it with every write
  FENCED_KEY        GROUP/p/<i>
  FENCED_OWNER      the owner digest (see fenced run --help)
  FENCED_STORE      the store URL with any password redacted

The member is one store client (one connection pool) for its membership and every
partition it holds. Each COMMAND runs under a supervisor process of its own, which
holds it as fenced run does (its own process group, a cgroup where the system allows
it, every process it starts) and which the member tells the partition lease's
validity after every renewal; the supervisors hold no store client. The lease is
released only once no process of COMMAND is left. COMMAND runs once per partition,
not once per member, so that a hand-off or loss ends the one partition's processes
while the others run on (docs/supervision.md says why, and what a member costs).
  - Handed off to another member, or the member leaves: every process of COMMAND
    gets SIGTERM, then SIGKILL after --grace, while the member keeps the lease.
  - Lost, or not renewed (the store is cut off, the member is stopped with
    SIGSTOP or starved of CPU): the processes get SIGTERM, and SIGKILL after
    --grace but before the validity the supervisor last heard of ends, so that
    none writes with the old fence once another member can be granted the
    partition.
  - The member dies (kill -9): the processes get SIGKILL at once.
--grace must be shorter than --ttl.

What each mode (cgroup or process tree, see fenced run --help) promises:
  lease not renewed, member stopped or starved   none after (both modes)
  kill -9 of the member                          none after (both modes)
  lease broken, renewal refused                  ended
  SIGSTOP of a partition's supervisor            as SIGSTOP of fenced run
  kill -9 of a partition's supervisor            as kill -9 of fenced run
"none after": no write with the old fence is attempted once another member may be
granted the partition; "ended": SIGTERM, then SIGKILL, but the store may have
granted the partition already; "fence only": COMMAND may run on, and only the
resource's fence check protects. docs/supervision.md has the whole table, and its
tests.

A COMMAND that exits by itself is started again, with a new fence, at the member's
next look at the group (a third of --ttl). SIGINT or SIGTERM makes the member
leave: it ends every COMMAND, releases its partitions and exits 0. Every member
must use the same -p.

Each line the member and its supervisors write on stderr starts with the time, in
UTC to the millisecond (2006-01-02T15:04:05.000Z); COMMAND's own output is passed
through as it is, and the last line of an error exit ("fenced: ... (exit N)")
carries no time.`,
		Example: `  # 64 shards of billing work across the hosts that run this
  fenced partitions run --store postgres://app@db/app billing -p 64 -- ./bill-shard`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case len(args) == 0 || dash == 0:
				return withCode(exitUsage, errors.New("partitions run: no GROUP: want GROUP -p P -- COMMAND [ARGS...]"))
			case dash < 0:
				return withCode(exitUsage, errors.New("partitions run: no -- before COMMAND: want GROUP -p P -- COMMAND [ARGS...]"))
			case dash > 1:
				return withCode(exitUsage, fmt.Errorf("partitions run: %q: one GROUP before --, got %d words", args[:dash], dash))
			case dash == len(args):
				return withCode(exitUsage, errors.New("partitions run: no COMMAND after --"))
			}
			g.stderr = newLineStamper(g.stderr) // a member runs for long: its lines say when
			return runPartitions(cmd.Context(), g, f, args[0], args[1:])
		},
	}
	fl := cmd.Flags()
	fl.IntVarP(&f.partitions, "partitions", "p", 0, "number of partitions of the group, the same for every member (required)")
	fl.DurationVar(&f.ttl, "ttl", 15*time.Second,
		"lease time to live of the membership and of each partition; a dead member's partitions move after about this long")
	fl.DurationVar(&f.grace, "grace", 10*time.Second,
		"after SIGTERM on loss or hand-off of a partition, how long before SIGKILL; shorter than --ttl, "+
			"and cut to the lease's validity left")
	fl.StringVar(&f.id, "id", "",
		"member ID (no '/'); a member that restarts with the same ID gets its partitions back (default: the host name and process ID)")
	fl.StringVar(&f.minFence, "min-fence", "strict", "weakest partition fence accepted: strict, repeatable or none; see fenced run --help")
	fl.IntVar(&f.weight, "weight", 1, "the member's capacity: members share the partitions in proportion to their weights (1 to 10000)")
	fl.Float64Var(&f.threshold, "rebalance-threshold", 0.1,
		"no voluntary move while every member holds within this share of its weighted share "+
			"(KCL's reBalanceThresholdPercentage, as a fraction; [0, 1))")
	fl.Float64Var(&f.dampening, "dampening", 0.8,
		"the share of its excess a member hands off at once, the rest after those hand-offs end "+
			"(KCL's dampeningPercentage, as a fraction; (0, 1])")
	fl.IntVar(&f.maxInTransition, "max-in-transition", 0,
		"the most partitions in hand-off in the group at once (Helix's maxPartitionInTransition; 0: a quarter of the partitions); "+
			"a dead member's partitions are never held back")
	return cmd
}

func runPartitions(ctx context.Context, g *globals, f *partitionsFlags, group string, argv []string) error {
	switch {
	case f.partitions == 0:
		return withCode(exitUsage,
			fmt.Errorf("partitions run: no -p: give the number of partitions, 1 to %d, the same for every member", limits.MaxPartitions))
	case f.partitions < 1 || f.partitions > limits.MaxPartitions:
		return withCode(exitUsage, fmt.Errorf("partitions run: -p %d: want 1 to %d partitions", f.partitions, limits.MaxPartitions))
	case f.grace < 0:
		return withCode(exitUsage, fmt.Errorf("partitions run: --grace %v is negative", f.grace))
	}
	minFence, err := parseFenceStrength(f.minFence)
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("partitions run: --min-fence: %w", err))
	}
	id := f.id
	if id == "" {
		host, _ := os.Hostname()
		id = host + "-" + strconv.Itoa(os.Getpid())
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("partitions run: %w", err)
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	c, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := checkTTL(c, "partitions run", f.ttl, &fenced.LeaseOptions{MinFence: minFence}); err != nil {
		return err
	}
	if f.grace >= f.ttl {
		return withCode(exitUsage,
			fmt.Errorf("partitions run: --grace %v is not shorter than --ttl %v: the lease would run out first; "+
				"give a --grace below the TTL", f.grace, f.ttl))
	}

	work := func(ctx context.Context, p recipe.Partition) error {
		vars := append(childEnv(nil, p.Lease, g.store),
			"FENCED_PARTITION="+strconv.Itoa(p.Index), "FENCED_PARTITIONS="+strconv.Itoa(f.partitions))
		return superviseProcess(ctx, g, self, f.grace, p.Lease, argv, vars)
	}
	opts := &recipe.PartitionsOptions{
		MemberID:     id,
		Lease:        &fenced.LeaseOptions{TTL: f.ttl, MinFence: minFence},
		HandoffGrace: f.grace + f.ttl,
		Weight:       f.weight, RebalanceThreshold: f.threshold, Dampening: f.dampening, MaxInTransition: f.maxInTransition,
		OnEvent: func(e recipe.PartitionEvent) {
			if !g.verbose {
				return
			}
			switch e.Kind {
			case fenced.EventAcquire:
				fmt.Fprintf(g.stderr, "fenced: %s: acquired partition %d (fence %d)\n", id, e.Partition, e.Fence)
			case fenced.EventRelease:
				fmt.Fprintf(g.stderr, "fenced: %s: released partition %d (fence %d): %s\n", id, e.Partition, e.Fence, errText(e.Cause))
			}
		},
	}
	joinCtx, stopJoin := interruptible(ctx, sigs, "the membership")
	m, err := recipe.JoinPartitions(joinCtx, c, group, f.partitions, work, opts)
	if sig := stopJoin(); sig != nil && err == nil {
		m.Leave(context.WithoutCancel(ctx))
		return fmt.Errorf("partitions run: interrupted by %v as the membership was granted; left the group", sig)
	}
	if err != nil {
		switch {
		case errors.Is(err, fenced.ErrNoFence):
			return noFenceError("partitions run", minFence, c.Capabilities())
		case errors.Is(err, recipe.ErrPartitionCount), errors.Is(err, recipe.ErrMemberLive):
			return withCode(exitUsage, err)
		}
		return err
	}
	if g.verbose {
		fmt.Fprintf(g.stderr, "fenced: %s joined %s (%d partitions)\n", id, group, f.partitions)
	}
	for {
		select {
		case sig := <-sigs:
			if slices.Contains(stopSignals, sig) {
				continue
			}
			fmt.Fprintf(g.stderr, "fenced: %v: leaving %s\n", sig, group)
			return m.Leave(context.WithoutCancel(ctx))
		case <-m.Done():
			return m.Leave(context.WithoutCancel(ctx))
		}
	}
}

// superviseProcess runs argv, with the FENCED_ variables vars, under a
// `fenced partitions supervise` child of this binary, which supervises it
// as fenced run does, until ctx ends or it exits. It returns once the
// child, and so every process of argv, is gone.
//
// The child holds no lease: it learns of the partition's lease by a pipe
// (its fd 3), on which this member writes lines (see pipeLink):
//
//	valid N       the lease's local validity ends at N, in nanoseconds of
//	              CLOCK_MONOTONIC, a clock both processes read alike; sent
//	              before the child starts and after each renewal
//	end KIND:WHY  the partition is lost (KIND "lost"; "expired" when its
//	              local validity ran out unrenewed) or handed off, or the
//	              member leaves ("planned"): the child ends argv's tree
//
// and closes it only once the child has exited. So the child ends the tree
// before the validity the member last sent ends, if no fresher one
// arrives: a member that is stopped (SIGSTOP), starved, or cut from the
// store stops sending, and its commands are ended before another member
// can be granted their partitions. A pipe that closes while the child
// runs means the member died: the child sends SIGKILL at once. A child
// killed with SIGKILL leaves the tree to its guard, which holds the
// child's fd 4, a second pipe: this member returns only at its end of
// file, once the guard has killed the tree too.
func superviseProcess(ctx context.Context, g *globals, self string, grace time.Duration, lease *fenced.Lease, argv, vars []string) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer w.Close()
	// The pipe holds this line for the child before it starts: it knows
	// the validity before it starts argv.
	sent := validUntil(lease)
	if _, err := fmt.Fprintf(w, "valid %d\n", sent); err != nil {
		r.Close()
		return err
	}
	args := []string{"partitions", "supervise", "--grace", grace.String()}
	for _, kv := range vars {
		args = append(args, "--env", kv)
	}
	args = append(args, "--")
	if g.verbose {
		args = append([]string{"-v"}, args...)
	}
	// The lifeline's write end is held by the child and by its guard,
	// which outlives a child killed with SIGKILL until it has killed the
	// tree the child left: its end of file means the tree is gone.
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		r.Close()
		return err
	}
	cmd := exec.Command(self, append(args, argv...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{r, lifeW} // fds 3 and 4
	// Its own group: a terminal's ^C reaches this member, which leaves,
	// and the supervisors end their commands when told.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	lifeW.Close()
	if err != nil {
		lifeR.Close()
		return err
	}
	var orphaned atomic.Bool // the child died; its guard is killing the tree
	desc := partitionDesc(vars)
	waited := awaitTree(g, cmd, lifeR, desc, &orphaned)
	// The validity is read often enough that the child learns of a
	// renewal well before the end it knows of comes near.
	poll := validityPoll(lease)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	// A child that does not read (stopped) must not block this loop once
	// the pipe is full: a line that cannot be written within a poll is
	// dropped, and the child acts on the validity it has.
	send := func(format string, a ...any) {
		_ = w.SetWriteDeadline(time.Now().Add(poll))
		_, _ = fmt.Fprintf(w, format, a...)
	}
	done := ctx.Done()
	for {
		select {
		case err := <-waited:
			return err
		case <-tick.C:
			if v := validUntil(lease); v > sent {
				sent = v
				send("valid %d\n", v)
			}
		case <-done:
			done = nil
			// Why, for the child's messages: a hand-off or leave is
			// planned, anything else a loss. A hand-off keeps the lease,
			// renewed, until the child has ended argv.
			cause := context.Cause(ctx)
			kind := "lost"
			switch {
			case errors.Is(cause, recipe.ErrHandedOff) || errors.Is(cause, recipe.ErrLeft):
				kind = "planned"
			case errors.Is(cause, fenced.ErrExpired):
				kind = "expired" // the supervisor may have slept past it
			}
			// One line shorter than PIPE_BUF is written whole or not at all.
			why := strings.ReplaceAll(errText(cause), "\n", " ")
			if len(why) > 1000 {
				why = why[:1000]
			}
			send("end %s:%s\n", kind, why)
			if orphaned.Load() && kind != "planned" {
				// Nobody renewed it in time (this member starved or cut
				// off): the store may grant it again while the tree runs.
				fmt.Fprintf(g.stderr, "fenced: %s: the lease ended (%s) before the supervisor's guard had killed every "+
					"process of COMMAND\n", desc, why)
			}
		}
	}
}

// awaitTree returns what cmd.Wait returned, once cmd has exited and the
// lifeline lifeR is closed: by cmd and by its guard, which a child killed
// with SIGKILL leaves to kill its tree. Only then may the lease go.
//
// orphaned is set while the guard alone is left to kill the tree.
func awaitTree(g *globals, cmd *exec.Cmd, lifeR *os.File, desc string, orphaned *atomic.Bool) <-chan error {
	treeGone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, lifeR)
		lifeR.Close()
		close(treeGone)
	}()
	waited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		select {
		case <-treeGone:
		case <-time.After(time.Second):
			if err == nil {
				<-treeGone // a slow guard after a clean exit: nothing to say
				break
			}
			orphaned.Store(true)
			fmt.Fprintf(g.stderr, "fenced: %s: its supervisor exited (%v); the lease is kept until the supervisor's guard "+
				"has killed every process of COMMAND\n", desc, err)
			<-treeGone
		}
		waited <- err
	}()
	return waited
}

// isPipe reports whether fd is open on a pipe.
func isPipe(fd int) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO
}

// validUntil returns when l's local validity ends, in nanoseconds of
// CLOCK_MONOTONIC: the clock is read before the validity left, so the
// result is never later than the true end.
func validUntil(l *fenced.Lease) int64 {
	now := monotonicNow()
	return now + int64(l.Remaining())
}

// validityPoll is how often the member reads a partition lease's validity
// for its supervisor: a twentieth of the validity, between 10ms and 500ms.
func validityPoll(l *fenced.Lease) time.Duration {
	return min(max(l.Remaining()/20, 10*time.Millisecond), 500*time.Millisecond)
}

// monotonicNow reads CLOCK_MONOTONIC, in nanoseconds: one clock for every
// process of the machine (of one time namespace), which neither steps nor
// counts a suspend, as Go's own monotonic readings.
func monotonicNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// pipeLink is the hold of a `fenced partitions supervise` process: the
// partition's lease is held by the parent member, which reports its
// validity, and the partition's end, on fd 3 (see superviseProcess).
type pipeLink struct {
	until atomic.Int64  // the validity's end, CLOCK_MONOTONIC ns
	done  chan struct{} // closed at "end" or at the pipe's close
	dead  chan struct{} // closed at the pipe's close: the member died
	why   string        // what "end" said, set before done closes
}

// newPipeLink reads the first validity from link, then follows link in
// the background.
func newPipeLink(link io.Reader) (*pipeLink, error) {
	p := &pipeLink{done: make(chan struct{}), dead: make(chan struct{})}
	sc := bufio.NewScanner(io.LimitReader(link, 1<<30))
	if !sc.Scan() {
		return nil, errors.New("the member sent no validity on fd 3")
	}
	if err := p.line(sc.Text()); err != nil || p.until.Load() == 0 {
		return nil, fmt.Errorf("the member's first line on fd 3 is %q, want \"valid N\"", sc.Text())
	}
	go func() {
		ended := false
		for sc.Scan() {
			if why, ok := strings.CutPrefix(sc.Text(), "end "); ok && !ended {
				ended = true
				p.why = why
				close(p.done)
				continue
			}
			_ = p.line(sc.Text())
		}
		// dead closes first: a supervisor that sees done for a death
		// finds dead closed too, and kills at once.
		close(p.dead)
		if !ended {
			close(p.done)
		}
	}()
	return p, nil
}

// line applies a "valid N" line; a validity never moves back.
func (p *pipeLink) line(l string) error {
	v, ok := strings.CutPrefix(l, "valid ")
	if !ok {
		return fmt.Errorf("unknown line %q", l)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return err
	}
	for {
		old := p.until.Load()
		if n <= old || p.until.CompareAndSwap(old, n) {
			return nil
		}
	}
}

func (p *pipeLink) Done() <-chan struct{} { return p.done }

func (p *pipeLink) Err() error {
	select {
	case <-p.done:
		if why, ok := strings.CutPrefix(p.why, "planned:"); ok {
			return plannedEnd(why)
		}
		if why, ok := strings.CutPrefix(p.why, "lost:"); ok {
			return fmt.Errorf("%w: %s", fenced.ErrLost, why)
		}
		if why, ok := strings.CutPrefix(p.why, "expired:"); ok {
			return fmt.Errorf("%w: %w", fenced.ErrLost, expiredEnd(why))
		}
		return fmt.Errorf("%w: the member died", fenced.ErrLost)
	default:
		return nil
	}
}

// expiredEnd is the member's word that a partition's lease ran out of
// local validity unrenewed; it matches fenced.ErrExpired, so a supervisor
// that did not run meanwhile kills at once, as `fenced run` does.
type expiredEnd string

func (e expiredEnd) Error() string { return string(e) }

// Is matches fenced.ErrExpired.
func (e expiredEnd) Is(target error) bool { return target == fenced.ErrExpired }

// plannedEnd is the end of a partition's hold that is no loss: the
// partition was handed off to another member, or its member left the
// group. The member releases the lease only after COMMAND has ended.
type plannedEnd string

func (e plannedEnd) Error() string { return string(e) }

// isPlannedEnd reports whether err is a plannedEnd.
func isPlannedEnd(err error) bool {
	var p plannedEnd
	return errors.As(err, &p)
}

// Remaining is the validity left by the end the member last reported, on
// this process's clock. It keeps counting after "end" (a hand-off keeps the
// lease) and after the member's death. So SIGKILL always goes out before
// the validity ends.
func (p *pipeLink) Remaining() time.Duration {
	return time.Duration(max(0, p.until.Load()-monotonicNow()))
}

func (p *pipeLink) Release(context.Context) error { return nil }

func newPartitionSuperviseCmd(g *globals) *cobra.Command {
	var grace time.Duration
	var vars []string
	cmd := &cobra.Command{
		Use:    "supervise --grace D -- COMMAND [ARGS...]",
		Short:  "Supervise COMMAND for fenced partitions run until fd 3 closes (internal)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			g.stderr = newLineStamper(g.stderr)
			link := os.NewFile(3, "member")
			if link == nil {
				return withCode(exitUsage, errors.New("partitions supervise: no pipe on fd 3; it is run by fenced partitions run"))
			}
			// COMMAND inherits neither pipe. The guard keeps the lifeline
			// open until the tree is gone (see superviseProcess). A member
			// started from an earlier binary, before a deploy replaced it,
			// passes no lifeline: fd 4 is then not a pipe, and is left be.
			syscall.CloseOnExec(3)
			if isPipe(4) {
				syscall.CloseOnExec(4)
				supervise.GuardHolds(os.NewFile(4, "lifeline"))
			}
			pl, err := newPipeLink(link)
			if err != nil {
				return withCode(exitUsage, fmt.Errorf("partitions supervise: %w; it is run by fenced partitions run", err))
			}
			sigs := make(chan os.Signal, 8)
			signal.Notify(sigs, forwarded...)
			defer signal.Stop(sigs)
			h := &hold{lease: pl, env: append(cleanEnv(os.Environ()), vars...), granted: time.Now(), grace: grace,
				desc: partitionDesc(vars), dead: pl.dead}
			return superviseCommand(cmd.Context(), g, h, argv, sigs)
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "after SIGTERM, how long before SIGKILL")
	cmd.Flags().StringArrayVar(&vars, "env", nil, "a FENCED_ variable K=V for COMMAND's environment")
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func newPartitionsLsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ls GROUP",
		Short: "Show GROUP's live members and its partitions: holder fence, time left, and the member each should move to",
		Long: `Ls shows the live members of GROUP, each with its partition count and the time left on
its membership, and every partition: whether it is held, its fence, the time left on
its lease, and its target, the member the assignment gives it. The lag is the number
of partitions not held: being handed off, or waiting for a dead owner's lease to run out.

A group with no live member and no partition lease (no such group, or every member
gone) is an error, exit 1; with -o json it prints that empty state and exits 0, for
scripts that poll a group as it forms.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			return lsPartitions(cmd.Context(), g, args[0])
		},
	}
	addOutputFlag(cmd, g)
	return cmd
}

// partitionRow is one partition as ls shows it.
type partitionRow struct {
	Partition int           `json:"partition"`
	Held      bool          `json:"held"`
	Owner     string        `json:"owner,omitempty"`
	Fence     uint64        `json:"fence"`
	Remaining time.Duration `json:"remaining_ns"`
	Target    string        `json:"target"`
}

func lsPartitions(ctx context.Context, g *globals, group string) error {
	c, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	st, err := recipe.ReadGroup(ctx, c, group)
	if err != nil {
		return err
	}
	members := st.Members
	p := st.Partitions()
	live := 0
	for _, m := range members {
		if m.Partitions == p {
			live++
		}
	}
	target := map[int]string{}
	for id, ps := range st.Targets() {
		for _, i := range ps {
			target[i] = id
		}
	}
	rows := make([]partitionRow, p)
	for i := range rows {
		rows[i] = partitionRow{Partition: i, Target: target[i]}
	}
	lag := p
	for i, in := range st.Leases {
		if i < p {
			rows[i].Held, rows[i].Owner, rows[i].Fence, rows[i].Remaining = true, st.Owners[i], in.Fence, in.Remaining
			lag--
		}
	}
	if g.output == "json" {
		return json.NewEncoder(g.stdout).Encode(map[string]any{
			"group": group, "partitions": p, "members": members, "lag": lag, "partition": rows,
			"invalid": append([]string{}, st.Invalid...),
		})
	}
	if len(members) == 0 && len(st.Leases) == 0 && len(st.Invalid) == 0 {
		return fmt.Errorf("partitions ls: group %q has no live member and no partition lease: no such group, or every member is gone",
			group)
	}
	g.writeStoreHeader(g.stdout)
	fmt.Fprintf(g.stdout, "group %s: %d partitions, %d members, lag %d (partitions not held)\n", group, p, live, lag)
	if len(st.Invalid) > 0 {
		fmt.Fprintf(g.stdout, "invalid keys (shaped like the group's, made by no member): %s\n", strings.Join(st.Invalid, ", "))
	}
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tPARTITIONS\tREMAINING")
	for _, m := range members {
		fmt.Fprintf(tw, "%s\t%d\t%v\n", m.ID, m.Partitions, m.Remaining.Round(time.Millisecond))
	}
	tw.Flush()
	tw = tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tHELD\tOWNER\tFENCE\tREMAINING\tTARGET")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%v\t%s\t%d\t%v\t%s\n", r.Partition, r.Held, r.Owner, r.Fence, r.Remaining.Round(time.Millisecond), r.Target)
	}
	return tw.Flush()
}

// partitionDesc names the partition of the FENCED_ variables vars, for
// messages: "partition 3 of billing (fence 7)".
func partitionDesc(vars []string) string {
	get := func(k string) string {
		for _, kv := range vars {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return "?"
	}
	key := get("FENCED_KEY")
	group, _, _ := strings.Cut(key, "/p/")
	return fmt.Sprintf("partition %s of %s (fence %s)", get("FENCED_PARTITION"), group, get("FENCED_FENCE"))
}
