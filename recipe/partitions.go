package recipe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fenced-dev/fenced"
)

// maxPartitions is the largest partition count of a group; the CLI and
// httpapi check it as internal/core/limits.MaxPartitions (a test ties them).
const maxPartitions = 4096

// Errors of Partitions, matched with errors.Is.
var (
	// ErrPartitionCount means a live member of the group has another
	// partition count, or partition leases of another count stayed held
	// for as long as a join waits: every member must be started with the
	// same P. It is also Err of a member that found the group at another
	// count when it took its lapsed membership back.
	ErrPartitionCount = errors.New("partition count disagrees with the group's")
	// ErrMemberLive means another process holds the membership of this
	// member ID and kept it for as long as JoinPartitions waits.
	ErrMemberLive = errors.New("member ID is live in the group already")
	// ErrHandedOff is the cause of a partition's context when the
	// assignment gave the partition to another member.
	ErrHandedOff = errors.New("partition handed off to another member")
	// ErrLeft is the cause of a partition's context when its member
	// leaves the group (Leave, or the context given to JoinPartitions
	// ended).
	ErrLeft = errors.New("member left the group")
)

// Partitions is one member of a partitioned group: a named group of P
// partitions, numbered 0 to P-1, shared out among the members that are
// live, so that each partition has exactly one owner at a time. It is the
// alternative to a lock per item: route every item to partition
// hash(item) mod P, and the owner of that partition does the item's work
// with no further locking, fenced by the partition's fence.
//
// How it works, and why:
//
//   - Every partition is a lease on key GROUP/p/<i>, with the lease
//     options given (FenceStrict by default). Its fence rises on every
//     change of owner, so a guard at the resource (package fence) refuses
//     the previous owner's late writes. A member only ever takes a
//     partition with TryAcquire: it never takes one before the previous
//     owner released it or its lease expired.
//   - Every member holds a membership lease on GROUP/m/<P>/<member ID>,
//     with no fence: membership decides who should own a partition, not
//     who may write.
//   - One partition count at a time. Items routed by hash mod 4 and by
//     hash mod 8 would be worked twice, each under a lease of its own
//     key, so P is recorded at the authority, where every member's one
//     listing reads it: in the name of each membership key and in the
//     owner tag of each partition lease (not every backend can store a
//     value with a grant, Client.Value). A member is admitted, at its
//     join and whenever it takes a lapsed membership back, only if no
//     member of another P is live (else ErrPartitionCount) and no
//     partition lease of another P, or of no member, is still held (a
//     join waits for those to end, and gives up with ErrPartitionCount
//     if they stay); it takes a partition only while the membership so
//     admitted stands. So a member paused past its TTL that finds the
//     group at another P when it resumes stops (Err), and two counts
//     never own partitions at once. To change P: stop every member of
//     the old P (Leave, or let their leases expire), then start the new
//     ones; the partition keys do not carry P, so each partition's fence
//     keeps rising across the change.
//   - Each member lists the group (one request: the live members and the
//     partition leases, whose owners start with a tag of their member,
//     fenced.LeaseOptions.OwnerTag), computes the same assignment from it
//     (GroupState.Targets: balanced within one, keeping current owners up
//     to their capacity, so a join or leave moves only the newcomer's or
//     leaver's share), hands off what it should no longer own and tries
//     for what it should. A hand-off cancels the partition's context with
//     ErrHandedOff, waits for the work function to return (at most
//     HandoffGrace) and only then releases the lease.
//   - Wake-ups: a member that joins or leaves rings a doorbell, a
//     grant and release of key GROUP/w/bell; members watch the bell and
//     the partitions they are waiting for as observers (Client.Watch)
//     where the backend can notify, so a join, leave or hand-off is
//     acted on at once. Crashes are noticed when the
//     membership lease expires, at the next poll (Poll, TTL/3 by
//     default), and on backends without notification every change is.
//   - All leases of a member are leases of one fenced.Client, so the
//     client's renewer renews them together (in one batch where the
//     backend batches renewals).
//
// Every key of a group is at least two names below GROUP, so no key of a
// group nested in it (say GROUP/m/4) reads as one of its members.
//
// A member whose membership lease is lost (a pause past the TTL, a break)
// hands off everything, since its partition leases are ending too, and
// joins again when it can, through the same count check as a join.
type Partitions struct {
	c         *fenced.Client
	group     string
	n         int
	id        string
	work      func(context.Context, Partition) error
	onEvent   func(PartitionEvent)
	part      fenced.LeaseOptions // partition leases
	member    fenced.LeaseOptions // the membership lease
	ttl       time.Duration
	poll      time.Duration
	grace     time.Duration
	rb        rebalance
	weight    int
	runCtx    context.Context
	stopRun   context.CancelCauseFunc
	kick      chan struct{}
	loopDone  chan struct{}
	leaveOnce sync.Once
	leaveErr  error
	failed    error // why the member stopped by itself (Err)

	mu         sync.Mutex
	membership *fenced.Lease
	owned      map[int]*ownedPartition
	members    []string
	targets    []int
	stats      PartitionStats
	unownedAt  time.Time // when a target first went unowned; zero if none is
	// other marks the partitions this member saw held by another holder
	// since it last held them: its next grant of one is a move.
	other map[int]bool
	// lastFence is the fence of this member's last grant of each
	// partition it held, so that a listing that shows it is not taken
	// for another holder's.
	lastFence map[int]uint64
	// unstableSince is when a look first planned a move after one that
	// planned none; zero while none is planned.
	unstableSince time.Time
	wg            sync.WaitGroup

	obsMu     sync.Mutex
	observers map[int]func(PartitionEvent) // Observe's, by subscription
	obsNext   int
}

