package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	_ "github.com/fenced-dev/fenced/fenceddynamodb"
	_ "github.com/fenced-dev/fenced/fencedetcd"
	_ "github.com/fenced-dev/fenced/fencedmysql"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	_ "github.com/fenced-dev/fenced/fencedredis"
	_ "github.com/fenced-dev/fenced/fencedredlock"
	"github.com/fenced-dev/fenced/fencedsqlite"
	_ "github.com/fenced-dev/fenced/fencedzookeeper"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
	_ "github.com/fenced-dev/fenced/mem"
)

// Exit codes, documented in the package comment and in --help.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 64
	exitUnavailable = 69
	exitHeld        = 75
	exitLost        = 77
)

// exitErr carries an exit code out of a command.
type exitErr struct {
	code int
	err  error
}

func (e *exitErr) Error() string { return e.err.Error() }
func (e *exitErr) Unwrap() error { return e.err }

func withCode(code int, err error) error { return &exitErr{code: code, err: err} }

// codeFor maps library errors to exit codes.
func codeFor(err error) int {
	var ee *exitErr
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, fenced.ErrHeld):
		return exitHeld
	case errors.Is(err, fenced.ErrUnavailable):
		return exitUnavailable
	case errors.Is(err, fenced.ErrInvalidKey), errors.Is(err, fenced.ErrInvalidTTL), errors.Is(err,
		fenced.ErrInvalidOptions), errors.Is(err, fenced.ErrInvalidURL):
		return exitUsage
	}
	return exitError
}

type globals struct {
	store   string
	verbose bool
	quiet   bool // no note that the default store is used
	noted   bool // the note was written
	// storeChosen reports whether --store or FENCED_STORE chose the
	// store, storeFlag whether --store did (both set by newRoot).
	storeChosen, storeFlag func() bool
	output                 string
	stdout                 io.Writer
	stderr                 io.Writer
	extra                  []*cobra.Command // hidden commands registered by others
}

