package recipe_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"github.com/fenced-dev/fenced/recipe"
)

// holdKeys takes a plain lease on each key, as someone else's process
// would, released at the end of the test.
func holdKeys(t *testing.T, c *fenced.Client, keys ...string) {
	t.Helper()
	for _, k := range keys {
		l, err := c.TryAcquire(context.Background(), k, &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceNone})
		if err != nil {
			t.Fatalf("holding %s: %v", k, err)
		}
		t.Cleanup(func() { l.Release(context.Background()) })
	}
}

// TestPartitionsNestedGroupIsNoMember: a group nested as G/m/4 (a name
// a user may well pick) uses keys under G/m/4: its membership, its
// partitions and its doorbell. Each is held (the doorbell as a member
// stopped mid-ring would leave it), and none may read as a member of G:
// before, the doorbell G/m/4/bell read as a live member "bell" of G with
// 4 partitions, which refused every join of G with another count and
// took a share of G that nobody owned.
func TestPartitionsNestedGroupIsNoMember(t *testing.T) {
	ctx := context.Background()
	url := partStores(t)["sqlite"]
	var mu sync.Mutex
	used := map[string]bool{} // every key the nested group's member takes
	nc, err := fenced.Open(ctx, url, &fenced.Options{Hook: func(e fenced.Event) {
		if e.Kind == fenced.EventAcquire && e.Lease != nil {
			mu.Lock()
			used[e.Lease.Key()] = true
			mu.Unlock()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	nested, err := recipe.JoinPartitions(ctx, nc, "G/m/4", 4, idle, &recipe.PartitionsOptions{MemberID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(nested.Owned()) < 4; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the nested group's member owns %v, want 4 partitions", nested.Owned())
		}
	}
	if err := nested.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range used {
			if !yield(k) {
				return
			}
		}
	})
	mu.Unlock()
	// 1 membership, 4 partitions, the doorbell.
	if len(keys) != 6 {
		t.Fatalf("the nested group's member took %v, want 6 keys", keys)
	}
	c := partOpen(t, url)
	holdKeys(t, c, keys...)
	st, err := recipe.ReadGroup(ctx, c, "G")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 0 || len(st.Leases) != 0 || len(st.Invalid) != 0 {
		t.Fatalf("with the nested group's keys %v held, G reads members %+v, leases %v, invalid %v; want none", keys, st.Members, st.Leases, st.Invalid)
	}
	m, err := recipe.JoinPartitions(ctx, c, "G", 8, idle, &recipe.PartitionsOptions{MemberID: "a"})
	if err != nil {
		t.Fatalf("G refuses a join while its nested group's keys %v are held: %v", keys, err)
	}
	defer m.Leave(ctx)
	partBalanced(t, []*recipe.Partitions{m}, 8, 10*time.Second)
}

// TestPartitionsOversizedMemberKey: a key shaped like a member key with a
// partition count past MaxPartitions (G/m/<huge>/x, which anyone can
// take) is no member: it is reported as invalid, never sized into rows,
// and an honest join still succeeds. Before, ReadGroup gave it as a
// live member of P=5000 (and ls and the dashboard allocated P rows, which
// at P=10¹² killed fenced serve), and every join was refused.
func TestPartitionsOversizedMemberKey(t *testing.T) {
	ctx := context.Background()
	c := partOpen(t, partStores(t)["sqlite"])
	idle := func(ctx context.Context, p recipe.Partition) error { <-ctx.Done(); return nil }
	over := "G/m/" + "5000" + "/x"
	holdKeys(t, c, over)
	st, err := recipe.ReadGroup(ctx, c, "G")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 0 || st.Partitions() != 0 || !slices.Equal(st.Invalid, []string{over}) {
		t.Fatalf("with %s held: members %+v, partitions %d, invalid %v; want no member, 0, [%s]", over, st.Members, st.Partitions(), st.Invalid, over)
	}
	// Past int, and past MaxPartitions for a partition number.
	huge := []string{"G/m/1000000000000/y", "G/m/99999999999999999999999999/z", "G/p/4096", "G/p/100000000000000000000000"}
	holdKeys(t, c, huge...)
	st, err = recipe.ReadGroup(ctx, c, "G")
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values(append([]string{over}, huge...)))
	if len(st.Members) != 0 || len(st.Leases) != 0 || !slices.Equal(st.Invalid, want) {
		t.Fatalf("members %+v, leases %v, invalid %v; want none, none, %v", st.Members, st.Leases, st.Invalid, want)
	}
	m, err := recipe.JoinPartitions(ctx, c, "G", 8, idle, &recipe.PartitionsOptions{MemberID: "a"})
	if err != nil {
		t.Fatalf("G refuses a join while %v are held: %v", want, err)
	}
	defer m.Leave(ctx)
	partBalanced(t, []*recipe.Partitions{m}, 8, 10*time.Second)
	for _, p := range []int{0, limits.MaxPartitions + 1} {
		if _, err := recipe.JoinPartitions(ctx, c, "H", p, idle, nil); err == nil || !strings.Contains(err.Error(), "is not 1 to 4096") {
			t.Errorf("a join with %d partitions: %v, want a refusal naming the bounds", p, err)
		}
	}
}
