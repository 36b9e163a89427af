package fenced

import (
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

// ops returns the optional operations of the client's driver: the one
// place where the portable layer asks what its driver can do. Every
// optional call goes through it.
func (c *Client) ops() capability.Ops { return capability.Of(c.drv) }

// Capabilities reports what the store can do beyond leases: a flag is set
// only where the backend declares the operation and has its methods. The
// doors that need one (Value and Lease.SetValue, Watch, Breaks,
// FenceFloor, RaiseFenceFloor, Prune) return an error matching
// ErrUnsupported where its flag is off. Keeps says how long the store may
// keep a grant after its holder's last renewal (Keeps.Outlives).
func (c *Client) Capabilities() driver.Capabilities { return c.ops().Declared }
