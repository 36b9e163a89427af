package fenced

import (
	"sync"

	"github.com/fenced-dev/fenced/driver"
)

var (
	expiryMu sync.Mutex
	expiries = map[string]driver.Expiry{}
)

// RegisterExpiry records how the backend of scheme rounds TTLs, beside its
// opener (Register): `fenced plan` and the dashboard of `fenced serve`
// figure with it without connecting. A backend registers the same Expiry
// its driver rounds with.
func RegisterExpiry(scheme string, e driver.Expiry) {
	expiryMu.Lock()
	defer expiryMu.Unlock()
	expiries[scheme] = e
}

// Expiries returns the registered Expiry of every scheme.
func Expiries() map[string]driver.Expiry {
	expiryMu.Lock()
	defer expiryMu.Unlock()
	out := make(map[string]driver.Expiry, len(expiries))
	for k, v := range expiries {
		out[k] = v
	}
	return out
}
