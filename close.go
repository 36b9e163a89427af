package fenced

import (
	"context"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced/driver"
)

// Close ends every lease still held through c and closes the driver. Later
// calls on c return ErrClosed; a second Close waits for the first and
// returns nil.
//
// In order: new acquisitions are refused, and waiters give up with
// ErrClosed. Every lease's context is cancelled with ErrClosed before any
// key is freed, so no work under a lease is live once another client can
// hold its key. Then the leases are released at the authority, in
// parallel. A grant that completes while Close runs is released, not
// handed out: its Acquire returns ErrClosed.
//
// Close waits for the store at most Options.CloseTimeout (real time),
// plus the driver's own Close once no request is in flight. If the store
// has not answered by then, Close returns an error matching
// ErrUnknownOutcome. Every lease's context is cancelled all the same.
// Grants whose release was not confirmed expire at the authority within
// their TTL, and the driver is closed once its requests return.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.closeDone
		return nil
	}
	c.closed = true
	c.beginClosing()
	c.mu.Unlock()
	// No lease joins the schedule once closed is set (see register).
	held := c.renew.held()
	defer close(c.closeDone)
	bound := time.AfterFunc(c.opts.CloseTimeout, c.haltRequests)
	defer bound.Stop()

	// Cancel every lease's context first, then free the keys.
	var ended []*Lease
	for _, l := range held {
		if l.end(ErrClosed) {
			ended = append(ended, l)
		}
	}
	renewerDone := c.renew.stop()
	settled := make(chan struct{})
	go func() {
		inParallel(min(len(ended), maxReleasers), len(ended), func(i int) { _ = ended[i].free(c.halt) })
		c.inflight.Wait() // acquisitions release what they were granted
		<-renewerDone
		close(settled)
	}()
	select {
	case <-settled:
	case <-c.halt.Done():
		select {
		case <-settled:
		default:
			go func() {
				<-settled
				_ = c.drv.Close()
			}()
			return fmt.Errorf("fenced: close: %w: the store did not answer within %v (Options.CloseTimeout); every lease's context is cancelled, grants whose release was not confirmed expire at the authority within their TTL, and the driver closes once its requests return",
				ErrUnknownOutcome, c.opts.CloseTimeout)
		}
	}
	c.haltRequests()
	return c.drv.Close()
}

// maxReleasers bounds the releases Close sends at once.
const maxReleasers = 64

// haltRequests abandons every request still in flight: Close has stopped
// waiting for the store, or is over.
func (c *Client) haltRequests() {
	c.cancelHalt(ErrClosed)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cancel := range c.acquiring {
		cancel(ErrClosed)
	}
}

// admit registers an acquisition with c, so that Close waits for it, or
// reports ErrClosed once Close has begun. It returns the context for the
// acquisition's requests to the store: ctx, also cancelled when Close stops
// waiting for the store. The caller passes the returned id and cancel to
// finish when the acquisition is over.
//
// A ctx that can never be cancelled (context.Background and the like) needs
// no context of its own: its requests run under c.halt, with ctx's values.
func (c *Client) admit(ctx context.Context) (dctx context.Context, id uint64, cancel context.CancelCauseFunc, err error) {
	if _, hasDeadline := ctx.Deadline(); ctx.Done() == nil && !hasDeadline {
		dctx = haltable{Context: c.halt, values: ctx}
	} else {
		dctx, cancel = context.WithCancelCause(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		if cancel != nil {
			cancel(nil)
		}
		return nil, 0, nil, ErrClosed
	}
	c.inflight.Add(1)
	if cancel != nil {
		c.admitted++
		id = c.admitted
		c.acquiring[id] = cancel
	}
	return dctx, id, cancel, nil
}

// finish ends an acquisition that admit admitted.
func (c *Client) finish(id uint64, cancel context.CancelCauseFunc) {
	if cancel != nil {
		c.mu.Lock()
		delete(c.acquiring, id)
		c.mu.Unlock()
		cancel(nil)
	}
	c.inflight.Done()
}

// haltable is c.halt (done, with cause ErrClosed, when Close stops waiting
// for the store) with the values of a context that is never done.
type haltable struct {
	context.Context
	values context.Context
}

// Value implements context.Context: values' values, and c.halt's for the
// keys values has nothing for (c.halt has none of its own, but
// context.Cause finds its cause this way).
func (h haltable) Value(key any) any {
	if v := h.values.Value(key); v != nil {
		return v
	}
	return h.Context.Value(key)
}

// register puts l on c's schedule, which Close ends, unless Close has
// begun.
func (c *Client) register(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.renew.add(l)
	return true
}

// releaseOrphan releases a grant that arrived after Close began and
// returns the error its acquisition reports.
func (c *Client) releaseOrphan(g driver.Grant) error {
	if err := c.drv.Release(c.halt, g); err != nil {
		return fmt.Errorf("%w: the client was closed as the grant (fence %d) arrived, and releasing it failed (it expires at the authority within its TTL): %v", ErrClosed, g.Fence, err)
	}
	return fmt.Errorf("%w: the client was closed as the grant (fence %d) arrived; it was released", ErrClosed, g.Fence)
}