// ownedPartition is a partition whose lease this member holds.
type ownedPartition struct {
	lease    *fenced.Lease
	cancel   context.CancelCauseFunc
	handoff  time.Time // when the hand-off began; zero if none
	released bool      // the lease was released before the work returned
	// ended is when a look first saw the lease ended while the work ran
	// on; zero before.
	ended time.Time
	// until is when the lease is released whether or not the work has
	// returned: HandoffGrace after its hand-off or its member's leave
	// began; zero before either (Partition.Finish).
	until time.Time
}

// Partition is one owned partition, given to the work function.
type Partition struct {
	// Index is the partition's number, in [0, P).
	Index int
	// Lease is the partition's lease. Send its Fence with every write, and
	// record progress with its Checkpoint method: the store keeps it only
	// while this lease is the partition's current grant.
	Lease *fenced.Lease
	// Checkpoint is the partition's last checkpoint (Lease.Checkpoint by
	// any earlier owner), read after this grant and before the work
	// started: nil if none was recorded, or if the store keeps no
	// checkpoints (Client.Capabilities().Checkpoint false; Lease.Checkpoint
	// then fails with fenced.ErrUnsupported).
	Checkpoint []byte

	g *Partitions
	o *ownedPartition
}

// PartitionEvent reports a change in what a member owns. Its Kind is one
// of the root's:
//   - fenced.EventAcquire: the member took the partition; its work starts.
//   - fenced.EventRelease: the partition's work returned and its lease was
//     released (or had ended).
//   - fenced.EventLost: the work had not returned HandoffGrace after its
//     hand-off (or its member's leave) began, and its lease was released
//     anyway: the work runs on without it, and the fence refuses its late
//     writes and checkpoints. HandOff is the time since the hand-off (or
//     the leave) began. An EventRelease follows when the work returns.
type PartitionEvent struct {
	Kind      fenced.EventKind
	Partition int
	Fence     uint64
	// Cause is why the partition's context ended (EventRelease only): nil if
	// the work returned by itself, ErrHandedOff, ErrLeft or the lease's
	// end.
	Cause error
	// WorkErr is what the work function returned (EventRelease only).
	WorkErr error
	// HandOff is the time from the decision to hand the partition off to
	// its release (EventRelease after a hand-off only).
	HandOff time.Duration
}

// PartitionsOptions configure a member. The zero value (or nil) gives the
// defaults.
type PartitionsOptions struct {
	// MemberID names the member; a member that restarts with the same ID
	// gets its partitions back. It must not contain '/'. Default: random.
	MemberID string
	// Lease configures the partition leases (TTL, MinFence, ...); the
	// membership lease takes the same TTL and no fence. ManualRenew and
	// FailOpen are always off; OwnerTag is the member's.
	Lease *fenced.LeaseOptions
	// Poll is how often a member reads the group when nothing woke it.
	// Default: a third of the TTL.
	Poll time.Duration
	// HandoffGrace bounds how long a hand-off (or Leave) waits for the
	// work function to return before releasing the lease anyway (the fence
	// then refuses the late work, and an EventLost event says so).
	// The work has that long to finish and record its last checkpoint
	// (Partition.Finish). Default: the TTL.
	//
	// A work still running a grace after its lease was released or lost
	// no longer keeps the partition: if the assignment gives it back,
	// the member starts a new work beside the old one, whose writes the
	// fence refuses. Its EventRelease comes when it returns.
	HandoffGrace time.Duration
	// OnEvent, if set, is called for every PartitionEvent, on the
	// member's goroutines; it must not block.
	OnEvent func(PartitionEvent)

	// Weight is the member's capacity: members share the partitions in
	// proportion to their weights (each within one of P·Weight/ΣWeight).
	// The others read it from the membership lease. 1 to 10000; default
	// 1. Members of an earlier release count as 1.
	Weight int
	// The three knobs below throttle voluntary moves only: partitions a
	// live member hands off to another because the balance changed (a
	// join, a weight). A partition that is free (its member left, died or
	// lost its membership) is taken at once, whatever they say. Each
	// member applies its own settings to what it hands off, so give
	// every member the same ones.
	//
	// RebalanceThreshold: no voluntary move happens while every member
	// holds within RebalanceThreshold × its share of its share (KCL 3.x's
	// reBalanceThresholdPercentage, as a fraction). In [0, 1); default
	// 0.1. A value below 1/P moves at any difference.
	RebalanceThreshold float64
	// Dampening is the share of its excess (what it holds beyond its
	// share) a member hands off at once, rounded up: the rest waits for
	// those hand-offs to end (KCL 3.x's dampeningPercentage, as a
	// fraction). In (0, 1]; default 0.8. 1 hands off the whole excess at
	// once.
	Dampening float64
	// MaxInTransition bounds the partitions in hand-off in the whole
	// group at once (Helix's maxPartitionInTransition), taken
	// round-robin over the members with an excess. At least 0; default
	// ⌈P/4⌉. P or more does not bound. It bounds each look's plan, and a
	// member starts no hand-off while those of an earlier plan are in
	// flight, but members look at the group a moment apart: while members
	// join or leave, a few more can be in flight briefly (17 for 16 in a
	// 4 → 8 join, measured).
	MaxInTransition int
}

