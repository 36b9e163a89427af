package fencedetcd_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedetcd"
	"github.com/fenced-dev/fenced/internal/testkit/crashtest"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestFreeNameFenceSurvivesCompaction checks that Inspect tells the exact
// fence of a free key's last grant however the grant ended (released,
// broken, its holder killed with SIGKILL so that etcd expired its session),
// after etcd's history of the grant was compacted away. So the fact cannot
// come from etcd's MVCC history (a Get at an old revision, a Watch from
// one): it must be written where compaction does not reach, by the grant
// itself, since a holder killed right after its grant writes nothing more.
func TestFreeNameFenceSurvivesCompaction(t *testing.T) {
	ctx := context.Background()
	cluster := testenv.StartEtcd(t)
	url := cluster.URL("")
	cli := newClient(t, cluster)
	c, err := fenced.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const ttl = time.Second
	want := map[string]uint64{}

	released, err := c.TryAcquire(ctx, "released", &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	want["released"] = released.Fence()
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}

	broken, err := c.TryAcquire(ctx, "broken", &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	want["broken"] = broken.Fence()
	if _, err := c.Break(ctx, "broken", "test", "test"); err != nil {
		t.Fatal(err)
	}

	holder := testenv.Start(t, "holder", crashtest.HolderCommand(url, "killed", ttl))
	holder.WaitLog(t, "FENCE ", time.Minute)
	for _, line := range testenv.Lines(holder.Log.String()) {
		if f, ok := strings.CutPrefix(line, "FENCE "); ok {
			if want["killed"], err = strconv.ParseUint(f, 10, 64); err != nil {
				t.Fatalf("holder printed %q", line)
			}
		}
	}
	holder.Kill()
	killed := time.Now()
	// etcd deletes the killed holder's key when its session expires:
	// within the session's TTL (TTL rounded up plus one second) and the
	// lessor's sweep, counted from the kill. The bound is ten times that, for
	// a busy machine; it only ends the wait, nothing is judged by it.
	bound := 10 * (fencedetcd.Expiry.Rounded(ttl) + fencedetcd.Expiry.Sweep)
	for {
		info, err := c.Inspect(ctx, "killed")
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held {
			break
		}
		if time.Since(killed) > bound {
			t.Fatalf("the killed holder's key is still held %v after the kill", bound)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Later writes, then a compaction of all history up to now.
	for i := range 10 {
		if _, err := cli.Put(ctx, fmt.Sprintf("other/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cli.Get(ctx, "other/0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	for key, fence := range want {
		info, err := c.Inspect(ctx, key)
		if err != nil || info.Held || info.Fence != fence {
			t.Errorf("Inspect(%s) after compaction = %+v, %v; want free with the last grant's fence %d", key, info, err, fence)
		}
	}
}
