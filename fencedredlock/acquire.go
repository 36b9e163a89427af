package fencedredlock

// Quorum acquisition: one grant round on every node, counted by fence.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
	"github.com/redis/go-redis/v9"
)

// TryAcquire implements driver.Driver: TryAcquireTerms with the default
// drift allowance, ttlrule.DefaultSafetyMargin(ttl).
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return d.TryAcquireTerms(ctx, key, owner, ttl, ttlrule.DefaultSafetyMargin(ttl))
}

// TryAcquireTerms implements driver.TermsAcquirer with one parallel round to
// every node, after one request to the fence source, if any. The grant
// counts if a majority made it. ttl minus the time the round took minus
// margin (the drift allowance) must still be positive.
func (d *Driver) TryAcquireTerms(ctx context.Context, key, owner string, ttl, margin time.Duration) (uint64, error) {
	if err := d.usable(); err != nil {
		return 0, err
	}
	start := time.Now()
	fence, err := d.nextFence(ctx, key)
	if err != nil {
		return 0, err
	}
	k := d.layout.Keys(key)
	budget := min(d.opts.Budget, ttl/3)
	// The attempt's number orders it after every earlier attempt of owner
	// (the Client's acquisition loop sends all of its attempts with one
	// owner token): on each node, the grant script refuses an attempt
	// older than the last one of its owner there, and the rollback below
	// deletes nothing a later attempt took or re-acquired, however late
	// either lands (see lua/redlock_acquire.lua and release_attempt.lua).
	attempt := d.nextAttempt()
	// Success is decided at a majority; failure waits for every node (or
	// the budget), so that the cleanup below finds every grant this
	// attempt made instead of racing with one still in flight.
	decided := func(rs []reply[rediskit.Acquired]) bool {
		return oursOnOneFence(rs) >= d.quorum
	}
	// A grant that lands after the attempt was decided as failed is
	// rolled back where it landed.
	var failed atomic.Bool
	outcome := make(chan struct{})
	defer close(outcome)
	late := func(r reply[rediskit.Acquired]) {
		<-outcome
		if failed.Load() && (isOurs(r) || r.err != nil) {
			d.rollbackOn(r.node, k, owner, attempt)
		}
	}
	rs := fanout(ctx, d, budget, d.acquireOp(k, owner, ttl, fence, attempt), decided, late)
	elapsed := time.Since(start)

	tl := d.tallyAcquire(rs, k)
	validity := ttl - elapsed - margin
	if tl.ours >= d.quorum && validity > 0 {
		return tl.granted, nil
	}

	// Failed: take back what this attempt got, on every node that granted
	// it or may have (late answers are handled by late).
	failed.Store(true)
	d.rollbackAll(rs, k, owner, attempt)
	return 0, d.acquireFailure(key, k, ttl, margin, budget, elapsed, tl)
}

// nextFence asks the fence source, if any, for the attempt's fence.
// Without a source it returns 0: the grant script counts the fence.
func (d *Driver) nextFence(ctx context.Context, key string) (uint64, error) {
	if d.opts.Fence == nil {
		return 0, nil
	}
	f, err := d.opts.Fence.Next(ctx, key)
	if err != nil {
		return 0, fmt.Errorf("redlock: acquire %q: fence source: %w", key, err)
	}
	if f == 0 {
		return 0, fmt.Errorf("redlock: acquire %q: fence source returned fence 0", key)
	}
	return f, nil
}

// acquireOp returns the grant script's call on one node for this attempt.
func (d *Driver) acquireOp(k rediskit.Keys, owner string, ttl time.Duration, fence uint64, attempt int64) func(context.Context,
	redis.UniversalClient) (rediskit.Acquired, error) {
	keys := []string{k.Lock, k.Fence, k.Claim}
	args := []any{owner, rediskit.Millis(ttl), strconv.FormatUint(fence, 10), attempt}
	if subs, member := d.waiters.Current(k); subs > 0 {
		// A refusal makes this process stand in each refusing node's
		// waiter queue; a grant moves it to the end of the queue
		// (lua/redlock_acquire.lua, waiter_queue.lua).
		keys = append(keys, k.Waiters)
		args = append(args, subs, rediskit.WaitersSlack.Milliseconds(), member)
	}
	return func(ctx context.Context, c redis.UniversalClient) (rediskit.Acquired, error) {
		res, err := rediskit.AcquireNode.Run(ctx, c, keys, args...).Result()
		if err != nil {
			return rediskit.Acquired{}, err
		}
		return rediskit.ParseAcquire(res), nil
	}
}

// isOurs tells whether a node granted the attempt.
func isOurs(r reply[rediskit.Acquired]) bool {
	return r.err == nil && r.val.Ours()
}

// oursOnOneFence returns the most nodes that granted the attempt with one
// fence. A node still holding an earlier attempt of the owner's (its
// request in flight when this one began) answers with that grant's fence;
// the grant counts only at a majority on one fence, as tallyAcquire says.
func oursOnOneFence(rs []reply[rediskit.Acquired]) int {
	byFence, most := map[uint64]int{}, 0
	for _, r := range rs {
		if isOurs(r) {
			byFence[r.val.Fence]++
			most = max(most, byFence[r.val.Fence])
		}
	}
	return most
}

