package proof

import (
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedetcd"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
)

// unwatchedEtcd is an etcd driver whose loss watch the Client cannot see:
// the field hides the driver's WatchLoss method, so the type implements
// every other interface of *fencedetcd.Driver but not
// driver.LossWatcher. A generative worker over it learns of a break or a
// reaped grant from its renewals alone, so a renewal that reports held a
// key that is gone shows as a lease outliving its break or as two owners
// at once (with the watch on, the watch reports such a loss first and
// hides the renewal's mistake).
type unwatchedEtcd struct {
	*fencedetcd.Driver
	WatchLoss struct{}
}

// withoutLossWatch returns a Client over c's driver with its loss watch
// hidden, if c's driver has one the proof knows how to hide (etcd), else
// c. The returned Client owns the driver; c must not be closed.
func withoutLossWatch(c *fenced.Client, opts *fenced.Options) (*fenced.Client, bool) {
	d, ok := rootaccess.Driver(c).(*fencedetcd.Driver)
	if !ok {
		return c, false
	}
	return fenced.NewClient(&unwatchedEtcd{Driver: d}, opts), true
}
