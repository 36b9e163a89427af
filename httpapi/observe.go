package httpapi

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/metrics"
)

// grantRecord is one grant of a key as this server saw it.
type grantRecord struct {
	Fence       uint64
	OwnerDigest string
	// Foreign names a holder that is not a fenced client (an etcdctl lock,
	// a Curator mutex), which has no owner digest.
	Foreign string
	// FirstSeen is when the server first saw the grant: its acquisition
	// when it came through this server's API, otherwise within one poll of
	// it (or the server's start, for grants older than the server).
	FirstSeen, LastSeen time.Time
	// Ended is when the server saw the grant gone or replaced; zero while
	// it is held.
	Ended time.Time
	// TTL is the grant's TTL when it came through this server, otherwise
	// the longest time left seen on it (close to its TTL once a renewal
	// has been seen). Zero for backends that report no time left.
	TTL time.Duration
	// Via is "api" for grants made through this server.
	Via string
}

func (g grantRecord) same(info fenced.LeaseInfo) bool {
	return g.Fence == info.Fence && g.OwnerDigest == info.OwnerDigest && g.Foreign == foreignHolder(info)
}

// foreignHolder is how a holder without an owner digest is named: the
// backend's own description (etcd lease, ZooKeeper session), which is not
// a fenced owner token.
func foreignHolder(info fenced.LeaseInfo) string {
	if info.OwnerDigest == "" {
		return info.Owner
	}
	return ""
}

type keyState struct {
	grants  []grantRecord // oldest first
	touched time.Time
}

func (k *keyState) current() *grantRecord {
	if n := len(k.grants); n > 0 && k.grants[n-1].Ended.IsZero() {
		return &k.grants[n-1]
	}
	return nil
}

// observer keeps what the server has seen of the store: each key's recent
// grants, and the counters of the store-level series. Listings are merged
// into it by the poller and by every API listing.
type observer struct {
	client     *fenced.Client
	groups     *metrics.Groups
	now        func() time.Time
	maxKeys    int
	maxHistory int

	mu           sync.Mutex
	keys         map[string]*keyState
	up           bool
	ownerChanges map[string]float64 // by key group
	breaksHere   map[string]float64 // by key group
	moves        map[string]*groupMoves
}

// groupMoves is what the server saw of a partition group's owners: the
// owner tag of each partition's last grant seen (the member's,
// fenced.LeaseOptions.OwnerTag), and the changes of it.
type groupMoves struct {
	tags  map[int]string
	moves int
	last  time.Time
}

// maxMoveGroups bounds the partition groups whose moves the server
// follows.
const maxMoveGroups = 100

// keyGroup returns the bounded key group of key: that of its partition
// group's name for the keys of a group (groupKeyGroup), else its own.
func (o *observer) keyGroup(key string) string { return o.groups.Of(groupKeyGroup(key)) }

// movedLocked counts a new grant of a partition key as a move when its
// owner's tag differs from the last grant's the server saw.
func (o *observer) movedLocked(info fenced.LeaseInfo, now time.Time) {
	group, p, ok := partitionKey(info.Key)
	if !ok || info.OwnerDigest == "" {
		return
	}
	gm := o.moves[group]
	if gm == nil {
		if len(o.moves) >= maxMoveGroups {
			return
		}
		gm = &groupMoves{tags: map[int]string{}}
		o.moves[group] = gm
	}
	tag := info.Owner[:min(len(info.Owner), ownerTagLen)]
	if prev, seen := gm.tags[p]; seen && prev != tag {
		gm.moves++
		gm.last = now
	}
	gm.tags[p] = tag
}

// ownerTagLen is how much of a shortened owner its tag can take
// (fenced.LeaseOptions.OwnerTag): a partition group member's.
const ownerTagLen = 8

// groupMoved returns the moves seen of group's partitions, and when the
// last was seen (nil if none).
func (o *observer) groupMoved(group string) (int, *time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	gm := o.moves[group]
	if gm == nil || gm.moves == 0 {
		return 0, nil
	}
	last := gm.last
	return gm.moves, &last
}

