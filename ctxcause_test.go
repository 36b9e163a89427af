package fenced_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/mem"
)

// TestAcquireSaysWhyItsContextEnded checks that an acquisition whose
// context was cancelled with a cause, before or while it waits, returns
// an error that says the cause and still matches context.Canceled.
func TestAcquireSaysWhyItsContextEnded(t *testing.T) {
	c, err := fenced.Open(context.Background(), "mem://cause", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	why := errors.New("interrupted by terminated while waiting for the lease")
	for _, held := range []bool{false, true} {
		if held {
			l, err := c.Acquire(context.Background(), "k", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(context.Background())
		}
		ctx, cancel := context.WithCancelCause(context.Background())
		if !held {
			cancel(why) // before the call
		} else {
			go func() { cancel(why) }() // while it waits
		}
		_, err := c.Acquire(ctx, "k", &fenced.LeaseOptions{MaxWait: fenced.WaitForever})
		if !errors.Is(err, context.Canceled) || !errors.Is(err, why) || !strings.Contains(err.Error(), why.Error()) {
			t.Fatalf("held %v: Acquire after cancel(cause) = %v; want an error matching context.Canceled and the cause, saying it", held, err)
		}
	}
}
