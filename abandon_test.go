package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/mem"
)

// replyLost grants at the store but never tells its caller so: after the
// grant it waits for the caller's context to end (hang), or fails with an
// unknown outcome.
type replyLost struct {
	*mem.Driver
	hang bool
	// late, when set, makes the request hang without granting and the
	// store apply it late after the caller's context ended (a statement
	// that ran on after its client had gone).
	late time.Duration
}

func (d replyLost) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if d.late > 0 {
		<-ctx.Done()
		time.AfterFunc(d.late, func() { d.Driver.TryAcquire(context.Background(), key, owner, ttl) })
		return 0, ctx.Err()
	}
	if _, err := d.Driver.TryAcquire(context.Background(), key, owner, ttl); err != nil {
		return 0, err
	}
	if d.hang {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return 0, fmt.Errorf("reply lost: %w", fenced.ErrUnknownOutcome)
}

// TestGrantWhoseCallerHasGoneIsReleased makes grants whose acquisition
// never learns of them: the caller's context ends while the grant's reply
// is outstanding, or every attempt's outcome is unknown. The client must
// release such a grant (found by its owner token) at once, not leave it
// to hold the key for its whole TTL.
func TestGrantWhoseCallerHasGoneIsReleased(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := mem.NewStore(nil)
	other := fenced.NewClient(store.Driver(), nil)
	defer other.Close()
	for _, hang := range []bool{true, false} {
		c := fenced.NewClient(replyLost{Driver: store.Driver(), hang: hang}, &fenced.Options{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
		actx, acancel := context.WithCancel(ctx)
		time.AfterFunc(20*time.Millisecond, acancel)
		_, err := c.Acquire(actx, "k", &fenced.LeaseOptions{TTL: time.Hour, MaxWait: time.Minute})
		acancel()
		if err == nil {
			t.Fatal("acquire through a driver that never confirms succeeded")
		}
		if hang && !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled acquire: %v, want context.Canceled", err)
		}
		deadline := time.Now().Add(2 * time.Second)
		for {
			l, err := other.TryAcquire(ctx, "k", &fenced.LeaseOptions{TTL: time.Hour})
			if err == nil {
				l.Release(ctx)
				break
			}
			if time.Now().After(deadline) {
				info, _ := other.Inspect(ctx, "k")
				t.Fatalf("hang=%v: the grant whose caller had gone still holds the key 2s later (%+v): %v", hang, info, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGrantAppliedLateIsReleased: the store applies a cancelled
// acquisition's request 1.5 s after the caller gave up, after abandon's
// first looks. The grant must still be found and released soon after, not
// hold the key for its hour-long TTL. (With looks only in the first second,
// it held the key until the TTL ran out.)
func TestGrantAppliedLateIsReleased(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store := mem.NewStore(nil)
	other := fenced.NewClient(store.Driver(), nil)
	defer other.Close()
	const late = 1500 * time.Millisecond
	c := fenced.NewClient(replyLost{Driver: store.Driver(), late: late}, nil)
	defer c.Close()
	actx, acancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err := c.Acquire(actx, "k", &fenced.LeaseOptions{TTL: time.Hour, MaxWait: time.Minute})
	acancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire: %v, want context.DeadlineExceeded", err)
	}
	gaveUp := time.Now()
	var seen, freed time.Duration
	for freed == 0 {
		info, err := other.Inspect(ctx, "k")
		if err != nil && !errors.Is(err, fenced.ErrNotFound) {
			t.Fatal(err)
		}
		switch since := time.Since(gaveUp); {
		case info.Held && seen == 0:
			seen = since
		case !info.Held && seen > 0:
			freed = since
		case since > late+5*time.Second:
			t.Fatalf("late grant seen at %v (%+v), still held %v after the acquire gave up", seen, info, since)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The look after the late grant comes at 2 s (looks double after the
	// first second), so the grant stands about half a second.
	if freed-seen > 2*time.Second {
		t.Fatalf("late grant seen at %v, released at %v: held %v", seen, freed, freed-seen)
	}
	t.Logf("late grant seen %v after the acquire gave up, released at %v", seen.Round(time.Millisecond), freed.Round(time.Millisecond))
}
