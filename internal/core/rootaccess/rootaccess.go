// Package rootaccess hands packages of this module what the root package
// keeps unexported: the driver under a *fenced.Client (for the CLI, the
// HTTP API, the proof harness and the backends' own accessors such as
// fencedpostgres.PoolOf), the client that granted a *fenced.Lease (for
// the guards' hooks), a lease's local deadline (for the conformance suite
// and the proof), and the registered schemes with their Expiry (for
// `fenced plan` and the CLI's help). The root package sets them in its
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
