package fencedredis

import (
	"context"
	"net/url"

	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/redis/go-redis/v9"
)

// NudgeMin is nudgeMin, for the tests' bounds.
const NudgeMin = nudgeMin

// SetCommands makes d renew and release with n's commands, as if its probe
// had found n (for the benchmark's comparison).
func SetCommands(d *Driver, n rediskit.Native) {
	d.nativeMu.Lock()
	d.native = &n
	d.nativeMu.Unlock()
}

// Pipe is d's autopipeliner (nil when unpipelined).
func Pipe(d *Driver) *redis.AutoPipeliner { return d.pipe }

// OpenURL is the URL opener, returning the driver itself.
func OpenURL(ctx context.Context, u *url.URL) (*Driver, error) {
	d, err := open(ctx, u)
	if err != nil {
		return nil, err
	}
	return d.(*Driver), nil
}
