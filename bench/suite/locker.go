package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
)

// locker takes and gives back locks for one goroutine.
type locker interface {
	// lock blocks until key is held and returns how to release it.
	lock(ctx context.Context, key string) (unlock func(context.Context) error, err error)
}

// process is one implementation's client as one process holds it: its
// connections, shared by the workers (goroutines) it hands out.
type process interface {
	// worker returns a locker for one goroutine of the process.
	worker() (locker, error)
	close()
}

// impl is one lock implementation under comparison.
type impl struct {
	name string
	// driverOnly: the fenced driver called without the portable Client;
	// measured in the uncontended workload only, to show what the Client
	// costs.
	driverOnly bool
	open       func(ctx context.Context) (process, error)
}

// benchTTL is the TTL of every lock the op workloads take: long enough
// never to expire during a measurement.
const benchTTL = 10 * time.Second

// fencedProcess is a fenced.Client; its workers share it.
type fencedProcess struct {
	c    *fenced.Client
	opts *fenced.LeaseOptions
}

// newFencedProcess wraps d in a Client with default options. Leases ask
// for the strongest fence the backend offers (Redis only repeats after a
// failover, Redlock has none) and renew automatically, as a user's would.
func newFencedProcess(d driver.Driver) *fencedProcess {
	return fencedClientProcess(fenced.NewClient(d, nil))
}

func fencedClientProcess(c *fenced.Client) *fencedProcess {
	return &fencedProcess{c: c, opts: &fenced.LeaseOptions{
		TTL: benchTTL, MaxWait: fenced.WaitForever, MinFence: minFence(c),
	}}
}

// minFence is the strongest fence c's store gives (what MinFence must
// accept).
func minFence(c *fenced.Client) fenced.FenceStrength {
	return max(c.Capabilities().Fence, fenced.FenceNone) // an undeclared strength is none
}

func (p *fencedProcess) worker() (locker, error) { return p, nil }
func (p *fencedProcess) close()                  { p.c.Close() }

func (p *fencedProcess) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := p.c.Acquire(ctx, key, p.opts)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

// driverProcess calls a fenced driver directly: its native wait queue
// where it has one, else TryAcquire (the key is free in the uncontended
// workload), then Release. No lease object, renewal or hooks.
type driverProcess struct {
	d driver.Driver
}

// The native wait queue's methods, matched by shape rather than through
// the driver package's interface names, which are being reshaped.
type (
	timedQueuer interface {
		AcquireTimed(ctx context.Context, key, owner string, ttl time.Duration) (uint64, time.Time, error)
	}
	queuer interface {
		Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error)
	}
)

func (p driverProcess) worker() (locker, error) { return p, nil }
func (p driverProcess) close()                  { p.d.Close() }

func (p driverProcess) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	owner := newOwner()
	var (
		f   uint64
		err error
	)
	if q, ok := p.d.(timedQueuer); ok {
		f, _, err = q.AcquireTimed(ctx, key, owner, benchTTL)
	} else if q, ok := p.d.(queuer); ok {
		f, err = q.Acquire(ctx, key, owner, benchTTL)
	} else {
		f, err = p.d.TryAcquire(ctx, key, owner, benchTTL)
	}
	if err != nil {
		return nil, err
	}
	g := driver.Grant{Key: key, Owner: owner, Fence: f}
	return func(ctx context.Context) error { return p.d.Release(ctx, g) }, nil
}

func newOwner() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// openFenced is an impl's open for a fenced store URL.
func openFenced(url string) func(context.Context) (process, error) {
	return func(ctx context.Context) (process, error) {
		c, err := fenced.Open(ctx, url, nil)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", redactURL(url), err)
		}
		return fencedClientProcess(c), nil
	}
}

// openDriverOnly is openFenced without the Client.
func openDriverOnly(url string) func(context.Context) (process, error) {
	return func(ctx context.Context) (process, error) {
		d, err := openDriver(ctx, url)
		if err != nil {
			return nil, err
		}
		return driverProcess{d}, nil
	}
}

// openDriver opens url's driver (through a Client, which is the only way
// the URL mux hands one out) and detaches it.
func openDriver(ctx context.Context, url string) (driver.Driver, error) {
	c, err := fenced.Open(ctx, url, nil)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", redactURL(url), err)
	}
	return rootaccess.Driver(c), nil
}

// fencedImpls are fenced's Client and its driver alone on the store URL
// args[0].
func fencedImpls(args []string) []impl {
	url := args[0]
	return []impl{
		{name: "fenced", open: openFenced(url)},
		{name: "fenced-driver", driverOnly: true, open: openDriverOnly(url)},
	}
}

// redactURL hides a URL's credentials.
func redactURL(u string) string {
	if i, j := strings.Index(u, "://"), strings.LastIndex(u, "@"); i >= 0 && j > i {
		return u[:i+3] + "…" + u[j:]
	}
	return u
}
