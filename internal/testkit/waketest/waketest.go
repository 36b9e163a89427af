// Package waketest checks how a driver's releases wake waiting processes,
// for the backends that wake one process per release (redis, redlock,
// sqlite).
package waketest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

// Woken reports whether s is woken within the given time.
func Woken(s driver.Subscription, within time.Duration) bool {
	select {
	case <-s.C():
		return true
	case <-time.After(within):
		return false
	}
}

// OnePerRelease checks that each release wakes one of subs, a different
// one each time, until all are woken, and that one more release wakes
// none. Each sub is a waiting process's subscription, refused once so that
// it stands in the key's waiter queue. release(n) releases the key for the
// n-th time (from 0) and grants it again to a process that does not wait.
//
// passedOn, if not nil, counts the rings the store passed on to the next
// process because the rung one did not acknowledge in time (SQLite): each
// such ring may wake one process more, and every wake beyond one a
// release must be explained by one. A nil passedOn allows none.
//
// After a release it waits up to 10 s (under load) for the first wake-up.
// Then it waits 300 ms for any other, draining the woken one too. A Redlock
// process hears a release from every node whose queue it heads, coalesced
// but spread over time.
func OnePerRelease(t *testing.T, subs []driver.Subscription, release func(n int), passedOn func() int64) {
	t.Helper()
	if passedOn == nil {
		passedOn = func() int64 { return 0 }
	}
	start := passedOn()
	woken := map[int]bool{}
	for round := 0; ; round++ {
		left := len(subs) - len(woken)
		release(round)
		var woke []int
		for deadline := time.Now().Add(10 * time.Second); len(woke) == 0 && left > 0 && time.Now().Before(deadline); {
			for i, s := range subs {
				if Woken(s, 10*time.Millisecond) {
					woke = append(woke, i)
					break
				}
			}
		}
		for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
			for i, s := range subs {
				if Woken(s, time.Millisecond) && !slices.Contains(woke, i) {
					woke = append(woke, i)
				}
			}
		}
		for _, i := range woke {
			if woken[i] {
				t.Fatalf("release %d woke process %d again, which had left the queue", round+1, i)
			}
			woken[i] = true
		}
		extra := passedOn() - start
		switch {
		case left > 0 && len(woke) == 0:
			t.Fatalf("release %d woke none of the %d processes still waiting", round+1, left)
		case int64(len(woken)) > int64(round+1)+extra:
			t.Fatalf("release %d woke processes %v: %d woken in %d releases, want one each (plus %d rings passed on unacknowledged)",
				round+1, woke, len(woken), round+1, extra)
		case left == 0 && len(woke) != 0:
			t.Fatalf("release %d woke processes %v with the queue empty", round+1, woke)
		case left == 0:
			if extra > 0 {
				t.Logf("%d rings were passed on unacknowledged: the machine is busy", extra)
			}
			return
		}
	}
}

// Refused subscribes d as a waiter for key and has it refused once (the key
// must be held by someone else). So its process stands in the key's waiter
// queue. The subscription is closed when the test ends.
func Refused(t *testing.T, ctx context.Context, d driver.Driver, key string) driver.Subscription {
	t.Helper()
	s, err := d.(driver.Notifier).Subscribe(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := d.TryAcquire(ctx, key, "waiter-"+strconv.FormatInt(time.Now().UnixNano(), 36), time.Minute); !errors.Is(err,
		fenced.ErrHeld) {
		t.Fatalf("try of a held key: %v", err)
	}
	return s
}

// Grant has d take key for a new owner with a one-minute TTL (the key must
// be free). It returns the grant, for release to wake the waiters.
func Grant(t *testing.T, ctx context.Context, d driver.Driver, key string) driver.Grant {
	t.Helper()
	owner := "holder-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	f, err := d.TryAcquire(ctx, key, owner, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return driver.Grant{Key: key, Owner: owner, Fence: f, TTL: time.Minute}
}

// OnePerReleaseSpread is OnePerRelease for a store of several nodes whose
// releases each node applies, and publishes, on its own (Redlock). The
// process a release wakes hears it once from every node whose queue it
// heads. These copies are spread over as long as the slowest node takes,
// which on a busy machine is longer than any fixed wait. So which processes
// a release woke is read at the store. published(n) returns the indices of
// the subs whose process any node published the n-th release's wake-up to
// (n from 0). It returns once every node has applied that release. Each of
// len(subs) releases must have published to exactly one process, a
// different one each time. That process's subscription must be woken
// (within 10 s, under load). One more release publishes to none. A
// subscription woken again after its own release is hearing another node's
// copy of it, and is drained. published shows that no later release
// published to it. A subscription woken whose process no release has
// published to fails the test.
func OnePerReleaseSpread(t *testing.T, subs []driver.Subscription, release func(n int), published func(n int) []int) {
	t.Helper()
	rounds := len(subs)
	wokenBefore := map[int]bool{}
	for round := range rounds + 1 {
		release(round)
		pub := published(round)
		switch {
		case round < rounds && len(pub) != 1:
			t.Fatalf("release %d published a wake-up to processes %v, want exactly one", round+1, pub)
		case round < rounds && wokenBefore[pub[0]]:
			t.Fatalf("release %d woke process %d again, which had left the queue", round+1, pub[0])
		case round == rounds && len(pub) != 0:
			t.Fatalf("release %d published a wake-up to processes %v with the queue empty", round+1, pub)
		}
		if round < rounds && !Woken(subs[pub[0]], 10*time.Second) {
			t.Fatalf("release %d published a wake-up to process %d, whose subscription did not hear it within 10 s", round+1, pub[0])
		}
		for _, i := range pub {
			wokenBefore[i] = true
		}
		for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); {
			for i, s := range subs {
				if Woken(s, time.Millisecond) && !wokenBefore[i] {
					t.Fatalf("release %d: process %d was woken, but no release published a wake-up to it", round+1, i)
				}
			}
		}
	}
}
