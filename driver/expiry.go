package driver

import "time"

// Expiry says how an authority turns a requested TTL into the time it
// keeps a grant that is not renewed. It is the backend's own rounding,
// which its driver applies and `fenced plan` figures with. A backend
// registers its Expiry with its URL opener (fenced.Register), so that a
// plan needs no connection. Its driver computes what it asks the authority
// for with the same value (Rounded). So the two cannot drift apart.
type Expiry struct {
	// Name is the backend's name, for humans.
	Name string
	// Pad is added to the TTL (etcd: the session outlives the grant by a
	// second; ZooKeeper: a tick for the keep-alive to be reported).
	Pad time.Duration
	// ScaleNum/ScaleDen multiplies the padded TTL, rounding up (ZooKeeper:
	// a session of 8/7 of it leaves two keep-alive periods). Zero means 1.
	ScaleNum, ScaleDen int64
	// Granularity rounds the result up to a multiple of it (etcd: whole
	// seconds; ZooKeeper: milliseconds). Zero: no rounding.
	Granularity time.Duration
	// Floor is the least time the authority keeps a grant whatever the TTL
	// (ZooKeeper's minSessionTimeout).
	Floor time.Duration
	// Sweep is how late the authority may notice an expiry (etcd's lessor
	// checks every 500ms; ZooKeeper expires sessions on tick boundaries).
	Sweep time.Duration
	// Observed is set for an authority without a clock of its own, where a
	// waiter takes a grant over once it has seen it unchanged for a whole
	// TTL (DynamoDB): a dead holder's grant may stand up to one TTL more
	// than it was kept (see Outlives). The earliest regrant is unchanged.
	Observed bool
	// MinTTL and MaxTTL, when not zero, bound the TTLs the backend accepts.
	MinTTL, MaxTTL time.Duration
	// Note explains the rounding, for humans.
	Note string
}

// Rounded returns what the driver asks the authority for, for a grant of
// ttl. That is ttl padded, scaled and rounded up, never shorter than
// ttl.
func (e Expiry) Rounded(ttl time.Duration) time.Duration {
	t := ttl + e.Pad
	if e.ScaleNum > 0 && e.ScaleDen > 0 {
		t = (t*time.Duration(e.ScaleNum) + time.Duration(e.ScaleDen) - 1) / time.Duration(e.ScaleDen)
	}
	if e.Granularity > 0 {
		t = (t + e.Granularity - 1) / e.Granularity * e.Granularity
	}
	return t
}

// KeepsFor returns how long the authority keeps a grant of ttl that is not
// renewed, at least: Rounded, and no less than Floor.
func (e Expiry) KeepsFor(ttl time.Duration) time.Duration { return max(e.Rounded(ttl), e.Floor) }

// Outlives returns how long after its holder's last renewal was sent a
// grant of ttl may still stand at the authority, at most. That is
// KeepsFor plus Sweep, plus Rounded when the expiry is Observed. A
// waiter for a dead holder's grant waits no longer than this.
func (e Expiry) Outlives(ttl time.Duration) time.Duration {
	d := e.KeepsFor(ttl) + e.Sweep
	if e.Observed {
		d += e.Rounded(ttl)
	}
	return d
}
