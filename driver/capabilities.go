package driver

// Capabilities is a driver's one declaration of what it can do beyond the
// Driver interface. It says which optional operations it offers, whether
// its waiters are served in arrival order, and narrower TTL bounds than
// the portable layer's. Driver.Capabilities returns it; nothing else asks
// a driver "can you?".
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
