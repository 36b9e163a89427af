package fencedotel

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/metrics"
	"github.com/fenced-dev/fenced/recipe"
)

// Instrument names (OpenTelemetry form) of the partition group series of
// package metrics (metrics.PartitionsMembers ...); the standard
// translation to Prometheus gives fencedprom's names.
const (
	PartitionsMembers         = "fenced.partitions.members"
	PartitionsOwned           = "fenced.partitions.owned"
	PartitionsTarget          = "fenced.partitions.target"
	PartitionsUnowned         = "fenced.partitions.unowned"
	PartitionsMoves           = "fenced.partitions.moves"
	PartitionsTimeToStable    = "fenced.partitions.time_to_stable"
	PartitionsHandoffDuration = "fenced.partitions.handoff.duration"
	PartitionsHandoffOverruns = "fenced.partitions.handoff.overruns"
)

// partitionsInstruments are the partition group instruments of a
// Telemetry, and the members they report.
type partitionsInstruments struct {
	handoff  metric.Float64Histogram
	overruns metric.Int64Counter

	mu      sync.Mutex
	members []observedMember
}

type observedMember struct {
	group attribute.Set
	m     *recipe.Partitions
}

// newPartitionsInstruments creates the instruments on m, with a callback
// that reads each observed member's Stats.
func newPartitionsInstruments(m metric.Meter, buckets []float64) (*partitionsInstruments, error) {
	p := &partitionsInstruments{}
	var errs []error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	members := gauge(PartitionsMembers, "{member}", "Live members of the group this member saw last.")
	owned := gauge(PartitionsOwned, "{partition}", "Partitions this member holds.")
	target := gauge(PartitionsTarget, "{partition}", "Partitions the assignment gives this member.")
	unowned := gauge(PartitionsUnowned, "{partition}", "Partitions of the group no lease held at this member's last look.")
	moves, err := m.Int64ObservableCounter(PartitionsMoves, metric.WithUnit("{move}"),
		metric.WithDescription("Partitions this member took over from another holder."))
	errs = append(errs, err)
	stable, err := m.Float64ObservableGauge(PartitionsTimeToStable, metric.WithUnit("s"),
		metric.WithDescription("How long the group's last rebalance took to settle as this member saw it, "+
			"from its first look that planned a move to its first that planned none."))
	errs = append(errs, err)
	ho := []metric.Float64HistogramOption{metric.WithUnit("s"),
		metric.WithDescription("This member's hand-offs, from the decision to hand the partition off to its release.")}
	if buckets != nil {
		ho = append(ho, metric.WithExplicitBucketBoundaries(buckets...))
	}
	p.handoff, err = m.Float64Histogram(PartitionsHandoffDuration, ho...)
	errs = append(errs, err)
	p.overruns, err = m.Int64Counter(PartitionsHandoffOverruns, metric.WithUnit("{overrun}"),
		metric.WithDescription("Hand-offs and leaves whose work had not returned HandoffGrace after they began: "+
			"the lease was released anyway."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		p.mu.Lock()
		ms := append([]observedMember(nil), p.members...)
		p.mu.Unlock()
		for _, om := range ms {
			s := om.m.Stats()
			set := metric.WithAttributeSet(om.group)
			o.ObserveInt64(members, int64(s.Members), set)
			o.ObserveInt64(owned, int64(len(om.m.Owned())), set)
			o.ObserveInt64(target, int64(s.Target), set)
			o.ObserveInt64(unowned, int64(s.Unowned), set)
			o.ObserveInt64(moves, int64(s.Moves), set)
			o.ObserveFloat64(stable, s.TimeToStable.Seconds(), set)
		}
		return nil
	}, members, owned, target, unowned, moves, stable)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// ObservePartitions reports member m of a partition group under the
// attribute group (metrics.LabelGroup: a bounded name the program
// chooses, the group's name as a rule, never a member ID): its gauges and
// moves read from m.Stats at each collection, and its hand-offs and
// overruns as m reports them (recipe.Partitions.Observe), from now on. A
// Telemetry without a MeterProvider ignores it. The instruments are
// those of package metrics' partition series (PartitionsMembers ...):
// members, owned, target, unowned, moves, time_to_stable, and the
// hand-off duration histogram and overrun counter.
func (t *Telemetry) ObservePartitions(group string, m *recipe.Partitions) {
	p := t.parts
	if p == nil || m == nil {
		return
	}
	set := attribute.NewSet(attribute.String(metrics.LabelGroup, group))
	p.mu.Lock()
	p.members = append(p.members, observedMember{group: set, m: m})
	p.mu.Unlock()
	with := metric.WithAttributeSet(set)
	p.overruns.Add(bg, 0, with)
	m.Observe(func(e recipe.PartitionEvent) {
		switch {
		case e.Kind == fenced.EventLost:
			p.overruns.Add(bg, 1, with)
		case e.Kind == fenced.EventRelease && e.HandOff > 0:
			p.handoff.Record(bg, e.HandOff.Seconds(), with)
		}
	})
}
