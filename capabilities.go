package fenced

import "github.com/fenced-dev/fenced/driver"

// ops returns the optional operations of the client's driver: the one
// place where the portable layer asks what its driver can do (see
// driver.CapabilitiesOf). Every optional call goes through it.
func (c *Client) ops() driver.Ops { return driver.CapabilitiesOf(c.drv) }
