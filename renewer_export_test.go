package fenced

// RenewerLoops returns how many times c's schedule loop has looked at its
// leases, for tests of how often it is woken.
func RenewerLoops(c *Client) int64 { return c.renew.loops.Load() }
