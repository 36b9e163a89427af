package recipe_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// What the partitions proof measures of its machine, so that its time
// bounds follow the machine rather than a quiet one's figures. Under a
// load of 35-45 on 2 cores (other builds and tests beside a -race run) a
// single SQLite statement was seen to take 2.1 s: with a 1 s TTL every
// member's membership then lapsed every 1 to 4 s ("renew batch: outcome
// unknown: context deadline exceeded"), on the code before and after the
// count check alike, and no group can settle. The TTL must be long enough
// for the machine to renew in time, and the liveness bounds follow it.
// The safety checks (no stale write accepted, fences never go down) do
// not depend on any of this.

// proofMaxTTL caps the measured TTL: a machine slower than this fails the
// liveness checks, as it should.
const proofMaxTTL = 8 * time.Second

// lateSampler measures, until stopped, the delays the run sees: how late
// a timer fires (scheduling, testenv.Lateness), and, with a client, how
// long a round trip to the store takes (a TryAcquire and a Release of a
// probe key every 200 ms: on a SQL store, the wait for its write lock
// that every member's grant and renewal sees too).
type lateSampler struct {
	timer *testenv.Lateness
	mu    sync.Mutex
	store time.Duration
	stop  chan struct{}
	done  chan struct{}
}

func startLateSampler(c *fenced.Client) *lateSampler {
	s := &lateSampler{timer: testenv.SampleLateness(), stop: make(chan struct{}), done: make(chan struct{})}
	if c == nil {
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		ctx := context.Background()
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			at := time.Now()
			l, err := c.TryAcquire(ctx, "proof-probe", &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceNone})
			if err == nil {
				l.Release(ctx)
			}
			s.mu.Lock()
			s.store = max(s.store, time.Since(at))
			s.mu.Unlock()
		}
	}()
	return s
}

// Max returns the worst delay seen so far.
func (s *lateSampler) Max() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.store, s.timer.Max())
}

// Stop ends the sampling.
func (s *lateSampler) Stop() {
	close(s.stop)
	<-s.done
	s.timer.Stop()
}

// measureProofTTL measures the machine for about a second: the worst of a
// timer's lateness and a round trip to the store (a TryAcquire and a
// Release of a probe key, each a write on a SQL store), and returns the
// TTL the proof's members use: proofTTL on a quiet machine, else 8 times
// that worst delay (a renewal is due every TTL/3 and must land within the
// remaining 2/3 TTL, behind the other members' statements), rounded up to
// 100 ms and capped at proofMaxTTL.
func measureProofTTL(t *testing.T, c *fenced.Client) (ttl, worst time.Duration) {
	t.Helper()
	s := startLateSampler(nil)
	ctx := context.Background()
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		at := time.Now()
		l, err := c.TryAcquire(ctx, "proof-probe", &fenced.LeaseOptions{TTL: time.Minute, MinFence: fenced.FenceNone})
		if err == nil {
			err = l.Release(ctx)
		}
		if err != nil {
			t.Fatalf("probing the store: %v", err)
		}
		worst = max(worst, time.Since(at))
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	worst = max(worst, s.Max())
	ttl = max(proofTTL, 8*worst)
	ttl = min((ttl + 99*time.Millisecond).Truncate(100*time.Millisecond), proofMaxTTL)
	return ttl, worst
}
