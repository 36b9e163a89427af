package fencedredis

import (
	"context"
	"fmt"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

var _ driver.Checkpointer = (*Driver)(nil)

// Checkpoint implements driver.Checkpointer: one script checks that the
// grant's lock is the key's and writes the checkpoint (a hash in the
// lease's slot that never expires), so no grant comes between.
func (d *Driver) Checkpoint(ctx context.Context, g driver.Grant, value []byte) error {
	if err := d.usable(); err != nil {
		return err
	}
	if err := capability.CheckCheckpoint(value); err != nil {
		return fmt.Errorf("redis: checkpoint %q: %w", g.Key, err)
	}
	ok, err := rediskit.RunCheckpoint(ctx, d.c, d.layout, g, value)
	if err != nil {
		return d.scriptErr("checkpoint", g.Key, err, true, d.layout.Lock(g.Key), d.layout.Checkpoint(g.Key))
	}
	if !ok {
		return fmt.Errorf("redis: checkpoint %v: %w", g, fenced.ErrNotHeld)
	}
	return nil
}

// ReadCheckpoint implements driver.Checkpointer.
func (d *Driver) ReadCheckpoint(ctx context.Context, key string) ([]byte, uint64, error) {
	if err := d.usable(); err != nil {
		return nil, 0, err
	}
	v, f, err := rediskit.ReadCheckpoint(ctx, d.c, d.layout, key)
	if err != nil {
		return nil, 0, d.scriptErr("read checkpoint", key, err, false, d.layout.Checkpoint(key))
	}
	return v, f, nil
}
