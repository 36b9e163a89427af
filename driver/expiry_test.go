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
		if got, want := etcd.Rounded(ttl), (ttl+time.Second-1)/time.Second*time.Second+time.Second; got != want {
			t.Errorf("etcd %v: %v, want %v", ttl, got, want)
		}
		ns := ((ttl+2*time.Second)*8 + 6) / 7
		if got, want := zk.Rounded(ttl), (ns+time.Millisecond-1)/time.Millisecond*time.Millisecond; got != want {
			t.Errorf("zk %v: %v, want %v", ttl, got, want)
		}
		if zk.KeepsFor(ttl) < max(zk.Rounded(ttl), zk.Floor) || zk.Rounded(ttl) < ttl {
			t.Errorf("zk %v: keeps %v, rounded %v", ttl, zk.KeepsFor(ttl), zk.Rounded(ttl))
		}
	}
}

// An observed expiry keeps a grant for its TTL, but a dead holder's grant
// may stand a TTL more (the waiter's look at it); a swept one stands its
// sweep more.
func TestExpiryOutlives(t *testing.T) {
	ttl := 3 * time.Second
	for _, c := range []struct {
		e           Expiry
		keeps, outl time.Duration
	}{
		{Expiry{}, ttl, ttl},
		{Expiry{Observed: true}, ttl, 2 * ttl},
		{Expiry{Pad: time.Second, Granularity: time.Second, Sweep: 500 * time.Millisecond}, 4 * time.Second, 4500 * time.Millisecond},
	} {
		if k, o := c.e.KeepsFor(ttl), c.e.Outlives(ttl); k != c.keeps || o != c.outl {
			t.Errorf("%+v: keeps %v, outlives %v; want %v, %v", c.e, k, o, c.keeps, c.outl)
		}
	}
}
