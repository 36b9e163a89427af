package recipe_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/recipe"
)

// cpLedger records each partition's accepted checkpoints and what every
// new owner was given, and fails when an owner does not start from the
// last accepted one (or from one written after it whose outcome was
// unknown: it may have landed).
type cpLedger struct {
	mu       sync.Mutex
	accepted map[int][]byte   // partition -> last accepted checkpoint
	maybe    map[int][]string // partition -> unknown outcomes since it
	starts   int
	errs     []string
}

func newCPLedger() *cpLedger { return &cpLedger{accepted: map[int][]byte{}, maybe: map[int][]string{}} }

func (lg *cpLedger) fail(format string, args ...any) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	lg.errs = append(lg.errs, fmt.Sprintf(format, args...))
}

// record checkpoints v for p's owner and records it if the store took it.
func (lg *cpLedger) record(ctx context.Context, p recipe.Partition, v string) error {
	err := p.Lease.Checkpoint(ctx, []byte(v))
	lg.mu.Lock()
	defer lg.mu.Unlock()
	switch {
	case err == nil:
		lg.accepted[p.Index], lg.maybe[p.Index] = []byte(v), nil
	case errors.Is(err, fenced.ErrUnknownOutcome):
		lg.maybe[p.Index] = append(lg.maybe[p.Index], v)
	}
	return err
}

// last reports whether v may be partition i's last checkpoint: the last
// accepted, or one written since whose outcome was unknown (then taken as
// accepted). lg.mu is held.
func (lg *cpLedger) last(i int, v []byte) bool {
	if string(v) == string(lg.accepted[i]) {
		return true
	}
	for _, m := range lg.maybe[i] {
		if m == string(v) {
			lg.accepted[i], lg.maybe[i] = v, nil
			return true
		}
	}
	return false
}

// work checkpoints every 20 milliseconds while it owns p and, handed off
// or left, records its last checkpoint within Partition.Finish.
func (lg *cpLedger) work(member string) func(context.Context, recipe.Partition) error {
	return func(ctx context.Context, p recipe.Partition) error {
		lg.mu.Lock()
		lg.starts++
		if want := lg.accepted[p.Index]; !lg.last(p.Index, p.Checkpoint) {
			lg.errs = append(lg.errs, fmt.Sprintf("partition %d: %s starts from checkpoint %q, the last accepted is %q",
				p.Index, member, p.Checkpoint, want))
		}
		lg.mu.Unlock()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				fctx, cancel := p.Finish(ctx)
				defer cancel()
				if err := lg.record(fctx, p, fmt.Sprintf("%s fence %d final %d", member, p.Lease.Fence(), n)); err != nil {
					lg.fail("partition %d: %s's last checkpoint within its hand-off: %v", p.Index, member, err)
				}
				return nil
			case <-time.After(20 * time.Millisecond):
			}
			if err := lg.record(ctx, p, fmt.Sprintf("%s fence %d step %d", member, p.Lease.Fence(), n)); err != nil && ctx.Err() == nil {
				lg.fail("partition %d: %s's checkpoint while it owns the partition: %v", p.Index, member, err)
			}
		}
	}
}

func (lg *cpLedger) check(t *testing.T) {
	t.Helper()
	lg.mu.Lock()
	defer lg.mu.Unlock()
	for _, e := range lg.errs {
		t.Error(e)
	}
}

