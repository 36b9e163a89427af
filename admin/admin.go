// Package admin is the operator's side of a fenced.Client: list held
// leases, break one, read the audit log of breaks, and manage a store's
// fence floor.
//
// It uses only the root package's public API (Client.Driver), like
// package recipe. Owner tokens never leave it whole: every owner it
// returns is shortened (driver.ShortOwner).
package admin

import (
	"context"
	"fmt"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// BreakRecord is one recorded break; see Breaks.
type BreakRecord = driver.BreakRecord

// List returns the held leases whose keys start with prefix ("" for all),
// sorted by key.
func List(ctx context.Context, c *fenced.Client, prefix string) ([]fenced.LeaseInfo, error) {
	infos, err := c.Driver().List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("fenced: list %q: %w", prefix, err)
	}
	for i := range infos {
		infos[i].Owner = driver.ShortOwner(infos[i].Owner)
	}
	return infos, nil
}

// Break ends the current grant of key, whoever holds it. The holder's
// next renewal fails (its lease context is cancelled with ErrLost), and
// the next grant gets a higher fence. reason is required; by names who
// broke it. Backends with an audit log record the break (see Breaks).
// Break returns what it broke, or an error matching fenced.ErrNotHeld
// when nothing was held.
func Break(ctx context.Context, c *fenced.Client, key, reason, by string) (fenced.LeaseInfo, error) {
	if err := fenced.ValidateKey(key); err != nil {
		return fenced.LeaseInfo{}, fmt.Errorf("fenced: break: %w", err)
	}
	if reason == "" {
		return fenced.LeaseInfo{}, fmt.Errorf("fenced: break %q: a reason is required", key)
	}
	info, err := c.Driver().Break(ctx, key, driver.BreakRequest{Reason: reason, By: by})
	info.Owner = driver.ShortOwner(info.Owner)
	if err != nil {
		return info, fmt.Errorf("fenced: break %q: %w", key, err)
	}
	return info, nil
}

// Breaks returns the recorded breaks of key ("" for every key), oldest
// first. Backends without an audit log return fenced.ErrUnsupported.
func Breaks(ctx context.Context, c *fenced.Client, key string) ([]BreakRecord, error) {
	bl := driver.CapabilitiesOf(c.Driver()).BreakLogger
	if bl == nil {
		return nil, fmt.Errorf("fenced: breaks: %w", fenced.ErrUnsupported)
	}
	recs, err := bl.Breaks(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("fenced: breaks %q: %w", key, err)
	}
	for i := range recs {
		recs[i].Owner = driver.ShortOwner(recs[i].Owner)
	}
	return recs, nil
}
