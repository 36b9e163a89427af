package fenced

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
)

// The module's own tools reach a client's driver, and guards a lease's
// client, through rootaccess; neither is part of the public API.
func init() {
	rootaccess.Set(
		func(c any) driver.Driver { return c.(*Client).drv },
		func(l any) any { return l.(*Lease).c },
	)
}

// Client is the portable handle on a lease store. It is safe for concurrent
// use; open one per process and store and share it. Close it to release its
// leases and connections.
type Client struct {
	drv   driver.Driver
	opts  Options
	clock clock.Clock
	// epoch is c's clock when c was made. Leases keep their moments as
	// durations since it (see since), which are smaller than time.Time
	// values and keep the monotonic reading of a real clock.
	epoch time.Time

	renew *renewer

	// closing is cancelled when Close begins: waits end, and a grant that
	// arrives afterwards is released instead of handed out.
	closing      context.Context
	beginClosing context.CancelFunc
	// halt is cancelled when Close stops waiting for the store (after
	// Options.CloseTimeout) or has finished: requests still in flight are
	// abandoned then.
	halt       context.Context
	cancelHalt context.CancelCauseFunc
	closeDone  chan struct{} // closed when the first Close returns

	mu        sync.Mutex
	closed    bool
	inflight  sync.WaitGroup                     // acquisitions admitted before Close began
	acquiring map[uint64]context.CancelCauseFunc // their requests' contexts, by admission
	admitted  uint64                             // admissions so far, the keys of acquiring
	wakeups   map[string]chan struct{}           // local release signals, per waited-for key
	waiting   map[string]int                     // waiters per key; wakeups entries live while > 0

	// releases counts releases through c, and waiters the entries of
	// waiting, so that a release need not take mu when nobody waits, and
	// a waiter can tell whether a release happened before it registered.
	releases atomic.Uint64
	waiters  atomic.Int64
}

// NewClient returns a Client over drv, for backends opened with their typed
// constructors. opts may be nil. The Client owns drv and closes it on Close.
// Options.MinFence is checked when a lease is acquired (or by Resolve).
func NewClient(drv driver.Driver, opts *Options) *Client {
	c := &Client{drv: drv, acquiring: map[uint64]context.CancelCauseFunc{}, wakeups: map[string]chan struct{}{}, waiting: map[string]int{}, closeDone: make(chan struct{})}
	if opts != nil {
		c.opts = *opts
	}
	if c.opts.Clock == nil {
		c.opts.Clock = clock.Real()
	}
	if c.opts.MinBackoff <= 0 {
		c.opts.MinBackoff = 10 * time.Millisecond
	}
	if c.opts.MaxBackoff < c.opts.MinBackoff {
		c.opts.MaxBackoff = max(time.Second, c.opts.MinBackoff)
	}
	if c.opts.FallbackPoll <= 0 {
		c.opts.FallbackPoll = 2 * time.Second
	}
	if c.opts.CloseTimeout <= 0 {
		c.opts.CloseTimeout = defaultCloseTimeout
	}
	c.clock = c.opts.Clock
	c.epoch = c.clock.Now()
	c.closing, c.beginClosing = context.WithCancel(context.Background())
	c.halt, c.cancelHalt = context.WithCancelCause(context.Background())
	c.renew = newRenewer(c)
	return c
}

// since returns t as a duration since c.epoch: c's timeline, on which
// leases keep their moments.
func (c *Client) since(t time.Time) time.Duration { return t.Sub(c.epoch) }

// at returns the moment d of c's timeline as a time.
func (c *Client) at(d time.Duration) time.Time { return c.epoch.Add(d) }

// now returns c's clock now, on c's timeline.
func (c *Client) now() time.Duration { return c.since(c.clock.Now()) }

// Guarantees returns what the backend declares it promises. How waiters
// are woken is not among them: see Capabilities (Subscribe, Queue, FIFO).
func (c *Client) Guarantees() driver.Guarantees { return c.drv.Guarantees() }

// newOwner returns 128 random bits, hex encoded.
func newOwner() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("fenced: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// Inspect describes key as the authority sees it. The owner is shortened.
// A key never granted returns an error matching ErrNotFound.
func (c *Client) Inspect(ctx context.Context, key string) (LeaseInfo, error) {
	if err := ValidateKey(key); err != nil {
		return LeaseInfo{}, fmt.Errorf("fenced: inspect: %w", err)
	}
	info, err := c.drv.Inspect(ctx, key)
	if err != nil {
		return shortOwner(info), fmt.Errorf("fenced: inspect %q: %w", key, err)
	}
	return shortOwner(info), nil
}

// shortOwner makes sure that no owner token leaves Inspect whole,
// whatever the driver reported: drivers shorten owners already
// (LeaseInfo.SetOwner), and ShortOwner leaves a shortened owner as it is.
func shortOwner(info LeaseInfo) LeaseInfo {
	info.Owner = driver.ShortOwner(info.Owner)
	return info
}
