package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/recipe"
)

// quota is member m's exact weighted share of p partitions.
func quota(weight map[string]int, m string, p int) float64 {
	total := 0
	for _, w := range weight {
		total += w
	}
	return float64(p) * float64(weight[m]) / float64(total)
}

// TestAssignPartitionsWeighted: without a throttle, every member holds
// within one of its weighted share, from nothing and after a join.
func TestAssignPartitionsWeighted(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, p := range []int{7, 64, 1000, 4096} {
		weight := map[string]int{}
		var members []string
		for i := range 6 {
			id := fmt.Sprintf("m%d", i)
			members = append(members, id)
			weight[id] = 1 + rng.IntN(10)
		}
		a := recipe.AssignThrottled(members[:4], weight, p, nil, 0, 0, 0)
		b := recipe.AssignThrottled(members, weight, p, owners(a), 0, 0, 0)
		for _, got := range []map[string][]int{b, recipe.AssignThrottled(members, weight, p, nil, 0, 0, 0)} {
			total := 0
			for _, m := range members {
				total += len(got[m])
				if q := quota(weight, m, p); math.Abs(float64(len(got[m]))-q) >= 1 {
					t.Errorf("P=%d weights %v: %s holds %d, share %.2f", p, weight, m, len(got[m]), q)
				}
			}
			if total != p {
				t.Errorf("P=%d: %d assigned", p, total)
			}
		}
	}
}

// TestAssignPartitionsThrottled plays a 4 → 8 join of weighted members
// step by step, every hand-off of a step ending before the next: each
// step moves at most MaxInTransition partitions and ⌈share × excess⌉ of
// each member's, orphans (the partitions of a member that died) are
// given at once whatever the throttle, and the group ends within the
// threshold of the weighted shares, with as many moves as the
// unthrottled plan needs or few more.
func TestAssignPartitionsThrottled(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	counts := []int{64, 256, 1024, 4096}
	if testing.Short() {
		counts = counts[:2] // the large counts take seconds of CPU
	}
	for _, p := range counts {
		for _, knobs := range []struct {
			threshold, share float64
			maxMoves         int
		}{{0.1, 0.8, (p + 3) / 4}, {0.05, 0.3, 1}, {0.2, 1, 0}, {0.0001, 0.5, 7}} {
			if knobs.maxMoves == 1 && p > 256 {
				continue // a step per move: P = 64 and 256 show it
			}
			weight := map[string]int{}
			var members []string
			for i := range 8 {
				id := fmt.Sprintf("m%d", i)
				members = append(members, id)
				weight[id] = 1 + rng.IntN(4)
			}
			cur := owners(recipe.AssignThrottled(members[:4], weight, p, nil, 0, 0, 0))
			minimum := movedPartitions(recipe.AssignThrottled(members[:4], weight, p, nil, 0, 0, 0),
				recipe.AssignThrottled(members, weight, p, cur, 0, 0, 0))
			moves, steps := 0, 0
			for ; steps < 10000; steps++ {
				plan := recipe.AssignThrottled(members, weight, p, cur, knobs.threshold, knobs.share, knobs.maxMoves)
				next := owners(plan)
				moved := 0
				from := map[string]int{}
				for q, m := range next {
					if cur[q] != m {
						moved++
						from[cur[q]]++
					}
				}
				if len(next) != p {
					t.Fatalf("P=%d: plan gives %d partitions", p, len(next))
				}
				if moved == 0 {
					break
				}
				if knobs.maxMoves > 0 && moved > knobs.maxMoves {
					t.Errorf("P=%d %+v: a step moves %d", p, knobs, moved)
				}
				counts := map[string]int{}
				for _, m := range cur {
					counts[m]++
				}
				unthrottled := recipe.AssignThrottled(members, weight, p, cur, 0, 0, 0)
				for m, n := range from {
					excess := counts[m] - len(unthrottled[m])
					if limit := int(math.Ceil(knobs.share * float64(excess))); n > limit {
						t.Errorf("P=%d %+v: %s hands off %d of an excess %d", p, knobs, m, n, excess)
					}
				}
				moves += moved
				cur = next
			}
			counts := map[string]int{}
			for _, m := range cur {
				counts[m]++
			}
			for _, m := range members {
				q := quota(weight, m, p)
				if d := math.Abs(float64(counts[m]) - q); d > knobs.threshold*math.Ceil(q)+1 {
					t.Errorf("P=%d %+v weights %v: %s ends at %d, share %.1f", p, knobs, weight, m, counts[m], q)
				}
			}
			if moves > minimum {
				t.Errorf("P=%d %+v: %d moves in %d steps; the unthrottled plan needs %d", p, knobs, moves, steps, minimum)
			}
			t.Logf("P=%d %+v: %d moves in %d steps (unthrottled: %d in one)", p, knobs, moves, steps, minimum)

			// A member dies: its partitions are free, and the next plan
			// gives them all, whatever the throttle.
			dead := members[1]
			alive := slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == dead })
			plan := recipe.AssignThrottled(alive, weight, p, cur, knobs.threshold, knobs.share, 1)
			if n := len(owners(plan)); n != p {
				t.Errorf("P=%d %+v: after %s died the plan gives %d of %d partitions", p, knobs, dead, n, p)
			}
		}
	}
}

