package main

import (
	"errors"
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"regexp"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

// floorJSON is the machine-readable form of a store's floor.
type floorJSON struct {
	Floor    uint64 `json:"floor"`
	MaxFence uint64 `json:"max_fence"`
}

func newFloorCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "floor",
		Short: "Show the store's fence floor and the highest fence it records",
		Long: `Every grant's fence is above the store's fence floor. Raise the floor when a key's
counter restarted or is about to while resources still hold its old fences: keys
moved to another table or store, lease rows deleted by hand, or a failover that
lost recent grants. Without it every guarded write is refused as stale for ever.

fenced floor shows the floor and the highest fence the store records; the larger
of the two is what to seed a new store with. The floor lives in the SQL stores
(sqlite, postgres, mysql), in the table TABLE_floor beside the lease table.`,
		Example: `  fenced floor --store postgres://app@db/app
  # moving keys to a new table: seed it from the old one first
  fenced floor raise --from 'postgres://app@db/app?table=leases' --store 'postgres://app@db/app?table=leases_v2'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			var floor, maxFence uint64
			err := g.withClient(cmd.Context(), func(c *fenced.Client) (err error) {
				floor, maxFence, err = c.FenceFloor(cmd.Context())
				return err
			})
			if err != nil {
				return explainNoFloor(err)
			}
			if g.output == "json" {
				return writeJSON(g.stdout, floorJSON{Floor: floor, MaxFence: maxFence})
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "store:\t%s\n", storeurl.Redact(g.store))
			fmt.Fprintf(tw, "floor:\t%d\n", floor)
			fmt.Fprintf(tw, "highest fence:\t%d\n", maxFence)
			return tw.Flush()
		},
	}
	addOutputFlag(cmd, g)
	cmd.AddCommand(newFloorRaiseCmd(g))
	return cmd
}

func newFloorRaiseCmd(g *globals) *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:   "raise (N | --from STORE)",
		Short: "Raise the fence floor so that every later grant's fence is above N",
		Long: `Raise the store's fence floor to N, or to the highest fence another store has handed
out (--from STORE: the larger of its floor and its highest recorded fence). Every
grant that starts afterwards, of any key, gets a fence above the floor. A floor is
never lowered: raising it to less than it is changes nothing.`,
		Example: `  fenced floor raise 5000
  fenced floor raise --from sqlite:///var/lib/app/leases.db --store postgres://app@db/app`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var target uint64
			switch {
			case len(args) == 1 && from != "":
				return withCode(exitUsage, errors.New("floor raise: give N or --from, not both"))
			case len(args) == 1:
				n, err := strconv.ParseUint(args[0], 10, 64)
				if err != nil || n > limits.MaxFenceFloor {
					return withCode(exitUsage, fmt.Errorf("floor raise: %q is not a number from 0 to %d", args[0], limits.MaxFenceFloor))
				}
				target = n
			case from != "":
				src, err := fenced.Open(ctx, from, nil)
				if err != nil {
					return fmt.Errorf("floor raise --from: %w", err)
				}
				floor, maxFence, err := src.FenceFloor(ctx)
				src.Close()
				if err != nil {
					return fmt.Errorf("floor raise --from %s: %w", storeurl.Redact(from), explainNoFloor(err))
				}
				target = max(floor, maxFence)
				fmt.Fprintf(g.stdout, "%s: floor %d, highest fence %d\n", storeurl.Redact(from), floor, maxFence)
			default:
				return withCode(exitUsage, errors.New("floor raise: give the new floor N, or --from STORE"))
			}
			var now uint64
			err := g.withClient(ctx, func(c *fenced.Client) (err error) {
				now, err = c.RaiseFenceFloor(ctx, target)
				return err
			})
			if errors.Is(err, fenced.ErrInvalidFloor) {
				return withCode(exitUsage, err)
			}
			if err != nil {
				return explainNoFloor(err)
			}
			if now > target {
				fmt.Fprintf(g.stdout, "fence floor of %s is %d, already above %d; unchanged\n", storeurl.Redact(g.store), now, target)
				return nil
			}
			fmt.Fprintf(g.stdout, "fence floor of %s is now %d: every later grant gets a higher fence\n", storeurl.Redact(g.store), now)
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "raise to the highest fence of this other store (URL)")
	// A negative N reaches the flag parser as a shorthand flag; say what
	// is wrong with it rather than cobra's "unknown shorthand flag".
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		if m := negativeArg.FindStringSubmatch(err.Error()); m != nil {
			return withCode(exitUsage, fmt.Errorf("floor raise: %q is not a number from 0 to %d", m[1], limits.MaxFenceFloor))
		}
		return err
	})
	return cmd
}

// negativeArg matches pflag's error for a negative number taken as flags.
var negativeArg = regexp.MustCompile(`^unknown shorthand flag: '[0-9]' in (-[0-9].*)$`)

// explainNoFloor adds to an ErrUnsupported from a floor or prune which
// stores have one.
func explainNoFloor(err error) error {
	if errors.Is(err, fenced.ErrUnsupported) {
		return fmt.Errorf("%w; only the SQL stores (sqlite, postgres, mysql) and mem keep a fence floor and a row per key", err)
	}
	return err
}
