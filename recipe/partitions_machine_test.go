package recipe_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
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

// probeEvery is how often a lateSampler probes the store. Each probe is
// two writes: on SQLite under -race beside a CPU hog a write holds the
// file's write lock for 50 to 150 ms (fsync included), so a probe every
// 200 ms was itself half the writes of a group of four members (whose
// renewals come every TTL/3), and queued their renewals past the TTL.
const probeEvery = time.Second

// lateSampler measures, until stopped, the delays the run sees: how late
// a timer fires (scheduling, testenv.Lateness), and, with a client, how
// long a round trip to the store takes (a TryAcquire and a Release of a
// probe key every probeEvery: on a SQL store, the wait for its write lock
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
			case <-time.After(probeEvery):
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

// measureProofTTL measures the machine for about two seconds through
// proofMembers+1 clients of the store (one for each member process and the
// test's sampler) and returns the TTL the proof's members use (machineTTL
// from proofTTL). A lone probe misses the wait for a SQL store's write
// lock behind the other members: on SQLite under -race beside a CPU hog a
// lone probe took 240 ms while renewals beside four other clients took up
// to 1.4 s.
func measureProofTTL(t *testing.T, store string) (ttl, worst time.Duration) {
	t.Helper()
	cs := make([]*fenced.Client, proofMembers+1)
	for i := range cs {
		c, err := fenced.Open(context.Background(), store, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cs[i] = c
	}
	return machineTTL(t, cs, proofTTL)
}

// machineTTL measures the store through one of cs alone, then through all
// of cs at once (measureDelay), and returns the TTL: quiet, or 8 times the
// lone worst delay, or 3 times the worst with every client probing,
// whichever is most; and the worst delay measured. The lone rule was the
// proof's before (a renewal must land within 2/3 TTL, behind the others'
// statements, which a lone probe does not see: on PostgreSQL they barely
// slow it); the contended one covers SQLite's write lock.
func machineTTL(t *testing.T, cs []*fenced.Client, quiet time.Duration) (ttl, worst time.Duration) {
	t.Helper()
	lone := measureDelay(t, cs[:1])
	all := measureDelay(t, cs)
	return clampTTL(max(quiet, 8*lone, 3*all)), max(lone, all)
}

// measureDelay measures the machine for about a second: the worst of a
// timer's lateness and a round trip to the store, each client probing at
// once (a TryAcquire and a Release of a probe key of its own, each a write
// on a SQL store, then 20 ms of rest): with several clients, the round
// trip includes the wait for a SQL store's write lock behind the others.
func measureDelay(t *testing.T, cs []*fenced.Client) (worst time.Duration) {
	t.Helper()
	s := startLateSampler(nil)
	worst = drivertest.SlowestGrant(t, cs...)
	s.Stop()
	return max(worst, s.Max())
}

// clampTTL rounds ttl up to 100 ms and caps it at proofMaxTTL.
func clampTTL(ttl time.Duration) time.Duration {
	return min((ttl + 99*time.Millisecond).Truncate(100*time.Millisecond), proofMaxTTL)
}
