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
func TestRenewBatchNodesDeleted(t *testing.T) {
	ens := testenv.StartZooKeeper(t)
	d := openDriver(t, ens.URL("/renewbatch", "")).(*fencedzookeeper.Driver)
	ctx := context.Background()
	const ttl = 5 * time.Second
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
}
