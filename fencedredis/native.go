package fencedredis

import (
	"context"
	"fmt"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
)

// A server that has it renews with the conditional SET IFEQ instead of a
// script (rediskit.Native; the release stays a script, which says why).
// The driver probes for it once, on the first renewal or release, and
// keeps the answer for its client's pool; a Cluster client keeps the
// script (its nodes could answer differently). A renewal that the server
// refuses as unknown (a failover to an older server) goes back to the
// script and is sent again as one. The grant is the script either way, so
// its fence stays strictly increasing on a server.

// nativePath returns the commands d renews with, probing the server the
// first time. A probe that fails to get an answer decides nothing: the
// call uses the script, and the next call probes again.
func (d *Driver) nativePath(ctx context.Context) rediskit.Native {
	d.nativeMu.Lock()
	defer d.nativeMu.Unlock()
	if d.native != nil {
		return *d.native
	}
	if d.layout.Cluster {
		d.native = &rediskit.Native{}
		return *d.native
	}
	n, err := rediskit.ProbeNative(ctx, d.c, d.opts.Prefix+"native-probe")
	if err != nil {
		return rediskit.Native{}
	}
	d.native = &n
	return n
}

// nativeRefused records that the server refused SET IFEQ: d renews by
// script from now on.
func (d *Driver) nativeRefused() {
	d.nativeMu.Lock()
	d.native = &rediskit.Native{}
	d.nativeMu.Unlock()
}

// Commands says which path renewal and release take on d's server (for
// the CLI's inspect), probing it if no call did yet: "renewal by SET IFEQ,
// release by script", or both by script.
func (d *Driver) Commands(ctx context.Context) string { return d.nativePath(ctx).String() }

// renewNative renews g with SET IFEQ. ok is false when the server refused
// the command, and the caller then runs the script.
func (d *Driver) renewNative(ctx context.Context, g driver.Grant, lock string) (ok bool, err error) {
	renewed, err := rediskit.RenewNative(ctx, d.c, lock, rediskit.Value(g.Fence, g.Owner), g.TTL.Milliseconds())
	if rediskit.NotSupported(err) {
		d.nativeRefused()
		return false, nil
	}
	if err != nil {
		return true, d.scriptErr("renew", g.Key, err, true, lock)
	}
	if !renewed {
		return true, fmt.Errorf("redis: renew %v: %w", g, fenced.ErrNotHeld)
	}
	return true, nil
}
