package drivertest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// testListInspectBreak checks Client.List, Inspect, Break and
// Breaks on held, broken and released keys. List returns the held
// keys under a prefix, sorted, with owners shortened but their digests
// whole. Break returns what it broke, refuses a key held by no one, an
// invalid key and an empty reason, and keeps the fence.
func (s *suite) testListInspectBreak(t *testing.T) {
	ctx := Context(t)
	c := s.h.Client(t, nil)
	prefix := Key("admin") + ":"
	if _, err := c.Inspect(ctx, prefix+"never"); !errors.Is(err, fenced.ErrNotFound) {
		t.Fatalf("Inspect of a never-granted key: %v, want ErrNotFound", err)
	}
	var leases []*fenced.Lease
	digests := map[string]string{}
	for _, k := range []string{"b", "a", "c"} {
		l, err := c.TryAcquire(ctx, prefix+k, &fenced.LeaseOptions{TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		digests[l.Key()] = token.Digest(l.Owner())
	}
	other, err := c.TryAcquire(ctx, prefix[:len(prefix)-1]+"-other", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(ctx)
	list, err := c.List(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, i := range list {
		keys = append(keys, strings.TrimPrefix(i.Key, prefix))
		if !i.Held || i.Fence == 0 || i.Owner == "" {
			t.Errorf("listed %+v: want held with fence and owner", i)
		}
		if len(i.Owner) > 12 {
			t.Errorf("List reveals a %d-character owner token; owners must be shortened", len(i.Owner))
		}
		if i.OwnerDigest != digests[i.Key] {
			t.Errorf("listed %s with owner digest %q, want owner.Digest of its owner %q", i.Key, i.OwnerDigest, digests[i.Key])
		}
	}
	if got := strings.Join(keys, ","); got != "a,b,c" {
		t.Fatalf("List(%q) keys = %s, want a,b,c (sorted, prefix only)", prefix, got)
	}
	info, err := c.Inspect(ctx, prefix+"b")
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Fence != leases[0].Fence() || info.Remaining <= 0 || info.Remaining > time.Minute+time.Second {
		t.Fatalf("Inspect = %+v, want held with fence %d and time left", info, leases[0].Fence())
	}
	if info.OwnerDigest != digests[prefix+"b"] {
		t.Fatalf("Inspect owner digest %q, want owner.Digest of the owner %q", info.OwnerDigest, digests[prefix+"b"])
	}
	broken, err := c.Break(ctx, prefix+"b", "conformance test", "drivertest")
	if err != nil {
		t.Fatal(err)
	}
	if broken.Fence != leases[0].Fence() || broken.OwnerDigest != digests[prefix+"b"] {
		t.Fatalf("Break reported fence %d owner digest %q, want %d and %q",
			broken.Fence, broken.OwnerDigest, leases[0].Fence(), digests[prefix+"b"])
	}
	if _, err := c.Break(ctx, prefix+"b", "again", "drivertest"); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("second Break: %v, want ErrNotHeld", err)
	}
	if _, err := c.Break(ctx, prefix+"a", "", "drivertest"); err == nil {
		t.Fatal("Break without a reason succeeded")
	}
	if _, err := c.Break(ctx, "", "x", "y"); !errors.Is(err, fenced.ErrInvalidKey) {
		t.Errorf("Break(\"\"): %v, want ErrInvalidKey", err)
	}
	info, err = c.Inspect(ctx, prefix+"b")
	if err != nil || info.Held || info.Fence != leases[0].Fence() || info.OwnerDigest != "" {
		t.Fatalf("Inspect after break = %+v, %v; want free, fence kept, no owner", info, err)
	}
	if recs, err := c.Breaks(ctx, prefix+"b"); err == nil {
		if len(recs) != 1 || recs[0].Reason != "conformance test" || recs[0].By != "drivertest" ||
			recs[0].Fence != leases[0].Fence() || recs[0].Time.IsZero() {
			t.Fatalf("break records = %+v", recs)
		}
	} else if !errors.Is(err, fenced.ErrUnsupported) {
		t.Fatal(err)
	}
	for _, l := range leases[1:] {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if list, _ := c.List(ctx, prefix); len(list) != 0 {
		t.Fatalf("List after releasing all = %+v", list)
	}
}
