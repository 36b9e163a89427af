package fenced

import "time"

// The methods below are what a recipe built on a Client needs from it
// besides leases (package recipe uses nothing else).

// Options returns the options c was made with, defaults filled in. A
// recipe reads its Clock, its Hook, and its CloseTimeout to bound a
// release made after the caller's context has ended.
func (c *Client) Options() Options { return c.opts }

// Backoff returns how long a poller sleeps before attempt n (from 0).
// It is full jitter under a cap that doubles from Options.MinBackoff up
// to Options.MaxBackoff. Acquire polls with it.
func (c *Client) Backoff(n int) time.Duration { return c.backoff(n) }

// Closing returns a channel closed when Close begins. A wait should then
// end with ErrClosed.
func (c *Client) Closing() <-chan struct{} { return c.closing.Done() }
