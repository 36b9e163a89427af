package sqllease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/leasetable"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

// CheckpointsSuffix names the table of checkpoints (driver.Checkpointer):
// the lease table's name plus it. It is apart from the lease table, so
// that a lease table of an earlier version keeps its shape, and a
// checkpoint outlives a pruned lease row.
const CheckpointsSuffix = "_checkpoints"

// CheckpointStatements are a dialect's checkpoint SQL.
type CheckpointStatements struct {
	// Write stores a checkpoint: key, owner, fence, value. In one
	// statement it must insert or replace the key's checkpoint row (key,
	// fence, value) only when the lease row has that owner and fence and
	// has not expired, locking the lease row where the database would
	// otherwise let a concurrent grant commit between the check and the
	// write; it changes exactly one row when it stored the value.
	Write Stmt
	// Read reads a checkpoint: key; columns value, fence.
	Read Stmt
}

// Checkpoint implements driver.Checkpointer in one statement. A dialect
// without checkpoint statements refuses with fenced.ErrUnsupported.
func (e *Engine) Checkpoint(ctx context.Context, g driver.Grant, value []byte) error {
	if err := e.checkpoints(); err != nil {
		return err
	}
	if err := capability.CheckCheckpoint(value); err != nil {
		return fmt.Errorf("%s: checkpoint %q: %w", e.d.Name, g.Key, err)
	}
	if g.Owner == "" {
		return leasetable.NotHeld(g)
	}
	if value == nil {
		value = []byte{}
	}
	s := e.d.Checkpoints.Write
	a := Args{Key: g.Key, Owner: g.Owner, Fence: g.Fence}
	res, err := e.db.Exec(ctx, s.SQL, append(s.args(a, g.Key, g.Owner, int64(g.Fence)), value)...)
	if err != nil {
		return e.Wrap("checkpoint", g.Key, err)
	}
	if res.RowsAffected != 1 {
		return leasetable.NotHeld(g)
	}
	return nil
}

// ReadCheckpoint implements driver.Checkpointer. A stored empty value is
// returned as an empty, not nil, slice.
func (e *Engine) ReadCheckpoint(ctx context.Context, key string) ([]byte, uint64, error) {
	if err := e.checkpoints(); err != nil {
		return nil, 0, err
	}
	s := e.d.Checkpoints.Read
	var value []byte
	var fence int64
	err := e.db.QueryRow(ctx, s.SQL, s.args(Args{Key: key}, key)...).Scan(&value, &fence)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, e.Wrap("read checkpoint", key, err)
	}
	return append([]byte{}, value...), uint64(fence), nil
}

// checkpoints returns fenced.ErrClosed after Close, and
// fenced.ErrUnsupported when the dialect keeps no checkpoints.
func (e *Engine) checkpoints() error {
	if err := e.CheckOpen(); err != nil {
		return err
	}
	if e.d.Checkpoints == nil {
		return fmt.Errorf("%s: checkpoint: %w", e.d.Name, fenced.ErrUnsupported)
	}
	return nil
}
