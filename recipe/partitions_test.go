package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/internal/core/limits"
	_ "github.com/fenced-dev/fenced/mem"
	"github.com/fenced-dev/fenced/recipe"
)

// TestAssignPartitionsBalanceAndMovement checks the assignment alone:
// every partition has one owner, counts are ⌊P/N⌋ or ⌈P/N⌉, and a join or
// leave computed from the current owners moves exactly the minimum: the
// ⌊P/N⌋ partitions the newcomer takes, or those the leaver had.
func TestAssignPartitionsBalanceAndMovement(t *testing.T) {
	for _, p := range []int{1, 7, 64, 1024} {
		for n := 1; n <= 9; n++ {
			members := make([]string, n)
			for i := range members {
				members[i] = fmt.Sprintf("m%d", i)
			}
			a := recipe.AssignPartitions(members, p, nil)
			checkAssignment(t, a, members, p)
			// Join of one more member.
			joined := append(slices.Clone(members), "new")
			b := recipe.AssignPartitions(joined, p, owners(a))
			checkAssignment(t, b, joined, p)
			if moved, minimum := movedPartitions(a, b), p/(n+1); moved != minimum || len(b["new"]) != minimum {
				t.Errorf("P=%d N=%d→%d: %d partitions moved, the newcomer got %d, minimum %d", p, n, n+1, moved, len(b["new"]), minimum)
			}
			// Leave of m0, from the joined group.
			left := joined[1:]
			c := recipe.AssignPartitions(left, p, owners(b))
			checkAssignment(t, c, left, p)
			if moved, minimum := movedPartitions(b, c), len(b["m0"]); moved != minimum {
				t.Errorf("P=%d N=%d→%d: %d partitions moved, minimum %d", p, n+1, n, moved, minimum)
			}
			// A fixed point: nothing moves when nothing changed.
			if d := recipe.AssignPartitions(left, p, owners(c)); movedPartitions(c, d) != 0 {
				t.Errorf("P=%d N=%d: a second look moves %d partitions", p, n, movedPartitions(c, d))
			}
			// Deterministic whatever the order of the list.
			rev := slices.Clone(joined)
			slices.Reverse(rev)
			if d := recipe.AssignPartitions(rev, p, owners(a)); movedPartitions(b, d) != 0 {
				t.Errorf("P=%d N=%d: assignment depends on the members' order", p, n)
			}
		}
	}
}

// TestAssignPartitionsChurn runs a long random sequence of joins, leaves
// and crashes, each computed from the previous owners, and checks that
// every step is balanced and moves exactly the minimum, and that owners
// that are not members (a crashed member still holding) count as free.
func TestAssignPartitionsChurn(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range []int{5, 64, 1024} {
		members := []string{"a", "b", "c"}
		cur := recipe.AssignPartitions(members, p, nil)
		next := 0
		for step := range 200 {
			var changed []string
			if len(members) > 1 && (len(members) > 12 || rng.IntN(2) == 0) {
				i := rng.IntN(len(members))
				changed = []string{members[i]}
				members = slices.Delete(slices.Clone(members), i, i+1)
			} else {
				next++
				id := fmt.Sprintf("j%d", next)
				if next%5 == 0 && step > 0 {
					id = "a" // a restart with an old ID
				}
				if slices.Contains(members, id) {
					id = fmt.Sprintf("k%d", next)
				}
				changed = []string{id}
				members = append(slices.Clone(members), id)
			}
			got := recipe.AssignPartitions(members, p, owners(cur))
			checkAssignment(t, got, members, p)
			minimum := len(got[changed[0]]) // a join
			if _, ok := cur[changed[0]]; ok && !slices.Contains(members, changed[0]) {
				minimum = len(cur[changed[0]]) // a leave
			}
			if moved := movedPartitions(cur, got); moved != minimum {
				t.Fatalf("P=%d step %d (%v, %d members): %d moved, minimum %d", p, step, changed, len(members), moved, minimum)
			}
			cur = got
		}
	}
}

