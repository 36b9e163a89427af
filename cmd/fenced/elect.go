package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

type electFlags struct {
	ttl, grace time.Duration
	value      string
	minFence   string
}

func newElectCmd(g *globals) *cobra.Command {
	f := &electFlags{}
	cmd := &cobra.Command{
		Use:   "elect [flags] NAME [flags --] COMMAND [ARGS...]",
		Short: "Campaign to lead NAME and run COMMAND while leader; stop it if leadership is lost",
		Long: `Elect campaigns for the leadership of NAME, waiting for as long as another process
leads, and runs COMMAND once this process leads. Leadership is a lease on NAME,
renewed every third of --ttl; its fence is the leader's epoch, higher for every new
leader. Send the epoch with every command COMMAND gives, and have followers and
resources refuse an epoch lower than the highest they have seen: a paused leader
that lost its term is then refused.

COMMAND's environment:
  FENCED_EPOCH  the leader's epoch (the lease's fence)
  FENCED_FENCE  the same number, for tools written for fenced run
  FENCED_KEY    NAME
  FENCED_OWNER  the owner digest (see fenced run --help)
  FENCED_STORE  the store URL with any password redacted

COMMAND is supervised exactly as by fenced run (see fenced run --help): when
leadership is lost, every process of COMMAND gets SIGTERM, then SIGKILL after
--grace, and fenced exits 77; when COMMAND ends, fenced resigns and exits with its
code. Run elect in a loop (systemd Restart=always) to stand again.

--value publishes a value with the leadership (an address, say), which fenced
observe and, on etcd, etcdctl elect -l show. Only etcd keeps a leader's value;
on other stores --value is an error. On etcd, NAME maps to the etcd election name
PREFIX+NAME (the store URL's prefix, default fenced/), and fenced elect and
etcdctl elect PREFIX+NAME exclude each other.`,
		Example: `  # one scheduler across the hosts sharing a store
  fenced elect --store postgres://app@db/app scheduler -- ./scheduler

  # publish the leader's address on etcd
  fenced elect --store etcd://10.0.0.1:2379 --value 10.0.0.7:8080 api-leader -- ./serve`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return withCode(exitUsage, errors.New("elect: no NAME: want NAME -- COMMAND [ARGS...]"))
			}
			name := args[0]
			argv, helped, err := commandAfter(cmd, "NAME", name, args[1:])
			if err != nil || helped {
				return err
			}
			if len(argv) == 0 {
				return withCode(exitUsage, errors.New("elect: no COMMAND: want NAME -- COMMAND [ARGS...]"))
			}
			return electAndRun(cmd.Context(), g, f, name, argv)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", 15*time.Second,
		"leadership lease time to live, positive; renewed every third of it; a dead leader is replaced after about this long")
	fl.DurationVar(&f.grace, "grace", 10*time.Second, "after SIGTERM on loss of leadership, how long before SIGKILL")
	fl.StringVar(&f.value, "value", "", "value to publish with the leadership (etcd only)")
	fl.StringVar(&f.minFence, "min-fence", "strict", "weakest fence (epoch) accepted: strict, repeatable or none; see fenced run --help")
	fl.SetInterspersed(false)
	return cmd
}

func electAndRun(ctx context.Context, g *globals, f *electFlags, name string, argv []string) error {
	if f.grace < 0 {
		return withCode(exitUsage, fmt.Errorf("elect: --grace %v is negative", f.grace))
	}
	minFence, err := parseFenceStrength(f.minFence)
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("elect: --min-fence: %w", err))
	}
	opts := &fenced.LeaseOptions{TTL: f.ttl, MinFence: minFence, FailOpen: false}

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	// A follower that finds the store busy at start waits for it as it
	// would for the leadership: until a signal (see openWaiting).
	openCtx, stopOpen := interruptible(ctx, sigs, "the store")
	c, err := g.openWaiting(openCtx, "elect")
	if sig := stopOpen(); sig != nil && err == nil {
		c.Close()
		return fmt.Errorf("interrupted by %v while opening the store; nothing ran", sig)
	}
	if err != nil {
		return err
	}
	var held *hold
	defer func() { closeClient(c, held) }()
	if err := checkTTL(c, "elect", f.ttl, opts); err != nil {
		return err
	}
	el, err := recipe.NewElection(c, name, opts)
	if err != nil {
		if errors.Is(err, fenced.ErrNoFence) {
			return noFenceError("elect", opts.MinFence, c.Capabilities())
		}
		return err
	}
	if f.value != "" && !c.Capabilities().Value {
		return withCode(exitUsage,
			fmt.Errorf("elect: --value: this store keeps no value with a leader (only etcd does); leave --value out"))
	}
	// The error names the key already.
	h, err := acquireOrInterrupt(ctx, sigs, "the leadership", func(acqCtx context.Context) (*hold, error) {
		ld, err := el.Campaign(acqCtx, f.value)
		if err != nil {
			return nil, err
		}
		env := append(childEnv(os.Environ(), ld.Lease, g.store), "FENCED_EPOCH="+strconv.FormatUint(ld.Fence(), 10))
		return &hold{lease: leaseHold{ld.Lease}, leases: []*fenced.Lease{ld.Lease}, env: env, granted: time.Now(), grace: f.grace,
			pause: pauserOf(c), desc: fmt.Sprintf("the leadership of %s (epoch %d)", name, ld.Fence())}, nil
	})
	if err != nil {
		return err
	}
	if g.verbose {
		fmt.Fprintf(g.stderr, "fenced: leading: %s\n", h.desc)
	}
	held = h
	return superviseCommand(ctx, g, h, argv, sigs)
}