// TestPartitionsCheckpointTravels: a partition's checkpoint goes with it.
// A owns four partitions and checkpoints as it works; B joins and takes
// two, then A leaves and B takes the rest. Each hand-off's work records a
// last checkpoint within Partition.Finish, and every new owner starts from
// the last checkpoint the store accepted for its partition.
func TestPartitionsCheckpointTravels(t *testing.T) {
	for name, url := range partStores(t) {
		t.Run(name, func(t *testing.T) {
			const p = 4
			ctx := context.Background()
			lg := newCPLedger()
			// A hand-off's last checkpoint has a TTL (the default
			// HandoffGrace) to land: one the machine renews in time.
			// Floor 3s: eight works checkpointing keep SQLite's write
			// lock busy, which the probe's idle store does not show.
			ttl := drivertest.MeasuredTTL(t, 3*time.Second, partOpen(t, url), partOpen(t, url))
			wait := max(10*time.Second, 5*ttl)
			join := func(id string) *recipe.Partitions {
				m, err := recipe.JoinPartitions(ctx, partOpen(t, url), "cp", p, lg.work(id),
					&recipe.PartitionsOptions{MemberID: id, Lease: &fenced.LeaseOptions{TTL: ttl}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { m.Leave(ctx) })
				return m
			}
			a := join("a")
			partBalanced(t, []*recipe.Partitions{a}, p, wait)
			time.Sleep(50 * time.Millisecond)
			b := join("b")
			partBalanced(t, []*recipe.Partitions{a, b}, p, wait)
			time.Sleep(50 * time.Millisecond)
			if err := a.Leave(ctx); err != nil {
				t.Fatal(err)
			}
			partBalanced(t, []*recipe.Partitions{b}, p, wait)
			if err := b.Leave(ctx); err != nil {
				t.Fatal(err)
			}
			lg.check(t)
			c := partOpen(t, url)
			for i := range p {
				v, _, err := c.Checkpoint(ctx, fmt.Sprintf("cp/p/%d", i))
				if err != nil || !lg.last(i, v) {
					t.Errorf("partition %d: checkpoint after everyone left %q, %v; the last accepted %q", i, v, err, lg.accepted[i])
				}
			}
			if lg.starts != 2*p {
				t.Errorf("%d works started, want %d (A's four, B's two after its join and two after A's leave)", lg.starts, 2*p)
			}
		})
	}
}

// TestPartitionsHandOffOverran: a work that ignores its hand-off past
// HandoffGrace is reported (fenced.EventLost) and its lease released; its
// late checkpoint is refused with ErrNotHeld, and the new owner starts from
// the last checkpoint before the hand-off.
func TestPartitionsHandOffOverran(t *testing.T) {
	const grace = 200 * time.Millisecond
	ctx := context.Background()
	url := "mem://" + t.Name()
	type lateCP struct {
		p   int
		err error
	}
	late := make(chan lateCP, 2)
	overran := make(chan recipe.PartitionEvent, 2)
	// released[i] closes at partition i's EventLost, sent once its lease
	// is released at the store (the lease's context ends before that).
	released := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	stubborn := func(ctx context.Context, p recipe.Partition) error {
		if err := p.Lease.Checkpoint(ctx, fmt.Appendf(nil, "a before %d", p.Index)); err != nil {
			return err
		}
		<-ctx.Done()
		<-released[p.Index] // ignores the hand-off until the lease is released
		late <- lateCP{p.Index, p.Lease.Checkpoint(context.Background(), []byte("a late"))}
		return nil
	}
	a, err := recipe.JoinPartitions(ctx, partOpen(t, url), "over", 2, stubborn, &recipe.PartitionsOptions{
		MemberID: "a", Lease: &fenced.LeaseOptions{TTL: 5 * time.Second}, HandoffGrace: grace,
		OnEvent: func(e recipe.PartitionEvent) {
			if e.Kind == fenced.EventLost {
				overran <- e
				close(released[e.Partition])
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Leave(ctx) })
	partBalanced(t, []*recipe.Partitions{a}, 2, 10*time.Second)
	type start struct {
		p  int
		cp []byte
	}
	started := make(chan start, 2)
	b, err := recipe.JoinPartitions(ctx, partOpen(t, url), "over", 2, func(ctx context.Context, p recipe.Partition) error {
		started <- start{p.Index, p.Checkpoint}
		<-ctx.Done()
		return nil
	}, &recipe.PartitionsOptions{MemberID: "b", Lease: &fenced.LeaseOptions{TTL: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Leave(ctx) })
	var moved int
	select {
	case e := <-overran:
		moved = e.Partition
		if e.HandOff < grace {
			t.Errorf("overran event %+v: want one after at least the grace %v", e, grace)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no EventLost event 20 s after the hand-off (the grace is 200 ms)")
	}
	if l := <-late; l.p != moved || !errors.Is(l.err, fenced.ErrNotHeld) {
		t.Errorf("the overrunning work's late checkpoint on partition %d: %v, want ErrNotHeld on partition %d", l.p, l.err, moved)
	}
	select {
	case s := <-started:
		if want := fmt.Sprintf("a before %d", moved); s.p != moved || string(s.cp) != want {
			t.Errorf("the new owner starts partition %d from %q, want partition %d from %q", s.p, s.cp, moved, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the new owner did not start")
	}
}

// TestPartitionsLeaveOverran: Leave waits HandoffGrace for a work that
// ignores its end, then releases the lease anyway and reports it with a
// EventLost event; the work's Finish context has ended by then,
// and the overrunning work's checkpoint is refused.
func TestPartitionsLeaveOverran(t *testing.T) {
	const grace = 200 * time.Millisecond
	ctx := context.Background()
	finished := make(chan error, 1)
	released := make(chan struct{}) // closes at EventLost, sent once the store released the lease
	var mu sync.Mutex
	var events []recipe.PartitionEvent
	m, err := recipe.JoinPartitions(ctx, partOpen(t, "mem://"+t.Name()), "leave", 1, func(ctx context.Context, p recipe.Partition) error {
		<-ctx.Done()
		fctx, cancel := p.Finish(ctx)
		defer cancel()
		<-fctx.Done() // the grace is over (or the lease ended)
		<-released    // overruns: returns only once the lease is released
		finished <- p.Lease.Checkpoint(context.Background(), []byte("late"))
		return nil
	}, &recipe.PartitionsOptions{Lease: &fenced.LeaseOptions{TTL: 5 * time.Second}, HandoffGrace: grace,
		OnEvent: func(e recipe.PartitionEvent) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, e)
			if e.Kind == fenced.EventLost {
				close(released)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	partBalanced(t, []*recipe.Partitions{m}, 1, 10*time.Second)
	if err := m.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-finished; !errors.Is(err, fenced.ErrNotHeld) {
		t.Errorf("a checkpoint after the grace of a leave: %v, want ErrNotHeld", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range events {
		if e.Kind == fenced.EventLost {
			if e.HandOff < grace {
				t.Errorf("overran after %v, before the grace %v", e.HandOff, grace)
			}
			return
		}
	}
	t.Errorf("no EventLost event after a leave whose work overran: %+v", events)
}

// TestPartitionsOverranWorkKeepsNoPartition: a work blocked for good
// past its hand-off does not keep its partition from its member. When the
// assignment gives the partition back, the member starts a new work with
// a higher fence. The proof saw a partition unowned for seconds: its
// member's old work was stuck in a write, and nobody else was planned it.
func TestPartitionsOverranWorkKeepsNoPartition(t *testing.T) {
	const grace = 200 * time.Millisecond
	ctx := context.Background()
	url := "mem://" + t.Name()
	type start struct {
		p     int
		fence uint64
	}
	starts := make(chan start, 8)
	stuck := make(chan struct{})
	blocked := func(ctx context.Context, p recipe.Partition) error {
		starts <- start{p.Index, p.Lease.Fence()}
		<-stuck // ignores its context, as a work stuck in a write
		return nil
	}
	lost := make(chan int, 8)
	a, err := recipe.JoinPartitions(ctx, partOpen(t, url), "back", 2, blocked, &recipe.PartitionsOptions{
		MemberID: "a", Lease: &fenced.LeaseOptions{TTL: 3 * time.Second}, HandoffGrace: grace,
		OnEvent: func(e recipe.PartitionEvent) {
			if e.Kind == fenced.EventLost {
				lost <- e.Partition
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Leave(ctx) })
	t.Cleanup(func() { close(stuck) }) // runs first: lets a's works return
	first := map[int]uint64{}
	for range 2 {
		select {
		case s := <-starts:
			first[s.p] = s.fence
		case <-time.After(20 * time.Second):
			t.Fatalf("a started %d of 2 partitions in 20 s", len(first))
		}
	}
	b, err := recipe.JoinPartitions(ctx, partOpen(t, url), "back", 2, func(ctx context.Context, p recipe.Partition) error {
		<-ctx.Done()
		return nil
	}, &recipe.PartitionsOptions{MemberID: "b", Lease: &fenced.LeaseOptions{TTL: 3 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	var moved int
	select {
	case moved = <-lost:
	case <-time.After(20 * time.Second):
		t.Fatal("no EventLost 20 s after b joined (the grace is 200 ms)")
	}
	partBalanced(t, []*recipe.Partitions{a, b}, 2, 20*time.Second)
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	// b's leave rings the doorbell: a looks at once, and at the latest
	// at its next poll (a third of the TTL).
	select {
	case s := <-starts:
		if s.p != moved || s.fence <= first[moved] {
			t.Errorf("a started partition %d with fence %d, want partition %d above fence %d", s.p, s.fence, moved, first[moved])
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("a did not take partition %d back within 20 s of b's leave: its old work, stuck, kept it", moved)
	}
	if got := a.Owned(); len(got) != 2 {
		t.Errorf("a owns %v after b left, want both partitions", got)
	}
}

// TestPartitionsLostWorkKeepsNoPartition: a work stuck past its lease's
// loss (a break) keeps its partition a grace at most. The member, still
// planned the partition, then takes it again with a higher fence.
func TestPartitionsLostWorkKeepsNoPartition(t *testing.T) {
	const grace = 200 * time.Millisecond
	ctx := context.Background()
	url := "mem://" + t.Name()
	fences := make(chan uint64, 4)
	stuck := make(chan struct{})
	a, err := recipe.JoinPartitions(ctx, partOpen(t, url), "lost", 1, func(ctx context.Context, p recipe.Partition) error {
		fences <- p.Lease.Fence()
		<-stuck // ignores its context, as a work stuck in a write
		return nil
	}, &recipe.PartitionsOptions{MemberID: "a", Lease: &fenced.LeaseOptions{TTL: 3 * time.Second}, HandoffGrace: grace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Leave(ctx) })
	t.Cleanup(func() { close(stuck) })
	var first uint64
	select {
	case first = <-fences:
	case <-time.After(20 * time.Second):
		t.Fatal("a did not start its partition in 20 s")
	}
	if _, err := partOpen(t, url).Break(ctx, "lost/p/0", "test: a lost lease", "test"); err != nil {
		t.Fatal(err)
	}
	// The loss is seen at a's next renewal (a third of the TTL); its next
	// look a grace later takes the partition again.
	select {
	case f := <-fences:
		if f <= first {
			t.Errorf("a took the partition again with fence %d, want above %d", f, first)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a did not take its partition back within 20 s of the break: its old work, stuck, kept it")
	}
}

// TestPartitionsStaleGrantReadsNoLaterCheckpoint: a partition lease that
// lapsed between its grant and the member's read of the checkpoint (a
// pause) finds a later grant's checkpoint; the member must not start the
// work from it. The SQLite proof saw fence 1 start from fence 2's "2:0".
func TestPartitionsStaleGrantReadsNoLaterCheckpoint(t *testing.T) {
	ctx := context.Background()
	url := "mem://" + t.Name()
	a, b := partOpen(t, url), partOpen(t, url)
	opts := &fenced.LeaseOptions{TTL: 5 * time.Second}
	stale, err := a.TryAcquire(ctx, "cp/p/0", opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Break(ctx, "cp/p/0", "test: a lapse", "test"); err != nil {
		t.Fatal(err)
	}
	later, err := b.TryAcquire(ctx, "cp/p/0", opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := later.Checkpoint(ctx, []byte("2:0")); err != nil {
		t.Fatal(err)
	}
	if cp, err := recipe.ReadCheckpoint(ctx, a, stale); !errors.Is(err, fenced.ErrNotHeld) {
		t.Errorf("fence %d read the checkpoint %q of fence %d (err %v), want ErrNotHeld", stale.Fence(), cp, later.Fence(), err)
	}
	if cp, err := recipe.ReadCheckpoint(ctx, b, later); err != nil || string(cp) != "2:0" {
		t.Errorf("the current grant read %q, %v; want \"2:0\"", cp, err)
	}
}
