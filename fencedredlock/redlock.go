// Package fencedredlock is the fenced backend for Redlock: the same lease held on
// a majority of N independent Redis primaries.
//
//	import _ "github.com/fenced-dev/fenced/fencedredlock"
//
//	client, err := fenced.Open(ctx, "redlock://:password@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379/0", nil)
//
// The URL lists host:port pairs separated by commas (hostnames or IPv4);
// user, password, database and go-redis query options apply to every
// node. fenced options:
//
//	prefix=fenced:    namespace of every Redis key fenced writes
//	budget=250ms      longest time one acquisition, renewal or release may take
//	fence=URL         an external fence source: another fenced store, e.g.
//	                  fence=postgres://… or fence=sqlite:///var/lib/fence.db
//	                  (URL-escaped; its backend package must be linked in)
//	audit_len=100     breaks kept per key and node
//
// # The algorithm
//
// TryAcquire sends a grant script to every node in parallel. It succeeds
// once a majority (N/2+1) granted it within the budget, at most a third of
// the TTL. It then checks that the TTL minus the time taken minus a drift
// allowance is still positive. The allowance is the lease's SafetyMargin
// (fenced.LeaseOptions, 1% of the TTL + 2ms unless the lease or the client's
// defaults set another), which the driver receives through
// driver.TermsAcquirer, so its check and the holder's local validity are the
// same arithmetic. It returns as soon as the outcome is decided, so nodes
// that are down or stopped cost nothing beyond the budget. A failed attempt
// releases whatever it was granted on every node. That rollback, and the
// attempt's own grant requests, may reach a slow or stopped node long
// after a later attempt of the same owner (the Client keeps one owner token
// for all attempts of one Acquire) was granted and counted there: each
// node keeps, per key, a claim naming the last attempt of the owner whose
// grant it holds (a key that never expires, like the fence counter), so
// that a late request of an earlier attempt is refused and its rollback
// deletes nothing a later attempt counted. The driver tries once; the
// portable Client retries with backoff and full jitter, or when woken by a
// release (waiters subscribe on every node; each node's release wakes the
// process first in that node's waiter queue, as the redis backend does).
// Renewal and release go to every node in parallel; renewal needs a
// majority. The Client measures validity from before the first request was
// sent, minus the same drift allowance.
//
// A node whose key holds a value fenced did not write refuses the grant
// and is never written to. If such nodes leave too few for a majority,
// the attempt fails with an error matching ErrForeignValue; otherwise
// they count as refusals, and a failure for another reason (a holder,
// nodes that did not answer) says so, naming them when it is
// ErrUnavailable.
//
// # Guarantees
//
// Each node decides expiry by its wall clock (PX). A forward step of that
// clock on the nodes a rival needs ends the grant early there, and lets a
// second majority form (Capabilities.ClockStepSafe is false). When the
// holder's majority is exact, one node is enough.
//
// Redlock has no monotonic token. With no FenceSource the driver declares
// FenceNone, and every fence is zero. A lease is then refused unless its
// LeaseOptions.MinFence is FenceNone: work whose duplicates only waste
// effort, or a caller who fences the resource itself. Its mutual exclusion
// also rests on timing assumptions (bounded clock drift between nodes,
// pauses and network delays shorter than the TTL) and on nodes keeping their
// data across restarts (appendfsync always, or restarts delayed by a TTL).
//
// With a FenceSource, the fence of each grant comes from that source, taken
// before the grant. Every node remembers the highest fence it granted and
// refuses an older one. So fences rise in grant order as long as a majority
// of nodes keep their data. The declared strength is the source's. Even when
// Redlock's timing assumptions fail and two clients hold the key, their
// fences differ and the resource refuses the older one.
package fencedredlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
	"github.com/redis/go-redis/v9"
)

func init() {
	fenced.Register("redlock", open, driver.Expiry{Name: "Redlock",
		Note: "PX in milliseconds on each node; validity also loses the acquire time and the drift allowance"})
}

// ErrForeignValue means a Redis key in fenced's namespace holds something
// fenced did not write. Fenced refuses to touch it.
var ErrForeignValue = rediskit.ErrForeignValue

// FenceSource issues fences for Redlock grants, which have none of their
// own.
type FenceSource interface {
	// Next returns a fence for key greater than every fence it returned
	// before for key.
	Next(ctx context.Context, key string) (uint64, error)
	// Strength says how far Next's promise holds (for example across a
	// failover of the source).
	Strength() fenced.FenceStrength
}

// Options configure a Driver. The zero value gives the defaults.
type Options struct {
	// Prefix starts every Redis key and channel fenced uses. Default
	// "fenced:".
	Prefix string
	// Fence supplies fences; nil means none (FenceNone).
	Fence FenceSource
	// Budget is the longest one round of requests to the nodes may take
	// (further capped at a third of the TTL for acquisition). Default
	// 250ms.
	Budget time.Duration
	// AuditLen is how many breaks each node keeps per key. Default 100.
	AuditLen int
}

// Driver is a Redlock driver over N go-redis clients, one per independent
// primary. It implements driver.Driver, driver.Notifier,
// driver.BatchRenewer and driver.BreakLogger.
type Driver struct {
	nodes  []node
	quorum int
	owns   bool
	layout rediskit.Layout
	opts   Options
	closed chan struct{}
	once   sync.Once
	// wg counts the cleanups of failed attempts (see fanout); wgMu
	// orders their starts with Close's wait, which sets wgClosed.
	wgMu     sync.Mutex
	wgClosed bool
	wg       sync.WaitGroup

	lastAttempt atomic.Int64 // see nextAttempt

	// waiters is this process's side of the nodes' waiter queues (see
	// Subscribe).
	waiters *rediskit.WaitQueue

	bgMu     sync.Mutex // orders finishRelease's starts with Close
	bgClosed bool
	bg       sync.WaitGroup // finishRelease's retries
}