// TestAssignPartitionsSticky: a member that leaves and comes back gets
// its partitions back when its share is ⌊P/N⌋.
func TestAssignPartitionsSticky(t *testing.T) {
	members := []string{"a", "b", "c", "d"}
	first := recipe.AssignPartitions(members, 64, nil) // 16 each
	gone := recipe.AssignPartitions(members[:3], 64, owners(first))
	back := recipe.AssignPartitions(members, 64, owners(gone))
	if !slices.Equal(first["d"], back["d"]) {
		t.Errorf("d had %v, got %v back", first["d"], back["d"])
	}
	if movedPartitions(first, back) != 0 {
		t.Errorf("the group did not come back to its first assignment: %v → %v", first, back)
	}
}

// owners inverts an assignment.
func owners(a map[string][]int) map[int]string {
	o := map[int]string{}
	for m, ps := range a {
		for _, p := range ps {
			o[p] = m
		}
	}
	return o
}

func checkAssignment(t *testing.T, a map[string][]int, members []string, p int) {
	t.Helper()
	seen := make([]int, p)
	n := len(members)
	for _, m := range members {
		got := len(a[m])
		if got != p/n && got != (p+n-1)/n {
			t.Errorf("P=%d N=%d: %s owns %d partitions", p, n, m, got)
		}
		for _, i := range a[m] {
			seen[i]++
		}
	}
	for i, s := range seen {
		if s != 1 {
			t.Errorf("P=%d N=%d: partition %d has %d owners", p, n, i, s)
		}
	}
}

// movedPartitions counts partitions whose owner differs between a and b.
func movedPartitions(a, b map[string][]int) int {
	owner := map[int]string{}
	for m, ps := range a {
		for _, p := range ps {
			owner[p] = m
		}
	}
	moved := 0
	for m, ps := range b {
		for _, p := range ps {
			if owner[p] != m {
				moved++
			}
		}
	}
	return moved
}

// partLedger records, across the members of one test, who holds each
// partition according to their events and work, and fails on an overlap.
type partLedger struct {
	t      *testing.T
	mu     sync.Mutex
	holder map[int]string // partition -> member whose work runs
	// holderCtx is the context of that work. Work may outlive a context
	// ended by a loss or by Close (the key is freed once the context is
	// cancelled, not once the work returns), never one ended gracefully.
	holderCtx map[int]context.Context
	fences    map[int]uint64 // partition -> last fence
	running   map[int]bool   // work function running
	errs      []string
	// lapses counts the partitions released because their lease ran out
	// (a renewal that came too late on a busy machine), not handed off,
	// left or closed.
	lapses int
}

func newPartLedger(t *testing.T) *partLedger {
	return &partLedger{t: t, holder: map[int]string{}, holderCtx: map[int]context.Context{}, fences: map[int]uint64{}, running: map[int]bool{}}
}

func (lg *partLedger) fail(format string, args ...any) {
	lg.errs = append(lg.errs, fmt.Sprintf(format, args...))
}

// work returns a member's work function: it marks the partition as
// worked on, waits for its context, and unmarks it before returning.
func (lg *partLedger) work(member string) func(context.Context, recipe.Partition) error {
	return func(ctx context.Context, p recipe.Partition) error {
		lg.mu.Lock()
		if h, ok := lg.holder[p.Index]; ok {
			switch hc := lg.holderCtx[p.Index]; {
			case hc.Err() == nil:
				lg.fail("partition %d: %s starts work while %s works on it", p.Index, member, h)
			case errors.Is(context.Cause(hc), recipe.ErrHandedOff), errors.Is(context.Cause(hc), recipe.ErrLeft):
				lg.fail("partition %d: %s starts work while %s still finishes its hand-off", p.Index, member, h)
			}
		}
		if f := p.Lease.Fence(); f <= lg.fences[p.Index] {
			lg.fail("partition %d: fence %d not above %d", p.Index, f, lg.fences[p.Index])
		}
		lg.holder[p.Index], lg.holderCtx[p.Index], lg.fences[p.Index] = member, ctx, p.Lease.Fence()
		lg.mu.Unlock()
		<-ctx.Done()
		if cause := context.Cause(ctx); errors.Is(cause, recipe.ErrHandedOff) || errors.Is(cause, recipe.ErrLeft) {
			// Graceful: the work is cancelled first, the lease released
			// only after the work returns.
			if err := p.Lease.Err(); err != nil {
				lg.mu.Lock()
				lg.fail("partition %d: %s's lease ended (%v) before its work returned from %v", p.Index, member, err, cause)
				lg.mu.Unlock()
			}
		}
		time.Sleep(5 * time.Millisecond) // a little clean-up after the cancel
		if errors.Is(context.Cause(ctx), recipe.ErrHandedOff) && p.Lease.Err() != nil {
			lg.mu.Lock()
			lg.fail("partition %d: %s's lease ended during its hand-off clean-up", p.Index, member)
			lg.mu.Unlock()
		}
		lg.mu.Lock()
		if lg.holderCtx[p.Index] == ctx {
			delete(lg.holder, p.Index)
			delete(lg.holderCtx, p.Index)
		}
		lg.mu.Unlock()
		return nil
	}
}

