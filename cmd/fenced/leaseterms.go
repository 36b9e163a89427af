package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/fenced-dev/fenced"
)

// checkTTL checks the lease terms that --ttl sets, once, with the root's
// option resolution on c (which also knows the store's TTL bounds). A
// refusal is a usage error (exit 64) that names the flag. The other flags
// of opts are checked by their commands before the store is opened.
//
// Zero is refused here: in LeaseOptions it means the library's default,
// which a flag with a default of its own must not silently become.
func checkTTL(c *fenced.Client, command string, ttl time.Duration, opts *fenced.LeaseOptions) error {
	if ttl == 0 {
		return withCode(exitUsage, fmt.Errorf("%s: --ttl %v: the lease TTL must be positive", command, ttl))
	}
	o := *opts
	o.TTL = ttl
	if _, err := c.Resolve(&o); errors.Is(err, fenced.ErrInvalidOptions) {
		return withCode(exitUsage, fmt.Errorf("%s: --ttl %v: %w", command, ttl, err))
	}
	// A store whose fence is too weak is reported by the acquisition, in
	// the command's own words (noFenceError).
	return nil
}
