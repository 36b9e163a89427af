package fencedprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/metrics"
	"github.com/fenced-dev/fenced/recipe"
)

// PartitionsCollector exports one member of a recipe.Partitions group:
// gauges and counters read from its Stats at each scrape, and the
// hand-offs it observes (Partitions.Observe) from its creation on.
// Register it beside the client's Metrics:
//
//	reg.MustRegister(fencedprom.NewPartitionsCollector("billing", member))
//
// Its series carry one label, group: a bounded name the program chooses,
// the group's name as a rule. Never use a member ID, which changes with
// every process; scrape targets tell the members apart. The series, each
// member's own (sum(owned) by group is the partitions held; members,
// unowned and time_to_stable are the group as the member saw it last, so
// take their max or min by group):
//
//	fenced_partitions_members                  live members it saw last
//	fenced_partitions_owned                    partitions the member holds
//	fenced_partitions_target                   partitions the assignment gives it
//	fenced_partitions_unowned                  partitions no lease held at its last look
//	fenced_partitions_moves_total              partitions it took over from another holder
//	fenced_partitions_time_to_stable_seconds   how long the last rebalance took to settle
//	fenced_partitions_handoff_duration_seconds hand-offs, decision to release (histogram)
//	fenced_partitions_handoff_overruns_total   hand-offs (and leaves) that overran HandoffGrace
//	fenced_partitions_rebalances_total         changes of its target set
//	fenced_partitions_acquired_total           partitions it took
//	fenced_partitions_handoffs_total           partitions it handed off
//	fenced_partitions_handoff_seconds_total    time its hand-offs took, decision to release
//	fenced_partitions_unowned_seconds_total    time during which one of its targets was not held
type PartitionsCollector struct {
	m                                          *recipe.Partitions
	owned, target, members, unowned, stable    *prometheus.Desc
	rebalances, acquired, handoffs, handoffSec *prometheus.Desc
	unownedSec, moves                          *prometheus.Desc
	handoff                                    prometheus.Histogram
	overruns                                   prometheus.Counter
	group                                      string
}

// NewPartitionsCollector returns the collector of member m of group. It
// observes m's hand-offs from now on, for as long as m runs.
func NewPartitionsCollector(group string, m *recipe.Partitions) *PartitionsCollector {
	labels := prometheus.Labels{metrics.LabelGroup: group}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, nil, labels)
	}
	c := &PartitionsCollector{m: m, group: group,
		owned:   d(metrics.PartitionsOwned, "Partitions this member holds."),
		target:  d(metrics.PartitionsTarget, "Partitions the assignment gives this member."),
		members: d(metrics.PartitionsMembers, "Live members of the group this member saw last."),
		unowned: d(metrics.PartitionsUnowned, "Partitions of the group no lease held at this member's last look."),
		stable: d(metrics.PartitionsTimeToStable, "How long the group's last rebalance took to settle as this member saw it, "+
			"from its first look that planned a move to its first that planned none."),
		rebalances: d(metrics.PartitionsRebalances, "Changes of this member's target set."),
		acquired:   d(metrics.PartitionsAcquired, "Partitions this member took."),
		handoffs:   d(metrics.PartitionsHandoffs, "Partitions this member handed off."),
		handoffSec: d(metrics.PartitionsHandoffTime, "Time this member's hand-offs took, from the decision to the release."),
		unownedSec: d(metrics.PartitionsUnownedTime, "Time during which a partition the assignment gave this member was not held by it."),
		moves:      d(metrics.PartitionsMoves, "Partitions this member took over from another holder."),
		handoff: prometheus.NewHistogram(prometheus.HistogramOpts{Name: metrics.PartitionsHandoffDuration,
			Help:        "This member's hand-offs, from the decision to hand the partition off to its release.",
			ConstLabels: labels, Buckets: DefaultWaitBuckets}),
		overruns: prometheus.NewCounter(prometheus.CounterOpts{Name: metrics.PartitionsHandoffOverruns,
			Help:        "Hand-offs and leaves whose work had not returned HandoffGrace after they began: the lease was released anyway.",
			ConstLabels: labels}),
	}
	m.Observe(c.observe)
	return c
}

// observe records a hand-off's duration and an overrun.
func (c *PartitionsCollector) observe(e recipe.PartitionEvent) {
	switch {
	case e.Kind == fenced.EventLost:
		c.overruns.Inc()
	case e.Kind == fenced.EventRelease && e.HandOff > 0:
		c.handoff.Observe(e.HandOff.Seconds())
	}
}

func (c *PartitionsCollector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{c.owned, c.target, c.members, c.unowned, c.stable, c.rebalances, c.acquired, c.handoffs,
		c.handoffSec, c.unownedSec, c.moves}
}

// Describe implements prometheus.Collector.
func (c *PartitionsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
	c.handoff.Describe(ch)
	c.overruns.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *PartitionsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.Stats()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	n := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	g(c.owned, float64(len(c.m.Owned())))
	g(c.target, float64(s.Target))
	g(c.members, float64(s.Members))
	g(c.unowned, float64(s.Unowned))
	g(c.stable, s.TimeToStable.Seconds())
	n(c.rebalances, float64(s.Rebalances))
	n(c.acquired, float64(s.Acquired))
	n(c.handoffs, float64(s.HandOffs))
	n(c.handoffSec, s.HandOffTime.Seconds())
	n(c.unownedSec, s.UnownedTime.Seconds())
	n(c.moves, float64(s.Moves))
	c.handoff.Collect(ch)
	c.overruns.Collect(ch)
}
