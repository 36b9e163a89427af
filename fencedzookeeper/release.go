package fencedzookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// Release implements driver.Driver: it deletes g's node.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	e, err := d.grantEntry("release", g)
	if err != nil {
		return err
	}
	session, sent := e.zc.conn.SessionID(), time.Now()
	err = e.zc.conn.DeleteContext(ctx, e.path, -1)
	if ctxErr := ctx.Err(); err != nil && ctxErr != nil && errors.Is(err, ctxErr) {
		return fmt.Errorf("zookeeper: release %s: %w: %w", g, fenced.ErrUnknownOutcome, ctxErr)
	}
	if err == nil {
		e.zc.recordWrite(session, sent)
	}
	if errors.Is(err, zk.ErrNoNode) {
		d.grants.Forget(e)
		return fmt.Errorf("zookeeper: release %s: %w", g, fenced.ErrNotHeld)
	}
	if err != nil {
		return writeErr("release", err)
	}
	d.grants.Forget(e)
	return nil
}
