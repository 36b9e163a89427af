package fencedredlock

import (
	"errors"
	"fmt"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
)

// acquireTally sorts the nodes' answers to one acquire attempt.
type acquireTally struct {
	granted    uint64  // the fence most granting nodes gave
	ours       int     // how many nodes granted under that fence
	answered   int     // how many nodes answered within the budget
	heldTTLs   []int64 // the remaining times of other holders, in ms
	nodeErrs   []error // each failed node's error, named
	foreign    int     // nodes whose lock key holds a foreign value
	stale      bool    // a node had granted a newer fence
	unknown    bool    // a node may have applied the attempt unseen
	superseded int     // nodes that refused it for a later attempt
}

// tallyAcquire counts the answers; ours are counted by fence, since an
// idempotent re-acquire keeps its old fence.
func (d *Driver) tallyAcquire(rs []reply[rediskit.Acquired], k rediskit.Keys) acquireTally {
	tl := acquireTally{answered: len(rs)}
	byFence := map[uint64]int{}
	for _, r := range rs {
		switch {
		case r.err != nil:
			tl.nodeErrs = append(tl.nodeErrs, fmt.Errorf("%s: %w", d.nodes[r.node].name, d.nodeErr(r.err, true, k)))
			if errors.Is(d.nodeErr(r.err, true, k), fenced.ErrUnknownOutcome) {
				tl.unknown = true
			}
		case isOurs(r):
			byFence[r.val.Fence]++
		case r.val.Status == rediskit.StatusHeld:
			tl.heldTTLs = append(tl.heldTTLs, r.val.PTTL)
		case r.val.Status == rediskit.StatusForeign:
			tl.foreign++
		case r.val.Status == rediskit.StatusStale:
			tl.stale = true
		case r.val.Status == rediskit.StatusSuperseded:
			tl.superseded++
		}
	}
	for f, n := range byFence {
		if n > tl.ours {
			tl.ours, tl.granted = n, f
		}
	}
	return tl
}
