package fencedmysql

import "time"

// BellName is the doorbell of key.
func BellName(d *Driver, key string) string { return d.bell.name(key) }

// SetMaxBellSleep sets the bound of one doorbell wait until the returned
// function restores it.
func SetMaxBellSleep(d time.Duration) (restore func()) {
	old := maxBellSleep.Swap(int64(d))
	return func() { maxBellSleep.Store(old) }
}
