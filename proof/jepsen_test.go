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
