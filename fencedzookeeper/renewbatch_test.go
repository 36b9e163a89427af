package fencedzookeeper_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedzookeeper"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestRenewBatchNodesDeleted: when an admin deletes some grants' nodes,
// the transaction of checks fails; RenewBatch must end exactly those
// grants and still renew the others.
//
// The first grant must still stand when the batch is sent, 2 s after the
// set-up, by a fifth of the TTL at least: a longer set-up (under the hog,
// the grants, the admin's connection and its deletes took over 3 s of a
// 5 s TTL) runs again with twice the TTL.
func TestRenewBatchNodesDeleted(t *testing.T) {
	ens := testenv.StartZooKeeper(t)
	for round, ttl := 1, 5*time.Second; ; round, ttl = round+1, 2*ttl {
		setup, ok := renewBatchRound(t, ens, fmt.Sprintf("/renewbatch-%d", round), ttl)
		if ok {
			return
		}
		if round == 3 {
			t.Fatalf("the set-up took %v of a TTL of %v: the machine is too slow to tell a renewal from a grant", setup, ttl)
		}
		t.Logf("round %d: the set-up took %v of the TTL %v; again with twice the TTL", round, setup.Round(time.Millisecond), ttl)
	}
}

// renewBatchRound is one round of TestRenewBatchNodesDeleted under root,
// with grants of ttl. It reports false, having checked nothing, if the
// set-up left the batch less than a fifth of ttl before the first grant
// ends, and how long the set-up took.
func renewBatchRound(t *testing.T, ens *testenv.ZKEnsemble, root string, ttl time.Duration) (time.Duration, bool) {
	d := openDriver(t, ens.URL(root, "")).(*fencedzookeeper.Driver)
	ctx := context.Background()
	began := time.Now()
	var grants []driver.Grant
	for i := range 5 {
		g := driver.Grant{Key: fmt.Sprintf("k%d", i), Owner: fmt.Sprintf("owner-%d", i), TTL: ttl}
		f, err := d.TryAcquire(ctx, g.Key, g.Owner, ttl)
		if err != nil {
			t.Fatal(err)
		}
		g.Fence = f
		grants = append(grants, g)
	}
	admin, _, err := zk.Connect(ens.Servers(), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	deleted := map[int]bool{1: true, 3: true}
	for i := range deleted {
		path := d.LockPath(grants[i].Key)
		names, _, err := admin.Children(path)
		if err != nil || len(names) != 1 {
			t.Fatalf("children of %s: %v, %v", path, names, err)
		}
		if err := admin.Delete(path+"/"+names[0], -1); err != nil {
			t.Fatal(err)
		}
	}
	if setup := time.Since(began); setup > ttl-2*time.Second-ttl/5 {
		return setup, false
	}
	time.Sleep(2 * time.Second) // so that only a renewal keeps the rest
	renewed := time.Now()
	errs, err := d.RenewBatch(ctx, grants)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if deleted[i] != errors.Is(err, fenced.ErrNotHeld) || !deleted[i] && err != nil {
			t.Errorf("grant %d (node deleted: %v): %v", i, deleted[i], err)
		}
	}
	for i, g := range grants {
		info, err := d.Inspect(ctx, g.Key)
		if err != nil && !errors.Is(err, fenced.ErrNotFound) {
			t.Fatal(err)
		}
		if deleted[i] && info.Held {
			t.Errorf("%s is held after its node was deleted: %+v", g.Key, info)
		}
		// A renewal sent after renewed leaves at least the TTL less the
		// time since then; the grant alone, 2 s older, would leave less.
		if floor := ttl - time.Since(renewed); !deleted[i] && (!info.Held || info.Fence != g.Fence || info.Remaining < floor) {
			t.Errorf("%s after the batch: %+v; want held with fence %d and at least %v left (the TTL %v since the batch began)",
				g.Key, info, g.Fence, floor.Round(time.Millisecond), ttl)
		}
		if deleted[i] {
			if err := d.Renew(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
				t.Errorf("renew %s after the batch ended it: %v, want ErrNotHeld", g.Key, err)
			}
		}
	}
	return 0, true
}