func execute(args []string, stdout, stderr io.Writer) int {
	g := &globals{stdout: stdout, stderr: stderr}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ee *exitErr
	if errors.As(err, &ee) && ee.err == nil {
		return ee.code
	}
	code := codeFor(err)
	if strings.HasPrefix(err.Error(), "unknown command") || strings.Contains(err.Error(), "flag") ||
		strings.Contains(err.Error(), "arg(s)") {
		code = exitUsage
	}
	// The "(exit N)" tells fenced's own exit codes from a command's: fenced
	// run passes a command's code on with no such line (see run --help).
	// g.stderr: partitions run and supervise put the time before it.
	fmt.Fprintf(g.stderr, "fenced: %s (exit %d)\n", strings.TrimPrefix(err.Error(), "fenced: "), code)
	return code
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "fenced",
		Short: "Leases with fencing tokens: run commands under a lease, list, inspect and break leases",
		Long: `fenced grants leases on keys from a store you already run, with a fencing token
(FENCED_FENCE) that strictly increases on every grant, renews them while your work
runs, and stops the work the moment the lease is lost.

The store is chosen with --store or FENCED_STORE. The default is the embedded SQLite
file ` + defaultStoreHint() + `, which is per user:
another user, or the same user with another HOME or XDG_STATE_HOME (cron, sudo,
systemd), gets another file, and their leases never exclude each other. -v prints
the store actually used; without --store or FENCED_STORE every command says once
that it uses the default (--quiet hides that line).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	def := os.Getenv("FENCED_STORE")
	if def == "" {
		def = "sqlite:"
	}
	root.PersistentFlags().StringVar(&g.store, "store", def,
		"store URL (env FENCED_STORE; schemes: "+strings.Join(rootaccess.Schemes(), ", ")+"; default: a per-user SQLite file)")
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "say on stderr which store is used and what fenced does")
	root.PersistentFlags().BoolVarP(&g.quiet, "quiet", "q", false,
		"do not say on stderr that the default store is used when none was chosen")
	fromEnv := os.Getenv("FENCED_STORE") != ""
	g.storeFlag = func() bool { return root.PersistentFlags().Changed("store") }
	g.storeChosen = func() bool { return fromEnv || g.storeFlag() }
	root.AddCommand(newRunCmd(g), newLsCmd(g), newInspectCmd(g), newBreakCmd(g), newGuaranteesCmd(g), newDemoCmd(g))
	root.AddCommand(newFloorCmd(g), newPruneCmd(g))
	root.AddCommand(newProofCmd(g))
	root.AddCommand(newElectCmd(g), newObserveCmd(g))
	root.AddCommand(newPlanCmd(g))
	root.AddCommand(newPartitionsCmd(g))
	root.AddCommand(newServeCmd(g), newVersionCmd(g))
	root.AddCommand(g.extra...)
	return root
}

func defaultStoreHint() string {
	return "sqlite: ($XDG_STATE_HOME/fenced/fenced.db or ~/.local/state/fenced/fenced.db)"
}

func (g *globals) open(ctx context.Context) (*fenced.Client, error) {
	g.noteStore()
	return fenced.Open(ctx, g.store, nil)
}

// noteStore says on stderr which store is used: with -v always, and once
// when no store was chosen (neither --store nor FENCED_STORE), unless
// --quiet, since leases on the per-user default file exclude nobody using
// another store.
func (g *globals) noteStore() {
	switch {
	case g.verbose:
		fmt.Fprintf(g.stderr, "fenced: store %s\n", describeStore(g.store))
	case g.quiet || g.noted || g.storeChosen == nil || g.storeChosen():
		return
	default:
		fmt.Fprintf(g.stderr, "fenced: no store chosen, using %s; choose one with --store or FENCED_STORE (--quiet hides this line)\n",
			describeStore(g.store))
	}
	g.noted = true
}

// writeStoreHeader writes the store line that heads the table output of
// ls and observe.
func (g *globals) writeStoreHeader(w io.Writer) {
	fmt.Fprintf(w, "store: %s\n", describeStore(g.store))
}

// describeStore returns the store URL, password redacted, with the default
// SQLite file spelled out, so a user can see which file (whose) the leases
// are in.
func describeStore(store string) string {
	u, err := storeurl.Parse(store)
	if err != nil || u.Scheme != "sqlite" || u.Opaque != "" || u.Path != "" {
		return storeurl.Redact(store)
	}
	p, err := fencedsqlite.DefaultPath()
	if err != nil {
		return storeurl.Redact(store) + " (no default file: " + err.Error() + ")"
	}
	u.Path = p
	return storeurl.Redact(u.String()) + " (the default, per user)"
}

// flagFence is the --min-fence value that names s.
func flagFence(s fenced.FenceStrength) string {
	switch s {
	case fenced.FenceStrict:
		return "strict"
	case fenced.FenceRepeatable:
		return "repeatable"
	}
	return "none"
}

// noFenceError is a command's refusal of a store whose fence is weaker
// than --min-fence min, in the CLI's words: it names the flag's values,
// not the library's option names.
func noFenceError(command string, min fenced.FenceStrength, g driver.Capabilities) error {
	what := "issues no fencing token"
	if g.Fence >= fenced.FenceRepeatable {
		what = "has a fence that can repeat (" + g.Fence.String() + ")"
	}
	return withCode(exitUsage,
		fmt.Errorf("%s: %w: this store %s, weaker than --min-fence %s (the default is strict)\n(%s)\n(the store says: %s)",
			command, fenced.ErrNoFence, what, flagFence(min), minFenceHint(command, g), g.Note))
}

// withClient opens the store, runs fn and closes the store.
func (g *globals) withClient(ctx context.Context, fn func(*fenced.Client) error) error {
	c, err := g.open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(c)
}

func addOutputFlag(cmd *cobra.Command, g *globals) {
	cmd.Flags().StringVarP(&g.output, "output", "o", "table", "output format: table or json")
}

func (g *globals) checkOutput() error {
	if g.output != "table" && g.output != "json" {
		return withCode(exitUsage, fmt.Errorf("--output %q: want table or json", g.output))
	}
	return nil
}

// leaseJSON is the machine-readable form of a lease, stable for scripts.
type leaseJSON struct {
	Key         string  `json:"key"`
	Held        bool    `json:"held"`
	Fence       uint64  `json:"fence"`
	Owner       string  `json:"owner,omitempty"`
	RemainingMS int64   `json:"remaining_ms"`
	Breaks      []brkJS `json:"breaks,omitempty"`
}

type brkJS struct {
	Time   time.Time `json:"time"`
	Fence  uint64    `json:"fence"`
	Owner  string    `json:"owner"`
	Reason string    `json:"reason"`
	By     string    `json:"by"`
}

func toJSON(i fenced.LeaseInfo) leaseJSON {
	return leaseJSON{Key: i.Key, Held: i.Held, Fence: i.Fence, Owner: i.Owner, RemainingMS: i.Remaining.Milliseconds()}
}

func newLsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ls [PREFIX]",
		Short: "List held leases, optionally only keys starting with PREFIX",
		Example: `  fenced ls
  fenced ls invoice:
  fenced ls -o json --store postgres://app@db/app`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			var infos []fenced.LeaseInfo
			err := g.withClient(cmd.Context(), func(c *fenced.Client) (err error) {
				infos, err = c.List(cmd.Context(), prefix)
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				out := make([]leaseJSON, 0, len(infos))
				for _, i := range infos {
					out = append(out, toJSON(i))
				}
				return writeJSON(g.stdout, out)
			}
			g.writeStoreHeader(g.stdout)
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "KEY\tFENCE\tOWNER\tREMAINING")
			for _, i := range infos {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", i.Key, i.Fence, i.Owner, fmtLeft(i.Remaining))
			}
			return tw.Flush()
		},
	}
	addOutputFlag(cmd, g)
	return cmd
}

