package proof

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// lostReplyStore is one backend of the lost-reply row: how to start its
// server (once, for every scenario) and the TTLs its scenarios use. A's
// TTL is longer than B's, so that a renewal of A's that reached B's grant
// would show as B's grant outliving B's own TTL.
type lostReplyStore struct {
	name string
	// start starts the server and returns the store URL clients use
	// directly.
	start func(t *testing.T) string
	// ttlA and ttlB are A's and B's TTLs, in the store's unit.
	ttlA, ttlB time.Duration
	// storeClock says Inspect's Remaining is the store's own expiry of
	// the grant (not a session backend's zero or an observer's watch).
	storeClock bool
	// minFence is the fence strength the store's leases ask for (Redis
	// has only repeatable fences).
	minFence fenced.FenceStrength
	// muxWait, if set, is how long the server has a request whose reply
	// is lost before its connection is cut, on a connection that carries
	// several calls at once (etcd's gRPC): the first bytes back may answer
	// something else (a ping), so the reply is dropped for muxWait rather
	// than the connection cut at the server's first answer
	// (testenv.Proxy.LoseReplyAfter). A server that had not applied the
	// request by then fails the scenario's look at the store.
	muxWait time.Duration
	// skip, if set, tells the chunks naming key that are not A's release
	// or renewal, and whose reply the proxy must therefore not lose.
	skip func(key string, chunk []byte) bool
	// noLink says the store has no network link to lose a reply on
	// (SQLite): the scenarios then drop the reply of a call that returned
	// (the caller "did not learn") and replay as a restarted process
	// would.
	noLink bool
}

// etcdWatch reports whether chunk creates a watch of key's etcd name
// (the lock's prefix, key, '/', the grant's session in hex), as the loss
// watch the etcd driver starts after a grant does: in a WatchCreateRequest
// the name is followed by its start revision (field 3, varint: tag 0x18).
// The driver's calls name it too (a Txn's compare or range), but with
// other fields after it, except a release's DeleteRange: its field 3 is
// prev_kv, a bool (0x18 0x01), where a watch's start revision is the
// grant's, above 1. A lost reply of a watch's creation loses no reply of
// a release or renewal.
func etcdWatch(key string, chunk []byte) bool {
	i := bytes.Index(chunk, []byte(key+"/"))
	if i < 0 {
		return false
	}
	rest := bytes.TrimLeft(chunk[i+len(key)+1:], "0123456789abcdef")
	if len(rest) == 0 || rest[0] != 0x18 {
		return false
	}
	rev, n := binary.Uvarint(rest[1:])
	return n > 0 && rev > 1
}

// zkWatch reports whether chunk is a ZooKeeper read that sets a watch
// (length, xid, opcode: exists 3, getData 4, getChildren 8 or 12; its last
// byte, the watch flag, set), as the loss watch the ZooKeeper driver sets
// on a grant's node does. A renewal's reads (a sync, an exists) set none.
func zkWatch(_ string, chunk []byte) bool {
	if len(chunk) < 13 {
		return false
	}
	switch binary.BigEndian.Uint32(chunk[8:12]) {
	case 3, 4, 8, 12:
		return chunk[len(chunk)-1] == 1
	}
	return false
}

