package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedsqlite"
)

// Backoff between two opens of a busy store: it doubles from the first to
// the most, with a random part so that followers that started together
// do not come back together.
const (
	busyFirstRetry = 100 * time.Millisecond
	busyMostRetry  = 2 * time.Second
)

// openWaiting opens the store as g.open does, but while the store answers
// that it is busy (fencedsqlite.ErrBusy: other processes held the lease
// file's locks past its busy timeout, as processes that start together on
// a loaded machine do) it opens again, with backoff, until ctx ends, and
// says on stderr, once, why it waits. Any other error is returned at once:
// a bad URL, a permission or a foreign file does not pass by waiting. When
// ctx ends first, the error is the store's last, naming how long it
// waited; its exit code is 69, as for an open that gave up at once.
func (g *globals) openWaiting(ctx context.Context, command string) (*fenced.Client, error) {
	g.noteStore()
	began := time.Now()
	backoff := busyFirstRetry
	var busy error // the store's last answer that it is busy
	gaveUp := func(tries int) error {
		return fmt.Errorf("%w (waited %v for the busy store, %d opens: %v)",
			busy, time.Since(began).Round(time.Millisecond), tries, context.Cause(ctx))
	}
	for tries := 1; ; tries++ {
		c, err := fenced.Open(ctx, g.store, nil)
		if err != nil && busy != nil && ctx.Err() != nil {
			return nil, gaveUp(tries) // this open was cut short by the end of the wait
		}
		if err == nil || !errors.Is(err, fencedsqlite.ErrBusy) {
			return c, err
		}
		busy = err
		switch {
		case tries == 1:
			fmt.Fprintf(g.stderr, "fenced: %s: the store is busy, opening it again until it answers or the wait ends: %v\n",
				command, err)
		case g.verbose:
			fmt.Fprintf(g.stderr, "fenced: %s: the store is still busy after %v (%d opens)\n",
				command, time.Since(began).Round(time.Millisecond), tries)
		}
		pause := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return nil, gaveUp(tries)
		case <-time.After(pause):
		}
		backoff = min(2*backoff, busyMostRetry)
	}
}

// openForRun opens the store for fenced run. With --wait, a busy store is
// waited for (see openWaiting) within the wait, and opts.MaxWait becomes
// what is left of it, so that the open and the lease's wait together last
// no longer than --wait; a signal ends the wait. Without --wait, the store
// is opened once, as the key is tried once.
func openForRun(ctx context.Context, g *globals, f *runFlags, opts *fenced.LeaseOptions,
	sigs <-chan os.Signal) (*fenced.Client, error) {
	if f.wait == 0 {
		return g.open(ctx)
	}
	deadline := time.Now().Add(f.wait)
	openCtx, stopOpen := interruptible(ctx, sigs, "the store")
	openCtx, cancel := context.WithDeadlineCause(openCtx, deadline,
		fmt.Errorf("--wait %v ran out", f.wait))
	c, err := g.openWaiting(openCtx, "run")
	cancel()
	if sig := stopOpen(); sig != nil && err == nil {
		c.Close()
		return nil, fmt.Errorf("interrupted by %v while opening the store; nothing ran", sig)
	}
	if err != nil && !time.Now().Before(deadline) && !errors.Is(err, fenced.ErrUnavailable) {
		// Cut short by the wait's end (the store's answer is an unknown
		// outcome then): the store did not answer within --wait.
		return nil, withCode(exitUnavailable, fmt.Errorf("--wait %v ran out while opening the store; nothing ran: %w", f.wait, err))
	}
	if err != nil {
		return nil, err
	}
	opts.MaxWait = max(time.Until(deadline), time.Millisecond)
	return c, nil
}
