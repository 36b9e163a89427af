package proof

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// partKnobs are a partitions run's rebalancing settings, the same on
// every member, and each slot's weight.
type partKnobs struct {
	weights         []int
	threshold       float64
	dampening       float64
	maxInTransition int
}

// drawPartKnobs draws the knobs from seed, on a stream of their own so
// that the nemesis's schedule of a seed stays what it was: weights 1 to
// 4, a threshold of 0.05 to 0.3, a dampening of 0.2 to 1 and 1 to 4
// partitions in transition at once.
func drawPartKnobs(seed uint64, members int) partKnobs {
	rng := rand.New(rand.NewPCG(seed, 1<<43))
	k := partKnobs{weights: make([]int, members), threshold: 0.05 + 0.25*rng.Float64(),
		dampening: 0.2 + 0.8*rng.Float64(), maxInTransition: 1 + rng.IntN(4)}
	for i := range k.weights {
		k.weights[i] = 1 + rng.IntN(4)
	}
	return k
}

func (k partKnobs) String() string {
	return fmt.Sprintf("weights %v, threshold %.2f, dampening %.2f, max in transition %d", k.weights, k.threshold,
		k.dampening, k.maxInTransition)
}

// partConvergence is what converge saw after the churn.
type partConvergence struct {
	took time.Duration // from the end of the last fault to the weighted balance
	ok   bool
	last string // the last listing's counts, when it did not converge
}

// partConvergeLimit is how long converge waits at most after the churn.
const partConvergeLimit = 3 * time.Minute

// converge waits, after the last fault, reviving members that exited,
// until every member is live at the current count, every partition is held by one of them, and each holds
// within the threshold of its weighted share (balanced), and at least 3
// TTLs, so that the observer also sees the last fault's spells end.
//
// A deploy's sleeper stops by itself only if the group moved on before it
// was admitted again: resumed while no member of the new count was live
// yet (they were still starting, or waiting for its partition leases),
// it is admitted at the old count, and the new count's members are
// refused while it lives (the first count back wins; two never work at
// once). Its rollout is not over then: as an orchestrator replaces every
// process of the old version, converge replaces such a straggler (a kill,
// then a start at the current count) once only members of other counts
// have been live for straggleAfter, and measures the balance from then.
func (r *genPartRun) converge(ctx context.Context) partConvergence {
	r.mu.Lock()
	end, p := r.churnEnd, r.p
	r.mu.Unlock()
	if end.IsZero() {
		return partConvergence{}
	}
	c, err := fenced.Open(ctx, r.cfg.Store, nil)
	if err != nil {
		return partConvergence{last: err.Error()}
	}
	defer c.Close()
	limit := partConvergeLimit
	if d, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(d)-30*time.Second) // room to read the history and judge
	}
	var conv partConvergence
	logged := time.Now()
	var straggling time.Time // since when only other counts were live
	stopAt := end.Add(limit) // a replacement below moves end, not this
	for ctx.Err() == nil && time.Now().Before(stopAt) {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := recipe.ReadGroup(lctx, c, r.group)
		cancel()
		if err == nil {
			if others := stragglers(st, p); len(others) == 0 {
				straggling = time.Time{}
			} else if straggling.IsZero() {
				straggling = time.Now()
			} else if time.Since(straggling) > r.straggleAfter() {
				r.replace(others, p)
				end, straggling = time.Now(), time.Time{}
				continue
			}
			ok, last := r.balanced(st, p)
			if ok && conv.took == 0 {
				conv.took = time.Since(end)
			}
			if !ok {
				conv.took = 0
			}
			conv.ok, conv.last = ok, last
			if !ok && time.Since(logged) > 5*time.Second {
				r.cfg.Logf("seed %d: not balanced by weight %v after the churn: %s", r.cfg.Seed, time.Since(end).Round(time.Second), last)
				logged = time.Now()
			}
			if ok && time.Since(end) >= 3*r.cfg.TTL {
				return conv
			}
		}
		// A member at an old count (the last deploy's sleeper) exits once
		// continued: revive starts it again at the current count, as the
		// nemesis's sleeps do.
		if err := r.sleep(ctx, 50*time.Millisecond); err != nil {
			break
		}
	}
	return conv
}

// stragglers returns the slots of the live members of st, if every one of
// them has a count other than p.
func stragglers(st recipe.GroupState, p int) []int {
	var slots []int
	for _, m := range st.Members {
		if m.Partitions == p {
			return nil
		}
		var i int
		if _, err := fmt.Sscanf(m.ID, "m%d", &i); err == nil {
			slots = append(slots, i)
		}
	}
	return slots
}

