package consensus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
)

// driverLocker calls a driver's wait queue (driver.TimedQueuer) directly, without the portable
// Client, to separate the driver's cost from the Client's.
type driverLocker struct {
	d   driver.Driver
	key string
	g   driver.Grant
}

func (l *driverLocker) Lock(ctx context.Context) error {
	var b [16]byte
	rand.Read(b[:])
	owner := hex.EncodeToString(b[:])
	const ttl = 10 * time.Second
	f, _, err := l.d.(driver.TimedQueuer).AcquireTimed(ctx, l.key, owner, ttl)
	l.g = driver.Grant{Key: l.key, Owner: owner, Fence: f, TTL: ttl}
	return err
}

func (l *driverLocker) Unlock(ctx context.Context) error { return l.d.Release(ctx, l.g) }

func driverFactory(url string) newLocker {
	return func(b *testing.B, key string) locker {
		c, err := fenced.Open(context.Background(), url, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return &driverLocker{d: rootaccess.Driver(c), key: key}
	}
}
