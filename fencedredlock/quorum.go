package fencedredlock

// The quorum machinery (fan-out to every node, counting compare-then-act
// replies) and the renewal and release it serves.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/redis/go-redis/v9"
)

// reply is one node's answer.
type reply[T any] struct {
	node int
	val  T
	err  error
}

// fanout runs op on every node in parallel and collects replies until
// decided reports true for the replies so far, every node answered, or the
// budget runs out. Replies that arrive later are sent to late, which is
// closed after the last one (nil if the caller does not care), unless
// d has begun to close: those are dropped.
func fanout[T any](ctx context.Context, d *Driver, budget time.Duration,
	op func(context.Context, redis.UniversalClient) (T, error), decided func([]reply[T]) bool, late func(reply[T])) []reply[T] {
	ctx, cancel := context.WithTimeout(ctx, budget)
	ch := make(chan reply[T], len(d.nodes))
	for i, n := range d.nodes {
		go func() {
			v, err := op(ctx, n.c)
			ch <- reply[T]{node: i, val: v, err: err}
		}()
	}
	var got []reply[T]
	timer := time.NewTimer(budget)
	defer timer.Stop()
collect:
	for len(got) < len(d.nodes) {
		select {
		case r := <-ch:
			got = append(got, r)
			if decided != nil && decided(got) {
				break collect
			}
		case <-timer.C:
			break collect
		}
	}
	missing := len(d.nodes) - len(got)
	if missing == 0 {
		cancel()
		return got
	}
	// An attempt that began before Close and ends after it starts no
	// cleanup: Close no longer waits for one, and its clients are closing
	// (a late grant then lasts its TTL on its node, as a crash leaves it).
	d.wgMu.Lock()
	defer d.wgMu.Unlock()
	if d.wgClosed {
		cancel()
		return got
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer cancel()
		for range missing {
			r := <-ch
			if late != nil {
				late(r)
			}
		}
	}()
	return got
}

// majority runs a compare-then-act script on every node and counts the
// replies with tally. The round ends as soon as done(ok, refused) reports
// true; the requests still in flight complete in the background.
func (d *Driver) majority(ctx context.Context, budget time.Duration, done func(ok, refused int) bool, script *redis.Script,
	keys []string, args ...any) (ok, refused int, errs []error) {
	rs := fanout(ctx, d, budget, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		return script.Run(ctx, c, keys, args...).Int64()
	}, func(rs []reply[int64]) bool {
		return done(d.tally(rs))
	}, nil)
	ok, refused, errs = d.tallyErrs(rs)
	if missing := len(d.nodes) - len(rs); missing > 0 {
		errs = append(errs, fmt.Errorf("%w: %d nodes did not answer within %v", fenced.ErrUnknownOutcome, missing, budget))
	}
	return ok, refused, errs
}

// tally counts the nodes' replies to one compare-then-act script (renew,
// release): ok where it took effect (1), refused where the node answered
// that it does not hold the grant (0). Every other reply counts as
// neither: a transport failure, and equally a server error such as
// LOADING, BUSY or OOM, which says nothing about whether the node holds
// the grant. Renew, RenewBatch and Release all count with it, so a server
// error can never end a lease as refused.
func (d *Driver) tally(rs []reply[int64]) (ok, refused int) {
	for _, r := range rs {
		switch {
		case r.err != nil:
		case r.val == 1:
			ok++
		default:
			refused++
		}
	}
	return ok, refused
}

// tallyErrs is tally that also returns the errors, classified and named by
// node.
func (d *Driver) tallyErrs(rs []reply[int64]) (ok, refused int, errs []error) {
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, rediskit.Classify(r.err, true)))
		}
	}
	ok, refused = d.tally(rs)
	return ok, refused, errs
}

// Renew implements driver.Driver: a majority must still hold g.
func (d *Driver) Renew(ctx context.Context, g driver.Grant) error {
	if err := d.usable(g); err != nil {
		return err
	}
	k := d.layout.Keys(g.Key)
	decided := func(ok, refused int) bool { return ok >= d.quorum || refused > len(d.nodes)-d.quorum }
	ok, refused, errs := d.majority(ctx, min(d.opts.Budget, g.TTL/3), decided, rediskit.Renew, []string{k.Lock},
		rediskit.Value(g.Fence, g.Owner), rediskit.Millis(g.TTL))
	return d.verdict("renew", g, ok, refused, errs)
}

