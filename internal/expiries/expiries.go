// Package expiries keeps the Expiry each backend registers beside its URL
// opener (fenced.RegisterExpiry), for tools that figure without a
// connection (fenced plan, the dashboard of fenced serve).
package expiries

import (
	"maps"
	"sync"

	"github.com/fenced-dev/fenced/driver"
)

var (
	mu  sync.Mutex
	all = map[string]driver.Expiry{}
)

// Register records e as the Expiry of scheme.
func Register(scheme string, e driver.Expiry) {
	mu.Lock()
	defer mu.Unlock()
	all[scheme] = e
}

// All returns the registered Expiry of every scheme.
func All() map[string]driver.Expiry {
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(all)
}
