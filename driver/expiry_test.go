package driver

import (
	"testing"
	"time"
)

// The rules etcd and ZooKeeper applied before their Expiry existed:
// ceil(TTL) seconds plus one, and ceil((TTL + tick)·8/7) in milliseconds.
func TestExpiryRounded(t *testing.T) {
	etcd := Expiry{Pad: time.Second, Granularity: time.Second}
	zk := Expiry{Pad: 2 * time.Second, ScaleNum: 8, ScaleDen: 7, Granularity: time.Millisecond, Floor: 4 * time.Second}
	for _, ttl := range []time.Duration{time.Nanosecond, time.Second, 1500 * time.Millisecond, 30*time.Second + 1, 33 * time.Second} {
		if got, want := etcd.Rounded(ttl), time.Duration(TTLUnits(ttl, time.Second)+1)*time.Second; got != want {
			t.Errorf("etcd %v: %v, want %v", ttl, got, want)
		}
		ns := ((ttl+2*time.Second)*8 + 6) / 7
		if got, want := zk.Rounded(ttl), time.Duration(TTLUnits(ns, time.Millisecond))*time.Millisecond; got != want {
			t.Errorf("zk %v: %v, want %v", ttl, got, want)
		}
		if zk.KeepsFor(ttl) < max(zk.Rounded(ttl), zk.Floor) || zk.Rounded(ttl) < ttl {
			t.Errorf("zk %v: keeps %v, rounded %v", ttl, zk.KeepsFor(ttl), zk.Rounded(ttl))
		}
	}
}