// rollbackAll takes back the attempt on every node that granted it or
// may have, and waits for the rollbacks to end.
func (d *Driver) rollbackAll(rs []reply[rediskit.Acquired], k rediskit.Keys, owner string, attempt int64) {
	var cleanup sync.WaitGroup
	for _, r := range rs {
		if isOurs(r) || r.err != nil {
			cleanup.Add(1)
			go func() {
				defer cleanup.Done()
				d.rollbackOn(r.node, k, owner, attempt)
			}()
		}
	}
	cleanup.Wait()
}

// acquireFailure says why a failed attempt failed, from the nodes' answers.
func (d *Driver) acquireFailure(key string, k rediskit.Keys, ttl, margin, budget, elapsed time.Duration, tl acquireTally) error {
	switch {
	case tl.foreign > len(d.nodes)-d.quorum:
		// Too few nodes are left for a majority, whatever the others
		// answered. Fewer foreign values count as refusals: the key
		// can still be granted, and the error below names them.
		return fmt.Errorf("redlock: acquire %q: %w", key, rediskit.ForeignError(k.Lock))
	case tl.ours >= d.quorum:
		return fmt.Errorf(
			"redlock: acquire %q: %w: a majority granted it but only after %v of the %v TTL (drift allowance %v); released it",
			key, fenced.ErrUnavailable, elapsed.Round(time.Millisecond), ttl, margin)
	case len(tl.heldTTLs) > 0 || tl.stale:
		// Held elsewhere: the key frees when enough holders' grants end;
		// the shortest remaining time is the earliest worth another try.
		sort.Slice(tl.heldTTLs, func(i, j int) bool { return tl.heldTTLs[i] < tl.heldTTLs[j] })
		var rem time.Duration
		if len(tl.heldTTLs) > 0 {
			rem = rediskit.PTTL(tl.heldTTLs[0])
		}
		return &fenced.HeldError{Remaining: rem}
	}
	sentinel := fenced.ErrUnavailable
	if tl.unknown {
		sentinel = fenced.ErrUnknownOutcome
	}
	missing := len(d.nodes) - tl.answered
	msg := fmt.Sprintf("%d of %d nodes granted it (need %d), %d did not answer within %v", tl.ours, len(d.nodes), d.quorum, missing, budget)
	if tl.foreign > 0 {
		msg += fmt.Sprintf(", %d refused it for a value fenced did not write in %s", tl.foreign, k.Lock)
	}
	if tl.superseded > 0 {
		// Only when one owner token's attempts overlap (the Client never
		// does that): a later one was already there.
		msg += fmt.Sprintf(", %d refused it for a later attempt of the same owner", tl.superseded)
	}
	if err := errors.Join(tl.nodeErrs...); err != nil {
		return fmt.Errorf("redlock: acquire %q: %w: %s: %w", key, sentinel, msg, err)
	}
	return fmt.Errorf("redlock: acquire %q: %w: %s", key, sentinel, msg)
}

// nextAttempt numbers a grant attempt: above every number this driver
// gave before, and otherwise the wall clock in microseconds, so that
// attempts of one owner through another Driver (another process) also
// rise as long as the clock does not step back between them. The
// numbers stay below 2^53, exact in Lua's doubles, until the year 2255.
func (d *Driver) nextAttempt() int64 {
	for {
		prev := d.lastAttempt.Load()
		n := max(prev+1, time.Now().UnixMicro())
		if d.lastAttempt.CompareAndSwap(prev, n) {
			return n
		}
	}
}

// rollbackOn takes back, within the budget, what attempt (owner's) was
// granted of k on one node: owner's grant there, whatever its fence,
// unless a later attempt of owner claimed it. The node may still apply
// it after the budget, at any later time; it stays exact then.
func (d *Driver) rollbackOn(i int, k rediskit.Keys, owner string, attempt int64) {
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Budget)
	defer cancel()
	_ = rediskit.ReleaseAttempt.Run(ctx, d.nodes[i].c, []string{k.Lock, k.Claim, k.Waiters}, owner, attempt, k.Channel).Err()
}

// nodeErr classifies one node's error; a key of the wrong type or a
// counter that is not a number becomes ErrForeignValue.
func (d *Driver) nodeErr(err error, mayApply bool, k rediskit.Keys) error {
	if ferr := rediskit.ForeignReply(err, k.Lock, k.Fence, k.Claim, k.Waiters); ferr != nil {
		return ferr
	}
	if errors.Is(err, context.DeadlineExceeded) {
		if mayApply {
			return fmt.Errorf("%w: no answer within the budget", fenced.ErrUnknownOutcome)
		}
		return fmt.Errorf("%w: no answer within the budget", fenced.ErrUnavailable)
	}
	return rediskit.Classify(err, mayApply)
}