// lostReplyStores are the backends of the row. mem is not one: its store
// is the calling process's memory, a call is a function call that has no
// reply apart from its return, and no second process can hold a grant
// after the caller is gone, so there is no later grant for a retry to
// reach.
func lostReplyStores() []lostReplyStore {
	return []lostReplyStore{
		{name: "postgres", ttlA: 2 * time.Second, ttlB: time.Second, storeClock: true, start: func(t *testing.T) string {
			return testenv.StartPostgres(t).URL()
		}},
		{name: "mysql", ttlA: 2 * time.Second, ttlB: time.Second, storeClock: true, start: func(t *testing.T) string {
			return testenv.StartMySQL(t).URL()
		}},
		{name: "redis", ttlA: 2 * time.Second, ttlB: time.Second, storeClock: true, minFence: fenced.FenceRepeatable, start: func(t *testing.T) string {
			return testenv.StartRedis(t, testenv.RedisConfig{}).URL()
		}},
		{name: "redlock", ttlA: 2 * time.Second, ttlB: time.Second, storeClock: true, start: func(t *testing.T) string {
			return redlockEnv(t, 3, false).store
		}},
		{name: "etcd", ttlA: 2 * time.Second, ttlB: time.Second, storeClock: true, skip: etcdWatch, muxWait: 500 * time.Millisecond, start: func(t *testing.T) string {
			return testenv.StartEtcd(t).URL("")
		}},
		{name: "zookeeper", ttlA: 2 * time.Second, ttlB: time.Second, skip: zkWatch, start: func(t *testing.T) string {
			return testenv.StartZooKeeper(t).URL("/lostreply", "")
		}},
		{name: "dynamodb", ttlA: 2 * time.Second, ttlB: time.Second, start: func(t *testing.T) string {
			return testenv.StartDynalite(t, testenv.DynaliteConfig{}).URL("fenced_lostreply", "create=1")
		}},
		{name: "sqlite", ttlA: 2 * time.Second, ttlB: time.Second, storeClock: true, noLink: true, start: func(t *testing.T) string {
			return "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
		}},
	}
}

// TestLostReplyRetried is the etcd-io/etcd#22082 pattern on every
// backend: a release or renewal that the store applied but whose reply
// was lost, retried after a later grant of the same key, must neither
// delete nor extend that grant. Each backend runs three scenarios against
// one server (see lostReplyRelease, lostReplySameOwner,
// lostReplyRenewal); the retries are the same Lease's call again and A's
// driver sending the same grant again, which is what a client library's
// own retry of the request sends.
func TestLostReplyRetried(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server of every backend")
	}
	for _, s := range lostReplyStores() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			store := s.start(t)
			s := s.scaled(t, store)
			t.Run("release", func(t *testing.T) { lostReplyRelease(t, s, store) })
			t.Run("release same owner", func(t *testing.T) { lostReplySameOwner(t, s, store) })
			t.Run("renewal", func(t *testing.T) { lostReplyRenewal(t, s, store) })
		})
	}
}

// scaled returns s with its TTLs for the machine as loaded now: the quiet
// ones times the smallest whole factor that makes B's ten times the worst
// delay a probe of the store sees (a grant and release's round trip, or
// a timer's lateness meanwhile). B's lease renews itself while the
// scenarios run, and A's grant must live until its renewal is sent; a
// whole factor keeps them in the store's unit and A's the longer.
func (s lostReplyStore) scaled(t *testing.T, store string) lostReplyStore {
	t.Helper()
	late := testenv.SampleLateness()
	worst := max(drivertest.SlowestGrant(t, openLostReply(t, store, nil)), late.Max())
	late.Stop()
	factor := max(1, int64(math.Ceil(float64(10*worst)/float64(s.ttlB))))
	s.ttlA, s.ttlB = time.Duration(factor)*s.ttlA, time.Duration(factor)*s.ttlB
	t.Logf("TTLs %v (A) and %v (B): the worst delay of a probe was %v", s.ttlA, s.ttlB, worst.Round(time.Millisecond))
	return s
}

// opts returns lease options with ttl, renewed by hand if manual.
func (s lostReplyStore) opts(ttl time.Duration, manual bool) *fenced.LeaseOptions {
	return &fenced.LeaseOptions{TTL: ttl, ManualRenew: manual, MinFence: s.minFence}
}

// lossLink is A's link to the store: one testenv proxy per server host
// (every Redlock node), or none on a store without a network.
type lossLink struct {
	proxies []*testenv.Proxy
	skip    func(key string, chunk []byte) bool // see lostReplyStore.skip
	muxWait time.Duration                       // see lostReplyStore.muxWait
}

