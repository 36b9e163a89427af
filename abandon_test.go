package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/mem"
)

// replyLost grants at the store but never tells its caller so: after the
// grant it waits for the caller's context to end (hang), or fails with an
// unknown outcome.
type replyLost struct {
	*mem.Driver
	hang bool
}

func (d replyLost) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if _, err := d.Driver.TryAcquire(context.Background(), key, owner, ttl); err != nil {
		return 0, err
	}
	if d.hang {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return 0, fmt.Errorf("reply lost: %w", driver.ErrUnknownOutcome)
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
