package main

import (
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced/internal/cli/leaseplan"
	"github.com/fenced-dev/fenced/internal/core/storeurl"
)

func newPlanCmd(g *globals) *cobra.Command {
	var in leaseplan.Input
	cmd := &cobra.Command{
		Use:   "plan [--ttl 30s] [--renew-every 10s] [--max-pause 45s]",
		Short: "Size a lease: the freeze it absorbs, the stale window, recovery after a crash, renewal traffic",
		Long: `Plan prints the trade-off of a lease's TTL and renewal interval on the store's
backend, as the dashboard of fenced serve draws it. The holder is assumed to freeze
just as a renewal falls due, the worst moment:

  freeze absorbed     the longest such freeze after which the holder still holds the
                      lease (TTL − renewal interval − safety margin)
  regrant after       how far into the freeze another worker may be granted the key
                      (the TTL as the backend rounds it − renewal interval)
  stale window        for --max-pause: how long another worker may hold the key while
                      the frozen one still acts; only the fence protects the resource
  recovery            how long after the holder crashes the key is free again
  renewal traffic     requests per second per lease

With --max-pause (your measured worst pause: GC, VM migration, swap) it recommends
the TTL that absorbs it and says what that costs in recovery time.

The backend comes from the scheme of --store (FENCED_STORE); plan does not connect
to the store. Backends that round TTLs are taken into account: etcd counts whole
seconds plus a second of session; ZooKeeper sessions are (TTL + tickTime)×8/7,
figured with ZooKeeper's default tickTime of 2s; on DynamoDB, whose expiry is
observed by the waiters, a crashed holder's grant may stand twice the TTL.`,
		Example: `  fenced plan --ttl 30s --max-pause 45s
  fenced plan --store etcd://localhost:2379 --ttl 1500ms
  fenced plan --ttl 10s --renew-every 5s -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			u, err := storeurl.Parse(g.store)
			if err != nil {
				return err
			}
			in.Authority = leaseplan.ForScheme(u.Scheme)
			p, err := leaseplan.Compute(in)
			if err != nil {
				return withCode(exitUsage, fmt.Errorf("plan: %w", err))
			}
			if g.output == "json" {
				return writeJSON(g.stdout, p.JSON())
			}
			return printPlan(g, p)
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&in.TTL, "ttl", ttlrule.Default, "lease time to live")
	fl.DurationVar(&in.RenewEvery, "renew-every", 0, "renewal interval (default a third of the TTL)")
	fl.DurationVar(&in.MaxPause, "max-pause", 0, "the longest pause a holder suffers (measured); enables a recommendation")
	addOutputFlag(cmd, g)
	return cmd
}

func printPlan(g *globals, p leaseplan.Plan) error {
	a := p.Authority
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "backend:\t%s (%s): %s\n", a.Name, a.Scheme, a.Note)
	fmt.Fprintf(tw, "TTL:\t%v, renewed every %v, safety margin %v\n", planDur(p.TTL), planDur(p.RenewEvery), planDur(p.SafetyMargin))
	fmt.Fprintf(tw, "authority keeps:\t%v an unrenewed grant\n", planDur(p.AuthorityTTL))
	fmt.Fprintf(tw, "freeze absorbed:\t%v (a freeze that starts as a renewal falls due)\n", planDur(p.FreezeAbsorbed))
	fmt.Fprintf(tw, "regrant after:\t%v into such a freeze another worker may hold the key\n", planDur(p.RegrantAfter))
	if p.MaxPause > 0 {
		if p.StaleWindow > 0 {
			fmt.Fprintf(tw, "stale window:\t%v for a %v pause: only the fence protects the resource\n", planDur(p.StaleWindow),
				planDur(p.MaxPause))
		} else {
			fmt.Fprintf(tw, "stale window:\tnone for a %v pause\n", planDur(p.MaxPause))
		}
	}
	fmt.Fprintf(tw, "recovery after a crash:\t%v to %v\n", planDur(p.RecoveryBest), planDur(p.RecoveryWorst))
	fmt.Fprintf(tw, "renewal traffic:\t%.3g requests/s per lease (%.0f/s for 1000 leases)\n", p.RenewalsPerSecond, p.RenewalsPerSecond*1000)
	fmt.Fprintf(tw, "failed renewals tolerated:\t%d in a row\n", p.FailedRenewalsTolerated)
	if p.RecommendedTTL > 0 {
		fmt.Fprintf(tw, "recommended TTL:\t%v (renew every %v)\n", planDur(p.RecommendedTTL), planDur(p.RecommendedTTL/3))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(g.stdout)
	for _, a := range p.Advice {
		fmt.Fprintln(g.stdout, "- "+a)
	}
	return nil
}

// planDur rounds d for the plan's table: to the millisecond (3.333s, not
// 3.333333333s), or to the microsecond below a millisecond.
func planDur(d time.Duration) time.Duration {
	if d >= time.Millisecond || d <= -time.Millisecond {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}