// maxWeight is the largest PartitionsOptions.Weight: its tag on the
// membership lease ("w" + digits + "x") fits fenced's 8-character
// OwnerTag.
const maxWeight = 10000

// PartitionStats are a member's counters, for metrics.
type PartitionStats struct {
	// Target is how many partitions the assignment gives the member
	// (Partitions.Owned says which it holds); Members how many live
	// members it saw last.
	Target, Members int
	// Rebalances counts changes of the member's target set.
	Rebalances uint64
	// Acquired and HandOffs count partitions taken and handed off.
	Acquired, HandOffs uint64
	// HandOffTime is the total time hand-offs took, from the decision to
	// the release.
	HandOffTime time.Duration
	// UnownedTime is the total time during which a partition the
	// assignment gave this member was not yet held by it.
	UnownedTime time.Duration
	// Unowned is how many of the group's partitions no lease held at the
	// member's last look at the group (its own grants and releases
	// counted; a crashed member's partitions count as held until their
	// leases run out). The members that looked last see the group's
	// present; the others see it as of their last look, a Poll ago at
	// most.
	Unowned int
	// Moves counts the partitions this member took over from another
	// holder: one it saw held by someone else (listed, or a refused try)
	// since it last held it itself. A member's first grants in a new
	// group are no moves; the members' sum is the group's owner changes
	// (a holder that took a partition and gave it back between two looks
	// of the next one can go unseen).
	Moves uint64
	// TimeToStable is how long the last rebalance took, as this member
	// saw it: from its first look that planned a move (a partition not
	// held by the member the assignment gives it) to its first look that
	// planned none (zero before the first). The member that made the last
	// move sees the end at once; the others at their next look.
	TimeToStable time.Duration
}

// JoinPartitions makes c a member of group, a group of partitions
// partitions (1 to 4096), and returns once the membership is
// held. It waits for an earlier process with the same MemberID to be gone
// for as long as the store may keep a dead holder's grant, plus a TTL
// (twice the TTL on a store that ends grants at their TTL), and fails with
// ErrMemberLive if that process is still there. It fails at once with
// ErrPartitionCount if a member with another count is live, and waits
// while partition leases of another count are held (members of an old
// count that were killed or stopped): for as long as they had left when
// first seen plus the wait above, then fails with ErrPartitionCount. From
// then on the member takes and hands off partitions by itself, running
// work for each partition it owns, until Leave or until ctx ends.
//
// work's context ends when the partition is lost (the lease's cause),
// handed off (ErrHandedOff) or the member leaves (ErrLeft); it must
// return soon after. When it returns the lease is released; if the
// partition is still the member's, the member takes it again (with a new
// fence) and calls work again at its next look at the group.
func JoinPartitions(ctx context.Context, c *fenced.Client, group string, partitions int,
	work func(ctx context.Context, p Partition) error, opts *PartitionsOptions) (*Partitions, error) {
	if partitions < 1 || partitions > maxPartitions {
		return nil, invalidArg(group, "the partition count %d is not 1 to %d", partitions, maxPartitions)
	}
	if work == nil {
		return nil, invalidArg(group, "the work function is nil")
	}
	var o PartitionsOptions
	if opts != nil {
		o = *opts
	}
	if o.MemberID == "" {
		var b [8]byte
		rand.Read(b[:])
		o.MemberID = hex.EncodeToString(b[:])
	}
	if strings.Contains(o.MemberID, "/") {
		return nil, invalidArg(group, "MemberID %q contains '/'", o.MemberID)
	}
	if o.Poll < 0 {
		return nil, invalidArg(group, "Poll %v is negative; zero polls every third of the TTL", o.Poll)
	}
	if o.HandoffGrace < 0 {
		return nil, invalidArg(group, "HandoffGrace %v is negative; zero waits a TTL", o.HandoffGrace)
	}
	rb, err := o.rebalance(group, partitions)
	if err != nil {
		return nil, err
	}
	g := &Partitions{c: c, group: group, n: partitions, id: o.MemberID, work: work, onEvent: o.OnEvent, rb: rb,
		weight: max(1, o.Weight),
		kick:   make(chan struct{}, 1), loopDone: make(chan struct{}), owned: map[int]*ownedPartition{},
		other: map[int]bool{}, lastFence: map[int]uint64{}}
	for _, k := range []string{group, g.partitionKey(partitions - 1), g.memberKey(), g.bellKey()} {
		if err := fenced.ValidateKey(k); err != nil {
			return nil, fmt.Errorf("fenced: partitions %q: %w", group, err)
		}
	}
	if o.Lease != nil {
		g.part = *o.Lease
	}
	g.part.ManualRenew, g.part.FailOpen, g.part.MaxWait = false, false, 0
	g.part.OwnerTag = ownerTag(o.MemberID, partitions)
	spec, err := c.Resolve(&g.part)
	if err != nil {
		return nil, fmt.Errorf("fenced: partitions %q: %w", group, err)
	}
	g.ttl = spec.TTL
	g.member = g.part
	g.member.TTL, g.member.MinFence, g.member.MaxHold = spec.TTL, fenced.FenceNone, 0
	g.member.OwnerTag = weightTag(g.weight)
	// A process restarted with the same MemberID waits for its previous
	// incarnation's membership to go: as long as the store may keep a
	// grant after its last renewal (etcd rounds the session up and sweeps
	// every 500 ms; ZooKeeper keeps a session two ticks at least), and a
	// TTL more for the news to arrive.
	g.member.MaxWait = c.Capabilities().Keeps.Outlives(spec.TTL) + spec.TTL
	if _, err := c.Resolve(&g.member); err != nil {
		return nil, fmt.Errorf("fenced: partitions %q: membership: %w", group, err)
	}
	g.poll, g.grace = o.Poll, o.HandoffGrace
	if g.poll <= 0 {
		g.poll = spec.TTL / 3
	}
	if g.grace <= 0 {
		g.grace = spec.TTL
	}

	// Metrics hooks group every key of the group under its name, so a
	// group's series are bounded whatever P and the member IDs are.
	ctx = fenced.WithKeyGroup(ctx, group)
	m, err := g.join(ctx)
	if err != nil {
		return nil, err
	}
	g.membership = m
	g.ring(ctx)
	g.runCtx, g.stopRun = context.WithCancelCause(context.WithoutCancel(ctx))
	go g.loop()
	go func() {
		select {
		case <-ctx.Done():
			g.Leave(context.WithoutCancel(ctx))
		case <-g.loopDone:
			if g.Err() != nil {
				g.Leave(context.WithoutCancel(ctx)) // it stopped by itself: end its work
			}
		}
	}()
	return g, nil
}

