package fencedredlock

// Finishing a release that a node did not confirm within the budget.

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/redis/go-redis/v9"
)

// releaseRetryMax caps the pause between two tries of an unconfirmed
// release on one node.
const releaseRetryMax = time.Second

// finishRelease sends the release of value on one node again, in the
// background, until the node answers, the grant's TTL from now has passed
// (it has expired there by then), or d closes. A release that ran out of
// budget on a loaded node would otherwise leave the grant in place until
// it expires: with a majority so blocked, every waiter waits for the TTL.
// The script deletes value only, so a late try never touches another
// grant.
func (d *Driver) finishRelease(c redis.UniversalClient, k rediskit.Keys, value string, ttl time.Duration) {
	d.bgMu.Lock()
	defer d.bgMu.Unlock()
	if d.bgClosed {
		return
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), ttl)
		defer cancel()
		pause := 10 * time.Millisecond
		for {
			t := time.NewTimer(rand.N(pause) + pause/2)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			case <-d.closed:
				t.Stop()
				return
			}
			rctx, rcancel := context.WithTimeout(ctx, 4*d.opts.Budget)
			err := rediskit.Release.Run(rctx, c, []string{k.Lock, k.Waiters}, value, k.Channel).Err()
			rcancel()
			if err == nil {
				return
			}
			pause = min(2*pause, releaseRetryMax)
		}
	}()
}
