package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// leaderJSON is one line of fenced observe -o json, stable for scripts.
type leaderJSON struct {
	Time   time.Time `json:"time"`
	Name   string    `json:"name"`
	Leader bool      `json:"leader"`
	// Epoch is the leader's epoch, or with leader false the last leader's
	// (0 if none ever led).
	Epoch uint64 `json:"epoch"`
	Value string `json:"value,omitempty"`
	Owner string `json:"owner,omitempty"`
}

func newObserveCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "observe NAME",
		Short: "Print one line per change of NAME's leader, including when nobody leads",
		Long: `Observe watches the election NAME (see fenced elect) and prints one line per
change until interrupted: first the current state, then each new leader with its
epoch and value, each new value, and "no leader" whenever nobody leads. Between
two leaders there is always a "no leader" line, since terms never overlap.

It reads the store every 250ms, when the leader's lease is due to expire, and at
once when the store notifies a release. A term that begins and ends between two
reads may not be printed.`,
		Example: `  fenced observe scheduler
  fenced observe -o json --store etcd://10.0.0.1:2379 api-leader`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			defer stop()
			// Like a follower of fenced elect, an observer waits for a
			// busy store (see openWaiting) until a signal.
			c, err := g.openWaiting(ctx, "observe")
			if err != nil {
				return err
			}
			defer c.Close()
			el, err := recipe.NewElection(c, args[0], &fenced.LeaseOptions{MinFence: fenced.FenceNone})
			if err != nil {
				return err
			}
			return observe(ctx, g, args[0], el)
		},
	}
	addOutputFlag(cmd, g)
	return cmd
}

func observe(ctx context.Context, g *globals, name string, el *recipe.Election) error {
	if g.output != "json" {
		g.writeStoreHeader(g.stdout)
	}
	for l := range el.Observe(ctx) {
		if g.output == "json" {
			if err := writeJSONLine(g,
				leaderJSON{Time: time.Now().UTC(), Name: name, Leader: l.Present, Epoch: l.Epoch, Value: l.Value,
					Owner: l.Owner}); err != nil {
				return err
			}
			continue
		}
		var err error
		switch {
		case !l.Present:
			_, err = fmt.Fprintf(g.stdout, "%s no leader (last epoch %d)\n", time.Now().Format(time.RFC3339Nano), l.Epoch)
		case l.Value != "":
			_, err = fmt.Fprintf(g.stdout, "%s leader epoch %d owner %s value %q\n", time.Now().Format(time.RFC3339Nano), l.Epoch, l.Owner,
				l.Value)
		default:
			_, err = fmt.Fprintf(g.stdout, "%s leader epoch %d owner %s\n", time.Now().Format(time.RFC3339Nano), l.Epoch, l.Owner)
		}
		if err != nil {
			return err
		}
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// writeJSONLine writes v as one line of JSON.
func writeJSONLine(g *globals, v any) error { return json.NewEncoder(g.stdout).Encode(v) }