// onEvent checks that a release is reported only after the work returned.
func (lg *partLedger) onEvent(member string) func(recipe.PartitionEvent) {
	return func(e recipe.PartitionEvent) {
		if e.Kind != fenced.EventRelease {
			return
		}
		lg.mu.Lock()
		defer lg.mu.Unlock()
		if e.Cause != nil && !errors.Is(e.Cause, recipe.ErrHandedOff) && !errors.Is(e.Cause, recipe.ErrLeft) &&
			!errors.Is(e.Cause, fenced.ErrClosed) {
			lg.lapses++
			lg.t.Logf("partition %d: %s's lease ended: %v", e.Partition, member, e.Cause)

		}
		if h, ok := lg.holder[e.Partition]; ok && h == member && lg.fences[e.Partition] == e.Fence {
			lg.fail("partition %d: released by %s before its work returned", e.Partition, member)
		}
	}
}

// lapsed returns how many partitions were released because their lease
// ran out.
func (lg *partLedger) lapsed() int {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	return lg.lapses
}

func (lg *partLedger) check() {
	lg.t.Helper()
	lg.mu.Lock()
	defer lg.mu.Unlock()
	for _, e := range lg.errs {
		lg.t.Error(e)
	}
	lg.errs = nil
}

// partStores are the stores the in-process tests run on.
func partStores(t *testing.T) map[string]string {
	return map[string]string{
		"mem":    "mem://" + t.Name(),
		"sqlite": "sqlite://" + filepath.Join(t.TempDir(), "leases.db"),
	}
}

