package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

// pruneJSON is the machine-readable result of a prune.
type pruneJSON struct {
	Deleted int64  `json:"deleted"`
	Floor   uint64 `json:"floor"`
}

func newPruneCmd(g *globals) *cobra.Command {
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:   "prune --older-than DURATION",
		Short: "Delete the rows of keys unused for DURATION, keeping every key's fences increasing",
		Long: `A SQL lease table keeps one row per key for ever, because the row holds the key's
fence counter. prune deletes the rows of keys that are not held and whose last
grant ended more than DURATION ago, and in the same transaction raises the
table's fence floor to the highest fence it deleted: a deleted key granted again
later gets a fence above every one it had, so resources never see it go back.

MySQL and SQLite do not record when a lease was released or broken; there such a
key is old enough for any DURATION. Held keys are never deleted. Break records
(TABLE_breaks) are kept. Safe to run while leases are granted, and to stop: it
works in batches of a few hundred rows, each one transaction.`,
		Example: `  fenced prune --older-than 720h
  fenced prune --older-than 168h --store mysql://app@db/app -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			if !cmd.Flags().Changed("older-than") {
				return withCode(exitUsage, errors.New("prune: --older-than is required (for example 720h)"))
			}
			if olderThan < 0 {
				return withCode(exitUsage, fmt.Errorf("prune: --older-than %v is negative", olderThan))
			}
			var deleted int64
			var floor uint64
			err := g.withClient(cmd.Context(), func(c *fenced.Client) (err error) {
				deleted, floor, err = c.Prune(cmd.Context(), olderThan)
				return err
			})
			if err != nil {
				return explainNoFloor(err)
			}
			if g.output == "json" {
				return writeJSON(g.stdout, pruneJSON{Deleted: deleted, Floor: floor})
			}
			fmt.Fprintf(g.stdout, "pruned %d keys from %s; fence floor is %d\n", deleted, storeurl.Redact(g.store), floor)
			return nil
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 0,
		"delete keys whose last grant ended longer ago than this (required; for example 720h)")
	addOutputFlag(cmd, g)
	return cmd
}
