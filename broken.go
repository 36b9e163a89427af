package fenced

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// ErrBroken is part of the cause of a lease that an admin broke (Client.Break,
// fenced break, the break button of fenced serve). Such a cause also matches
// ErrLost, so IsLost stays true and code that only checks ErrLost keeps
// working; ErrBroken lets a holder, a log line or a metric say "broken by
// alice: host wedged" instead of "renewal refused".
//
// It is only reported where it can be told apart: when a renewal is refused
// and the store keeps an audit log of breaks (driver.BreakLogger: the SQL
// backends, Redis, Redlock, mem) that records a break of this very grant
// (same fence and owner). On etcd and ZooKeeper, which keep no break log, a
// broken lease is reported as lost (ErrLost) without ErrBroken.
var ErrBroken = errors.New("broken by an admin")

// breakLookupTimeout bounds the audit-log read that tells a broken lease
// from one whose renewal was refused for another reason. It runs once per
// lost lease, after the loss is certain, so it delays only the report.
const breakLookupTimeout = time.Second

// refusedCause is the cause of a lease whose renewal the authority refused
// with err: a break recorded for this grant in the store's audit log when
// there is one, a plain refusal otherwise.
func (l *Lease) refusedCause(err error) error {
	if rec, ok := l.recordedBreak(); ok {
		return fmt.Errorf("%w: %w (%s, at %s): %s", ErrLost, ErrBroken, rec.By, rec.Time.UTC().Format(time.RFC3339), rec.Reason)
	}
	return fmt.Errorf("%w: the authority refused renewal: %v", ErrLost, err)
}

// recordedBreak looks in the store's break log for a break of l's grant.
func (l *Lease) recordedBreak() (driver.BreakRecord, bool) {
	bl := l.c.ops().BreakLogger
	if bl == nil {
		return driver.BreakRecord{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), breakLookupTimeout)
	defer cancel()
	recs, err := bl.Breaks(ctx, l.key)
	if err != nil {
		return driver.BreakRecord{}, false
	}
	short := driver.ShortOwner(l.owner)
	for i := len(recs) - 1; i >= 0; i-- {
		if r := recs[i]; r.Fence == l.fence && r.Owner == short {
			return r, true
		}
	}
	return driver.BreakRecord{}, false
}