// TestPartitionsRebalanceOptionsInvalid: each bad knob is refused with
// ErrInvalidOptions and an error naming it.
func TestPartitionsRebalanceOptionsInvalid(t *testing.T) {
	c := partOpen(t, "mem://"+t.Name())
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	for field, o := range map[string]recipe.PartitionsOptions{
		"Weight":              {Weight: -1},
		"Weight ":             {Weight: 10001},
		"RebalanceThreshold":  {RebalanceThreshold: -0.1},
		"RebalanceThreshold ": {RebalanceThreshold: 1},
		"Dampening":           {Dampening: -0.5},
		"Dampening ":          {Dampening: 1.5},
		"Dampening  ":         {Dampening: math.NaN()},
		"MaxInTransition":     {MaxInTransition: -1},
	} {
		_, err := recipe.JoinPartitions(context.Background(), c, "g", 8, idle, &o)
		if !errors.Is(err, fenced.ErrInvalidOptions) || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("%+v: got %v; want ErrInvalidOptions naming %s", o, err, strings.TrimSpace(field))
		}
	}
}

// throttleProbe counts the partitions in hand-off at once: from the
// cancel of their work with ErrHandedOff to its return.
type throttleProbe struct {
	mu             sync.Mutex
	inFlight, most int
}

func (pr *throttleProbe) work(ctx context.Context, p recipe.Partition) error {
	<-ctx.Done()
	if errors.Is(context.Cause(ctx), recipe.ErrHandedOff) {
		pr.mu.Lock()
		pr.inFlight++
		pr.most = max(pr.most, pr.inFlight)
		pr.mu.Unlock()
		time.Sleep(20 * time.Millisecond) // the work's clean-up
		pr.mu.Lock()
		pr.inFlight--
		pr.mu.Unlock()
	}
	return nil
}

// withinThreshold reports whether ms hold every partition between them,
// each where the members' own rule leaves it: within threshold × its
// target of its target, the floor or the ceiling of its weighted share.
func withinThreshold(ms []*recipe.Partitions, weight map[string]int, p int, threshold float64) bool {
	total := 0
	for _, m := range ms {
		n := float64(len(m.Owned()))
		total += len(m.Owned())
		q := quota(weight, m.MemberID(), p)
		near := func(target float64) bool { return math.Abs(n-target) <= threshold*target+1e-9 }
		if !near(math.Floor(q)) && !near(math.Ceil(q)) {
			return false
		}
	}
	return total == p
}

// TestPartitionsThrottledJoinTime measures, on SQLite, the time from a
// 4 → 8 join of equal members (P = 64) to a balanced assignment with the
// default throttle and with none, and the most partitions in hand-off
// at once. The defaults' figures are in docs/recipes.md.
func TestPartitionsThrottledJoinTime(t *testing.T) {
	const p = 64
	url := partStores(t)["sqlite"]
	mc := newPartMachine(t, url, 2*time.Second, 8)
	for _, mode := range []struct {
		name string
		opts recipe.PartitionsOptions
		most int
		// threshold is the balance the members stop at: a member within
		// it of its share is not moved (the default 0.1 leaves 15 to 17
		// of 16 where they are; of 8, nothing but 8).
		threshold float64
	}{
		{"defaults", recipe.PartitionsOptions{}, (p + 3) / 4, 0.1},
		{"none", recipe.PartitionsOptions{RebalanceThreshold: 1e-9, Dampening: 1, MaxInTransition: p}, p, 0},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ctx := context.Background()
			pr := &throttleProbe{}
			group := "join-" + mode.name
			weight := map[string]int{}
			var ms []*recipe.Partitions
			join := func(id string) {
				o := mode.opts
				o.MemberID, o.Lease = id, &fenced.LeaseOptions{TTL: mc.ttl}
				m, err := recipe.JoinPartitions(ctx, partOpen(t, url), group, p, pr.work, &o)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { m.Leave(ctx) })
				ms = append(ms, m)
				weight[id] = 1
			}
			for i := range 4 {
				join(fmt.Sprintf("a%d", i))
			}
			// Waves: the defaults move ⌈0.8 × 8⌉ = 7 of each old member's 8
			// surplus in hand-offs of at most 16 at once (two waves), then
			// the last one each (a third); a rebalance bound each, and one
			// per join. Read at every look: the delays grow on a busy
			// machine.
			bound := func() time.Duration { return 8 * mc.rebalanceBound(p, 8, 0) }
			waitFor(t, func() bool { return withinThreshold(ms, weight, p, mode.threshold) }, bound)
			start := time.Now()
			for i := range 4 {
				join(fmt.Sprintf("b%d", i))
			}
			waitFor(t, func() bool { return withinThreshold(ms, weight, p, mode.threshold) }, bound)
			took := time.Since(start)
			pr.mu.Lock()
			most := pr.most
			pr.mu.Unlock()
			t.Logf("%s: 4 → 8 join balanced in %v; at most %d partitions in hand-off at once (TTL %v, worst delay %v)",
				mode.name, took.Round(time.Millisecond), most, mc.ttl, mc.late.Max().Round(time.Millisecond))
			// Not asserted: MaxInTransition bounds each look's plan, and
			// members that look a moment apart during the four joins can
			// exceed it briefly (17 to 19 for 16 measured).
			t.Logf("MaxInTransition %d", mode.most)
		})
	}
}

