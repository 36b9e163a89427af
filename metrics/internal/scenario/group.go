package scenario

import (
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/metrics"
	"github.com/fenced-dev/fenced/recipe"
)

// Exporter is one member process's exporter, as a group test sees it:
// the hook of the member's client, how the member is attached to it
// once it has joined, and the Prometheus series it gives (for
// OpenTelemetry, through OpenTelemetry's Prometheus exporter).
type Exporter struct {
	Hook     func(store string) func(fenced.Event)
	Attach   func(group string, m *recipe.Partitions)
	Gatherer prometheus.Gatherer
}

// GroupName is the partition group of Group.
const GroupName = "billing"

// groupMember is one member of Group, with its own client and exporter,
// as a process of its own would have.
type groupMember struct {
	m   *recipe.Partitions
	exp Exporter
}

// GroupsBounded runs Group on the embedded SQLite store and on mem, each
// with 16 and 64 partitions, and checks that the label values are the
// same at both: a group's series are bounded whatever P and the member IDs.
func GroupsBounded(t *testing.T, newExporter func(testing.TB) Exporter) {
	for _, store := range []string{"sqlite", "mem"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel() // stores of their own
			var labels [][]string
			for _, p := range []int{16, 64} {
				url := fmt.Sprintf("mem://%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), p)
				if store == "sqlite" {
					url = "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
				}
				labels = append(labels, Group(t, url, store, p, newExporter))
			}
			if !slices.Equal(labels[0], labels[1]) {
				t.Errorf("label values differ with P:\nP=16: %v\nP=64: %v", labels[0], labels[1])
			}
			t.Logf("%d label values, P=16 and P=64: %v", len(labels[0]), labels[0])
		})
	}
}

