package fenced

import (
	"context"
	"fmt"
)

// The methods below are what a recipe built on a Client needs from it
// besides leases (package recipe uses nothing else).

// Options returns the options c was made with, defaults filled in. A
// recipe reads its Clock, its Hook, its backoff bounds, and its
// CloseTimeout to bound a release made after the caller's context has
// ended.
func (c *Client) Options() Options { return c.opts }

// Value returns key's holder as Inspect describes it, and the value its
// grant carries (Lease.SetValue): "" when the holder set none. A key that
// is not held has Held false and no value; a key never granted returns an
// error matching ErrNotFound. Stores without a value slot
// (Capabilities().Value false) return ErrUnsupported; use Inspect there.
func (c *Client) Value(ctx context.Context, key string) (LeaseInfo, string, error) {
	if err := ValidateKey(key); err != nil {
		return LeaseInfo{}, "", fmt.Errorf("fenced: value: %w", err)
	}
	v := c.ops().Valuer
	if v == nil {
		return LeaseInfo{}, "", fmt.Errorf("fenced: value of %q: %w: the store has no value slot", key, ErrUnsupported)
	}
	info, value, err := v.Value(ctx, key)
	if err != nil {
		return shortOwner(info), "", fmt.Errorf("fenced: value of %q: %w", key, err)
	}
	return shortOwner(info), value, nil
}

// SetValue publishes value with l's grant for readers of Client.Value, as
// an election's leader proclaims itself. The value lives as long as the
// grant. It fails with an error matching ErrNotHeld when the store no
// longer has the grant (l is not ended by it: Renew asks again), and with
// ErrUnsupported on stores without a value slot.
func (l *Lease) SetValue(ctx context.Context, value string) error {
	v := l.c.ops().Valuer
	if v == nil {
		return fmt.Errorf("fenced: set value of %q: %w: the store has no value slot", l.key, ErrUnsupported)
	}
	if err := v.SetValue(ctx, l.grant(), value); err != nil {
		return fmt.Errorf("fenced: set value of %q: %w", l.key, err)
	}
	return nil
}

// Watch returns a channel that receives (coalesced) whenever the store
// tells that key may have been released or broken, until ctx ends; the
// channel is not closed then. A watcher never takes the wake-up a release
// gives the waiters of key, so it suits an observer that does not try for
// the key. Stores that cannot tell observers (Capabilities().Observe
// false) return ErrUnsupported; read the key on a timer there.
func (c *Client) Watch(ctx context.Context, key string) (<-chan struct{}, error) {
	if err := ValidateKey(key); err != nil {
		return nil, fmt.Errorf("fenced: watch: %w", err)
	}
	obs := c.ops().Observer
	if obs == nil {
		return nil, fmt.Errorf("fenced: watch %q: %w: the store cannot tell observers", key, ErrUnsupported)
	}
	sub, err := obs.SubscribeObserver(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("fenced: watch %q: %w", key, err)
	}
	context.AfterFunc(ctx, func() { _ = sub.Close() })
	return sub.C(), nil
}
