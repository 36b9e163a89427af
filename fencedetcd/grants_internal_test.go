package fencedetcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

func newTestDriver(t *testing.T) (*Driver, *clientv3.Client) {
	t.Helper()
	d, cli, _ := newTestCluster(t)
	return d, cli
}

// newTestCluster starts a one-member etcd and returns a driver over a
// client of it, the client, and the cluster.
func newTestCluster(t *testing.T) (*Driver, *clientv3.Client, *testenv.EtcdCluster) {
	t.Helper()
	cluster := testenv.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	d, err := New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, cli, cluster
}

// TestSlowRenewalOfAReapedGrant orders, with the renewal hook, the
// interleaving in which a renewal that read its grant's key lands after
// the reaper deleted and forgot the grant, and another owner of the same
// driver has since put a key of the same name on the same session (key
// names are reused, see waiterKey). The renewal must report the grant not
// held, not bring it back; a later release of the reaped grant must fail
// with ErrNotHeld and leave the other owner's key alone.
func TestSlowRenewalOfAReapedGrant(t *testing.T) {
	d, cli := newTestDriver(t)
	ctx := context.Background()
	const ttl = time.Second
	a := driver.Grant{Key: "k", Owner: "owner-a", TTL: ttl}
	var err error
	if a.Fence, err = d.TryAcquire(ctx, a.Key, a.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	ea := d.grants.Lookup(a.Key, a.Owner)
	read, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d.renewHook = func() {
		once.Do(func() {
			close(read)
			<-resume
		})
	}
	renewed := make(chan error, 1)
	go func() { renewed <- d.Renew(ctx, a) }()
	<-read // the renewal found a's key; its outcome waits for resume

	// Meanwhile a's deadline passes: the reaper deletes its key and
	// forgets it, freeing its name on the session.
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.mu.Lock()
		nameFree := !ea.s.names[ea.name]
		d.mu.Unlock()
		resp, err := cli.Get(ctx, ea.etcdKey)
		if err != nil {
			t.Fatal(err)
		}
		if nameFree && len(resp.Kvs) == 0 && d.grants.Lookup(a.Key, a.Owner) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reaper did not end the unrenewed grant within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	b := driver.Grant{Key: "k", Owner: "owner-b", TTL: ttl}
	if b.Fence, err = d.TryAcquire(ctx, b.Key, b.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	if eb := d.grants.Lookup(b.Key, b.Owner); eb.etcdKey != ea.etcdKey {
		t.Fatalf("setup: the next grant put %s, not the reaped grant's key name %s", eb.etcdKey, ea.etcdKey)
	}

	close(resume)
	if err := <-renewed; !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("renewal that landed after the reaper ended the grant: %v, want ErrNotHeld", err)
	}
	if e := d.grants.Lookup(a.Key, a.Owner); e != nil {
		t.Fatal("the late renewal brought the reaped grant back")
	}
	if err := d.Release(ctx, a); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("release of the reaped grant: %v, want ErrNotHeld", err)
	}
	resp, err := cli.Get(ctx, ea.etcdKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 || uint64(resp.Kvs[0].CreateRevision) != b.Fence {
		t.Fatalf("the other owner's key %s (fence %d) is gone after the reaped grant's release: %v", ea.etcdKey, b.Fence, resp.Kvs)
	}
	if err := d.Renew(ctx, b); err != nil {
		t.Fatalf("renewal of the other owner's grant: %v", err)
	}
	if err := d.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
}

// TestRenewAfterBreakReportsLost breaks one of many grants on one
// session (checked against a listing of the session's keys, see
// attachedKeys) just after a renewal of all of them, and renews again at
// once: the broken grant must be reported not held, however recent the
// last listing is.
func TestRenewAfterBreakReportsLost(t *testing.T) {
	d, _ := newTestDriver(t)
	ctx := context.Background()
	const n = maxReadsPerTxn + 10 // more than one session's read limit: a listing
	grants := make([]driver.Grant, n)
	for i := range grants {
		g := driver.Grant{Key: fmt.Sprintf("k%d", i), Owner: fmt.Sprintf("owner-%d", i), TTL: 10 * time.Second}
		var err error
		if g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, g.TTL); err != nil {
			t.Fatal(err)
		}
		grants[i] = g
	}
	check := func(what string, broken int) {
		t.Helper()
		errs, err := d.RenewBatch(ctx, grants)
		if err != nil {
			t.Fatal(err)
		}
		for i, err := range errs {
			switch {
			case i == broken && !errors.Is(err, fenced.ErrNotHeld):
				t.Fatalf("%s: renewal of the broken grant %s: %v, want ErrNotHeld", what, grants[i], err)
			case i != broken && err != nil:
				t.Fatalf("%s: renewal of %s: %v", what, grants[i], err)
			}
		}
	}
	check("first renewal", -1)
	if _, err := d.Break(ctx, grants[7].Key, "test", "test"); err != nil {
		t.Fatal(err)
	}
	check("renewal right after the break", 7)
}