// linkTo returns the URL A opens, through a new lossLink in front of
// every host of store.
func linkTo(t *testing.T, s lostReplyStore, store string) (string, *lossLink) {
	t.Helper()
	if s.noLink {
		return store, &lossLink{}
	}
	l := &lossLink{skip: s.skip, muxWait: s.muxWait}
	url, err := proxyURL(store, func(hp string) (string, error) {
		p := testenv.StartProxy(t, hp)
		l.proxies = append(l.proxies, p)
		return p.Addr, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return url, l
}

// loseReplyTo arms every proxy to forward the next request that names key
// to the server and to cut its connection before the reply comes back.
func (l *lossLink) loseReplyTo(key string) {
	match := func(chunk []byte) bool {
		return bytes.Contains(chunk, []byte(key)) && (l.skip == nil || !l.skip(key, chunk))
	}
	for _, p := range l.proxies {
		if l.muxWait > 0 {
			p.LoseReplyAfter(match, l.muxWait)
		} else {
			p.CutAfter(match)
		}
	}
}

// cuts returns how many connections the proxies cut.
func (l *lossLink) cuts() int {
	n := 0
	for _, p := range l.proxies {
		n += p.Cuts()
	}
	return n
}

// blackHole turns every proxy into a black hole (on) or back.
func (l *lossLink) blackHole(on bool) {
	for _, p := range l.proxies {
		p.BlackHole(on)
	}
}

// lostReplyClient opens a client on url with options o (nil for the
// defaults), closed when the test ends. It takes one lease of a key of its
// own through each of acquire, renew and release first, so that what a
// connection does once (Redis loading its scripts, a statement being
// prepared) is done before a scenario loses a reply.
func lostReplyClient(t *testing.T, s lostReplyStore, url string, o *fenced.Options) *fenced.Client {
	t.Helper()
	c := openLostReply(t, url, o)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := c.TryAcquire(ctx, lostReplyKey("warm"), s.opts(s.ttlA, false))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// openLostReply opens a client on url with options o (nil for the
// defaults) within 30s, closed when the test ends.
func openLostReply(t *testing.T, url string, o *fenced.Options) *fenced.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := fenced.Open(ctx, url, o)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// lostReplyKey returns a key of its own for scenario name: letters,
// digits and dashes, which every backend writes verbatim into its
// requests, so the proxy can tell a request about it.
func lostReplyKey(name string) string {
	return fmt.Sprintf("lostreply-%s-%d", name, time.Now().UnixNano())
}

// storeView returns what the store says of key; a key the store never
// had (or deleted whole, as the session backends do) is not held.
func storeView(t *testing.T, d *fenced.Client, key string) fenced.LeaseInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	info, err := d.Inspect(ctx, key)
	if errors.Is(err, fenced.ErrNotFound) {
		return fenced.LeaseInfo{Key: key}
	}
	if err != nil {
		t.Fatalf("inspect %q: %v", key, err)
	}
	return info
}

// checkNamed fails unless the store names owner's grant of key with fence,
// and (where its Remaining is the store's expiry) with no more than ttl
// left: a renewal with A's longer TTL that reached the grant would leave
// more. Rounding to the store's unit is at most a millisecond here, and
// time passing only shortens what is left, so the bound takes no slack.
func checkNamed(t *testing.T, s lostReplyStore, d *fenced.Client, key, owner string, fence uint64, ttl time.Duration, after string) {
	t.Helper()
	info := storeView(t, d, key)
	if !info.Held || info.OwnerDigest != token.Digest(owner) || info.Fence != fence {
		t.Fatalf("%s: the store says %+v; want the later grant (fence %d, owner digest %s) intact", after, info, fence, token.Digest(owner))
	}
	if s.storeClock && info.Remaining > ttl+time.Millisecond {
		t.Fatalf("%s: the later grant has %v left, more than its own TTL %v: a retried renewal extended it", after, info.Remaining, ttl)
	}
}

// replayer returns the driver that sends A's request again: A's own,
// whose client library would retry on its connection; on a store without
// a network (SQLite), the driver of a new client on the same store, as A's
// process restarted from a recorded grant would, since a process that
// gets no reply there is one that died before it could read it.
func replayer(t *testing.T, s lostReplyStore, url string, a *fenced.Client) driver.Driver {
	t.Helper()
	if !s.noLink {
		return rootaccess.Driver(a)
	}
	return rootaccess.Driver(lostReplyClient(t, s, url, nil))
}

// ctxFor returns a context for one call, bounded by d.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// lostReplyRelease is scenario (a): A holds K (f1); A's Release reaches
// the store and is applied, its reply is lost; B acquires K (f2 > f1);
// A's release is retried (the Lease's Release again, and A's driver
// sending the same grant again): B's grant must survive, and A must not
// renew.
func lostReplyRelease(t *testing.T, s lostReplyStore, store string) {
	url, link := linkTo(t, s, store)
	a, d := lostReplyClient(t, s, url, nil), lostReplyClient(t, s, store, nil)
	key := lostReplyKey("release")
	la, err := a.TryAcquire(ctxFor(t, 10*time.Second), key, s.opts(s.ttlA, true))
	if err != nil {
		t.Fatal(err)
	}
	g1 := driver.Grant{Key: key, Owner: la.Owner(), Fence: la.Fence(), TTL: s.ttlA}
	link.loseReplyTo(key)
	err = la.Release(ctxFor(t, 5*time.Second))
	t.Logf("A's release with its reply lost: %v (cuts %d)", err, link.cuts())
	if !s.noLink && (err == nil || link.cuts() == 0) {
		t.Fatalf("A's release returned %v after %d cuts; want an error: its reply was to be lost", err, link.cuts())
	}
	if info := storeView(t, d, key); info.Held {
		t.Fatalf("the store still names a holder after A's release reached it: %+v (the release was not applied)", info)
	}
	lb, err := d.TryAcquire(ctxFor(t, 10*time.Second), key, s.opts(s.ttlB, false))
	if err != nil {
		t.Fatalf("B's acquire after A's release: %v", err)
	}
	defer lb.Release(context.Background())
	if lb.Fence() <= g1.Fence {
		t.Fatalf("B's fence %d is not above A's %d", lb.Fence(), g1.Fence)
	}
	if err := la.Release(ctxFor(t, 5*time.Second)); err == nil && !s.noLink {
		t.Fatal("A's second Release reported success after its first failed")
	}
	checkNamed(t, s, d, key, lb.Owner(), lb.Fence(), s.ttlB, "after the Lease's Release again")
	err = replayer(t, s, url, a).Release(ctxFor(t, 5*time.Second), g1)
	t.Logf("A's driver re-sending the release: %v", err)
	if err == nil {
		t.Fatal("A's re-sent release succeeded while B holds the key")
	}
	checkNamed(t, s, d, key, lb.Owner(), lb.Fence(), s.ttlB, "after A's driver re-sent the release")
	if err := la.Renew(ctxFor(t, 5*time.Second)); err == nil {
		t.Fatal("A's released lease renewed")
	}
	err = replayer(t, s, url, a).Renew(ctxFor(t, 5*time.Second), g1)
	if !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("A's driver renewing the released grant: %v; want ErrNotHeld", err)
	}
	checkNamed(t, s, d, key, lb.Owner(), lb.Fence(), s.ttlB, "after A's driver tried to renew")
	if err := lb.Err(); err != nil {
		t.Fatalf("B's lease ended: %v", err)
	}
}

// lostReplySameOwner is scenario (b): as lostReplyRelease, but the later
// grant is A's own, under the same owner token (what a release matched on
// the owner alone would delete). It runs on A's driver, the level at which
// an owner can be reused; the client makes a new owner per acquisition.
func lostReplySameOwner(t *testing.T, s lostReplyStore, store string) {
	url, link := linkTo(t, s, store)
	a, d := lostReplyClient(t, s, url, nil), lostReplyClient(t, s, store, nil)
	da := rootaccess.Driver(a)
	key := lostReplyKey("owner")
	owner := fmt.Sprintf("%032x", time.Now().UnixNano())
	f1, err := da.TryAcquire(ctxFor(t, 10*time.Second), key, owner, s.ttlA)
	if err != nil {
		t.Fatal(err)
	}
	g1 := driver.Grant{Key: key, Owner: owner, Fence: f1, TTL: s.ttlA}
	link.loseReplyTo(key)
	err = da.Release(ctxFor(t, 5*time.Second), g1)
	t.Logf("A's release with its reply lost: %v (cuts %d)", err, link.cuts())
	if !s.noLink && (err == nil || link.cuts() == 0) {
		t.Fatalf("A's release returned %v after %d cuts; want an error: its reply was to be lost", err, link.cuts())
	}
	if info := storeView(t, d, key); info.Held {
		t.Fatalf("the store still names a holder after A's release reached it: %+v (the release was not applied)", info)
	}
	f2, err := da.TryAcquire(ctxFor(t, 10*time.Second), key, owner, s.ttlA)
	if err != nil {
		t.Fatalf("A's second grant: %v", err)
	}
	g2 := driver.Grant{Key: key, Owner: owner, Fence: f2, TTL: s.ttlA}
	defer da.Release(context.Background(), g2)
	if f2 <= f1 {
		t.Fatalf("A's second grant has fence %d, not above its first %d: the driver handed back the released grant", f2, f1)
	}
	err = da.Release(ctxFor(t, 5*time.Second), g1)
	t.Logf("A's driver re-sending the first release: %v", err)
	if err == nil {
		t.Fatal("A's re-sent release of its first grant succeeded while its second holds the key")
	}
	checkNamed(t, s, d, key, owner, f2, s.ttlA, "after A re-sent the first grant's release")
	if err := da.Renew(ctxFor(t, 5*time.Second), g1); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("A renewing its released first grant: %v; want ErrNotHeld", err)
	}
	checkNamed(t, s, d, key, owner, f2, s.ttlA, "after A tried to renew its first grant")
}

