package mem

import (
	"context"
	"fmt"

	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

var _ driver.Checkpointer = (*Driver)(nil)

// checkpoint is a key's last stored checkpoint and the fence it was
// stored under.
type checkpoint struct {
	value []byte
	fence uint64
}

// Checkpoint implements driver.Checkpointer: under the store's lock, the
// check that g is the key's current grant and the write are one step.
func (d *Driver) Checkpoint(ctx context.Context, g driver.Grant, value []byte) error {
	if err := capability.CheckCheckpoint(value); err != nil {
		return fmt.Errorf("mem: checkpoint %q: %w", g.Key, err)
	}
	s, err := d.lockCtx(ctx)
	if err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, err := s.held(g); err != nil {
		return err
	}
	if s.checkpoints == nil {
		s.checkpoints = map[string]checkpoint{}
	}
	s.checkpoints[g.Key] = checkpoint{value: append([]byte{}, value...), fence: g.Fence}
	return nil
}

// ReadCheckpoint implements driver.Checkpointer.
func (d *Driver) ReadCheckpoint(ctx context.Context, key string) ([]byte, uint64, error) {
	s, err := d.lockCtx(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer s.mu.Unlock()
	c, ok := s.checkpoints[key]
	if !ok {
		return nil, 0, nil
	}
	return append([]byte{}, c.value...), c.fence, nil
}