func (d *Driver) verdict(op string, g driver.Grant, ok, refused int, errs []error) error {
	switch {
	case ok >= d.quorum:
		return nil
	case refused > len(d.nodes)-d.quorum:
		return fmt.Errorf("redlock: %s %v: %w on %d of %d nodes", op, g, fenced.ErrNotHeld, refused, len(d.nodes))
	}
	return fmt.Errorf("redlock: %s %v: %w: confirmed on %d of %d nodes (need %d): %w",
		op, g, fenced.ErrUnknownOutcome, ok, len(d.nodes), d.quorum, errors.Join(errs...))
}

// RenewBatch implements driver.BatchRenewer: one pipeline per node, all
// nodes in parallel, so one round trip for the whole batch. Each grant's
// replies are counted as Renew counts them (tally), so a server error on
// a node (LOADING, BUSY, OOM) is never taken for a refusal.
func (d *Driver) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := d.usable(grants...); err != nil {
		return nil, err
	}
	// A node answers with one reply per request; a request's own server
	// error is in its reply, a failure of the whole pipeline (transport)
	// in the node's.
	rs := fanout(ctx, d, d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) ([]rediskit.RenewReply, error) {
		return rediskit.RenewAll(ctx, c, d.layout, grants)
	}, nil, nil)
	var nodeErrs []error
	answered := 0
	for _, r := range rs {
		if r.err != nil {
			nodeErrs = append(nodeErrs, fmt.Errorf("%s: %w", d.nodes[r.node].name, r.err)) // classified by RenewAll
		} else {
			answered++
		}
	}
	if missing := len(d.nodes) - len(rs); missing > 0 {
		nodeErrs = append(nodeErrs, fmt.Errorf("%w: %d nodes did not answer within %v", fenced.ErrUnknownOutcome, missing, d.opts.Budget))
	}
	if answered < d.quorum {
		return nil, fmt.Errorf("redlock: renew batch of %d: %w: %d of %d nodes answered (need %d): %w",
			len(grants), fenced.ErrUnknownOutcome, answered, len(d.nodes), d.quorum, errors.Join(nodeErrs...))
	}
	out := make([]error, len(grants))
	for i, g := range grants {
		var replies []reply[int64]
		for _, r := range rs {
			if r.err == nil {
				replies = append(replies, reply[int64]{node: r.node, val: renewed(r.val[i]), err: r.val[i].Err})
			}
		}
		ok, refused, errs := d.tallyErrs(replies)
		out[i] = d.verdict("renew", g, ok, refused, append(errs, nodeErrs...))
	}
	return out, nil
}

// renewed is a RenewAll reply as the Renew script's reply: 1 if renewed,
// else 0.
func renewed(r rediskit.RenewReply) int64 {
	if r.Renewed {
		return 1
	}
	return 0
}

// Release implements driver.Driver: it deletes g on every node that has it
// and wakes waiters there. It succeeds if any node still had g.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	if err := d.usable(); err != nil {
		return err
	}
	k := d.layout.Keys(g.Key)
	// Enough nodes must have answered that a new majority can form; the
	// rest finish in the background.
	decided := func(ok, refused int) bool { return ok >= d.quorum || ok+refused == len(d.nodes) }
	value := rediskit.Value(g.Fence, g.Owner)
	// A node that did not confirm (no answer within the budget, or an
	// error) gets the release again in the background (finishRelease).
	rs := fanout(ctx, d, d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		n, err := rediskit.Release.Run(ctx, c, []string{k.Lock, k.Waiters}, value, k.Channel).Int64()
		if err != nil {
			d.finishRelease(c, k, value, g.TTL)
		}
		return n, err
	}, func(rs []reply[int64]) bool {
		return decided(d.tally(rs))
	}, nil)
	ok, refused, errs := d.tallyErrs(rs)
	if missing := len(d.nodes) - len(rs); missing > 0 {
		errs = append(errs, fmt.Errorf("%w: %d nodes did not answer within %v", fenced.ErrUnknownOutcome, missing, d.opts.Budget))
	}
	switch {
	case ok >= d.quorum:
		return nil
	case refused == len(d.nodes):
		return fmt.Errorf("redlock: release %v: %w", g, fenced.ErrNotHeld)
	case ok > 0 && ok+refused == len(d.nodes):
		// Only a minority still had it (the rest of an earlier release may
		// still be in flight, or the grant expired on the others): it was
		// not the current grant, though its remnants are gone now.
		return fmt.Errorf("redlock: release %v: %w (still present on %d of %d nodes, removed)", g, fenced.ErrNotHeld, ok, len(d.nodes))
	case refused > len(d.nodes)-d.quorum:
		return fmt.Errorf("redlock: release %v: %w on %d of %d nodes (the rest did not answer)",
			g, fenced.ErrNotHeld, refused, len(d.nodes))
	}
	return fmt.Errorf("redlock: release %v: %w: %w", g, fenced.ErrUnknownOutcome, errors.Join(errs...))
}
