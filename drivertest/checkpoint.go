package drivertest

import (
	"bytes"
	"context"
	"errors"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// testCheckpoint checks driver.Checkpointer: a checkpoint is stored only
// under the key's current grant, a late one from an earlier holder (its
// grant expired, as after a pause past the TTL) is refused whether or not
// a newer grant exists, the next holder reads the last one stored, it
// outlives the grant that stored it, and a value over
// limits.MaxCheckpoint is refused and changes nothing.
func (s *suite) testCheckpoint(t *testing.T) {
	d, clk := s.expiryDriver(t)
	if !d.Capabilities().Checkpoint {
		skipUndeclared(t, "Checkpoint", "fenced.Lease.Checkpoint returns ErrUnsupported")
	}
	cp := d.(driver.Checkpointer)
	ctx := Context(t)
	key := Key("checkpoint")
	want := func(step string, value []byte, fence uint64) {
		t.Helper()
		got, f, err := cp.ReadCheckpoint(ctx, key)
		if err != nil || !bytes.Equal(got, value) || f != fence || (value != nil && got == nil) {
			t.Fatalf("%s: ReadCheckpoint = %q, fence %d, %v; want %q, fence %d", step, got, f, err, value, fence)
		}
	}
	refused := func(step string, g driver.Grant, value []byte, sentinel error) {
		t.Helper()
		if err := cp.Checkpoint(ctx, g, value); !errors.Is(err, sentinel) {
			t.Fatalf("%s: Checkpoint = %v, want an error matching %v", step, err, sentinel)
		}
	}
	big := bytes.Repeat([]byte{0xfe}, limits.MaxCheckpoint)
	// A's grant must outlive its calls below on a busy machine: its TTL
	// is ShortTTL, or, if longer, 20 times the slowest of three reads
	// or 5 times the slowest of three writes of a grant, its largest
	// checkpoint and its release on another key (about as many writes
	// as A makes), in whole seconds (a real clock sleeps it out below).
	var slowRead, slowWrite time.Duration
	for range 3 {
		start := time.Now()
		want("never recorded", nil, 0)
		slowRead = max(slowRead, time.Since(start))
		if clk == nil {
			start = time.Now()
			probe := driver.Grant{Key: Key("checkpoint-probe"), Owner: owner(), TTL: time.Minute}
			var err error
			if probe.Fence, err = d.TryAcquire(ctx, probe.Key, probe.Owner, probe.TTL); err != nil {
				t.Fatal(err)
			}
			if err := cp.Checkpoint(ctx, probe, big); err != nil {
				t.Fatal(err)
			}
			if err := d.Release(ctx, probe); err != nil {
				t.Fatal(err)
			}
			slowWrite = max(slowWrite, time.Since(start))
		}
	}
	ttl := s.h.ShortTTL
	if need := max(20*slowRead, 5*slowWrite); clk == nil && need > ttl {
		ttl = (need + time.Second - 1).Truncate(time.Second)
		t.Logf("A's TTL is %v: the slowest of three reads took %v, of three writes %v", ttl, slowRead, slowWrite)
	}
	a := driver.Grant{Key: key, Owner: owner(), TTL: ttl}
	var err error
	if a.Fence, err = d.TryAcquire(ctx, key, a.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	if err := cp.Checkpoint(ctx, a, []byte{}); err != nil {
		t.Fatalf("A's empty checkpoint: %v", err)
	}
	want("A's empty checkpoint", []byte{}, a.Fence)
	if err := cp.Checkpoint(ctx, a, big); err != nil {
		t.Fatalf("A's checkpoint of limits.MaxCheckpoint bytes: %v", err)
	}
	want("A's largest checkpoint", big, a.Fence)
	good := []byte("offset=42\x00\xff")
	if err := cp.Checkpoint(ctx, a, good); err != nil {
		t.Fatal(err)
	}
	refused("one byte over limits.MaxCheckpoint", a, append(big, 0), fenced.ErrCheckpointTooLarge)
	refused("another owner with A's fence", driver.Grant{Key: key, Owner: owner(), Fence: a.Fence, TTL: ttl},
		[]byte("x"), fenced.ErrNotHeld)
	refused("A's owner with a later fence", driver.Grant{Key: key, Owner: a.Owner, Fence: a.Fence + 1, TTL: ttl},
		[]byte("x"), fenced.ErrNotHeld)
	want("after the refusals", good, a.Fence)

	s.expire(clk, ttl) // A paused past its TTL
	refused("A after its grant expired", a, []byte("late"), fenced.ErrNotHeld)
	b := driver.Grant{Key: key, Owner: owner(), TTL: time.Minute}
	if b.Fence, err = d.TryAcquire(ctx, key, b.Owner, b.TTL); err != nil {
		t.Fatalf("B acquire after A expired: %v", err)
	}
	want("B's read after its grant", good, a.Fence)
	refused("A's late checkpoint under B's grant", a, []byte("late"), fenced.ErrNotHeld)
	want("B's read after A's late checkpoint", good, a.Fence)
	if err := cp.Checkpoint(ctx, b, []byte("b")); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
	refused("B after its release", b, []byte("released"), fenced.ErrNotHeld)
	refused("A after B's release", a, []byte("late"), fenced.ErrNotHeld)
	want("after B's release", []byte("b"), b.Fence)

	s.checkpointDoors(ctx, t)
}

// checkpointDoors checks the portable doors over the driver: a fresh
// key's holder reads nothing, its checkpoint outlives its release, and a
// lease that lost its grant is refused.
func (s *suite) checkpointDoors(ctx context.Context, t *testing.T) {
	c := s.h.Client(t, nil)
	key := Key("checkpoint-door")
	l, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if v, f, err := c.Checkpoint(ctx, key); err != nil || v != nil || f != 0 {
		t.Fatalf("Client.Checkpoint of a key never checkpointed = %q, %d, %v", v, f, err)
	}
	if err := l.Checkpoint(ctx, []byte("door")); err != nil {
		t.Fatalf("Lease.Checkpoint: %v", err)
	}
	if err := l.Checkpoint(ctx, make([]byte, limits.MaxCheckpoint+1)); !errors.Is(err, fenced.ErrCheckpointTooLarge) {
		t.Fatalf("Lease.Checkpoint over the bound: %v, want ErrCheckpointTooLarge", err)
	}
	fence := l.Fence()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Checkpoint(ctx, []byte("late")); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("Lease.Checkpoint after its release: %v, want ErrNotHeld", err)
	}
	if v, f, err := c.Checkpoint(ctx, key); err != nil || string(v) != "door" || f != fence {
		t.Fatalf("Client.Checkpoint after the release = %q, %d, %v; want \"door\", %d", v, f, err, fence)
	}
}
