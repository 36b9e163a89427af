package fencedprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenced-dev/fenced/recipe"
)

// PartitionsCollector exports one member of a recipe.Partitions group,
// read from its Stats at each scrape. Register it beside the client's
// Metrics:
//
//	reg.MustRegister(fencedprom.NewPartitionsCollector("billing", member))
//
// Its series carry one label, group: a bounded name the program chooses.
// Never use a member ID, which changes with every process:
//
//	fenced_partitions_owned                 partitions the member holds
//	fenced_partitions_target                partitions the assignment gives it
//	fenced_partitions_members               live members it saw last
//	fenced_partitions_rebalances_total      changes of its target set
//	fenced_partitions_acquired_total        partitions it took
//	fenced_partitions_handoffs_total        partitions it handed off
//	fenced_partitions_handoff_seconds_total time its hand-offs took, decision to release
//	fenced_partitions_unowned_seconds_total time during which one of its targets was not held
type PartitionsCollector struct {
	m                                          *recipe.Partitions
	owned, target, members                     *prometheus.Desc
	rebalances, acquired, handoffs, handoffSec *prometheus.Desc
	unownedSec                                 *prometheus.Desc
	group                                      string
}

// NewPartitionsCollector returns the collector of member m of group.
func NewPartitionsCollector(group string, m *recipe.Partitions) *PartitionsCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("fenced_partitions_"+name, help, nil, prometheus.Labels{"group": group})
	}
	return &PartitionsCollector{m: m, group: group,
		owned:      d("owned", "Partitions this member holds."),
		target:     d("target", "Partitions the assignment gives this member."),
		members:    d("members", "Live members of the group this member saw last."),
		rebalances: d("rebalances_total", "Changes of this member's target set."),
		acquired:   d("acquired_total", "Partitions this member took."),
		handoffs:   d("handoffs_total", "Partitions this member handed off."),
		handoffSec: d("handoff_seconds_total", "Time this member's hand-offs took, from the decision to the release."),
		unownedSec: d("unowned_seconds_total", "Time during which a partition the assignment gave this member was not held by it."),
	}
}

// Describe implements prometheus.Collector.
func (c *PartitionsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.owned, c.target, c.members, c.rebalances, c.acquired, c.handoffs, c.handoffSec, c.unownedSec} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PartitionsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.Stats()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	n := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	g(c.owned, float64(s.Owned))
	g(c.target, float64(s.Target))
	g(c.members, float64(s.Members))
	n(c.rebalances, float64(s.Rebalances))
	n(c.acquired, float64(s.Acquired))
	n(c.handoffs, float64(s.HandOffs))
	n(c.handoffSec, s.HandOffTime.Seconds())
	n(c.unownedSec, s.UnownedTime.Seconds())
}
