package fencedsqlite

// AckCap is ackCap, for the tests' bounds.
const AckCap = ackCap

// RingsPassedOn is how many rings d's queue passed on to the next entry
// because the rung process did not acknowledge in time.
func (d *Driver) RingsPassedOn() int64 { return d.queue.passed.Load() }
