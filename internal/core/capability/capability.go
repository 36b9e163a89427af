// Package capability reads what a driver can do beyond the Driver
// interface: the root package's one lookup, shared with the conformance
// suite and the crash tests of this module, none of which is public API.
package capability

import (
	"fmt"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/sentinel"
)

// Ops is what a driver can do beyond the Driver interface. Each field is
// the driver's implementation of one optional interface. It is nil unless
// the driver both declares it in its Capabilities and has its methods.
type Ops struct {
	// Declared is the driver's declaration, with the flags of operations
	// it lacks the methods for cleared (and FIFO cleared without a queue).
	Declared driver.Capabilities

	Notifier      driver.Notifier
	Observer      driver.ObserveNotifier
	Queuer        driver.TimedQueuer
	TermsAcquirer driver.TermsAcquirer
	BatchRenewer  driver.BatchRenewer
	LossWatcher   driver.LossWatcher
	BreakLogger   driver.BreakLogger
	Valuer        driver.Valuer
	FenceFloorer  driver.FenceFloorer
	Checkpointer  driver.Checkpointer
}

// Of reads d's optional operations. An operation is present when d declares
// it (Driver.Capabilities) and implements its interface. So a wrapper that
// embeds another driver offers only the operations whose methods it has
// itself. What the embedded driver declares does not matter.
func Of(d driver.Driver) Ops {
	c := d.Capabilities()
	var o Ops
	o.Notifier = has[driver.Notifier](d, &c.Subscribe)
	o.Observer = has[driver.ObserveNotifier](d, &c.Observe)
	o.Queuer = has[driver.TimedQueuer](d, &c.Queue)
	o.TermsAcquirer = has[driver.TermsAcquirer](d, &c.Terms)
	o.BatchRenewer = has[driver.BatchRenewer](d, &c.BatchRenew)
	o.LossWatcher = has[driver.LossWatcher](d, &c.WatchLoss)
	o.BreakLogger = has[driver.BreakLogger](d, &c.BreakLog)
	o.Valuer = has[driver.Valuer](d, &c.Value)
	o.FenceFloorer = has[driver.FenceFloorer](d, &c.FenceFloor)
	o.Checkpointer = has[driver.Checkpointer](d, &c.Checkpoint)
	c.FIFO = c.FIFO && c.Queue
	o.Declared = c
	return o
}

// has returns d as an I when *declared is set and d implements I, and
// clears *declared otherwise.
func has[I any](d driver.Driver, declared *bool) I {
	var zero I
	if !*declared {
		return zero
	}
	i, ok := d.(I)
	if !ok {
		*declared = false
		return zero
	}
	return i
}

// Notifies reports whether o's waiters are woken by the authority (its
// notification, Subscribe, or its own queue, Queue) rather than by polling.
// Whether they are served in arrival order is o.Declared.FIFO.
func (o Ops) Notifies() bool { return o.Notifier != nil || o.Queuer != nil }

// Implemented lists the optional interfaces d has the methods of, by the
// name of their Capabilities flag, whatever d declares. The conformance
// suite compares it with the declaration.
func Implemented(d driver.Driver) driver.Capabilities {
	_, sub := d.(driver.Notifier)
	_, obs := d.(driver.ObserveNotifier)
	_, q := d.(driver.TimedQueuer)
	_, terms := d.(driver.TermsAcquirer)
	_, br := d.(driver.BatchRenewer)
	_, lw := d.(driver.LossWatcher)
	_, bl := d.(driver.BreakLogger)
	_, v := d.(driver.Valuer)
	_, ff := d.(driver.FenceFloorer)
	_, cp := d.(driver.Checkpointer)
	return driver.Capabilities{Subscribe: sub, Observe: obs, Queue: q, Terms: terms, BatchRenew: br,
		WatchLoss: lw, BreakLog: bl, Value: v, FenceFloor: ff, Checkpoint: cp}
}

// TTLBounds returns the TTL range a driver declaring c accepts within
// [lo, hi], the portable layer's range.
func TTLBounds(c driver.Capabilities, lo, hi time.Duration) (time.Duration, time.Duration) {
	if d := c.Keeps.MinTTL; d > 0 {
		lo = max(lo, d)
	}
	if d := c.Keeps.MaxTTL; d > 0 {
		hi = min(hi, d)
	}
	return lo, hi
}

// CheckCheckpoint returns an error matching fenced.ErrCheckpointTooLarge
// when value is longer than limits.MaxCheckpoint.
func CheckCheckpoint(value []byte) error {
	if len(value) > limits.MaxCheckpoint {
		return fmt.Errorf("%w: %d bytes, at most %d", sentinel.ErrCheckpointTooLarge, len(value), limits.MaxCheckpoint)
	}
	return nil
}
