package fencedetcd

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
)

var _ driver.ObserveNotifier = (*Driver)(nil)

// observeSetup bounds how long SubscribeObserver waits for the server to
// set its watch up.
const (
	observeSetup = 5 * time.Second
	// A failed watch is set up again after observeRetry, doubling up
	// to observeRetryMax.
	observeRetry    = 250 * time.Millisecond
	observeRetryMax = 2 * time.Second
)

// SubscribeObserver implements driver.ObserveNotifier with a watch on the
// key's waiter keys. Every delete wakes the observer: a release, a break,
// an expired session or a reaped grant. Waiters watch their predecessor's
// key, not this one, so an observer never takes a waiter's wake-up.
//
// It returns once the server has set the watch up, so a delete after it
// returns wakes the observer. A watch that fails later (no leader, a lost
// connection) wakes the observer once, since it may have missed a delete,
// and is set up again until ctx ends, Close is called or the driver is
// closed.
func (d *Driver) SubscribeObserver(ctx context.Context, key string) (driver.Subscription, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, fenced.ErrClosed
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.ctx, cancel) // the driver's Close ends it too
	pfx := d.LockName(key) + "/"
	wch := d.cli.Watch(clientv3.WithRequireLeader(wctx), pfx, clientv3.WithPrefix(), clientv3.WithFilterPut(),
		clientv3.WithCreatedNotify())
	t := time.NewTimer(observeSetup)
	defer t.Stop()
	var err error
	select {
	case wr, ok := <-wch:
		switch {
		case !ok:
			err = fenced.ErrUnavailable
		case wr.Err() != nil:
			err = wr.Err()
		case !wr.Created:
			err = fmt.Errorf("%w: the watch's first answer was not its creation", fenced.ErrUnavailable)
		}
	case <-t.C:
		err = fmt.Errorf("%w: no watch set up within %v", fenced.ErrUnavailable, observeSetup)
	}
	if err != nil {
		stop()
		cancel()
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, readErr("observe "+strconv.Quote(key), err)
	}
	o := &observer{c: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer stop()
		o.run(wctx, d.cli, pfx, wch)
	}()
	return o, nil
}

// observer is one SubscribeObserver subscription.
type observer struct {
	c      chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// C implements driver.Subscription.
func (o *observer) C() <-chan struct{} { return o.c }

// Close implements driver.Subscription: it ends the watch and waits for
// its goroutine.
func (o *observer) Close() error {
	o.once.Do(o.cancel)
	<-o.done
	return nil
}

// wake signals C without blocking: one pending wake-up covers many deletes.
func (o *observer) wake() {
	select {
	case o.c <- struct{}{}:
	default:
	}
}

// run forwards the deletes of wch, a watch of pfx, and sets the watch up
// again after it fails, until ctx ends.
func (o *observer) run(ctx context.Context, cli *clientv3.Client, pfx string, wch clientv3.WatchChan) {
	defer close(o.done)
	pause := observeRetry
	for {
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			pause = observeRetry
			if len(wr.Events) > 0 {
				o.wake()
			}
		}
		if ctx.Err() != nil {
			return
		}
		o.wake()
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, observeRetryMax)
		wch = cli.Watch(clientv3.WithRequireLeader(ctx), pfx, clientv3.WithPrefix(), clientv3.WithFilterPut())
	}
}