// lostReplyRenewal is scenario (c): A's renewal is applied but its reply is
// lost, and A's link then stays silent (a black hole) past its TTL, so its
// renewer's retries wait in the network; A's lease ends lost and B
// acquires. The link then heals, delivering the held retries, and A's
// driver sends the renewal again: neither may extend B's grant (B's
// remaining validity stays within B's own, shorter, TTL) nor revive A's.
func lostReplyRenewal(t *testing.T, s lostReplyStore, store string) {
	url, link := linkTo(t, s, store)
	key := lostReplyKey("renew")
	// The outcome of every renewal of key, in order: the one whose reply
	// was lost has its outcome once the proxy has cut its connection,
	// which it does only after the server has answered.
	// Each outcome carries the cuts counted when it came: a renewal's
	// request is counted before it reaches the server, so an outcome
	// after a cut is that renewal's or a later one's.
	type outcome struct {
		err  error
		cuts int
	}
	renewed := make(chan outcome, 64)
	hook := func(e fenced.Event) {
		if e.Kind == fenced.EventRenew && e.Key == key {
			select {
			case renewed <- outcome{e.Err, link.cuts()}:
			default:
			}
		}
	}
	a, d := lostReplyClient(t, s, url, &fenced.Options{Hook: hook}), lostReplyClient(t, s, store, nil)
	la, err := a.TryAcquire(ctxFor(t, 10*time.Second), key, s.opts(s.ttlA, s.noLink))
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	g1 := driver.Grant{Key: key, Owner: la.Owner(), Fence: la.Fence(), TTL: s.ttlA}
	if s.noLink {
		// The renewal commits; its caller never learns (the reply is
		// dropped here, as a process killed right after the commit
		// would). It comes a third of the TTL in, as the renewer's
		// would, so that the look below can tell it happened.
		time.Sleep(s.ttlA / 3)
		_ = la.Renew(ctxFor(t, 5*time.Second))
	} else {
		link.loseReplyTo(key)
		// The renewer's first renewal is due a third of the TTL in; its
		// retry a quarter of that after a failure, which the black hole
		// then holds.
		// The renewal whose reply was lost is the first to end after the
		// cut. It fails, or a driver that checks again on a new connection
		// (ZooKeeper's batch falls back to a sync and a read) confirms it.
		deadline := time.After(2 * s.ttlA)
		var err error
	wait:
		for {
			select {
			case o := <-renewed:
				if o.cuts > 0 {
					err = o.err
					break wait
				}
			case <-deadline:
				t.Fatalf("no renewal of A's ended after a cut within %v (cuts %d)", 2*s.ttlA, link.cuts())
			}
		}
		link.blackHole(true)
		t.Logf("A's renewal with its reply lost, %v after the grant: %v (cuts %d)", time.Since(granted).Round(time.Millisecond), err, link.cuts())
	}
	looked := time.Now()
	info := storeView(t, d, key)
	t.Logf("the store after A's renewal with its reply lost: %+v", info)
	if !info.Held || info.Fence != g1.Fence {
		t.Fatalf("A's grant is gone right after its renewal: %+v", info)
	}
	// Unrenewed, A's grant would have at most ttlA less the time from its
	// grant's reply to this look left; the renewal, sent later, leaves
	// more. (Session backends have no store-side expiry per grant, and a
	// DynamoDB observer's Remaining is its own watch: there the renewal
	// is a read, or a version bump Inspect does not show.)
	if unrenewed := s.ttlA - looked.Sub(granted); s.storeClock && info.Remaining <= unrenewed {
		t.Fatalf("A's grant has %v left, no more than the %v it had unrenewed: the renewal was not applied", info.Remaining, unrenewed)
	}
	// A's local validity ends within its TTL of the last renewal it saw
	// confirmed (the grant, or the renewal above if its driver confirmed
	// it), whatever the load.
	select {
	case <-la.Context().Done():
	case <-time.After(2 * s.ttlA):
		t.Fatalf("A's lease is still live %v after its grant, its TTL being %v", 2*s.ttlA, s.ttlA)
	}
	if err := la.Err(); !fenced.IsLost(err) {
		t.Fatalf("A's lease ended with %v; want it lost", err)
	}
	// The store ends A's grant a TTL after the applied renewal (sessions:
	// the session's timeout plus the reaper's sweep; DynamoDB: a TTL
	// after B first sees the grant); this is liveness, not safety.
	wait := 5*s.ttlA + 10*time.Second
	lb, err := d.Acquire(ctxFor(t, wait+5*time.Second), key, &fenced.LeaseOptions{TTL: s.ttlB, MaxWait: wait, MinFence: s.minFence})
	if err != nil {
		t.Fatalf("B's acquire after A's lease ran out (waited up to %v): %v", wait, err)
	}
	defer lb.Release(context.Background())
	if lb.Fence() <= g1.Fence {
		t.Fatalf("B's fence %d is not above A's %d", lb.Fence(), g1.Fence)
	}
	link.blackHole(false)
	err = replayer(t, s, url, a).Renew(ctxFor(t, 10*time.Second), g1)
	t.Logf("A's driver re-sending the renewal after B's grant: %v", err)
	if err == nil {
		t.Fatal("A's re-sent renewal succeeded while B holds the key")
	}
	checkNamed(t, s, d, key, lb.Owner(), lb.Fence(), s.ttlB, "after A's renewal was retried")
	if err := la.Renew(ctxFor(t, 5*time.Second)); err == nil || !strings.Contains(err.Error(), key) {
		t.Fatalf("A's lost lease renewed: %v", err)
	}
	if err := lb.Err(); err != nil {
		t.Fatalf("B's lease ended: %v", err)
	}
}
