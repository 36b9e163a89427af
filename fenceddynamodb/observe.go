package fenceddynamodb

import (
	"sync"
	"time"

	"github.com/fenced-dev/fenced/clock"
)

// observer remembers, per key, the grant this driver last saw and since
// when, on its own monotonic clock. It is how a store without a server
// clock decides expiry: a grant may be taken over only by a driver that has
// seen it unchanged (same fence and version) for a whole TTL.
//
// "Seen since" is the local time at which a response carrying that version
// was received. The version was written before the response was sent. The
// holder measures its validity from before it sent the request that wrote
// it. So the holder's validity (TTL minus its safety margin, counted from
// its send) ends before this observer's TTL (counted from the receive). That
// holds unless the two clocks run at rates that differ by more than
// SafetyMargin/TTL.
type observer struct {
	clk clock.Clock

	mu      sync.Mutex
	seen    map[string]*observation
	inserts int
}

// observation is one grant as an observer saw it.
type observation struct {
	fence, version uint64
	ttl            time.Duration
	since          time.Time // first receipt of a response showing this version
	last           time.Time // latest such receipt
}

// pruneEvery is how many new observations are recorded between sweeps of
// the ones nobody has looked at for a long time.
const pruneEvery = 4096

func newObserver(clk clock.Clock) *observer {
	return &observer{clk: clk, seen: map[string]*observation{}}
}

// see records that a response received at at showed it for key, and
// returns how long from now until this observer may take the grant over
// (zero or less: now). A free item makes the observer forget the key and
// returns 0. A version older than one already seen (a slow response
// overtaken by a faster one) changes nothing.
func (o *observer) see(key string, it leaseItem, at time.Time) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	if it.owner == "" {
		delete(o.seen, key)
		return 0
	}
	ob, ok := o.seen[key]
	switch {
	case ok && it.version < ob.version:
		// Stale: keep the newer observation.
	case ok && it.version == ob.version:
		ob.ttl = it.ttl
		if at.After(ob.last) {
			ob.last = at
		}
	default:
		ob = &observation{fence: it.fence, version: it.version, ttl: it.ttl, since: at, last: at}
		o.seen[key] = ob
		o.inserts++
		if o.inserts%pruneEvery == 0 {
			o.pruneLocked()
		}
	}
	return ob.since.Add(ob.ttl).Sub(o.clk.Now())
}

// ripe returns the observation of key if it has been unchanged for its
// whole TTL, so the grant may be taken over by naming its version.
func (o *observer) ripe(key string) (observation, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ob, ok := o.seen[key]
	if !ok || o.clk.Now().Sub(ob.since) < ob.ttl {
		return observation{}, false
	}
	return *ob, true
}

// forget drops what the observer knows of key (it was released or broken
// by this driver).
func (o *observer) forget(key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.seen, key)
}

// pruneLocked drops observations nobody has refreshed for a minute past
// their TTL. Forgetting only ever delays a takeover (the next look starts
// a new observation), so it is always safe.
func (o *observer) pruneLocked() {
	now := o.clk.Now()
	for k, ob := range o.seen {
		if now.Sub(ob.last) > ob.ttl+time.Minute {
			delete(o.seen, k)
		}
	}
}
