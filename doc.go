// Package fenced grants leases on keys with fencing tokens, keeps them
// renewed, and cancels the holder's work the moment a lease is lost.
//
// Three parties take part in every protected operation:
//
//   - the authority (a store the user already runs) grants a lease on a key
//     for a limited time, with a fence: a uint64 that strictly increases on
//     every grant of that key and is never reissued;
//   - the worker holds a *Lease: fenced renews it, measures its validity on
//     the local monotonic clock, and cancels Lease.Context with a cause when
//     the lease is lost or can no longer be trusted;
//   - the protected resource receives the fence with every write and refuses
//     writes from an older generation (package fence has guards for SQL,
//     Redis, etcd and HTTP). A paused process cannot be stopped by any
//     client-side check; only the resource can refuse it.
//
// Stores are opened by URL, like database/sql, after importing the backend
// package for its side effect:
//
//	import _ "github.com/fenced-dev/fenced/fencedsqlite"
//
//	client, err := fenced.Open(ctx, "sqlite:///var/lib/app/leases.db", nil)
//
// The backends in this module and their schemes: mem (mem:), sqlite
// (sqlite:), postgres (postgres:, postgresql:), mysql (mysql:), redis
// (redis:, rediss:), redlock (redlock:), etcd (etcd:), zookeeper (zk:) and
// dynamodb (dynamodb:). The root package imports none of them; Open on a
// scheme whose package is not linked in says so and lists the registered
// ones.
//
// Every backend declares what it guarantees in its Capabilities (fence
// strength, whose clock decides expiry, whether a clock step is safe). A lease is refused on a
// backend whose fence is weaker than its LeaseOptions.MinFence. That is
// strict unless the lease (or Options.MinFence) names a weaker one:
// FenceRepeatable, or FenceNone for work that needs no fence. Only a lease
// that accepts no fence may FailOpen.
//
// # Recipes
//
// Package recipe builds election, semaphore and multi-key locking on the
// public API of this package only, so users can write recipes of their
// own the same way. Client.Options, Client.Capabilities, Client.List,
// Client.Watch and Client.Value with Lease.SetValue are what it needs
// besides leases.
//
// # Operators
//
// Client.List, Client.Break, Client.Breaks, Client.FenceFloor,
// Client.RaiseFenceFloor and Client.Prune are the operator's side of a
// store. Operations a store lacks return ErrUnsupported.
//
// # Errors
//
// Errors match the sentinels below with errors.Is and are wrapped once with
// the operation and key. ErrHeld and ErrNotHeld are refusals; ErrUnavailable
// means nothing reached the authority; ErrUnknownOutcome means a request may
// or may not have been applied.
package fenced
