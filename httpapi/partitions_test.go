package httpapi_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// TestPartitionGroupView: two members of an 8-partition group on the
// served store; the API lists both with their counts, every partition
// with its owner (named by the member's tag), fence and time left, and
// none unowned; the page shows the same; after one leaves the other owns
// all; a bad group name is a 400.
func TestPartitionGroupView(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	join := func(id string) *recipe.Partitions {
		m, err := recipe.JoinPartitions(ctx, open(t, f.store), "billing", 8, idle,
			&recipe.PartitionsOptions{MemberID: id, Lease: &fenced.LeaseOptions{TTL: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Leave(ctx) })
		return m
	}
	a, b := join("a"), join("b")
	type view struct {
		Partitions int `json:"partitions"`
		Members    []struct {
			ID     string `json:"id"`
			Owned  int    `json:"owned"`
			Target int    `json:"target"`
		} `json:"members"`
		Partition []struct {
			Held        bool   `json:"held"`
			Owner       string `json:"owner"`
			Fence       uint64 `json:"fence"`
			RemainingMS int64  `json:"remaining_ms"`
		} `json:"partition"`
		Unowned []int `json:"unowned"`
	}
	get := func() view {
		r := f.do(t, "GET", "/api/v1/partitions/billing", "")
		if r.status != 200 {
			t.Fatalf("GET: %d %s", r.status, r.body)
		}
		var v view
		if err := json.Unmarshal([]byte(r.body), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	deadline := time.Now().Add(10 * time.Second)
	var v view
	for {
		v = get()
		if len(v.Unowned) == 0 && len(v.Members) == 2 && v.Members[0].Owned == 4 && v.Members[1].Owned == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not balanced: %+v (a owns %v, b %v)", v, a.Owned(), b.Owned())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v.Partitions != 8 || len(v.Partition) != 8 {
		t.Fatalf("partitions %d, %d rows", v.Partitions, len(v.Partition))
	}
	own := map[string][]int{"a": a.Owned(), "b": b.Owned()}
	for id, ps := range own {
		for _, p := range ps {
			pv := v.Partition[p]
			if !pv.Held || pv.Owner != id || pv.Fence == 0 || pv.RemainingMS <= 0 {
				t.Errorf("partition %d of %s: %+v", p, id, pv)
			}
		}
	}
	for _, m := range v.Members {
		if m.Target != 4 {
			t.Errorf("member %s: target %d, want 4", m.ID, m.Target)
		}
	}
	page := f.do(t, "GET", "/partitions/billing", "")
	if page.status != 200 || !strings.Contains(page.body, `<dd id="unowned">0</dd>`) ||
		strings.Count(page.body, "<td>a</td>") != 1+2*len(own["a"]) || !strings.Contains(page.body, "/keys/billing%2Fp%2F0") {
		t.Errorf("page: %d\n%s", page.status, page.body)
	}

	// The front page links the group, with its P and live members.
	index := f.do(t, "GET", "/", "")
	if index.status != 200 || !strings.Contains(index.body, `<a href="/partitions/billing">billing</a></td><td>8</td><td>2</td>`) {
		t.Errorf("front page does not link the group: %d\n%s", index.status, index.body)
	}

	// b leaves: a owns all 8, b is gone from the members.
	b.Leave(ctx)
	for v = get(); len(v.Members) != 1 || v.Members[0].Owned != 8; v = get() {
		if time.Now().After(deadline) {
			t.Fatalf("after b left: %+v", v)
		}
		time.Sleep(50 * time.Millisecond)
	}

	if r := f.do(t, "GET", "/api/v1/partitions/bad%01group", ""); r.status != 400 {
		t.Errorf("bad group: %d %s", r.status, r.body)
	}
}

// TestPartitionGroupViewWeighted: members of weights 1 and 3 on an
// 8-partition group settle at 2 and 6, and the API's target for each is
// what it holds, the weighted assignment the members move towards (an
// unweighted one would say 4 and 4).
func TestPartitionGroupViewWeighted(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	for _, m := range []struct {
		id     string
		weight int
	}{{"a", 1}, {"b", 3}} {
		g, err := recipe.JoinPartitions(ctx, open(t, f.store), "weighted", 8, idle,
			&recipe.PartitionsOptions{MemberID: m.id, Weight: m.weight, Lease: &fenced.LeaseOptions{TTL: 2 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Leave(ctx) })
	}
	want := map[string]int{"a": 2, "b": 6}
	// As TestPartitionGroupView: 10 s is five TTLs, for the members'
	// looks at the group on a busy machine; only the settling waits on it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := f.do(t, "GET", "/api/v1/partitions/weighted", "")
		if r.status != 200 {
			t.Fatalf("GET: %d %s", r.status, r.body)
		}
		var v struct {
			Members []struct {
				ID     string `json:"id"`
				Owned  int    `json:"owned"`
				Target int    `json:"target"`
			} `json:"members"`
		}
		if err := json.Unmarshal([]byte(r.body), &v); err != nil {
			t.Fatal(err)
		}
		settled := len(v.Members) == 2
		for _, m := range v.Members {
			settled = settled && m.Owned == want[m.ID]
		}
		if settled {
			for _, m := range v.Members {
				if m.Target != want[m.ID] {
					t.Errorf("member %s holds %d, its weighted share, but the API's target is %d", m.ID, m.Owned, m.Target)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("members not at their weighted shares %v: %s", want, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
