package fenced_test

import (
	"context"
	"errors"
	"github.com/fenced-dev/fenced/internal/core/limits"
	"testing"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/mem"
)

// TestCheckpointDoors checks the checkpoint doors on their own: a store
// without checkpoints says ErrUnsupported (and Capabilities false) and
// the lease goes on; a checkpoint over limits.MaxCheckpoint is refused
// before the store is asked, and a bad key is refused by its name.
func TestCheckpointDoors(t *testing.T) {
	ctx := context.Background()
	bare := fenced.NewClient(bareDriver{mem.NewStore(nil).Driver()}, nil)
	defer bare.Close()
	if bare.Capabilities().Checkpoint {
		t.Fatal("a driver without driver.Checkpointer's methods declares Checkpoint")
	}
	l, err := bare.TryAcquire(ctx, "doors", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if err := l.Checkpoint(ctx, []byte("v")); !errors.Is(err, fenced.ErrUnsupported) {
		t.Errorf("Lease.Checkpoint on a store without checkpoints = %v; want ErrUnsupported", err)
	}
	if _, _, err := bare.Checkpoint(ctx, "doors"); !errors.Is(err, fenced.ErrUnsupported) {
		t.Errorf("Client.Checkpoint on a store without checkpoints = %v; want ErrUnsupported", err)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("a refused checkpoint ended the lease: %v", err)
	}

	c := fenced.NewClient(mem.NewStore(nil).Driver(), nil)
	defer c.Close()
	l2, err := c.TryAcquire(ctx, "doors", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Release(ctx)
	if err := l2.Checkpoint(ctx, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if err := l2.Checkpoint(ctx, make([]byte, limits.MaxCheckpoint+1)); !errors.Is(err, fenced.ErrCheckpointTooLarge) {
		t.Errorf("a checkpoint of limits.MaxCheckpoint+1 bytes = %v; want ErrCheckpointTooLarge", err)
	}
	if v, _, err := c.Checkpoint(ctx, "doors"); err != nil || string(v) != "kept" {
		t.Errorf("after the refused one, Client.Checkpoint = %q, %v; want \"kept\"", v, err)
	}
	if _, _, err := c.Checkpoint(ctx, ""); !errors.Is(err, fenced.ErrInvalidKey) {
		t.Errorf("Client.Checkpoint of the empty key = %v; want ErrInvalidKey", err)
	}
}
