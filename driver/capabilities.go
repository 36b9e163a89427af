package driver

// Capabilities is a driver's one declaration: what the backend promises
// (its fence, whose clock decides expiry, whether a clock step is safe),
// which optional operations it offers, whether its waiters are served in
// arrival order, and how it keeps a grant (Keeps, with narrower TTL bounds
// than the portable layer's). Driver.Capabilities returns it; nothing else
// asks a driver "can you?". The promises are declared, not measured, and
// the conformance suite checks the ones it can.
//
// Each operation flag names the optional interface whose methods carry it.
// A flag is honoured only where the driver also has those methods. The
// conformance suite fails a driver whose flags and methods disagree (a
// flag without its methods, or methods that work although their flag is
// off). A flag may depend on how the driver was opened. PostgreSQL without
// a LISTEN connection keeps its Subscribe method but declares Subscribe
// false. The method then refuses with ErrUnsupported.
//
// How waiters are woken is read from it alone: Subscribe or Queue, and
// FIFO (Client.Capabilities clears the flags a driver lacks methods for).
type Capabilities struct {
	// Fence is the strength of the fencing token.
	Fence FenceStrength
	// ServerClock reports whether expiry is decided by the authority's own
	// clock. It is false for stores whose conditional writes cannot read a
	// clock (DynamoDB). There expiry is observed. A waiter may take a grant
	// over only after it has seen the same grant version unchanged for a
	// whole TTL on its own monotonic clock. Every renewal changes the
	// version, and the takeover is conditional on the version seen. So a
	// waiter that arrives after the holder died waits up to one TTL longer.
	// A TryAcquire that does not wait never takes over a dead holder.
	ServerClock bool
	// ClockStepSafe reports whether a step of the authority's wall clock
	// leaves its grants' expiry alone. It is true where expiry is counted on
	// a monotonic clock (etcd's lessor, ZooKeeper's session ticks). It is
	// false where the wall clock decides it (SQL now(), Redis PX).
	//
	// When false, a forward step of the authority's wall clock larger than
	// the lease's SafetyMargin ends grants early at the authority. (NTP
	// stepping a wrong clock, a VM resumed from a snapshot, or date -s can
	// step it.) Their holders still trust their local validity, which runs
	// on the holders' monotonic clocks. The authority grants the key again,
	// and two holders overlap. Only the fence protects the resource then:
	// the resource refuses the older holder. A backward step only lengthens
	// grants: the next holder waits longer, nobody overlaps. The zero value
	// promises nothing, so a driver that does not say is taken as unsafe.
	ClockStepSafe bool
	// Note explains anything a user must know (for example the failover
	// hazard of a repeatable fence).
	Note string

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
	// FenceFloor: FenceFloorer, a fence floor an operator can raise, and
	// deletion of unused keys' records under it.
	FenceFloor bool
	// Checkpoint: Checkpointer, a key's checkpoint stored under its fence.
	Checkpoint bool
	// Keeps is how the authority keeps a grant that is no longer renewed:
	// the Expiry the backend also registers for its scheme, with the
	// driver's own settings (ZooKeeper's tick). A recipe that waits for a
	// dead holder's grant to go reads how long that can take from it
	// (Expiry.Outlives). The zero value: the grant ends at its TTL. Its
	// MinTTL and MaxTTL, when not zero, narrow the TTLs the driver accepts
	// (ZooKeeper's session timeouts, etcd's whole seconds); the portable
	// bounds apply as well.
	Keeps Expiry
}