func newObserver(c *fenced.Client, now func() time.Time) *observer {
	return &observer{
		client: c, groups: metrics.NewGroups(nil), now: now, maxKeys: 1000, maxHistory: 20,
		keys: map[string]*keyState{}, ownerChanges: map[string]float64{}, breaksHere: map[string]float64{},
		moves: map[string]*groupMoves{},
	}
}

// list lists the held leases with prefix and merges them.
func (o *observer) list(ctx context.Context, prefix string) ([]fenced.LeaseInfo, error) {
	infos, err := o.client.List(ctx, prefix)
	o.mu.Lock()
	defer o.mu.Unlock()
	if prefix == "" {
		o.up = err == nil
	}
	if err != nil {
		return nil, err
	}
	now := o.now()
	listed := make(map[string]bool, len(infos))
	for _, info := range infos {
		if !info.Held {
			continue
		}
		listed[info.Key] = true
		o.seenLocked(info, now, "")
	}
	for key, k := range o.keys {
		if cur := k.current(); cur != nil && strings.HasPrefix(key, prefix) && !listed[key] {
			cur.Ended = now
			k.touched = now
		}
	}
	return infos, nil
}

// inspected merges what Inspect said of one key.
func (o *observer) inspected(info fenced.LeaseInfo) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	if info.Held {
		o.seenLocked(info, now, "")
		return
	}
	if k := o.keys[info.Key]; k != nil {
		if cur := k.current(); cur != nil {
			cur.Ended, k.touched = now, now
		}
	}
}

// acquired records a grant made through the API, with its exact TTL.
func (o *observer) acquired(info fenced.LeaseInfo, ttl time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seenLocked(info, o.now(), "api")
	o.keys[info.Key].current().TTL = ttl
}

// ended records a grant that this server released or broke.
func (o *observer) ended(key string, fence uint64, broken bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if broken {
		o.breaksHere[o.keyGroup(key)]++
	}
	if k := o.keys[key]; k != nil {
		if cur := k.current(); cur != nil && cur.Fence == fence {
			now := o.now()
			cur.Ended, k.touched = now, now
		}
	}
}

func (o *observer) seenLocked(info fenced.LeaseInfo, now time.Time, via string) {
	k := o.keys[info.Key]
	if k == nil {
		o.evictLocked()
		k = &keyState{}
		o.keys[info.Key] = k
	}
	k.touched = now
	if cur := k.current(); cur != nil && cur.same(info) {
		cur.LastSeen = now
		cur.TTL = max(cur.TTL, info.Remaining)
		return
	} else if cur != nil {
		cur.Ended = now
	}
	o.movedLocked(info, now)
	g := o.keyGroup(info.Key)
	o.breaksHere[g] += 0 // counters start at zero, so their first increase shows
	o.ownerChanges[g] += 0
	if len(k.grants) > 0 {
		o.ownerChanges[g]++
	}
	k.grants = append(k.grants, grantRecord{
		Fence: info.Fence, OwnerDigest: info.OwnerDigest, Foreign: foreignHolder(info),
		FirstSeen: now, LastSeen: now, TTL: info.Remaining, Via: via,
	})
	if len(k.grants) > o.maxHistory {
		k.grants = append(k.grants[:0], k.grants[len(k.grants)-o.maxHistory:]...)
	}
}

// evictLocked makes room for one more key: it forgets the key touched
// longest ago, preferring keys that nobody holds.
func (o *observer) evictLocked() {
	if len(o.keys) < o.maxKeys {
		return
	}
	var victim string
	var victimHeld bool
	var oldest time.Time
	for key, k := range o.keys {
		held := k.current() != nil
		if victim == "" || (victimHeld && !held) || (held == victimHeld && k.touched.Before(oldest)) {
			victim, victimHeld, oldest = key, held, k.touched
		}
	}
	delete(o.keys, victim)
}

// record returns the current grant record of key, if any.
func (o *observer) record(key string) (grantRecord, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if k := o.keys[key]; k != nil {
		if cur := k.current(); cur != nil {
			return *cur, true
		}
	}
	return grantRecord{}, false
}

// history returns the recorded grants of key, newest first.
func (o *observer) history(key string) []grantRecord {
	o.mu.Lock()
	defer o.mu.Unlock()
	k := o.keys[key]
	if k == nil {
		return nil
	}
	out := make([]grantRecord, len(k.grants))
	for i, g := range k.grants {
		out[len(out)-1-i] = g
	}
	return out
}

