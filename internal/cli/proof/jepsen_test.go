package proof

import (
	"context"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestJepsenQueuedWaiterExpiry is Jepsen's etcd 3.4.3 lock finding
// (etcd#11456) as a scenario: a waiter whose lease expires while it is
// queued must not be granted the key while somebody else holds it. A holds
// the key; B queues for it through a proxy; B is cut off for 3 TTLs, so
// its session expires at etcd while it waits; A releases and C, who asks
// after, must get the key (B's reaped entry blocks nobody); the partition
// heals. B may be granted the key only once C has released it, with a
// higher fence, and B must then be the holder the store names.
func TestJepsenQueuedWaiterExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	ctx := t.Context()
	store := testenv.StartEtcd(t).URL("")
	ttl := 2 * time.Second
	opts := &fenced.LeaseOptions{TTL: ttl, MaxWait: fenced.WaitForever}
	open := func(url string) *fenced.Client {
		c, err := fenced.Open(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var proxies []*proxy
	bURL, err := proxyURL(store, func(hp string) (string, error) {
		p, err := startProxy(hp)
		if err != nil {
			return "", err
		}
		proxies = append(proxies, p)
		return p.addr(), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range proxies {
			p.close()
		}
	})
	a, b, c := open(store), open(bURL), open(store)
	key := "jepsen:etcd-11456"
	la, err := a.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *fenced.Lease
		err error
		at  time.Time
	}
	bDone := make(chan result, 1)
	bctx, cancelB := context.WithTimeout(ctx, 12*ttl)
	defer cancelB()
	go func() {
		l, err := b.Acquire(bctx, key, opts)
		bDone <- result{l, err, time.Now()}
	}()
	time.Sleep(ttl / 2) // B is queued
	for _, p := range proxies {
		p.setDown(true)
	}
	time.Sleep(ttl + 2*time.Second) // B's session expires at etcd
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cctx, cancelC := context.WithTimeout(ctx, 3*ttl)
	lc, err := c.Acquire(cctx, key, opts)
	cancelC()
	if err != nil {
		t.Fatalf("C could not take the key after A released it while B's session was expired: %v (B's reaped queue entry blocks the key)", err)
	}
	for _, p := range proxies {
		p.setDown(false)
	}
	// C holds for 2 TTLs after the partition healed; B must not be granted
	// meanwhile.
	var got result
	select {
	case got = <-bDone:
	case <-time.After(2 * ttl):
	}
	cReleased := time.Now()
	if got.l != nil || got.err != nil {
		if got.err == nil && lc.Err() == nil {
			t.Fatalf("B was granted %q (fence %d) while C held it (fence %d): a waiter whose lease expired while queued was granted", key, got.l.Fence(), lc.Fence())
		}
	}
	if err := lc.Release(ctx); err != nil {
		t.Fatalf("C's release: %v (its lease: %v)", err, lc.Err())
	}
	if got.l == nil && got.err == nil {
		got = <-bDone
	}
	if got.err != nil {
		t.Logf("B's acquire ended without a grant: %v", got.err)
		return
	}
	defer got.l.Release(ctx)
	if got.at.Before(cReleased) {
		t.Fatalf("B was granted at %v, before C released at %v", got.at, cReleased)
	}
	if got.l.Fence() <= lc.Fence() {
		t.Fatalf("B's fence %d is not above C's %d", got.l.Fence(), lc.Fence())
	}
	info, err := c.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.OwnerDigest != fence.OwnerDigest(got.l.Owner()) || info.Fence != got.l.Fence() {
		t.Fatalf("B believes it holds %q (fence %d) but the store says %+v", key, got.l.Fence(), info)
	}
	t.Logf("A fence %d, C fence %d, B granted after C released with fence %d", la.Fence(), lc.Fence(), got.l.Fence())
}

// TestJepsenReplyLostRetried is Jepsen's jetcd 0.8.2 finding as a
// scenario: a lock request reaches the store but its reply is lost, and
// the caller retries. B's proxy goes silent right after B's acquire
// request has left (the reply never comes back) and heals as B gives up;
// B retries. The retry must get the key within a few seconds (the grant
// the lost reply carried is nobody's lease and must not keep the key), be
// the holder the store names, with a fence above every earlier grant, and
// exclude another client.
func TestJepsenReplyLostRetried(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	ctx := t.Context()
	store := testenv.StartEtcd(t).URL("")
	ttl := 5 * time.Second
	opts := &fenced.LeaseOptions{TTL: ttl, MaxWait: fenced.WaitForever}
	var proxies []*proxy
	bURL, err := proxyURL(store, func(hp string) (string, error) {
		p, err := startProxy(hp)
		if err != nil {
			return "", err
		}
		proxies = append(proxies, p)
		return p.addr(), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range proxies {
			p.close()
		}
	})
	open := func(url string) *fenced.Client {
		c, err := fenced.Open(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	b, d := open(bURL), open(store)
	key := "jepsen:jetcd-reply-lost"
	// A first grant and release, so the key has a fence to compare with.
	l0, err := d.Acquire(ctx, key, opts)
	if err != nil {
		t.Fatal(err)
	}
	f0 := l0.Fence()
	if err := l0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		p.afterNextSend(func() { p.setDown(true) })
	}
	actx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	_, err = b.Acquire(actx, key, opts)
	cancel()
	for _, p := range proxies {
		p.afterNextSend(nil)
		p.setDown(false)
	}
	if err == nil {
		t.Fatal("B's acquire succeeded although its proxy went silent after the request left")
	}
	t.Logf("B's acquire with the reply lost: %v", err)
	rctx, cancel := context.WithTimeout(ctx, 4*time.Second)
	defer cancel()
	began := time.Now()
	l, err := b.Acquire(rctx, key, opts)
	if err != nil {
		info, _ := d.Inspect(ctx, key)
		t.Fatalf("B's retry did not get the key within 4s (TTL %v): %v; the store names %+v (the lost reply's grant keeps the key)", ttl, err, info)
	}
	defer l.Release(ctx)
	t.Logf("B's retry got the key after %v, fence %d (earlier grant %d)", time.Since(began).Round(time.Millisecond), l.Fence(), f0)
	if l.Fence() <= f0 {
		t.Fatalf("the retry's fence %d is not above the earlier grant's %d", l.Fence(), f0)
	}
	info, err := d.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.OwnerDigest != fence.OwnerDigest(l.Owner()) || info.Fence != l.Fence() {
		t.Fatalf("B believes it holds %q (fence %d) but the store says %+v", key, l.Fence(), info)
	}
	if ld, err := d.TryAcquire(ctx, key, opts); err == nil {
		ld.Release(ctx)
		t.Fatalf("D was granted %q (fence %d) while B's retry holds it (fence %d)", key, ld.Fence(), l.Fence())
	}
}
