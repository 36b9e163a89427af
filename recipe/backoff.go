package recipe

import (
	"math/rand/v2"
	"time"

	"github.com/fenced-dev/fenced"
)

// backoff returns how long a recipe's poller sleeps before attempt n (from
// 0): full jitter under a cap that doubles from o.MinBackoff up to
// o.MaxBackoff, the rule the client polls by (Options.MinBackoff).
func backoff(o fenced.Options, n int) time.Duration {
	lo, hi := o.MinBackoff, o.MaxBackoff
	ceil := lo << min(n, 20)
	if ceil > hi || ceil <= 0 {
		ceil = hi
	}
	return lo/2 + rand.N(ceil)
}