func partOpen(t *testing.T, url string) *fenced.Client {
	t.Helper()
	c, err := fenced.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// partMachine is what an in-process test measures of its machine, so that
// its time bounds follow the machine rather than a quiet one's figures:
// the TTL its leases use, and the delays it sees while it runs.
type partMachine struct {
	ttl   time.Duration // the test's TTL on a quiet machine, or one from the delays measured
	keeps time.Duration // how long the store may keep a grant after its last renewal
	late  *lateSampler  // timer lateness and store round trips, for the rest of the test
}

// newPartMachine measures the machine through writers clients of url
// probing the store at once (one for each client the test opens), picks
// the TTL, and samples the delays until the test ends.
//
// The TTL is machineTTL's: quietTTL, 8 lone round trips, or 3 round trips
// with every client probing: a renewal is due every TTL/3 and must land
// within the remaining 2/3 TTL, and the probes, a write every 10 ms or so
// per client, load the store more than the members' renewals and tries
// do. On SQLite
// under -race beside a CPU hog one write holds the file's write lock for
// 50 to 150 ms, and the renewals of five clients queue behind each other
// (SQLite's busy wait polls, up to every 100 ms, and is not first come,
// first served): a renewal then took up to 1.4 s while a lone probe took
// 240 ms, so a TTL of 8 lone probes lapsed.
func newPartMachine(t *testing.T, url string, quietTTL time.Duration, writers int) *partMachine {
	t.Helper()
	cs := make([]*fenced.Client, writers)
	for i := range cs {
		cs[i] = partOpen(t, url)
	}
	ttl, worst := machineTTL(t, cs, quietTTL)
	t.Logf("TTL %v (%v on a quiet machine; the worst delay of %d clients probing at once was %v: a timer's lateness or a store round trip)",
		ttl, quietTTL, writers, worst.Round(time.Millisecond))
	late := startLateSampler(cs[0])
	t.Cleanup(late.Stop) // before the client's Close
	return &partMachine{ttl: ttl, keeps: cs[0].Capabilities().Keeps.Outlives(ttl), late: late}
}

// rebalanceBound is how long a rebalance of p partitions among n members
// may take on this machine, with lapses leases lost on the way.
//
// On a quiet machine, two TTLs: a poll (TTL/3) for a member that missed
// the doorbell, the hand-off, a poll for the taker that missed the
// release, and room for -race (4 s at a 2 s TTL; notified backends
// usually take tens of milliseconds). On a busy one, every step of that
// chain may also wait the worst delay the run has seen (a timer's
// lateness or a store round trip, re-read as the run goes): the doorbell
// (a grant, a refused try and a release), a listing, the hand-off's
// release, the taker's listing, and its tries, one grant after another
// for the ⌈P/N⌉ partitions it takes. A lease that ran out (a renewal that
// the machine delayed past the TTL) adds its recovery: the store keeps
// the grant until its TTL from the last renewal (keeps), and a poll later
// the member joins again or the partition is taken.
func (m *partMachine) rebalanceBound(p, n, lapses int) time.Duration {
	b := 2*m.ttl + time.Duration(6+(p+n-1)/n)*m.late.Max()
	if lapses > 0 {
		b += m.keeps + m.ttl/3
	}
	return b
}

// balanced waits until the members own every partition between them,
// each ⌊P/N⌋ or ⌈P/N⌉, for extra plus the rebalance bound (re-read as
// the wait goes, since the delays seen and the lapses lg counts may
// grow), and returns what each owns.
func (m *partMachine) balanced(t *testing.T, ms []*recipe.Partitions, p int, lg *partLedger, extra time.Duration) map[string][]int {
	t.Helper()
	return partBalancedWithin(t, ms, p, func() (time.Duration, string) {
		return extra + m.rebalanceBound(p, len(ms), lg.lapsed()), fmt.Sprintf("TTL %v, worst delay seen %v, %d leases ran out",
			m.ttl, m.late.Max().Round(time.Millisecond), lg.lapsed())
	})
}

// partBalanced waits until the members own every partition between them,
// each ⌊P/N⌋ or ⌈P/N⌉, and returns what each owns.
func partBalanced(t *testing.T, ms []*recipe.Partitions, p int, within time.Duration) map[string][]int {
	t.Helper()
	return partBalancedWithin(t, ms, p, func() (time.Duration, string) { return within, "a fixed bound" })
}

// partBalancedWithin is partBalanced with a bound read at every look,
// and what it derives from, for the failure message.
func partBalancedWithin(t *testing.T, ms []*recipe.Partitions, p int, bound func() (time.Duration, string)) map[string][]int {
	t.Helper()
	start := time.Now()
	for {
		got := map[string][]int{}
		total, ok := 0, true
		for _, m := range ms {
			o := m.Owned()
			got[m.MemberID()] = o
			total += len(o)
			if len(o) != p/len(ms) && len(o) != (p+len(ms)-1)/len(ms) {
				ok = false
			}
		}
		if ok && total == p {
			return got
		}
		if b, from := bound(); time.Since(start) > b {
			for _, m := range ms {
				t.Logf("%s: stats %+v owns %v", m.MemberID(), m.Stats(), m.Owned())
			}
			t.Fatalf("not balanced after %v, over the bound %v (%s): %v", time.Since(start).Round(time.Millisecond), b.Round(time.Millisecond), from, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPartitionsRebalance runs members in one process on mem and SQLite:
// three share 16 partitions within ±1; a fourth joins and gets its share
// with few moves and no overlap; one leaves gracefully and its
// partitions are taken at once, after its work has returned.
func TestPartitionsRebalance(t *testing.T) {
	for name, url := range partStores(t) {
		t.Run(name, func(t *testing.T) {
			const p = 16
			ctx := context.Background()
			lg := newPartLedger(t)
			mc := newPartMachine(t, url, 2*time.Second, 5)
			opts := func(id string) *recipe.PartitionsOptions {
				return &recipe.PartitionsOptions{MemberID: id, Lease: &fenced.LeaseOptions{TTL: mc.ttl},
					OnEvent: lg.onEvent(id)}
			}
			var ms []*recipe.Partitions
			join := func(id string) *recipe.Partitions {
				m, err := recipe.JoinPartitions(ctx, partOpen(t, url), "billing", p, lg.work(id), opts(id))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { m.Leave(ctx) })
				ms = append(ms, m)
				return m
			}
			for _, id := range []string{"a", "b", "c"} {
				join(id)
			}
			// Notified backends rebalance well within the poll (TTL/3).
			before := mc.balanced(t, ms, p, lg, 0)
			lg.check()

			join("d")
			after := mc.balanced(t, ms, p, lg, 0)
			lg.check()
			if moved, minimum := movedPartitions(before, after), len(after["d"]); moved > minimum+3 {
				t.Errorf("join moved %d partitions, minimum %d: %v → %v", moved, minimum, before, after)
			}
			if err := ms[0].Leave(ctx); err != nil {
				t.Fatal(err)
			}
			if o := ms[0].Owned(); len(o) != 0 {
				t.Errorf("a owns %v after Leave", o)
			}
			ms = ms[1:]
			mc.balanced(t, ms, p, lg, 0)
			lg.check()
			handoffs := uint64(0)
			for _, m := range ms {
				handoffs += m.Stats().HandOffs
			}
			if handoffs == 0 {
				t.Errorf("no hand-off counted after a join")
			}
		})
	}
}

// TestPartitionsStickyRestart: a member that leaves and joins again with
// the same ID gets its share back, moving nothing else.
func TestPartitionsStickyRestart(t *testing.T) {
	ctx := context.Background()
	url := "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
	lg := newPartLedger(t)
	mc := newPartMachine(t, url, 2*time.Second, 4)
	var ms []*recipe.Partitions
	for _, id := range []string{"a", "b", "c"} {
		m, err := recipe.JoinPartitions(ctx, partOpen(t, url), "g", 12, lg.work(id),
			&recipe.PartitionsOptions{MemberID: id, Lease: &fenced.LeaseOptions{TTL: mc.ttl}, OnEvent: lg.onEvent(id)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Leave(ctx) })
		ms = append(ms, m)
	}
	mc.balanced(t, ms, 12, lg, 0)
	ms[2].Leave(ctx)
	before := mc.balanced(t, ms[:2], 12, lg, 0)
	m, err := recipe.JoinPartitions(ctx, partOpen(t, url), "g", 12, lg.work("c"),
		&recipe.PartitionsOptions{MemberID: "c", Lease: &fenced.LeaseOptions{TTL: mc.ttl}, OnEvent: lg.onEvent("c")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Leave(ctx) })
	ms[2] = m
	again := mc.balanced(t, ms, 12, lg, 0)
	// Minimal movement comes first: the rejoin moves c's share and no
	// more. Which partitions c gets is pulled towards the fresh
	// assignment (TestAssignPartitionsSticky), which equals its old share
	// only if the group was at the fresh assignment before it left.
	if moved := movedPartitions(before, again); moved != len(again["c"]) {
		t.Errorf("the rejoin moved %d partitions, c got %d: %v → %v", moved, len(again["c"]), before, again)
	}
	lg.check()
}

// TestPartitionsCountMismatch: a member with another P is refused while
// a member with the group's P is live, with an error naming both.
func TestPartitionsCountMismatch(t *testing.T) {
	ctx := context.Background()
	url := "mem://" + t.Name()
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	m, err := recipe.JoinPartitions(ctx, partOpen(t, url), "g", 16, idle, &recipe.PartitionsOptions{MemberID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave(ctx)
	_, err = recipe.JoinPartitions(ctx, partOpen(t, url), "g", 8, idle, &recipe.PartitionsOptions{MemberID: "b"})
	if !errors.Is(err, recipe.ErrPartitionCount) {
		t.Fatalf("join with P=8 beside P=16: got %v, want ErrPartitionCount", err)
	}
	t.Logf("refused: %v", err)
	if st, err := recipe.ReadGroup(ctx, partOpen(t, url), "g"); err != nil || len(st.Members) != 1 {
		t.Errorf("members after the refusal: %v, %v; want a alone", st.Members, err)
	}
	// Bad input.
	for _, tc := range []struct {
		p    int
		opts recipe.PartitionsOptions
		want string
	}{
		{0, recipe.PartitionsOptions{MemberID: "x"}, "the partition count 0 is not 1 to"},
		{limits.MaxPartitions + 1, recipe.PartitionsOptions{MemberID: "x"}, "is not 1 to"},
		{4, recipe.PartitionsOptions{MemberID: "x/y"}, `MemberID "x/y" contains '/'`},
		{4, recipe.PartitionsOptions{MemberID: "x", Poll: -time.Second}, "Poll -1s is negative"},
		{4, recipe.PartitionsOptions{MemberID: "x", HandoffGrace: -time.Second}, "HandoffGrace -1s is negative"},
	} {
		_, err := recipe.JoinPartitions(ctx, partOpen(t, url), "g", tc.p, idle, &tc.opts)
		if !errors.Is(err, fenced.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "lease options") {
			t.Errorf("P=%d %+v: got %v, want ErrInvalidOptions saying %q (and not \"lease options\")", tc.p, tc.opts, err, tc.want)
		}
	}
}

// TestPartitionsMemberLive: a second live process with the same member ID
// is refused once the first has kept the membership for as long as a
// join waits (twice the TTL on mem). The TTL is 200 ms, or more on a busy
// machine (drivertest.MeasuredTTL): under the hog the first member's
// renewals came too late for 200 ms, its membership lapsed, and the
// second joined, as it should then.
func TestPartitionsMemberLive(t *testing.T) {
	ctx := context.Background()
	url := "mem://" + t.Name()
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	ttl := drivertest.MeasuredTTL(t, 200*time.Millisecond, partOpen(t, url), partOpen(t, url))
	o := &recipe.PartitionsOptions{MemberID: "a", Lease: &fenced.LeaseOptions{TTL: ttl}}
	m, err := recipe.JoinPartitions(ctx, partOpen(t, url), "g", 4, idle, o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave(ctx)
	if _, err := recipe.JoinPartitions(ctx, partOpen(t, url), "g", 4, idle, o); !errors.Is(err, recipe.ErrMemberLive) {
		t.Fatalf("second member a: got %v, want ErrMemberLive", err)
	}
}

// TestPartitionsClientClosed: a member whose client is closed under it
// (its leases end with ErrClosed, the member's loop still runs) stops
// owning anything, and the survivors take its partitions, with higher
// fences. Kill -9 and SIGSTOP are the multi-process proof's.
func TestPartitionsClientClosed(t *testing.T) {
	ctx := context.Background()
	url := "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
	lg := newPartLedger(t)
	mc := newPartMachine(t, url, 600*time.Millisecond, 4)
	ttl := mc.ttl
	var ms []*recipe.Partitions
	var clients []*fenced.Client
	for _, id := range []string{"a", "b", "c"} {
		c := partOpen(t, url)
		m, err := recipe.JoinPartitions(ctx, c, "g", 9, lg.work(id), &recipe.PartitionsOptions{MemberID: id, Lease: &fenced.LeaseOptions{TTL: ttl}, OnEvent: lg.onEvent(id)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Leave(ctx) })
		ms, clients = append(ms, m), append(clients, c)
	}
	mc.balanced(t, ms, 9, lg, 0)
	clients[0].Close()
	// Close releases a's grants; one it could not release in time stays
	// at the store until it expires (keeps) before a survivor can take it.
	mc.balanced(t, ms[1:], 9, lg, mc.keeps)
	if o := ms[0].Owned(); len(o) != 0 {
		t.Errorf("a owns %v with its client closed", o)
	}
	lg.check()
}
