package main

import (
	"context"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

// openRueidislock is a process of rueidislock (rueidis's lock) over its
// own rueidis client to addr. majority is its KeyMajority: 0 keeps the
// default (2 of 3 keys on the one server), 1 is one key. Its locks are
// extended by its own goroutines while held; waiters wake on client-side
// caching invalidations. It gives no fence.
func openRueidislock(addr string, majority int32) (process, error) {
	l, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: rueidis.ClientOption{InitAddress: []string{addr}, DisableRetry: true},
		KeyMajority:  majority,
	})
	if err != nil {
		return nil, err
	}
	lock := func(ctx context.Context, key string) (func(context.Context) error, error) {
		_, cancel, err := l.WithContext(ctx, key)
		if err != nil {
			return nil, err
		}
		// cancel releases every key and returns once they are deleted.
		return func(context.Context) error { cancel(); return nil }, nil
	}
	return clientProcess{l: lockFunc(lock), closers: []func() error{func() error { l.Close(); return nil }}}, nil
}