func fmtLeft(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newInspectCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "Show a key's holder, fence, time left and recorded breaks",
		Example: `  fenced inspect invoice:inv_72
  fenced inspect invoice:inv_72 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			var info fenced.LeaseInfo
			var breaks []driver.BreakRecord
			var commands string
			err := g.withClient(cmd.Context(), func(c *fenced.Client) (err error) {
				if info, err = c.Inspect(cmd.Context(), args[0]); err != nil {
					return err
				}
				// A Redis store says whether it renews and releases with
				// the server's conditional commands or with scripts.
				if d, ok := rootaccess.Driver(c).(interface{ Commands(context.Context) string }); ok {
					commands = d.Commands(cmd.Context())
				}
				breaks, _ = c.Breaks(cmd.Context(), args[0]) // not every store keeps them
				return nil
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				j := toJSON(info)
				for _, b := range breaks {
					j.Breaks = append(j.Breaks, brkJS{Time: b.Time.UTC(), Fence: b.Fence, Owner: b.Owner, Reason: b.Reason, By: b.By})
				}
				return writeJSON(g.stdout, j)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			state := "free"
			if info.Held {
				state = "held"
			}
			fmt.Fprintf(tw, "store:\t%s\n", describeStore(g.store))
			if commands != "" {
				fmt.Fprintf(tw, "commands:\t%s\n", commands)
			}
			fmt.Fprintf(tw, "key:\t%s\n", info.Key)
			fmt.Fprintf(tw, "state:\t%s\n", state)
			fmt.Fprintf(tw, "fence:\t%d\n", info.Fence)
			if info.Held {
				fmt.Fprintf(tw, "owner:\t%s\n", info.Owner)
				fmt.Fprintf(tw, "remaining:\t%s\n", fmtLeft(info.Remaining))
			}
			for _, b := range breaks {
				fmt.Fprintf(tw, "broken:\t%s fence %d by %s: %s\n", b.Time.UTC().Format(time.RFC3339), b.Fence, b.By, b.Reason)
			}
			return tw.Flush()
		},
	}
	addOutputFlag(cmd, g)
	return cmd
}

func newBreakCmd(g *globals) *cobra.Command {
	var reason, by string
	cmd := &cobra.Command{
		Use:   "break KEY --reason TEXT",
		Short: "End a lease whoever holds it; its holder is fenced out",
		Long: `Break ends the current grant of KEY whoever holds it. The holder's next renewal
fails and its work is cancelled; the next grant gets a higher fence, so writes the
evicted holder still sends are refused by fenced resources. The break is recorded
(time, key, fence, reason, who) where the store keeps an audit log.`,
		Example: `  fenced break invoice:inv_72 --reason "worker host wedged, ticket OPS-12"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return withCode(exitUsage, errors.New("break: --reason is required"))
			}
			var info fenced.LeaseInfo
			err := g.withClient(cmd.Context(), func(c *fenced.Client) (err error) {
				info, err = c.Break(cmd.Context(), args[0], reason, by)
				if errors.Is(err, fenced.ErrNotHeld) {
					// Nothing held: say whether the key was ever granted here,
					// which catches a mistyped key or the wrong --store.
					if _, ierr := c.Inspect(cmd.Context(), args[0]); errors.Is(ierr, fenced.ErrNotFound) {
						return fmt.Errorf("break %q: %w: no lease on it was ever granted in %s", args[0], fenced.ErrNotFound,
							describeStore(g.store))
					}
					return fmt.Errorf("break %q: nothing to break, no one holds it now: %w", args[0], err)
				}
				return err
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "broke %s: fence %d, owner %s; the next grant gets a higher fence\n", info.Key, info.Fence, info.Owner)
			return nil
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the lease is broken (required; recorded)")
	cmd.Flags().StringVar(&by, "by", whoAmI(), "who breaks it (recorded)")
	return cmd
}

func whoAmI() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}

func newGuaranteesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "guarantees",
		Short:   "Show what the store promises: fence strength, clock, clock steps, notification, FIFO",
		Example: `  fenced guarantees --store redis://localhost:6379`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var gr driver.Capabilities
			var caps driver.Capabilities
			err := g.withClient(cmd.Context(), func(c *fenced.Client) error {
				gr, caps = c.Capabilities(), c.Capabilities()
				return nil
			})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "store:\t%s\n", storeurl.Redact(g.store))
			fmt.Fprintf(tw, "fence:\t%s\n", gr.Fence)
			fmt.Fprintf(tw, "expiry by server clock:\t%v\n", gr.ServerClock)
			if gr.ClockStepSafe {
				fmt.Fprintf(tw, "safe from clock steps:\ttrue (expiry does not follow the store's wall clock)\n")
			} else {
				fmt.Fprintf(tw,
					"safe from clock steps:\tfalse (a forward step of the store's wall clock beyond the safety margin ends grants early: "+
						"two holders overlap and only the fence protects the resource)\n")
			}
			fmt.Fprintf(tw, "waiters notified:\t%v\n", caps.Subscribe || caps.Queue)
			fmt.Fprintf(tw, "waiters served FIFO:\t%v\n", caps.FIFO)
			fmt.Fprintf(tw, "note:\t%s\n", gr.Note)
			return tw.Flush()
		},
	}
}
