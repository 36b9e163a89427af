package fenced

import (
	"time"

	"github.com/fenced-dev/fenced/clock"
)

// The methods below are what a recipe built on a Client needs from it
// besides leases (package recipe uses nothing else).

// Clock returns the clock c measures time with (Options.Clock).
func (c *Client) Clock() clock.Clock { return c.clock }

// Backoff returns how long a poller sleeps before attempt n (from 0):
// full jitter under a cap that doubles from Options.MinBackoff up to
// Options.MaxBackoff. Acquire polls with it.
func (c *Client) Backoff(n int) time.Duration { return c.backoff(n) }

// CloseTimeout returns how long Close waits for the store
// (Options.CloseTimeout, or DefaultCloseTimeout). Use it to bound a
// release made after the caller's context has ended.
func (c *Client) CloseTimeout() time.Duration { return c.opts.CloseTimeout }

// Closing returns a channel closed when Close begins. A wait should then
// end with ErrClosed.
func (c *Client) Closing() <-chan struct{} { return c.closing.Done() }
