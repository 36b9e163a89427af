// Package rootaccess hands packages of this module what the root package
// keeps unexported: the driver under a *fenced.Client (for the CLI, the
// HTTP API, the proof harness and the backends' own accessors such as
// fencedpostgres.PoolOf) and the client that granted a *fenced.Lease (for
// the guards' hooks). The root package sets both functions in its init;
// nothing outside this module can import them.
package rootaccess

import "github.com/fenced-dev/fenced/driver"

var (
	driverOf func(client any) driver.Driver
	clientOf func(lease any) any
)

// Set installs the root package's accessors. Only the root calls it.
func Set(driverFn func(client any) driver.Driver, clientFn func(lease any) any) {
	driverOf, clientOf = driverFn, clientFn
}

// Driver returns the driver under client, a *fenced.Client.
func Driver(client any) driver.Driver { return driverOf(client) }

// Client returns the *fenced.Client (as any) that granted lease, a
// *fenced.Lease.
func Client(lease any) any { return clientOf(lease) }
