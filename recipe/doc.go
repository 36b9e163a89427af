// Package recipe builds coordination on fenced leases: leader election
// (Election), a counting semaphore (Semaphore), several keys taken at once
// (AcquireAll) and partitioned ownership (JoinPartitions: P partitions
// shared among the live members of a group, each partition a lease with
// its own fence).
//
// Every recipe is leases underneath, so it has the guarantees of a lease on
// its backend. An election's epoch is its lease's fence. Each permit is a
// lease of its own. AcquireAll takes its keys in one canonical order, all or
// nothing. A partition changes owner only through a release or an expiry,
// and its fence rises each time.
//
// The package imports only package fenced (never its driver package) and
// uses its public API: leases, Client.Options, Client.Capabilities (what
// the store can do, and how long it keeps a dead holder's grant),
// Client.List, Client.Watch, and Client.Value with Lease.SetValue. Its
// tests check that, so a recipe of your own can be written the same way. docs/recipes.md gives each recipe's guarantees per
// backend.
package recipe