// MemberID returns the member's ID.
func (g *Partitions) MemberID() string { return g.id }

// Owned returns the partitions the member holds now, sorted.
func (g *Partitions) Owned() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []int
	for p, o := range g.owned {
		if o.handoff.IsZero() && o.lease.Err() == nil {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// Stats returns the member's counters.
func (g *Partitions) Stats() PartitionStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	s.Target, s.Members = len(g.targets), len(g.members)
	if !g.unownedAt.IsZero() {
		s.UnownedTime += time.Since(g.unownedAt)
	}
	return s
}

// Done is closed once the member has left, or stopped by itself (Err).
func (g *Partitions) Done() <-chan struct{} { return g.loopDone }

// Err returns why the member stopped by itself, or nil: an error matching
// ErrPartitionCount when its membership had lapsed (a pause past the TTL,
// a break) and, when it took it back, a member with another partition
// count had joined. Its partitions' contexts end with this cause, and
// Leave returns it.
func (g *Partitions) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failed
}

// fail stops the member with err (see Err).
func (g *Partitions) fail(err error) {
	g.mu.Lock()
	g.failed = err
	g.mu.Unlock()
	g.stopRun(err)
}

// Leave ends the member's work. Every partition's context is cancelled with
// ErrLeft (or the member's Err). Its work function is waited for (at most
// HandoffGrace) and its lease released. Then the membership is released
// and the doorbell rung, so that the others take the partitions at once.
// It is safe to call more than once. It returns Err if the member had
// stopped by itself.
func (g *Partitions) Leave(ctx context.Context) error {
	g.leaveOnce.Do(func() {
		g.stopRun(ErrLeft)
		<-g.loopDone
		g.mu.Lock()
		cause := ErrLeft
		if g.failed != nil {
			cause, g.leaveErr = g.failed, g.failed
		}
		until := time.Now().Add(g.grace)
		for _, o := range g.owned {
			if o.until.IsZero() {
				o.until = until
			}
			o.cancel(cause)
		}
		g.mu.Unlock()
		g.waitWork(g.grace)
		g.mu.Lock()
		m := g.membership
		g.mu.Unlock()
		if m != nil {
			if err := m.Release(ctx); err != nil && !fenced.IsLost(err) && !errors.Is(err, fenced.ErrReleased) && g.leaveErr == nil {
				g.leaveErr = fmt.Errorf("fenced: partitions %q: leave: %w", g.group, err)
			}
		}
		g.ring(ctx)
	})
	return g.leaveErr
}

// waitWork waits for every work function to return, and after grace
// releases the leases of those that have not (their goroutines still end
// and report when the work returns).
func (g *Partitions) waitWork(grace time.Duration) {
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		g.mu.Lock()
		var late []overran
		now := time.Now()
		for p, o := range g.owned {
			if !o.released {
				o.released = true
				late = append(late, g.overrun(p, o, now))
			}
		}
		g.mu.Unlock()
		g.releaseOverran(late)
	}
}

func (g *Partitions) partitionKey(p int) string { return g.group + "/p/" + strconv.Itoa(p) }
func (g *Partitions) memberPrefix() string      { return g.group + "/m/" }
func (g *Partitions) memberKey() string {
	return g.memberPrefix() + strconv.Itoa(g.n) + "/" + g.id
}

