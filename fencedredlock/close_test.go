package fencedredlock_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestCloseDuringAcquisitions closes drivers while acquisitions are in
// flight and one node of three is stopped, so that each attempt leaves a
// cleanup waiting for that node's reply. Close waited for those cleanups
// while attempts that began before it still started new ones: a
// WaitGroup's Add after its Wait (hog7's race report; the WaitGroup may
// also panic so). Under -race this fails when a round hits that order:
// without the fix it failed 3 of 4 runs, ten rounds of eight callers each.
func TestCloseDuringAcquisitions(t *testing.T) {
	ctx := ctxT(t)
	c := startCluster(t, 3)
	c.nodes[0].Signal(syscall.SIGSTOP)
	t.Cleanup(func() { c.nodes[0].Signal(syscall.SIGCONT) })
	opts := c.fenced(t)
	opts.Budget = 50 * time.Millisecond
	for round := range 10 {
		d := c.open(t, c.nodes, opts)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				key := fmt.Sprintf("close:%d:%d", round, i)
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = d.TryAcquire(ctx, key, owner(), time.Second)
					time.Sleep(rand.N(30 * time.Millisecond))
				}
			})
		}
		time.Sleep(120 * time.Millisecond)
		if err := d.Close(); err != nil {
			t.Logf("round %d: Close: %v", round, err)
		}
		time.Sleep(100 * time.Millisecond) // attempts begun before Close end after it
		close(stop)
		wg.Wait()
	}
}
