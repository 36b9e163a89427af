// Package rootaccess hands packages of this module what the root package
// keeps unexported: the driver under a *fenced.Client (for the CLI, the
// HTTP API, the proof harness and the backends' own accessors such as
// fencedpostgres.PoolOf), the client that granted a *fenced.Lease (for
// the guards' hooks), a lease's local deadline (for the conformance suite
// and the proof), and the registered schemes with their Expiry (for
// `fenced plan` and the CLI's help), and a pause of a client's renewals
// (for the CLI's job control). The root package sets them in its
// init; nothing outside this module can import them.
package rootaccess

import (
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// Root is what the root package hands over.
type Root struct {
	// Driver returns the driver under client, a *fenced.Client.
	Driver func(client any) driver.Driver
	// Client returns the *fenced.Client (as any) that granted lease, a
	// *fenced.Lease.
	Client func(lease any) any
	// ValidUntil returns the local deadline of lease, a *fenced.Lease,
	// comparable with time.Now (clock.Local).
	ValidUntil func(lease any) time.Time
	// Schemes returns the registered schemes, sorted.
	Schemes func() []string
	// ExpiryOf returns the Expiry registered with scheme's backend, and
	// false when none is registered.
	ExpiryOf func(scheme string) (driver.Expiry, bool)
	// PauseRenewals pauses the renewals of client, a *fenced.Client.
	PauseRenewals func(client any) (resume func())
	// ScheduleDelays returns how late client's schedule woke, at most,
	// and its longest look, since the last call; it starts them afresh.
	ScheduleDelays func(client any) (late, busy time.Duration)
}

var root Root

// Set installs the root package's accessors. Only the root calls it.
func Set(r Root) { root = r }

// Driver returns the driver under client, a *fenced.Client.
func Driver(client any) driver.Driver { return root.Driver(client) }

// Client returns the *fenced.Client (as any) that granted lease, a
// *fenced.Lease.
func Client(lease any) any { return root.Client(lease) }

// ValidUntil returns the local deadline after which lease, a
// *fenced.Lease, must not be trusted. It is comparable with time.Now.
func ValidUntil(lease any) time.Time { return root.ValidUntil(lease) }

// Schemes returns the registered schemes, sorted.
func Schemes() []string { return root.Schemes() }

// ExpiryOf returns the Expiry registered with the backend of scheme
// (case-insensitive), and false when no linked-in package registered it.
func ExpiryOf(scheme string) (driver.Expiry, bool) { return root.ExpiryOf(scheme) }

// PauseRenewals waits for the renewals of client (a *fenced.Client) in
// flight to end, and starts no other until resume is called. Leases are
// not renewed meanwhile. It is for a process about to stop itself (job
// control): stopped mid-renewal, it would hold the request open, and on
// SQLite the file's write lock, until continued. The wait is bounded by
// the renewals' deadlines; resume may be called more than once; Close
// does not wait for it.
func PauseRenewals(client any) (resume func()) { return root.PauseRenewals(client) }

// ScheduleDelays returns the most the lease schedule of client (a
// *fenced.Client) woke after the moment it was set for, and the longest
// one of its looks took, since the last call (or since the client was
// made). A lease ends by its local validity plus about their sum. The
// conformance suite reports them beside a lease that ended late: a late
// wake with short looks is a starved process; a long look is the
// schedule's own work.
func ScheduleDelays(client any) (late, busy time.Duration) { return root.ScheduleDelays(client) }