// poll merges a full listing every interval until ctx ends.
func (o *observer) poll(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		lctx, cancel := context.WithTimeout(ctx, max(every, 5*time.Second))
		_, _ = o.list(lctx, "")
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Store-level series of fenced serve, computed from a fresh listing at
// each scrape (the owner-change counter comes from every listing merged).
var (
	descUp = prometheus.NewDesc("fenced_store_up",
		"1 when the last listing of the store succeeded.", nil, nil)
	descHeld = prometheus.NewDesc("fenced_store_leases_held",
		"Leases held in the store now, by whoever holds them.", []string{metrics.LabelKeyGroup}, nil)
	descExpiring = prometheus.NewDesc("fenced_store_leases_expiring",
		"Held leases with less than a renewal interval (a third of their TTL, the default) left: their holders missed a renewal. "+
			"Only for stores that report time left.", []string{metrics.LabelKeyGroup}, nil)
	descRemaining = prometheus.NewDesc("fenced_store_lease_validity_remaining_seconds",
		"The least time left among the held leases, by the store's clock. Only for stores that report time left.",
		[]string{metrics.LabelKeyGroup}, nil)
	descOwnerChanges = prometheus.NewDesc("fenced_store_owner_changes_total",
		"New grants of keys this server had seen granted before: the keys' churn, as seen by polling "+
			"(a grant shorter than a poll can be missed).", []string{metrics.LabelKeyGroup}, nil)
	descBreaks = prometheus.NewDesc("fenced_store_breaks_total",
		"Breaks recorded in the store's audit log, by anyone (fenced break, this server). Absent for stores without a break log (etcd, "+
			"ZooKeeper).", []string{metrics.LabelKeyGroup}, nil)
	descBreaksHere = prometheus.NewDesc("fenced_serve_breaks_total",
		"Breaks made through this server's API or dashboard.", []string{metrics.LabelKeyGroup}, nil)
)

// collector exports the store-level series.
type collector struct{ o *observer }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descHeld, descExpiring, descRemaining, descOwnerChanges, descBreaks, descBreaksHere} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	o := c.o
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	infos, err := o.list(ctx, "")
	up := 0.0
	if err == nil {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up)
	if err == nil {
		held, expiring := map[string]float64{}, map[string]float64{}
		least := map[string]time.Duration{}
		for _, info := range infos {
			if !info.Held {
				continue
			}
			g := o.keyGroup(info.Key)
			held[g]++
			if info.Remaining <= 0 {
				continue
			}
			if l, ok := least[g]; !ok || info.Remaining < l {
				least[g] = info.Remaining
			}
			if rec, ok := o.record(info.Key); ok && rec.TTL > 0 && info.Remaining < rec.TTL/3 {
				expiring[g]++
			}
		}
		// Groups seen before and holding nothing now report zero.
		o.mu.Lock()
		for g := range o.ownerChanges {
			held[g] += 0
		}
		o.mu.Unlock()
		for g, n := range held {
			ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, n, g)
			ch <- prometheus.MustNewConstMetric(descExpiring, prometheus.GaugeValue, expiring[g], g)
		}
		for g, d := range least {
			ch <- prometheus.MustNewConstMetric(descRemaining, prometheus.GaugeValue, d.Seconds(), g)
		}
	}
	// Stores without a break log (ErrUnsupported), and a failed read,
	// leave the series out of this scrape.
	if recs, err := o.client.Breaks(ctx, ""); err == nil {
		n := map[string]float64{}
		for _, r := range recs {
			n[o.keyGroup(r.Key)]++
		}
		for g, v := range n {
			ch <- prometheus.MustNewConstMetric(descBreaks, prometheus.CounterValue, v, g)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range []struct {
		d *prometheus.Desc
		v map[string]float64
	}{{descOwnerChanges, o.ownerChanges}, {descBreaksHere, o.breaksHere}} {
		groups := make([]string, 0, len(m.v))
		for g := range m.v {
			groups = append(groups, g)
		}
		sort.Strings(groups)
		for _, g := range groups {
			ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, m.v[g], g)
		}
	}
}
