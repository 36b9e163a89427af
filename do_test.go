package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/mem"
)

// TestDoTellsFinishedWorkFromUnfinished: when the lease ends while fn
// runs, Do's error says whether fn finished. Before, Do joined fn's error
// with the loss, so "committed, then lost" and "lost before writing" gave
// the same error when fn reported the loss as its own error.
func TestDoTellsFinishedWorkFromUnfinished(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1000, 0))
	c := fenced.NewClient(mem.New(&mem.Options{Clock: clk}), &fenced.Options{Clock: clk})
	defer c.Close()
	opts := &fenced.LeaseOptions{TTL: 10 * time.Second, ManualRenew: true}
	stall := func(ctx context.Context) {
		clk.Advance(time.Minute)
		<-ctx.Done()
	}

	committed := c.Do(ctx, "k", opts, func(ctx context.Context, l *fenced.Lease) error {
		stall(ctx) // the commit happened before the stall
		return nil
	})
	var ended *fenced.LeaseEndedError
	if !errors.As(committed, &ended) || ended.WorkErr != nil || !strings.Contains(committed.Error(), `do "k"`) || ended.Fence != 1 ||
		!errors.Is(ended.Cause, fenced.ErrExpired) || !fenced.IsLost(committed) || !errors.Is(committed, fenced.ErrExpired) {
		t.Fatalf("work finished, then lost: %#v (%v)", ended, committed)
	}

	boom := errors.New("write refused")
	unfinished := c.Do(ctx, "k", opts, func(ctx context.Context, l *fenced.Lease) error {
		stall(ctx)
		return fmt.Errorf("guarded write: %w (%w)", boom, context.Cause(ctx))
	})
	ended = nil
	if !errors.As(unfinished, &ended) || ended.WorkErr == nil || ended.Fence != 2 || !errors.Is(unfinished, boom) || !fenced.IsLost(unfinished) {
		t.Fatalf("lost before the work finished: %#v (%v)", ended, unfinished)
	}
	if committed.Error() == unfinished.Error() {
		t.Fatalf("the two outcomes read the same: %v", committed)
	}

	// Without a loss fn's error comes back as it is.
	plain := c.Do(ctx, "k", opts, func(context.Context, *fenced.Lease) error { return boom })
	if plain != boom {
		t.Fatalf("fn error without a loss: %v", plain)
	}
}

func TestIsLost(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("renew: %w", fenced.ErrLost), true},
		{fmt.Errorf("%w: no renewal confirmed in time", fenced.ErrExpired), true},
		{&fenced.LeaseEndedError{Cause: fenced.ErrLost}, true},
		{fenced.ErrReleased, false},
		{fenced.ErrClosed, false},
		{fenced.ErrStaleFence, false},
		{fenced.ErrHeld, false},
		{context.Canceled, false},
		{nil, false},
	} {
		if got := fenced.IsLost(tc.err); got != tc.want {
			t.Errorf("IsLost(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