// straggleAfter is how long converge lets members of an old count be the
// only live ones before it replaces them: long enough for a sleeper that
// lapsed to find the new count's members live and stop by itself (their
// wait for its leases, a TTL and the store's keep, then its next look),
// twice over.
func (r *genPartRun) straggleAfter() time.Duration {
	return 2 * (r.outlives + 2*r.cfg.TTL)
}

// replace ends the members in slots (kill -9) and starts them again at
// count p, as a rollout replaces an old version's processes.
func (r *genPartRun) replace(slots []int, p int) {
	for _, i := range slots {
		r.cfg.Logf("seed %d: member %d live at an old count, and no member of count %d, for %v after the churn: "+
			"replaced, as a rollout does", r.cfg.Seed, i, p, r.straggleAfter().Round(time.Millisecond))
		r.hold(i, true)
		r.end(i, true)
		err := r.startMember(i)
		r.hold(i, false)
		if err != nil {
			r.cfg.Logf("seed %d: start member %d: %v", r.cfg.Seed, i, err)
		}
		r.mu.Lock()
		r.faults["rollout"]++
		r.mu.Unlock()
	}
}

// balanced reports whether st shows the group of count p balanced by
// weight within the threshold, and describes it.
func (r *genPartRun) balanced(st recipe.GroupState, p int) (bool, string) {
	weights := map[string]int{}
	total := 0
	for _, m := range st.Members {
		if m.Partitions == p {
			weights[m.ID] = m.Weight
			total += m.Weight
		}
	}
	counts := map[string]int{}
	for i, id := range st.Owners {
		if i < p {
			counts[id]++
		}
	}
	desc := fmt.Sprintf("P %d, %d of %d held by live members, members (id: held/weight) ", p, len(st.Owners), p)
	ok := len(weights) == r.cfg.Members && len(st.Owners) == p
	for i := range r.cfg.Members {
		id := fmt.Sprintf("m%d", i)
		w, live := weights[id]
		desc += fmt.Sprintf("%s: %d/%d (live %v) ", id, counts[id], w, live)
		if !live || w != r.knobs.weights[i] {
			ok = false // not live, or its weight did not reach the listing
			continue
		}
		q := float64(p) * float64(w) / float64(total)
		if math.Abs(float64(counts[id])-q) > r.knobs.threshold*math.Ceil(q)+1 {
			ok = false
		}
	}
	return ok, desc
}

// judgeConvergence checks that the group, once the churn stopped, came to
// the weighted balance within its bound: the recovery bound (Bound: the
// last fault's partitions owned again), a TTL and the store's keep of a
// grant for a member killed last to be admitted again (it waits for its
// earlier incarnation's membership to end), and the waves of throttled
// hand-offs. A wave is a look (a poll, TTL/3), the work's return (a write
// period and a write), the release, the taker's look (TTL/3), 200ms of
// listing and 3 × the measured scheduling delay; there are as many as
// the dampening needs to bring an excess of P below one (⌈ln P /
// ln(1/(1-d))⌉ + 1, or 1 at d = 1) plus ⌈P / MaxInTransition⌉.
func (r *GenPartReport) judgeConvergence(c partConvergence, k partKnobs, p int, outlives, ttl time.Duration) {
	r.Knobs = k.String()
	waves := 1
	if k.dampening < 1 {
		waves = int(math.Ceil(math.Log(float64(p))/math.Log(1/(1-k.dampening)))) + 1
	}
	waves += (p + k.maxInTransition - 1) / k.maxInTransition
	wave := 2*ttl/3 + partWriteEvery + 200*time.Millisecond + 3*r.MaxSchedDelay
	r.ConvergeBound = r.Bound + ttl + outlives + time.Duration(waves)*wave
	r.Converge = c.took
	if !c.ok || c.took > r.ConvergeBound {
		r.Missed++
	}
	switch {
	case !c.ok:
		r.Problems = append(r.Problems, fmt.Sprintf("not balanced by weight within the threshold after the churn: %s", c.last))
	case c.took > r.ConvergeBound:
		r.Problems = append(r.Problems, fmt.Sprintf("balanced by weight %v after the churn, over the bound %v (recovery %v + "+
			"a TTL %v + the store's keep %v + %d waves of %v)", c.took.Round(time.Millisecond), r.ConvergeBound.Round(time.Millisecond),
			r.Bound.Round(time.Millisecond), ttl, outlives, waves, wave.Round(time.Millisecond)))
	}
}
