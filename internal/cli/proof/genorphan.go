package proof

import (
	"strings"
	"time"
)

// checkOrphans judges the grants listings saw that no Acquire returned.
func (c *genChecker) checkOrphans() {
	for k, s := range c.observed {
		if c.returned[k.owner] {
			continue
		}
		c.r.OrphansSeen++
		c.checkOrphan(k, s)
	}
}

// checkOrphan judges one orphan grant k, seen held over s.
func (c *genChecker) checkOrphan(k grantID, s *grantSpan) {
	held := max(0, time.Duration(s.last-s.first))
	if held <= c.bound {
		return
	}
	from := c.mayHaveLeft(k, s)
	orphanFrom := c.orphanFrom(s, from)
	if free := time.Duration(s.last - orphanFrom); free > c.ttl+time.Second {
		c.r.Orphans++
		c.r.problem(orphanFrom+int64(c.ttl),
			"%s: a grant no Acquire returned (owner %.8s, fence %d) was held for %v, %v of it after the acquisitions that could return "+
				"it ended, past its TTL", k.key, k.owner, k.fence, held, free)
		return
	}
	if c.missedTurn(k, s, from) {
		return
	}
	quiet := len(from) > 0
	for _, a := range from {
		if a.done == 0 || s.last < a.done+int64(c.bound) || faultIn(c.faults, a.worker, a.done-int64(time.Second), a.done+int64(c.bound)) {
			quiet = false
			break
		}
	}
	if quiet {
		c.r.SlowOrphans++
		c.r.problem(s.first+int64(c.bound), "%s: a grant no Acquire returned (owner %.8s, fence %d) was held for %v with no fault active",
			k.key, k.owner, k.fence, held)
	}
}

// mayHaveLeft returns the acquisitions that may have left orphan k: those
// invoked on its key (or, for a semaphore, on the name its permit keys
// start with) before it was seen, not completed a TTL before, that failed
// or take several grants (a set, a permit, a campaign). A grant such an
// acquisition holds while it runs is not an orphan. The Client looks for
// the grant of a failed one for a second and releases it; the orphan
// counts only if it was still held the bound after each of them
// completed, and neither their workers nor the authority were faulted
// from a second before each completed to the bound after.
func (c *genChecker) mayHaveLeft(k grantID, s *grantSpan) []*genAcq {
	var from []*genAcq
	for _, a := range c.acqs {
		if a.invoke > s.first+int64(200*time.Millisecond) || (a.done != 0 && a.done < s.first-int64(c.ttl)) {
			continue
		}
		if !a.failed && a.done != 0 && !multiGrant(a.name) {
			continue
		}
		for _, key := range a.keys {
			if key == k.key || strings.HasPrefix(k.key, key+"#") {
				from = append(from, a)
				break
			}
		}
	}
	return from
}

// orphanFrom returns when an orphan seen over s starts to count against
// the hard limit: held past the TTL once nothing that may still return
// it runs, with the authority answering.
func (c *genChecker) orphanFrom(s *grantSpan, from []*genAcq) int64 {
	// An acquisition running when the grant was first seen may be the
	// one that made it: a set holds the grants it has got while it waits
	// for the rest, for as long as its MaxWait, and a single-key
	// acquisition whose request was applied while the authority was
	// unreachable learns of its grant (or gives up and releases it) only
	// once it is back. So the count starts when the last such acquisition
	// completed; one still running at the end of the history does not
	// stop it.
	orphanFrom := s.first
	for _, a := range from {
		if a.done != 0 {
			orphanFrom = max(orphanFrom, a.done)
		}
	}
	// Nor while the authority could not answer (paused, or killed and
	// not yet answering again): no delete reaches it, and etcd gives
	// every session a full TTL again when it restarts. The count
	// starts again when the last such fault in the grant's life ended.
	for _, f := range c.faults {
		if f.worker < 0 && f.start <= s.last && f.end >= orphanFrom {
			orphanFrom = max(orphanFrom, f.end)
		}
	}
	return orphanFrom
}

// missedTurn reports, and counts, a queued waiter that missed its turn:
// its single-key acquisition (not a try, which never queues) went on
// waiting while its grant stood at the authority, for more than the TTL
// (a slow authority may take seconds to answer), with no fault active
// from a second before the grant was seen until the acquisition
// completed, and the grant went only as the acquisition gave up (within
// 250 ms of it).
func (c *genChecker) missedTurn(k grantID, s *grantSpan, from []*genAcq) bool {
	for _, a := range from {
		if multiGrant(a.name) || a.name == "try" || a.done == 0 || a.done-s.first <= int64(c.ttl) ||
			s.last < a.done-int64(250*time.Millisecond) {
			continue
		}
		if !faultIn(c.faults, a.worker, s.first-int64(time.Second), a.done) {
			c.r.SlowOrphans++
			c.r.problem(s.first+int64(c.ttl),
				"%s: a waiter's grant (owner %.8s, fence %d) stood %v while its acquisition (worker %d) went on waiting, "+
					"with no fault active", k.key, k.owner, k.fence, time.Duration(a.done-s.first), a.worker)
			return true
		}
	}
	return false
}
