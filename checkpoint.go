package fenced

import (
	"context"
	"fmt"

	"github.com/fenced-dev/fenced/internal/core/capability"
)

// Checkpoint records value as l's key's checkpoint: progress that outlives
// the grant, for the key's next holder to read (Client.Checkpoint). The
// store writes it only if l's grant is still the key's current one,
// checked in the same atomic operation; otherwise it fails with an error
// matching ErrNotHeld and changes nothing, so a holder paused past its TTL
// cannot overwrite its successor's checkpoint. A value longer than
// 64 KiB fails with ErrCheckpointTooLarge.
// Stores without checkpoints (Capabilities().Checkpoint false) return
// ErrUnsupported.
func (l *Lease) Checkpoint(ctx context.Context, value []byte) error {
	cp := l.c.ops().Checkpointer
	if cp == nil {
		return fmt.Errorf("fenced: checkpoint %q: %w: the store keeps no checkpoints", l.key, ErrUnsupported)
	}
	if err := capability.CheckCheckpoint(value); err != nil {
		return fmt.Errorf("fenced: checkpoint %q: %w", l.key, err)
	}
	if err := cp.Checkpoint(ctx, l.grant(), value); err != nil {
		return fmt.Errorf("fenced: checkpoint %q: %w", l.key, err)
	}
	return nil
}

// Checkpoint returns key's last recorded checkpoint (Lease.Checkpoint)
// and the fence of the grant that recorded it: nil and 0 when none was.
// Read by key's holder after its grant, it is the last checkpoint any
// earlier holder recorded. Stores without checkpoints
// (Capabilities().Checkpoint false) return ErrUnsupported.
func (c *Client) Checkpoint(ctx context.Context, key string) (value []byte, fence uint64, err error) {
	if err := ValidateKey(key); err != nil {
		return nil, 0, fmt.Errorf("fenced: read checkpoint: %w", err)
	}
	cp := c.ops().Checkpointer
	if cp == nil {
		return nil, 0, fmt.Errorf("fenced: read checkpoint %q: %w: the store keeps no checkpoints", key, ErrUnsupported)
	}
	value, fence, err = cp.ReadCheckpoint(ctx, key)
	if err != nil {
		return nil, 0, fmt.Errorf("fenced: read checkpoint %q: %w", key, err)
	}
	return value, fence, nil
}