// bellKey is the doorbell. Every key of a group is two names or more
// below it, so that no key of a group nested as GROUP/m/<P> reads as one
// of GROUP's members (GROUP/m/<P>/<id>).
func (g *Partitions) bellKey() string { return g.group + "/w/bell" }

// GroupMember is a live member of a group as the authority lists it.
type GroupMember struct {
	ID         string
	Partitions int
	Remaining  time.Duration
	// Weight is the member's PartitionsOptions.Weight (1 for a member of
	// an earlier release, which does not record it).
	Weight int
}

// GroupState is a partition group as one listing of the authority shows
// it: what every member reads at each look at the group, and what
// `fenced partitions ls` and the dashboard show.
type GroupState struct {
	// Members are the live members, sorted by ID, whatever their
	// partition count.
	Members []GroupMember
	// Leases are the held partition leases, by partition number.
	Leases map[int]fenced.LeaseInfo
	// Owners gives the live member holding each held partition, known by
	// the tag its partition leases' owners start with (the member's
	// partition count and a hash of its ID). A partition is missing when
	// no live member's tag matches: its holder is gone (or paused past
	// its membership), is no member, or shares its tag with another live
	// member of its count (26 bits: about one group in 10⁴ of a hundred
	// members). The assignment treats such a partition as free, which
	// costs a move, never an overlap: the leases decide who holds.
	Owners map[int]string
	// Invalid lists the held keys that have the shape of a member or a
	// partition key of the group but cannot be one: a partition count or
	// a partition number outside 1 to maxPartitions (0 to
	// maxPartitions-1). Nobody made them through JoinPartitions; they
	// are reported, never counted as members or partitions.
	Invalid []string
}

// ReadGroup lists group in one request.
func ReadGroup(ctx context.Context, c *fenced.Client, group string) (GroupState, error) {
	infos, err := c.List(ctx, group+"/")
	if err != nil {
		return GroupState{}, err
	}
	st := GroupState{Leases: map[int]fenced.LeaseInfo{}, Owners: map[int]string{}}
	for _, in := range infos {
		if !in.Held {
			continue
		}
		// Every key of a group is two names or more below it (GROUP/p/<i>,
		// GROUP/m/<P>/<id>, GROUP/w/bell), and the names are strict, so
		// no key of a nested group (GROUP/p/x/..., GROUP/m/x/...) parses
		// here.
		rest := strings.TrimPrefix(in.Key, group+"/")
		if s, ok := strings.CutPrefix(rest, "p/"); ok {
			switch i, ok := number(s); {
			case !ok:
			case i < maxPartitions:
				st.Leases[i] = in
			default:
				st.Invalid = append(st.Invalid, in.Key)
			}
			continue
		}
		if s, ok := strings.CutPrefix(rest, "m/"); ok {
			ps, id, ok := strings.Cut(s, "/")
			n, isNum := number(ps)
			if !ok || !isNum || id == "" || strings.Contains(id, "/") {
				continue // not a member key
			}
			if n < 1 || n > maxPartitions {
				st.Invalid = append(st.Invalid, in.Key)
				continue
			}
			st.Members = append(st.Members, GroupMember{ID: id, Partitions: n, Remaining: in.Remaining,
				Weight: parseWeightTag(in.Owner)})
		}
	}
	slices.Sort(st.Invalid)
	slices.SortFunc(st.Members, func(a, b GroupMember) int { return strings.Compare(a.ID, b.ID) })
	byTag := map[string]string{}
	for _, m := range st.Members {
		t := ownerTag(m.ID, m.Partitions)
		if _, dup := byTag[t]; dup {
			byTag[t] = "" // ambiguous
			continue
		}
		byTag[t] = m.ID
	}
	for i, in := range st.Leases {
		if len(in.Owner) < memberTagLen {
			continue
		}
		if id := byTag[in.Owner[:memberTagLen]]; id != "" {
			st.Owners[i] = id
		}
	}
	return st, nil
}

// memberTagLen is how many characters of a partition lease's owner name
// its member: ownerTag's length, within the root's 8-character limit on
// LeaseOptions.OwnerTag (a longer tag would be refused at acquire).
const memberTagLen = 8

// number reads a decimal number of a key name: digits only. A number too
// large for an int reads as the largest int.
func number(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	n := 0
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
		if n > (math.MaxInt-9)/10 {
			n = math.MaxInt
			continue
		}
		n = n*10 + int(r-'0')
	}
	return n, true
}

// Partitions returns the group's partition count: that of its first live
// member (members with another count are refused at their join), or zero
// when no member is live.
func (s GroupState) Partitions() int {
	if len(s.Members) == 0 {
		return 0
	}
	return s.Members[0].Partitions
}

