package httpapi_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// TestPartitionGroupOversizedMemberKey: anyone may take a key shaped like
// a member's with a huge partition count. GET /api/v1/partitions/G then
// sized its reply by that count (P = 3·10⁶ gave 495 MB; 10¹² killed the
// server). Now such a key is listed as invalid and no row is made for it:
// the reply stays a few hundred bytes, the page says so, and the front
// page lists no group for it.
func TestPartitionGroupOversizedMemberKey(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	hold := func(key string) {
		l, err := f.client.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceNone})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Release(ctx) })
	}
	type view struct {
		Partitions int               `json:"partitions"`
		Members    []json.RawMessage `json:"members"`
		Partition  []json.RawMessage `json:"partition"`
		Invalid    []string          `json:"invalid"`
	}
	get := func() (view, int) {
		r := f.do(t, "GET", "/api/v1/partitions/G", "")
		if r.status != 200 {
			t.Fatalf("GET: %d %s", r.status, r.body)
		}
		var v view
		if err := json.Unmarshal([]byte(r.body), &v); err != nil {
			t.Fatal(err)
		}
		return v, len(r.body)
	}
	// Just past MaxPartitions first: the original code survives it.
	hold("G/m/5000/x")
	v, n := get()
	if v.Partitions != 0 || len(v.Partition) != 0 || len(v.Members) != 0 || len(v.Invalid) != 1 || v.Invalid[0] != "G/m/5000/x" || n > 1000 {
		t.Fatalf("with G/m/5000/x held: partitions %d, %d rows, %d members, invalid %v, %d bytes; want 0, 0, 0, [G/m/5000/x], a short reply",
			v.Partitions, len(v.Partition), len(v.Members), v.Invalid, n)
	}
	hold("G/m/1000000000000/y")
	if v, n = get(); v.Partitions != 0 || len(v.Partition) != 0 || len(v.Invalid) != 2 || n > 1000 {
		t.Fatalf("with G/m/1000000000000/y held: partitions %d, %d rows, invalid %v, %d bytes", v.Partitions, len(v.Partition), v.Invalid, n)
	}
	page := f.do(t, "GET", "/partitions/G", "")
	if page.status != 200 || !strings.Contains(page.body, "G/m/1000000000000/y") || len(page.body) > 20000 {
		t.Errorf("page: %d, %d bytes, names the invalid key: %v", page.status, len(page.body), strings.Contains(page.body, "G/m/1000000000000/y"))
	}
	if index := f.do(t, "GET", "/", ""); index.status != 200 || strings.Contains(index.body, `href="/partitions/G"`) {
		t.Errorf("front page lists a group for the invalid keys: %d", index.status)
	}
}
