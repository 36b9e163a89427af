package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// TestPartitionsLsOversizedMemberKey: `partitions ls` of a group where
// someone holds a key shaped like a member's with a huge partition count
// (G/m/1000000000000/x) lists it as invalid and makes no row for it.
// Before, ls allocated that many rows (a fatal out of memory at 10¹²).
// The smaller key past MaxPartitions comes first, so that the original
// code fails on it rather than crash.
func TestPartitionsLsOversizedMemberKey(t *testing.T) {
	t.Parallel()
	store := tempStore(t)
	c := client(t, store)
	ctx := context.Background()
	for _, key := range []string{"G/m/5000/x", "G/m/1000000000000/y"} {
		l, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceNone})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(ctx)
		r := cli(t, store, "partitions", "ls", "-o", "json", "G")
		var v struct {
			Partitions int               `json:"partitions"`
			Members    []json.RawMessage `json:"members"`
			Partition  []json.RawMessage `json:"partition"`
			Invalid    []string          `json:"invalid"`
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil {
			t.Fatalf("ls with %s held: exit %d, %.300s %s", key, r.code, r.stdout, r.stderr)
		}
		if v.Partitions != 0 || len(v.Members) != 0 || len(v.Partition) != 0 || !slices.Contains(v.Invalid, key) {
			t.Fatalf("ls with %s held: partitions %d, %d members, %d rows, invalid %v; want 0, 0, 0 and the key invalid", key, v.Partitions, len(v.Members), len(v.Partition), v.Invalid)
		}
	}
	r := cli(t, store, "partitions", "ls", "G")
	if r.code != 0 || !strings.Contains(r.stdout, "invalid keys") || !strings.Contains(r.stdout, "G/m/1000000000000/y") || len(r.stdout) > 2000 {
		t.Errorf("ls: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