// TestPartitionsThrottleSparesOrphans: a member that dies has its
// partitions taken within the crash bound while the group's one
// hand-off slot (MaxInTransition 1) is taken by a hand-off whose work
// ignores its cancellation: throttles hold back voluntary moves only.
func TestPartitionsThrottleSparesOrphans(t *testing.T) {
	const p = 32
	url := partStores(t)["sqlite"]
	mc := newPartMachine(t, url, 2*time.Second, 5)
	ctx := context.Background()
	lg := newPartLedger(t)
	stuck := make(chan struct{})
	defer close(stuck)
	var stick atomic.Bool
	var ms []*recipe.Partitions
	clients := map[string]*fenced.Client{}
	join := func(id string, work func(context.Context, recipe.Partition) error) *recipe.Partitions {
		c := partOpen(t, url)
		m, err := recipe.JoinPartitions(ctx, c, "orphans", p, work, &recipe.PartitionsOptions{MemberID: id,
			Lease: &fenced.LeaseOptions{TTL: mc.ttl}, MaxInTransition: 1, Dampening: 0.01, HandoffGrace: time.Hour, RebalanceThreshold: 1e-9,
			OnEvent: lg.onEvent(id)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Leave(ctx) })
		clients[id] = c
		ms = append(ms, m)
		return m
	}
	// a's work ignores a hand-off: its one hand-off stays in flight.
	slow := func(ctx context.Context, part recipe.Partition) error {
		<-ctx.Done()
		if errors.Is(context.Cause(ctx), recipe.ErrHandedOff) && stick.Load() {
			<-stuck
		}
		return nil
	}
	join("a", slow)
	join("b", lg.work("b"))
	join("c", lg.work("c"))
	// One hand-off at a time: a gives b and c their shares one by one.
	mc.balanced(t, ms, p, lg, time.Duration(p)*mc.rebalanceBound(p, 3, 0)/2)
	handed := ms[0].Stats().HandOffs
	stick.Store(true)
	join("d", lg.work("d")) // a hands one off, and it sticks
	waitFor(t, func() bool { return ms[0].Stats().HandOffs > handed }, func() time.Duration { return 2 * mc.rebalanceBound(p, 4, lg.lapsed()) })
	time.Sleep(mc.ttl) // the stuck hand-off holds the group's one slot
	if n := ms[0].Stats().HandOffs; n != handed+1 {
		t.Fatalf("a handed off %d after the join; want 1 (MaxInTransition 1, its work stuck)", n-handed)
	}
	dead := ms[1].Owned()
	start := time.Now()
	rootaccess.Driver(clients["b"]).Close() // as a kill -9: nothing released
	alive := []*recipe.Partitions{ms[0], ms[2], ms[3]}
	// The crash bound: the store keeps b's grants a TTL from their last
	// renewal (keeps), its membership goes as late, then a poll and the
	// rebalance chain. It is re-read at every look: the delays seen and
	// the leases the survivors lose to them may grow while it waits.
	bound := func() time.Duration { return mc.keeps + mc.ttl/3 + mc.rebalanceBound(p, 3, lg.lapsed()) }
	waitFor(t, func() bool {
		held := map[int]bool{}
		for _, m := range alive {
			for _, q := range m.Owned() {
				held[q] = true
			}
		}
		for _, q := range dead {
			if !held[q] {
				return false
			}
		}
		return true
	}, bound)
	t.Logf("b's %d partitions re-owned %v after its crash (bound %v), a's hand-off still stuck", len(dead),
		time.Since(start).Round(time.Millisecond), bound().Round(time.Millisecond))
	if n := ms[0].Stats().HandOffs; n != handed+1 {
		t.Errorf("a handed off %d after the join; want 1", n-handed)
	}
	lg.check()
}

// waitFor polls cond every 10ms for at most bound (read at every look).
func waitFor(t *testing.T, cond func() bool, bound func() time.Duration) {
	t.Helper()
	start := time.Now()
	for !cond() {
		if b := bound(); time.Since(start) > b {
			t.Fatalf("not so after %v", b.Round(time.Millisecond))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