type node struct {
	c    redis.UniversalClient
	hub  *rediskit.Hub
	name string
}

var (
	_ driver.Driver          = (*Driver)(nil)
	_ driver.TermsAcquirer   = (*Driver)(nil)
	_ driver.Notifier        = (*Driver)(nil)
	_ driver.ObserveNotifier = (*Driver)(nil)
	_ driver.BatchRenewer    = (*Driver)(nil)
	_ driver.BreakLogger     = (*Driver)(nil)
)

// New returns a Redlock driver over clients, one per independent Redis
// primary (not replicas of each other, not a Cluster). Use an odd number,
// at least 3. opts may be nil. The driver does not own the clients. For
// the budget to bound slow nodes, clients should honour context deadlines
// (go-redis Options.ContextTimeoutEnabled). The driver stops waiting at the
// budget either way.
func New(clients []redis.UniversalClient, opts *Options) (*Driver, error) {
	if len(clients) == 0 {
		return nil, errors.New("redlock: New: no nodes")
	}
	d := &Driver{quorum: len(clients)/2 + 1, closed: make(chan struct{})}
	if opts != nil {
		d.opts = *opts
	}
	if d.opts.Prefix == "" {
		d.opts.Prefix = rediskit.DefaultPrefix
	}
	if err := rediskit.CheckPrefix(d.opts.Prefix); err != nil {
		return nil, fmt.Errorf("redlock: %w", err)
	}
	if d.opts.Budget <= 0 {
		d.opts.Budget = 250 * time.Millisecond
	}
	if d.opts.AuditLen <= 0 {
		d.opts.AuditLen = 100
	}
	d.layout = rediskit.Layout{Prefix: d.opts.Prefix}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("redlock: New: node %d is nil", i)
		}
		if _, ok := c.(*redis.ClusterClient); ok {
			return nil, fmt.Errorf("redlock: New: node %d is a Cluster client; Redlock needs independent primaries", i)
		}
		name := fmt.Sprintf("node %d", i)
		if cl, ok := c.(*redis.Client); ok {
			name = cl.Options().Addr
		}
		d.nodes = append(d.nodes, node{c: c, hub: rediskit.NewHub(c), name: name})
	}
	// One id for every node: a node's release wakes the process on the
	// same channel name whichever node it comes from.
	d.waiters = rediskit.NewWaitQueue(d.nodes[0].hub.ID(), d.leaveWaiters)
	return d, nil
}

// Nodes returns the number of nodes and the majority needed.
func (d *Driver) Nodes() (n, quorum int) { return len(d.nodes), d.quorum }

// usable returns ErrClosed once d is closed and, for a renewal, an error
// matching ErrInvalidTTL when a grant to renew carries no TTL
// (ttlrule.CheckAll).
func (d *Driver) usable(renewing ...driver.Grant) error {
	select {
	case <-d.closed:
		return fenced.ErrClosed
	default:
		return ttlrule.CheckAll(renewing)
	}
}

// guarantees is what the backend promises, the part of Capabilities
// that says how far a lease can be trusted.
func (d *Driver) guarantees() driver.Capabilities {
	note := fmt.Sprintf("redlock over %d nodes, majority %d: "+
		"mutual exclusion assumes bounded clock drift between nodes and pauses shorter than the TTL", len(d.nodes), d.quorum)
	strength := fenced.FenceNone
	if d.opts.Fence != nil {
		strength = d.opts.Fence.Strength()
		note += fmt.Sprintf("; fences come from an external source whose fence is %s, "+
			"and each node refuses a fence older than one it granted", strength)
	} else {
		note += "; Redlock has no monotonic token of its own, so supply a FenceSource with redlock.Options.Fence or fence= in the URL"
	}
	note += "; expiry is PX on each node's wall clock: a forward step on the nodes of a holder's majority that a rival needs " +
		"(one node, when that majority is exact) ends the grant early there, and a second majority can form (not safe from clock steps)"
	return driver.Capabilities{Fence: strength, ServerClock: true, ClockStepSafe: false, Note: note}
}

// Capabilities implements driver.Driver: waiters and observers woken by
// pub/sub, grants decided on the lease's terms (TryAcquireTerms), batch
// renewal and the break log.
func (d *Driver) Capabilities() driver.Capabilities {
	c := d.guarantees()
	c.Subscribe, c.Observe, c.Terms, c.BatchRenew, c.BreakLog = true, true, true, true, true
	return c
}

// Close implements driver.Driver: it closes the subscriber connections,
// and the clients when the driver was opened by URL.
func (d *Driver) Close() error {
	var errs []error
	d.once.Do(func() {
		close(d.closed)
		for _, n := range d.nodes {
			errs = append(errs, n.hub.Close())
		}
		d.waiters.Close()
		d.wgMu.Lock()
		d.wgClosed = true
		d.wgMu.Unlock()
		d.wg.Wait()
		d.bgMu.Lock()
		d.bgClosed = true
		d.bgMu.Unlock()
		d.bg.Wait()
		if d.owns {
			for _, n := range d.nodes {
				errs = append(errs, n.c.Close())
			}
			if c, ok := d.opts.Fence.(*clientFence); ok {
				errs = append(errs, c.c.Close())
			}
		}
	})
	return errors.Join(errs...)
}