// Group runs a real partition group of p partitions on the store at url
// (store is its store label): members a, b and c join one after the
// other, each once the assignment is stable, then c leaves and d joins.
// Each member has its own client and exporter (newExporter), as a process
// of its own would. After each change it waits, through the exporters'
// series, for the group to be stable: every live member sees every
// member and no unowned partition, holds its target, and the members own
// p between them. Then it checks the series against the recipe:
//
//   - moves_total sums, over the members, to the owner changes the
//     members' events show (a partition granted to a member other than
//     the one granted it last), less at most one per lease that ran
//     out, and each member's equals its Stats;
//   - every member that took part in a change observed a time to a
//     stable assignment, the hand-off histogram counted every hand-off
//     the member's events ended, and the overrun counter every overrun
//     they reported;
//   - the per-lease series group the partition, membership and doorbell
//     leases under the group's name (key_group="billing"), and no label
//     value is a member ID or a key.
//
// It returns the label values of every fenced series of every member's
// exporter, sorted, for the caller to compare across partition counts.
func Group(t *testing.T, url, store string, p int, newExporter func(testing.TB) Exporter) []string {
	t.Helper()
	ctx := context.Background()
	ttl, worst := groupTTL(t, url)
	// A rebalance needs a doorbell and a listing, the hand-offs, a listing
	// and a try per partition taken, and a poll (TTL/3) for the members
	// that look last. On a busy machine each step may wait the worst
	// delay measured. A lease that ran out (a renewal the machine delayed
	// past the TTL: the members' clients report it) adds its recovery: the
	// member's hand-off of everything, its join again a TTL later at most,
	// and a rebalance.
	var lapses atomic.Int64
	bound := func() time.Duration {
		return time.Duration(1+lapses.Load())*(4*ttl+time.Duration(8+p)*worst) + time.Duration(lapses.Load())*ttl
	}
	t.Logf("P=%d on %s: TTL %v, worst store round trip or timer lateness %v, stable within %v", p, store, ttl,
		worst.Round(time.Millisecond), bound())
	countLost := func(e fenced.Event) {
		if e.Kind == fenced.EventLost {
			lapses.Add(1)
		}
	}

	lg := &grantLedger{last: map[int]string{}, handedOff: map[string]int{}, overran: map[string]int{}}
	idle := func(ctx context.Context, _ recipe.Partition) error { <-ctx.Done(); return nil }
	join := func() *groupMember {
		t.Helper()
		exp := newExporter(t)
		c, err := fenced.Open(ctx, url, &fenced.Options{Hook: metrics.Join(exp.Hook(store), countLost)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// A random ID, as the recipe would pick, but known before the
		// member's first grant: its loop starts before JoinPartitions
		// returns, so MemberID() would come too late for the ledger.
		id := rand.Text()
		m, err := recipe.JoinPartitions(ctx, c, GroupName, p, idle, &recipe.PartitionsOptions{
			MemberID: id, Lease: &fenced.LeaseOptions{TTL: ttl}, OnEvent: lg.onEvent(id)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Leave(context.Background()) })
		exp.Attach(GroupName, m)
		return &groupMember{m: m, exp: exp}
	}

	var all, live []*groupMember
	add := func() *groupMember {
		gm := join()
		all, live = append(all, gm), append(live, gm)
		return gm
	}
	a := add()
	stable(t, live, p, bound)
	// The first member takes every partition at its first look: that
	// look planned them all, and its grants settled them.
	within(t, bound, "the first member observes a time to a stable assignment", func() bool {
		return value(t, a.exp.Gatherer, metrics.PartitionsTimeToStable) > 0
	})
	add()
	stable(t, live, p, bound)
	c := add()
	stable(t, live, p, bound)

	before := make([]float64, len(live))
	for i, gm := range live {
		before[i] = value(t, gm.exp.Gatherer, metrics.PartitionsTimeToStable)
	}
	if err := c.m.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	live = live[:2]
	stable(t, live, p, bound)
	// A member sees the end of a rebalance at its first look that plans
	// no move: at once for the member that moved last, a Poll later for
	// the others.
	within(t, bound, "a member observes a new time to a stable assignment after c left", func() bool {
		for i, gm := range live {
			if value(t, gm.exp.Gatherer, metrics.PartitionsTimeToStable) != before[i] {
				return true
			}
		}
		return false
	})
	d := add()
	stable(t, live, p, bound)
	within(t, bound, "the member that joined last observes a time to a stable assignment", func() bool {
		return value(t, d.exp.Gatherer, metrics.PartitionsTimeToStable) > 0
	})

	checkMoves(t, all, lg, int(lapses.Load()))
	t.Logf("P=%d: %d moves over a → a,b → a,b,c → a,b → a,b,d; %d leases ran out", p, lg.count(), lapses.Load())
	checkHandOffs(t, all, lg)
	return checkLabels(t, all)
}

// grantLedger follows the members' events: who was granted each
// partition last, the owner changes, and the hand-offs each member ended.
type grantLedger struct {
	mu        sync.Mutex
	last      map[int]string // partition → member granted it last
	moves     int
	handedOff map[string]int // member → hand-offs it ended
	overran   map[string]int // member → hand-offs and leaves that overran HandoffGrace
}

// onEvent returns the OnEvent of member id.
func (lg *grantLedger) onEvent(id string) func(recipe.PartitionEvent) {
	return func(e recipe.PartitionEvent) {
		lg.mu.Lock()
		defer lg.mu.Unlock()
		switch e.Kind {
		case fenced.EventAcquire:
			if prev, ok := lg.last[e.Partition]; ok && prev != id {
				lg.moves++
			}
			lg.last[e.Partition] = id
		case fenced.EventRelease:
			if e.HandOff > 0 {
				lg.handedOff[id]++
			}
		case fenced.EventLost:
			lg.overran[id]++
		}
	}
}

func (lg *grantLedger) count() int {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	return lg.moves
}

// checkMoves: each member's moves series is its Stats, and their sum is
// the owner changes the events show. A member counts a move only for a
// holder it saw (Stats.Moves); a lease that ran out makes churn a member
// can miss between two looks, so each lapse allows one unseen change.
// No member ever counts a change that did not happen.
func checkMoves(t *testing.T, all []*groupMember, lg *grantLedger, lapsed int) {
	t.Helper()
	var sum uint64
	for i, gm := range all {
		s := gm.m.Stats()
		if got := value(t, gm.exp.Gatherer, metrics.PartitionsMoves); got != float64(s.Moves) {
			t.Errorf("member %d: %s = %v, its Stats say %d", i, metrics.PartitionsMoves, got, s.Moves)
		}
		sum += s.Moves
	}
	want := lg.count()
	if int(sum) > want || int(sum) < want-lapsed || want == 0 {
		t.Errorf("%s sums to %d over the members; the members' grants show %d owner changes (%d leases ran out)",
			metrics.PartitionsMoves, sum, want, lapsed)
	}
}

// checkHandOffs: the hand-off histogram counts every hand-off the member's
// events ended, and the overrun counter every overrun they reported.
func checkHandOffs(t *testing.T, all []*groupMember, lg *grantLedger) {
	t.Helper()
	for i, gm := range all {
		lg.mu.Lock()
		n, over := lg.handedOff[gm.m.MemberID()], lg.overran[gm.m.MemberID()]
		lg.mu.Unlock()
		if got := histogramCount(t, gm.exp.Gatherer, metrics.PartitionsHandoffDuration); got != uint64(n) {
			t.Errorf("member %d: %s counts %d hand-offs, its events %d", i, metrics.PartitionsHandoffDuration, got, n)
		}
		// The work returns at once; an overrun is a release that took
		// longer than HandoffGrace on a busy store, as the events say.
		if got := value(t, gm.exp.Gatherer, metrics.PartitionsHandoffOverruns); got != float64(over) {
			t.Errorf("member %d: %s = %v, its events report %d overruns", i, metrics.PartitionsHandoffOverruns, got, over)
		}
	}
}

// checkLabels checks that no label value of the members' series holds a
// member ID or a key, and that the per-lease series have the group's
// name as their one key group. It returns the label values, sorted.
func checkLabels(t *testing.T, all []*groupMember) []string {
	t.Helper()
	values := map[string]bool{}
	for _, gm := range all {
		for _, v := range labelValues(t, gm.exp.Gatherer) {
			values[v] = true
		}
	}
	for v := range values {
		for _, gm := range all {
			if id := gm.m.MemberID(); strings.Contains(v, id) {
				t.Errorf("label value %q holds member ID %q", v, id)
			}
		}
		if strings.Contains(v, "/") {
			t.Errorf("label value %q is a key of the group, not its name", v)
		}
	}
	if got := labelOf(t, all[0].exp.Gatherer, metrics.Renewals, metrics.LabelKeyGroup); !slices.Equal(got, []string{GroupName}) {
		t.Errorf("%s key groups %v, want the group's name alone", metrics.Renewals, got)
	}
	return slices.Sorted(maps.Keys(values))
}

// stable waits, through the members' series, until the group is stable:
// each member sees every live member, no unowned partition and holds its
// target, and together they own p.
func stable(t *testing.T, live []*groupMember, p int, bound func() time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		owned, why := 0.0, ""
		for i, gm := range live {
			g := gm.exp.Gatherer
			o, tg := value(t, g, metrics.PartitionsOwned), value(t, g, metrics.PartitionsTarget)
			n, u := value(t, g, metrics.PartitionsMembers), value(t, g, metrics.PartitionsUnowned)
			owned += o
			if why == "" && (o != tg || n != float64(len(live)) || u != 0) {
				why = fmt.Sprintf("member %d: owned %v, target %v, members %v, unowned %v", i, o, tg, n, u)
			}
		}
		if why == "" && owned != float64(p) {
			why = fmt.Sprintf("the members own %v of %d", owned, p)
		}
		if why == "" {
			return
		}
		if b := bound(); time.Since(start) > b {
			t.Fatalf("not stable after %v (the bound derived from the TTL, the delays measured and the leases that ran out): %s", b, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// within waits until cond holds, for bound at most.
func within(t *testing.T, bound func() time.Duration, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(20 * time.Millisecond) {
		if b := bound(); time.Since(start) > b {
			t.Fatalf("after %v (the bound derived from the TTL, the delays measured and the leases that ran out): not yet: %s", b, what)
		}
	}
}

// groupTTL measures the store's worst round trip (a grant and a release)
// and a timer's lateness while three clients probe at once, as three
// members renew, and returns a TTL of ten such delays (at least 2 s) and
// the worst delay.
func groupTTL(t *testing.T, url string) (time.Duration, time.Duration) {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var worst time.Duration
	var wg sync.WaitGroup
	for i := range 3 {
		c, err := fenced.Open(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			for range 20 {
				start := time.Now()
				l, err := c.TryAcquire(ctx, fmt.Sprintf("probe:%d", i), nil)
				if err == nil {
					err = l.Release(ctx)
				}
				if err != nil {
					t.Error(err)
					return
				}
				t0 := time.Now()
				time.Sleep(5 * time.Millisecond)
				late := time.Since(t0) - 5*time.Millisecond
				mu.Lock()
				worst = max(worst, t0.Sub(start), late)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return max(2*time.Second, 10*worst), worst
}

// value returns the value of the one series of name (a gauge or a
// counter) in g.
func value(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	m := one(t, g, name)
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	t.Fatalf("%s is neither a gauge nor a counter", name)
	return 0
}

// histogramCount returns the sample count of the one histogram of name.
func histogramCount(t *testing.T, g prometheus.Gatherer, name string) uint64 {
	t.Helper()
	m := one(t, g, name)
	if m.GetHistogram() == nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

// one returns the one series of name in g, labelled group=GroupName.
// A histogram that has recorded nothing is missing from OpenTelemetry's
// export: it reads as an empty metric.
func one(t *testing.T, g prometheus.Gatherer, name string) *dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		if ms := mf.GetMetric(); len(ms) != 1 || labelValue(ms[0], metrics.LabelGroup) != GroupName {
			t.Fatalf("%s: %d series %v, want one labelled %s=%q", name, len(ms), ms, metrics.LabelGroup, GroupName)
		}
		return mf.GetMetric()[0]
	}
	if name == metrics.PartitionsHandoffDuration || name == metrics.PartitionsHandoffOverruns {
		return &dto.Metric{Counter: &dto.Counter{}}
	}
	t.Fatalf("no series %s", name)
	return nil
}

func labelValue(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

// labelValues returns every label value of every fenced series in g.
func labelValues(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "fenced_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				out = append(out, lp.GetName()+"="+lp.GetValue())
			}
		}
	}
	return out
}

// labelOf returns the distinct values of label on the series of name.
func labelOf(t *testing.T, g prometheus.Gatherer, name, label string) []string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				seen[labelValue(m, label)] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
