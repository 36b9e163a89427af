// Package recipe builds coordination on fenced leases: leader election
// (Election), a counting semaphore (Semaphore) and several keys taken at
// once (AcquireAll).
//
// Every recipe is leases underneath, so it has the guarantees of a lease on
// its backend. An election's epoch is its lease's fence. Each permit is a
// lease of its own. AcquireAll takes its keys in one canonical order, all or
// nothing.
//
// The package uses only the public API of package fenced (and its driver
// capabilities): Client.Clock, Client.Backoff, Client.CloseTimeout and
// Client.Closing besides leases. Its tests check that, so a recipe of your
// own can be written the same way. docs/recipes.md gives each recipe's
// guarantees per backend.
package recipe
