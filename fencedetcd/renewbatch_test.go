package fencedetcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedetcd"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestRenewBatchLarge renews more grants in one RenewBatch than etcd
// accepts operations in one transaction (--max-txn-ops, 128 by default),
// with every seventh grant's key deleted behind the driver's back: each
// live grant must be reported renewed and each deleted one not held, and
// the batch must not fail as a whole. (The grants share one session, so
// they are checked against the keys LeaseTimeToLive lists for it; smaller
// batches, read key by key, are checked by the conformance suite.)
func TestRenewBatchLarge(t *testing.T) {
	const n = 1500
	ctx := context.Background()
	cli := newClient(t, testenv.StartEtcd(t))
	d, err := fencedetcd.New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The TTL outlasts the acquisitions, which nothing renews meanwhile:
	// under load 1500 of them took over 10 s (grants on sessions no later
	// acquisition kept alive then lapsed, rightly). It is checked below.
	const ttl = time.Minute
	began := time.Now()
	grants := make([]driver.Grant, n)
	var wg sync.WaitGroup
	errc := make(chan error, n)
	sem := make(chan struct{}, 16)
	for i := range grants {
		grants[i] = driver.Grant{Key: fmt.Sprintf("batch-%d", i), Owner: fmt.Sprintf("owner-%d", i), TTL: ttl}
		wg.Add(1)
		sem <- struct{}{}
		go func(g *driver.Grant) {
			defer wg.Done()
			defer func() { <-sem }()
			var err error
			if g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, g.TTL); err != nil {
				errc <- fmt.Errorf("acquire %s: %w", g.Key, err)
			}
		}(&grants[i])
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if took := time.Since(began); took > ttl/2 {
		t.Fatalf("granting %d keys took %v: over half the TTL %v, so the renewals below could find grants lapsed", n, took, ttl)
	}
	stale := func(i int) bool { return i%7 == 3 }
	for i, g := range grants {
		if stale(i) {
			if _, err := cli.Delete(ctx, d.LockName(g.Key)+"/", clientv3.WithPrefix()); err != nil {
				t.Fatal(err)
			}
		}
	}
	errs, err := d.RenewBatch(ctx, grants)
	if err != nil {
		t.Fatalf("RenewBatch of %d grants failed as a whole: %v", n, err)
	}
	if len(errs) != n {
		t.Fatalf("RenewBatch returned %d results for %d grants", len(errs), n)
	}
	for i, err := range errs {
		if stale(i) {
			if !errors.Is(err, fenced.ErrNotHeld) {
				t.Errorf("grant %d (key deleted): %v, want ErrNotHeld", i, err)
			}
		} else if err != nil {
			t.Errorf("grant %d (key intact): %v, want renewed", i, err)
		}
	}
	// A second pass: the deleted grants stay not held, the rest renew again.
	errs, err = d.RenewBatch(ctx, grants)
	if err != nil {
		t.Fatalf("second RenewBatch: %v", err)
	}
	for i, err := range errs {
		if stale(i) != errors.Is(err, fenced.ErrNotHeld) || !stale(i) && err != nil {
			t.Errorf("second pass, grant %d (stale %v): %v", i, stale(i), err)
		}
	}
}

// TestRenewBatchGrantNewerThanListing renews, within a second of a renewal
// that listed a session's keys, a grant put after that listing: it must
// be renewed, not found gone (one listing serves the renewals that begin
// within a second of it, and the new grant's key is not in it).
func TestRenewBatchGrantNewerThanListing(t *testing.T) {
	const n = 300 // more than one transaction's reads, so the session's keys are listed
	ctx := context.Background()
	d, err := fencedetcd.New(newClient(t, testenv.StartEtcd(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// Every grant must still be held when the batch renews it: the TTL is
	// 10 s, or four times what n acquisitions take here (timed on 20) if
	// more.
	const probes = 20
	began := time.Now()
	for i := range probes {
		g := driver.Grant{Key: fmt.Sprintf("probe-%d", i), Owner: "probe", TTL: time.Minute}
		if g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, g.TTL); err != nil {
			t.Fatal(err)
		}
		defer d.Release(ctx, g)
	}
	ttl := max(10*time.Second, (4*time.Since(began)*n/probes).Truncate(time.Second)+time.Second)
	t.Logf("TTL %v: %d acquisitions took %v", ttl, probes, time.Since(began).Round(time.Millisecond))
	began = time.Now()
	grants := make([]driver.Grant, n)
	for i := range grants {
		grants[i] = driver.Grant{Key: fmt.Sprintf("listed-%d", i), Owner: fmt.Sprintf("owner-%d", i), TTL: ttl}
		if grants[i].Fence, err = d.TryAcquire(ctx, grants[i].Key, grants[i].Owner, grants[i].TTL); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d grants took %v", n, time.Since(began).Round(time.Millisecond))
	if errs, err := d.RenewBatch(ctx, grants); err != nil {
		t.Fatal(err)
	} else {
		for i, err := range errs {
			if err != nil {
				t.Fatalf("grant %d: %v", i, err)
			}
		}
	}
	late := driver.Grant{Key: "put-after-the-listing", Owner: "owner-late", TTL: ttl}
	if late.Fence, err = d.TryAcquire(ctx, late.Key, late.Owner, late.TTL); err != nil {
		t.Fatal(err)
	}
	errs, err := d.RenewBatch(ctx, append(grants, late))
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("grant %d of %d (the last put after the listing): %v, want renewed", i, n+1, err)
		}
	}
}
