package fencedetcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// batchRenewal is the state of one RenewBatch call.
// Slices indexed by j run over idx, the grants still worth renewing.
type batchRenewal struct {
	d       *Driver
	start   time.Time
	grants  []driver.Grant
	errs    []error  // the outcome of each grant
	entries []*entry // the entry of each grant worth renewing, else nil
	idx     []int    // positions in grants of those worth renewing
	// sessions holds the longest TTL renewed on each session.
	sessions map[*session]time.Duration

	wg     sync.WaitGroup // the keep-alives and the session listings
	mu     sync.Mutex     // guards kaErrs
	kaErrs map[*session]error

	// held[j] tells whether the read of entries[idx[j]] found its key as
	// the entry put it; readErrs[j] is set when the request carrying that
	// read failed.
	held     []bool
	readErrs []error
	failed   atomic.Int64 // how many reads failed
}

// newBatchRenewal starts the clock and admits the grants worth renewing.
func newBatchRenewal(d *Driver, grants []driver.Grant) *batchRenewal {
	r := &batchRenewal{
		d:        d,
		start:    time.Now(),
		grants:   grants,
		errs:     make([]error, len(grants)),
		entries:  make([]*entry, len(grants)),
		sessions: map[*session]time.Duration{},
		kaErrs:   map[*session]error{},
	}
	r.admit()
	r.held = make([]bool, len(r.idx))
	r.readErrs = make([]error, len(r.idx))
	return r
}

// admit refuses grants the driver does not hold, or whose TTL outruns
// their session. It records the others in idx and sessions.
func (r *batchRenewal) admit() {
	for i, g := range r.grants {
		e := r.d.grants.Lookup(g.Key, g.Owner)
		if e == nil || !e.granted || g.Fence == 0 || uint64(e.rev) != g.Fence {
			r.errs[i] = fmt.Errorf("etcd: renew %s: %w", g, fenced.ErrNotHeld)
			continue
		}
		if limit := time.Duration(e.s.ttl) * time.Second; g.TTL > limit {
			// A keep-alive would extend the session by its own TTL only:
			// the grant would end before the TTL the caller counts on.
			r.errs[i] = fmt.Errorf(
				"etcd: renew %s: %w: TTL %v exceeds the %v of the session the grant rides on (renew with the TTL it was granted with)",
				g, fenced.ErrInvalidTTL, g.TTL, limit)
			continue
		}
		r.entries[i] = e
		r.sessions[e.s] = max(r.sessions[e.s], g.TTL)
		r.idx = append(r.idx, i)
	}
}

// keepAlive starts one keep-alive per session, recording each answer in kaErrs.
func (r *batchRenewal) keepAlive(ctx context.Context) {
	for s, ttl := range r.sessions {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			err := <-r.d.keepAliveAsync(ctx, s, r.start, ttl)
			r.mu.Lock()
			r.kaErrs[s] = err
			r.mu.Unlock()
		}()
	}
}

// listSessions checks the grants of a session that carries many of them
// with one LeaseTimeToLive listing the session's keys, instead of a read
// per key. It returns the positions in idx left to read key by key.
func (r *batchRenewal) listSessions(ctx context.Context) []int {
	bySession := map[*session][]int{} // positions in idx
	for j, i := range r.idx {
		s := r.entries[i].s
		bySession[s] = append(bySession[s], j)
	}
	var reads []int
	for s, js := range bySession {
		if len(js) <= maxReadsPerTxn {
			reads = append(reads, js...)
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.listSession(ctx, s, js)
		}()
	}
	return reads
}

// listSession sets held for the grants of s at positions js in idx.
func (r *batchRenewal) listSession(ctx context.Context, s *session, js []int) {
	// Only a listing sent after this call began will do: one sent
	// earlier may list a key deleted (broken) since.
	attached, err := r.d.attachedKeys(ctx, s, r.start)
	if err != nil {
		for _, j := range js {
			r.readErrs[j] = err
		}
		r.failed.Add(int64(len(js)))
		return
	}
	for _, j := range js {
		// The name listed is e's key if e is still tracked now:
		// until the driver forgets e, no other grant can put a
		// key of that name on s (see waiterKey), and a tracked
		// entry's key was put before this call began.
		e := r.entries[r.idx[j]]
		r.held[j] = attached[e.etcdKey] && r.d.grants.Lookup(e.id.Key, e.id.Owner) == e
	}
}

// readKeys reads the keys of the grants at positions in idx, in
// transactions of at most maxReadsPerTxn reads, a few at a time.
func (r *batchRenewal) readKeys(ctx context.Context, positions []int) {
	slices.Sort(positions)
	chunks := make(chan int)
	var rg sync.WaitGroup
	for range min(renewReadsInFlight, (len(positions)+maxReadsPerTxn-1)/maxReadsPerTxn) {
		rg.Add(1)
		go func() {
			defer rg.Done()
			for lo := range chunks {
				r.readTxn(ctx, positions[lo:min(lo+maxReadsPerTxn, len(positions))])
			}
		}()
	}
	for lo := 0; lo < len(positions); lo += maxReadsPerTxn {
		chunks <- lo
	}
	close(chunks)
	rg.Wait()
}

// readTxn reads the keys of the grants at positions in one transaction.
func (r *batchRenewal) readTxn(ctx context.Context, positions []int) {
	ops := make([]clientv3.Op, 0, len(positions))
	for _, j := range positions {
		ops = append(ops, clientv3.OpGet(r.entries[r.idx[j]].etcdKey))
	}
	resp, err := r.d.cli.Txn(ctx).Then(ops...).Commit()
	for n, j := range positions {
		if err != nil {
			r.readErrs[j] = readErr("renew", err)
			continue
		}
		if kvs := resp.Responses[n].GetResponseRange().Kvs; len(kvs) > 0 {
			r.held[j] = r.entries[r.idx[j]].holds(kvs[0])
		}
	}
	if err != nil {
		r.failed.Add(int64(len(positions)))
	}
}

// settle sets each admitted grant's outcome from its read and keep-alive.
// A grant is extended only when both found it held.
func (r *batchRenewal) settle() {
	for j, i := range r.idx {
		e := r.entries[i]
		if r.readErrs[j] != nil {
			r.errs[i] = r.readErrs[j]
			continue
		}
		if !r.held[j] {
			r.d.grants.Forget(e)
			r.errs[i] = fmt.Errorf("etcd: renew %s: %w: key %s is gone", r.grants[i], fenced.ErrNotHeld, e.etcdKey)
			continue
		}
		if kerr := r.kaErrs[e.s]; kerr != nil {
			if errors.Is(kerr, errSessionGone) {
				r.d.grants.Forget(e)
				r.errs[i] = fmt.Errorf("etcd: renew %s: %w: %v", r.grants[i], fenced.ErrNotHeld, kerr)
			} else {
				r.errs[i] = kerr
			}
			continue
		}
		if !r.d.grants.Extend(e, r.grants[i].TTL, r.start) {
			// Ended meanwhile (its deadline passed, the reaper is deleting
			// it or has): whatever the reads found, it is not held.
			r.errs[i] = fmt.Errorf("etcd: renew %s: %w: the grant ended during the renewal", r.grants[i], fenced.ErrNotHeld)
		}
	}
}
