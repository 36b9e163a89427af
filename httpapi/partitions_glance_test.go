package httpapi_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/recipe"
)

// TestPartitionGroupAtAGlance: three members of a 16-partition group on
// the served store. The front page shows the group at a glance (3 live
// members, 16 owned, 0 unowned, no move seen yet); once one member has
// left and its partitions were taken, it shows 2 members, 16 owned and
// as many moves as the leaver held, with the time of the last. The
// store-level series group every key of the group (partitions,
// memberships, doorbell) under the group's name: one key_group, no
// member ID in any label.
func TestPartitionGroupAtAGlance(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const p = 16
	// A TTL long enough that no lease runs out on a busy machine (a lapse
	// would move more than the leaver's share); the members act on
	// notifications, not on the TTL.
	ttl := 5 * time.Second
	var lapses atomic.Int64
	idle := func(ctx context.Context, _ recipe.Partition) error { <-ctx.Done(); return nil }
	var ms []*recipe.Partitions
	for range 3 {
		c, err := fenced.Open(ctx, f.store, &fenced.Options{Hook: func(e fenced.Event) {
			if e.Kind == fenced.EventLost {
				lapses.Add(1)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		m, err := recipe.JoinPartitions(ctx, c, "billing", p, idle,
			&recipe.PartitionsOptions{Lease: &fenced.LeaseOptions{TTL: ttl}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Leave(ctx) })
		ms = append(ms, m)
	}
	row := regexp.MustCompile(`<a href="/partitions/billing">billing</a></td><td>(\d+)</td><td>(\d+)</td>` +
		`<td class="owned">(\d+)</td><td class="unowned[^"]*">(\d+)</td><td class="moves">(\d+)</td><td class="since">([^<]*)</td>`)
	glance := func() []string {
		r := f.do(t, "GET", "/", "")
		if r.status != 200 {
			t.Fatalf("GET /: %d %s", r.status, r.body)
		}
		m := row.FindStringSubmatch(r.body)
		if m == nil {
			t.Fatalf("the front page has no row for group billing:\n%s", r.body)
		}
		return m[1:]
	}
	// Balanced (each member within one of P/3), as the members see it.
	// Bound: eight TTLs: a rebalance is a doorbell, a listing and a
	// hand-off per member, each within a poll (TTL/3).
	balanced := func(live []*recipe.Partitions) {
		t.Helper()
		deadline := time.Now().Add(8 * ttl)
		for {
			sum, ok := 0, true
			for _, m := range live {
				n := len(m.Owned())
				sum += n
				ok = ok && n >= p/len(live) && n <= (p+len(live)-1)/len(live)
			}
			if ok && sum == p {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("not balanced after %v", 8*ttl)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	balanced(ms)
	cells := glance()
	if want := []string{"16", "3", "16", "0", "0", "–"}; strings.Join(cells, " ") != strings.Join(want, " ") {
		t.Errorf("with three members: partitions, members, owned, unowned, moves, last move = %v, want %v", cells, want)
	}

	gone := ms[2]
	moved := len(gone.Owned())
	before := time.Now().UTC().Truncate(time.Second)
	if err := gone.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	balanced(ms[:2])
	cells = glance()
	if want := []string{"16", "2", "16", "0", fmt.Sprint(moved)}; strings.Join(cells[:5], " ") != strings.Join(want, " ") {
		t.Errorf("after a member holding %d left: partitions, members, owned, unowned, moves = %v, want %v (%d leases ran out)",
			moved, cells[:5], want, lapses.Load())
	}
	if at, err := time.Parse("2006-01-02 15:04:05 UTC", cells[5]); err != nil || at.Before(before) {
		t.Errorf("last move %q (%v), want a time from %v on", cells[5], err, before)
	}

	r := f.do(t, "GET", "/metrics", "")
	if want := fmt.Sprintf(`fenced_store_leases_held{key_group="billing"} %d`, p+2); !strings.Contains(r.body, want) {
		t.Errorf("/metrics lacks %s:\n%s", want, r.body)
	}
	for _, line := range strings.Split(r.body, "\n") {
		if strings.HasPrefix(line, "fenced_") && strings.Contains(line, "key_group=") && !strings.Contains(line, `key_group="billing"`) {
			t.Errorf("a series of another key group than the group's name: %s", line)
		}
		for _, m := range ms {
			if strings.Contains(line, m.MemberID()) {
				t.Errorf("member ID %s in a label: %s", m.MemberID(), line)
			}
		}
	}
}
