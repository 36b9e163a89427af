package driver

import (
	"fmt"
	"time"
)

// Capabilities is a driver's one declaration of what it can do beyond the
// Driver interface: which optional operations it offers, whether its
// waiters are served in arrival order, and narrower TTL bounds than the
// portable layer's. Driver.Capabilities returns it; nothing else asks a
// driver "can you?".
//
// Each operation flag names the optional interface whose methods carry
// it. A flag is honoured only where the driver also has those methods, and
// the conformance suite fails a driver whose flags and methods disagree
// (a flag without its methods, or methods that work although their flag is
// off). A flag may depend on how the driver was opened: PostgreSQL without
// a LISTEN connection keeps its Subscribe method but declares Subscribe
// false, and the method then refuses with ErrUnsupported.
//
// How waiters are woken is read from it alone: Ops.Notifies and
// Declared.FIFO, as CapabilitiesOf reads it.
type Capabilities struct {
	// Subscribe: Notifier, waiters woken by the authority's notification.
	Subscribe bool
	// Observe: ObserveNotifier, observers woken without taking a waiter's
	// wake-up.
	Observe bool
	// Queue: TimedQueuer, the authority's own wait queue (woken by it).
	Queue bool
	// FIFO: the queue serves waiters in arrival order. Only with Queue.
	FIFO bool
	// Terms: TermsAcquirer, a grant decided on the lease's whole terms.
	Terms bool
	// BatchRenew: BatchRenewer, many renewals in one round trip.
	BatchRenew bool
	// WatchLoss: LossWatcher, a lost grant reported without being asked.
	WatchLoss bool
	// BreakLog: BreakLogger, an audit log of breaks.
	BreakLog bool
	// Value: Valuer, a value carried by each grant.
	Value bool
	// FenceFloor: FenceFloorer, a fence floor an operator can raise.
	FenceFloor bool
	// Prune: Pruner, deletion of unused keys' records.
	Prune bool
	// MinTTL and MaxTTL, when not zero, narrow the TTLs the driver accepts
	// (ZooKeeper's session timeouts, etcd's whole seconds). The portable
	// bounds apply as well.
	MinTTL, MaxTTL time.Duration
	// Keeps is how the authority keeps a grant that is no longer renewed:
	// the Expiry the backend also registers for its scheme, with the
	// driver's own settings (ZooKeeper's tick). A recipe that waits for a
	// dead holder's grant to go reads how long that can take from it
	// (Expiry.Outlives). The zero value: the grant ends at its TTL.
	Keeps Expiry
}

// Ops is what a driver can do beyond the Driver interface, as CapabilitiesOf
// reads it: each field is the driver's implementation of one optional
// interface, nil unless the driver both declares it in its Capabilities and
// has its methods.
type Ops struct {
	// Declared is the driver's declaration, with the flags of operations
	// it lacks the methods for cleared (and FIFO cleared without a queue).
	Declared Capabilities

	Notifier      Notifier
	Observer      ObserveNotifier
	Queuer        TimedQueuer
	TermsAcquirer TermsAcquirer
	BatchRenewer  BatchRenewer
	LossWatcher   LossWatcher
	BreakLogger   BreakLogger
	Valuer        Valuer
	FenceFloorer  FenceFloorer
	Pruner        Pruner
}

// CapabilitiesOf reads d's optional operations: the one place where the
// portable layer asks what a driver can do. An operation is present when d
// declares it (Driver.Capabilities) and implements its interface; a wrapper
// that embeds another driver therefore offers only the operations whose
// methods it has itself, whatever the embedded driver declares.
func CapabilitiesOf(d Driver) Ops {
	c := d.Capabilities()
	var o Ops
	o.Notifier = has[Notifier](d, &c.Subscribe)
	o.Observer = has[ObserveNotifier](d, &c.Observe)
	o.Queuer = has[TimedQueuer](d, &c.Queue)
	o.TermsAcquirer = has[TermsAcquirer](d, &c.Terms)
	o.BatchRenewer = has[BatchRenewer](d, &c.BatchRenew)
	o.LossWatcher = has[LossWatcher](d, &c.WatchLoss)
	o.BreakLogger = has[BreakLogger](d, &c.BreakLog)
	o.Valuer = has[Valuer](d, &c.Value)
	o.FenceFloorer = has[FenceFloorer](d, &c.FenceFloor)
	o.Pruner = has[Pruner](d, &c.Prune)
	c.FIFO = c.FIFO && c.Queue
	o.Declared = c
	return o
}

// has returns d as an I when *declared is set and d implements I, and
// clears *declared otherwise.
func has[I any](d Driver, declared *bool) I {
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

// Implemented lists the optional interfaces d has the methods of, by the
// name of their Capabilities flag, whatever d declares. The conformance
// suite compares it with the declaration.
func Implemented(d Driver) Capabilities {
	_, sub := d.(Notifier)
	_, obs := d.(ObserveNotifier)
	_, q := d.(TimedQueuer)
	_, terms := d.(TermsAcquirer)
	_, br := d.(BatchRenewer)
	_, lw := d.(LossWatcher)
	_, bl := d.(BreakLogger)
	_, v := d.(Valuer)
	_, ff := d.(FenceFloorer)
	_, p := d.(Pruner)
	return Capabilities{Subscribe: sub, Observe: obs, Queue: q, Terms: terms, BatchRenew: br,
		WatchLoss: lw, BreakLog: bl, Value: v, FenceFloor: ff, Prune: p}
}

// Notifies reports whether o's waiters are woken by the authority (its
// notification, Subscribe, or its own queue, Queue) rather than by polling.
// Whether they are served in arrival order is o.Declared.FIFO.
func (o Ops) Notifies() bool { return o.Notifier != nil || o.Queuer != nil }

// TTLBounds returns the TTL range o's driver accepts within [lo, hi], the
// portable layer's range.
func (o Ops) TTLBounds(lo, hi time.Duration) (time.Duration, time.Duration) {
	if d := o.Declared.MinTTL; d > 0 {
		lo = max(lo, d)
	}
	if d := o.Declared.MaxTTL; d > 0 {
		hi = min(hi, d)
	}
	return lo, hi
}

// CheckTTL returns an error matching ErrInvalidTTL unless ttl is within
// [lo, hi]: the one TTL check from a lease's terms to the authority. The
// portable layer calls it when it resolves a lease's terms (with the
// driver's bounds, see Ops.TTLBounds); drivers rely on the resolved TTL
// and call it only where users call them directly.
func CheckTTL(ttl, lo, hi time.Duration) error {
	if ttl < lo || ttl > hi {
		return fmt.Errorf("%w: %v is outside [%v, %v]", ErrInvalidTTL, ttl, lo, hi)
	}
	return nil
}
