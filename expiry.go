package fenced

import (
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/expiries"
)

// RegisterExpiry records how the backend of scheme rounds TTLs, beside its
// opener (Register). `fenced plan` and the dashboard of `fenced serve`
// figure with it without connecting. A backend registers the same Expiry
// its driver rounds with.
func RegisterExpiry(scheme string, e driver.Expiry) { expiries.Register(scheme, e) }
