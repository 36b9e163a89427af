package driver

import "context"

// ObserveNotifier is implemented by Notifiers that can wake a watcher of a
// key that never tries for it (an election observer) without counting it as
// a waiter. An observer's subscription is woken by every release or break
// the driver learns of. It must never take the wake-up meant for a waiter.
// Some backends wake one waiter per release (a head-of-line connection, one
// pub/sub wake-up per process). There an observer subscribed through
// Subscribe would be that one waiter, and the candidates would sleep until
// their fallback timers.
//
// The portable layer's observers use SubscribeObserver where a driver
// implements it. Otherwise they read the store on a timer. They never
// call Subscribe.
type ObserveNotifier interface {
	SubscribeObserver(ctx context.Context, key string) (Subscription, error)
}