// memberIDs returns the IDs of the live members with partition count p.
func (s GroupState) memberIDs(p int) []string {
	var ids []string
	for _, m := range s.Members {
		if m.Partitions == p {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// readMembers returns the group's listing and the live members with this
// member's partition count.
func (g *Partitions) readMembers(ctx context.Context) (GroupState, []string, error) {
	st, err := ReadGroup(ctx, g.c, g.group)
	if err != nil {
		return st, nil, err
	}
	return st, st.memberIDs(g.n), nil
}

// ring wakes the members watching the doorbell: a grant and release of
// the bell key, which wakes every observer of it (Client.Watch). Errors
// are ignored: members also poll.
func (g *Partitions) ring(ctx context.Context) {
	if !g.c.Capabilities().Observe {
		return
	}
	ctx, cancel := context.WithTimeout(fenced.WithKeyGroup(context.WithoutCancel(ctx), g.group), g.ttl)
	defer cancel()
	bell := fenced.LeaseOptions{TTL: g.ttl, MinFence: fenced.FenceNone, ManualRenew: true}
	l, err := g.c.TryAcquire(ctx, g.bellKey(), &bell)
	if err != nil {
		return // held: its holder is ringing
	}
	_ = l.Release(ctx)
}

// poke wakes the loop.
func (g *Partitions) poke() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// releaseLease releases l within a bounded time.
func (g *Partitions) releaseLease(l *fenced.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), g.ttl)
	defer cancel()
	_ = l.Release(ctx)
}

func (g *Partitions) emit(e PartitionEvent) {
	if g.onEvent != nil {
		g.onEvent(e)
	}
	g.obsMu.Lock()
	fns := slices.Collect(maps.Values(g.observers))
	g.obsMu.Unlock()
	for _, fn := range fns {
		fn(e)
	}
}

// Observe calls fn for every PartitionEvent of the member from now on,
// as PartitionsOptions.OnEvent is called (on the member's goroutines; fn
// must not block), until stop is called. The metrics exporters use it
// (package metrics/fencedprom). A nil fn is never called.
func (g *Partitions) Observe(fn func(PartitionEvent)) (stop func()) {
	if fn == nil {
		return func() {}
	}
	g.obsMu.Lock()
	defer g.obsMu.Unlock()
	if g.observers == nil {
		g.observers = map[int]func(PartitionEvent){}
	}
	id := g.obsNext
	g.obsNext++
	g.observers[id] = fn
	return func() {
		g.obsMu.Lock()
		defer g.obsMu.Unlock()
		delete(g.observers, id)
	}
}

// watches holds the member's observer subscriptions, each forwarding its
// wake-ups to the loop.
type watches struct {
	g    *Partitions
	obs  bool // the store tells observers (Client.Watch)
	subs map[string]func()
}

// set keeps subscriptions on exactly keys. It reports whether it made a
// new one: a release between the look that chose the key and the
// subscription woke nobody, so the caller looks again at once.
func (w *watches) set(ctx context.Context, keys map[string]bool) (added bool) {
	if !w.obs {
		return false
	}
	for k, stop := range w.subs {
		if !keys[k] {
			stop()
			delete(w.subs, k)
		}
	}
	for k := range keys {
		if _, ok := w.subs[k]; ok {
			continue
		}
		wctx, stop := context.WithCancel(ctx)
		wake, err := w.g.c.Watch(wctx, k)
		if err != nil {
			stop()
			continue // polled instead
		}
		added = true
		go func() {
			for {
				select {
				case <-wake:
					w.g.poke()
				case <-wctx.Done():
					return
				}
			}
		}()
		w.subs[k] = stop
	}
	return added
}

func (w *watches) close() {
	for _, stop := range w.subs {
		stop()
	}
}

// loop is the member's one goroutine that decides: it reads the group,
// hands off, tries for partitions and sleeps until woken or the poll.
func (g *Partitions) loop() {
	defer close(g.loopDone)
	ctx := g.runCtx
	w := &watches{g: g, subs: map[string]func(){}}
	w.obs = g.c.Capabilities().Observe
	defer w.close()
	for ctx.Err() == nil {
		next := g.step(ctx, w)
		t := time.NewTimer(next)
		select {
		case <-t.C:
		case <-g.kick:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// step is one look at the group; it returns how long to sleep at most.
func (g *Partitions) step(ctx context.Context, w *watches) time.Duration {
	next := g.poll
	m, wait, err := g.checkMembership(ctx)
	if err != nil {
		g.fail(err)
		return 0
	}
	if wait > 0 {
		next = min(next, wait+time.Millisecond)
	}
	var targets []int
	var look groupLook
	if m != nil {
		if look, err = g.assigned(ctx); err != nil {
			return min(next, time.Second) // keep what we hold; leases decide
		}
		targets = look.plan[g.id]
	}
	now := time.Now()
	if m != nil {
		g.notePlan(look, now)
	}
	g.handOff(targets, m != nil, now)
	watch, missing, next := g.tryTargets(ctx, m, targets, look.st.Leases, next)
	g.noteUnowned(missing, now)
	if m != nil {
		g.noteLook(look)
	}
	if w.set(ctx, watch) {
		return 0
	}
	return next
}

// checkMembership returns the membership, joined again if it was lost.
// It is nil while the group does not admit this member; wait then says
// when to look again (0 for the poll).
func (g *Partitions) checkMembership(ctx context.Context) (m *fenced.Lease, wait time.Duration, err error) {
	g.mu.Lock()
	m = g.membership
	g.mu.Unlock()
	if m.Err() == nil {
		return m, 0, nil
	}
	// Lost (a pause past the TTL, or a break): the partition leases
	// are ending too. Hand everything off and join again, admitted
	// by the same check as a join: the group may have moved to
	// another partition count meanwhile.
	nm, wait, err := g.rejoin(ctx)
	if err != nil {
		return nil, 0, err
	}
	if nm != nil {
		g.mu.Lock()
		g.membership = nm
		g.mu.Unlock()
		g.ring(ctx)
		return nm, 0, nil
	}
	return nil, wait, nil
}

// noteHolders marks the partitions st shows held by a grant that is not
// this member's: its next grant of one is a move. The caller holds g.mu.
func (g *Partitions) noteHolders(st GroupState) {
	for p, in := range st.Leases {
		f, ours := g.lastFence[p]
		if in.Fence == 0 { // leases without a fence: the owner's tag says
			ours = st.Owners[p] == g.id
		} else {
			ours = ours && f == in.Fence
		}
		if p < g.n && !ours {
			g.other[p] = true
		}
	}
}

// groupLook is one look at the group: its listing and the assignment
// computed from it.
type groupLook struct {
	st   GroupState
	plan map[string][]int
}

// assigned reads the members and returns the listing with the assignment
// computed from it.
func (g *Partitions) assigned(ctx context.Context) (groupLook, error) {
	st, members, err := g.readMembers(ctx)
	if err != nil {
		return groupLook{}, err
	}
	if !slices.Contains(members, g.id) {
		members = append(members, g.id) // we hold it; the listing lags
		slices.Sort(members)
	}
	g.mu.Lock()
	g.members = members
	g.noteHolders(st)
	g.mu.Unlock()
	return groupLook{st: st, plan: assignPartitions(members, st.weights(g.n, g.id, g.weight), g.n, st.Owners, g.rb)}, nil
}

// handOff hands off what is no longer ours, and releases the work that
// ignored its cancellation past the grace. While the member is in the
// group (member), it keeps at most as many hand-offs in flight as the
// plan moves of its partitions: a hand-off begun under an earlier plan
// counts against this one's (MaxInTransition). A member out of the group
// hands off everything at once: its leases are ending.
func (g *Partitions) handOff(targets []int, member bool, now time.Time) {
	isTarget := make(map[int]bool, len(targets))
	for _, p := range targets {
		isTarget[p] = true
	}
	var late []overran
	g.mu.Lock()
	if !slices.Equal(targets, g.targets) {
		g.stats.Rebalances++
		g.targets = targets
	}
	moves, inFlight := 0, 0
	for p, o := range g.owned {
		if !isTarget[p] {
			moves++
		}
		if !o.handoff.IsZero() {
			inFlight++
		}
	}
	for _, p := range slices.Sorted(maps.Keys(g.owned)) {
		o := g.owned[p]
		switch {
		case isTarget[p] && o.handoff.IsZero():
		case o.handoff.IsZero():
			if member && inFlight >= moves {
				continue // a hand-off of an earlier plan is still in flight
			}
			inFlight++
			o.handoff = now
			if o.until.IsZero() {
				o.until = now.Add(g.grace)
			}
			g.stats.HandOffs++
			o.cancel(ErrHandedOff)
		case !o.released && now.Sub(o.handoff) >= g.grace:
			o.released = true
			late = append(late, g.overrun(p, o, now))
			// Its work runs on, refused by the fence: the partition is no
			// longer this member's, and may be planned back to it.
			delete(g.owned, p)
		}
	}
	g.mu.Unlock()
	g.releaseOverran(late)
}

// tryTargets tries for the targets we do not hold, under membership m.
// It returns the keys to watch, how many targets are not held, and next
// lowered to the soonest expiry seen.
func (g *Partitions) tryTargets(ctx context.Context, m *fenced.Lease, targets []int, listed map[int]fenced.LeaseInfo,
	next time.Duration) (map[string]bool, int, time.Duration) {
	watch := map[string]bool{g.bellKey(): true}
	missing := 0
	for _, p := range targets {
		g.mu.Lock()
		o, have := g.owned[p]
		if have && g.outlived(o, time.Now()) {
			delete(g.owned, p) // the new work's fence refuses the old one
			have = false
		}
		g.mu.Unlock()
		if have {
			continue
		}
		if in, ok := listed[p]; ok && in.Remaining > 0 {
			// Held by another, as listed a moment ago: a try would be
			// refused, and on a SQL store take the write lock for
			// nothing. Watch it; look again at its release or expiry.
			missing++
			next = min(next, in.Remaining+time.Millisecond)
			watch[g.partitionKey(p)] = true
			continue
		}
		l, err := g.c.TryAcquire(ctx, g.partitionKey(p), &g.part)
		if err != nil {
			missing++
			var held *fenced.HeldError
			if errors.As(err, &held) {
				g.mu.Lock()
				g.other[p] = true
				g.mu.Unlock()
			}
			if held != nil && held.Remaining > 0 {
				next = min(next, held.Remaining+time.Millisecond)
			}
			watch[g.partitionKey(p)] = true
			continue
		}
		if m.Err() != nil {
			// The membership that passed the count check lapsed before
			// this grant: the check no longer covers it.
			g.releaseLease(l)
			missing++
			next = 0
			break
		}
		cp, err := g.readCheckpoint(ctx, l)
		if err != nil {
			// The work must not start without the progress it resumes
			// from: give the partition back, and try again at the next
			// look.
			g.releaseLease(l)
			missing++
			next = min(next, g.poll)
			continue
		}
		g.start(p, l, cp)
	}
	return watch, missing, next
}

// outlived reports whether o's work ran on a grace past its lease's end.
// Such a work keeps its partition from nobody, this member included: a
// work blocked for good must not keep a partition planned for the member
// unowned. The caller holds g.mu.
func (g *Partitions) outlived(o *ownedPartition, now time.Time) bool {
	if o.lease.Err() == nil {
		return false
	}
	if o.ended.IsZero() {
		o.ended = now
	}
	return now.Sub(o.ended) >= g.grace
}

// noteUnowned counts the time some target was not held.
func (g *Partitions) noteUnowned(missing int, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case missing > 0 && g.unownedAt.IsZero():
		g.unownedAt = now
	case missing == 0 && !g.unownedAt.IsZero():
		g.stats.UnownedTime += now.Sub(g.unownedAt)
		g.unownedAt = time.Time{}
	}
}

// planned returns the member the look's assignment gives each partition.
func (look groupLook) planned(n int) map[int]string {
	planned := make(map[int]string, n)
	for id, ps := range look.plan {
		for _, p := range ps {
			planned[p] = id
		}
	}
	return planned
}

// notePlan notes the start of a rebalance, before the look's hand-offs
// and grants: a listing that shows a partition not held by the member
// the assignment gives it (a member that takes all of its share at its
// first look plans moves all the same).
func (g *Partitions) notePlan(look groupLook, now time.Time) {
	planned := look.planned(g.n)
	for p := range g.n {
		if look.st.Owners[p] != planned[p] {
			g.mu.Lock()
			if g.unstableSince.IsZero() {
				g.unstableSince = now
			}
			g.mu.Unlock()
			return
		}
	}
}

// noteLook records what a look saw of the group, after this member's
// hand-offs and grants of the look: the partitions nobody holds, and
// whether the assignment still plans a move; if not, the time the
// rebalance took since notePlan saw it start.
func (g *Partitions) noteLook(look groupLook) {
	planned := look.planned(g.n)
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	unowned, moving := 0, false
	for p := range g.n {
		// holder is the live member holding p to keep it; held is
		// whether anyone holds it at all (ours in hand-off too, a
		// crashed member's until its lease runs out).
		holder := look.st.Owners[p]
		in, held := look.st.Leases[p]
		if f, ok := g.lastFence[p]; holder == g.id || (ok && f == in.Fence && in.Fence != 0) {
			holder, held = "", false // ours as listed: what we hold now says
		}
		if o, ok := g.owned[p]; ok && o.lease.Err() == nil {
			held = true
			if o.handoff.IsZero() {
				holder = g.id
			}
		}
		if !held {
			unowned++
		}
		if holder != planned[p] {
			moving = true
		}
	}
	g.stats.Unowned = unowned
	if !moving && !g.unstableSince.IsZero() {
		g.stats.TimeToStable = now.Sub(g.unstableSince)
		g.unstableSince = time.Time{}
	}
}

// start runs the work of partition p, held by l, from checkpoint cp, and
// releases l after it.
func (g *Partitions) start(p int, l *fenced.Lease, cp []byte) {
	wctx, cancel := context.WithCancelCause(l.Context())
	o := &ownedPartition{lease: l, cancel: cancel}
	g.mu.Lock()
	g.owned[p] = o
	g.stats.Acquired++
	if g.other[p] {
		g.stats.Moves++
		delete(g.other, p)
	}
	g.lastFence[p] = l.Fence()
	g.wg.Add(1)
	g.mu.Unlock()
	g.emit(PartitionEvent{Kind: fenced.EventAcquire, Partition: p, Fence: l.Fence()})
	go func() {
		defer g.wg.Done()
		workErr := g.runWork(wctx, Partition{Index: p, Lease: l, Checkpoint: cp, g: g, o: o})
		cause := context.Cause(wctx)
		cancel(nil)
		g.mu.Lock()
		released := o.released
		g.mu.Unlock()
		if !released {
			g.releaseLease(l)
		}
		ev := PartitionEvent{Kind: fenced.EventRelease, Partition: p, Fence: l.Fence(), Cause: cause, WorkErr: workErr}
		g.mu.Lock()
		if g.owned[p] == o {
			delete(g.owned, p)
		}
		if !o.handoff.IsZero() {
			ev.HandOff = time.Since(o.handoff)
			g.stats.HandOffTime += ev.HandOff
		}
		g.mu.Unlock()
		g.emit(ev)
		if cause != nil {
			g.poke() // a work that returned by itself is run again at the next poll, not in a loop
		}
	}()
}

// runWork calls the work function, turning a panic into an error so that
// the lease is still released.
func (g *Partitions) runWork(ctx context.Context, p Partition) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fenced: partition %d: work panicked: %v", p.Index, r)
		}
	}()
	return g.work(ctx, p)
}

// invalidArg returns an error about an argument of JoinPartitions, which
// matches fenced.ErrInvalidOptions and names the argument at fault.
func invalidArg(group, format string, args ...any) error {
	return &argError{msg: fmt.Sprintf("fenced: partitions %q: ", group) + fmt.Sprintf(format, args...)}
}

// argError is a refused argument of JoinPartitions.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

// Is matches fenced.ErrInvalidOptions.
func (e *argError) Is(target error) bool { return target == fenced.ErrInvalidOptions }
