package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	_ "github.com/fenced-dev/fenced/mem"
)

// Keys moved to a new table start their counters again; seeding the new
// table's floor with the old table's highest fence keeps every key above
// the fences its resources have seen.
func ExampleClient_RaiseFenceFloor() {
	dir, _ := os.MkdirTemp("", "fenced-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	file := "sqlite://" + filepath.Join(dir, "leases.db")

	old, err := fenced.Open(ctx, file+"?table=leases", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer old.Close()
	for range 3 {
		l, err := old.TryAcquire(ctx, "invoice:inv_72", nil)
		if err != nil {
			log.Fatal(err)
		}
		l.Release(ctx)
	}
	oldFloor, oldMax, err := old.FenceFloor(ctx)
	if err != nil {
		log.Fatal(err)
	}

	moved, err := fenced.Open(ctx, file+"?table=leases_v2", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer moved.Close()
	floor, err := moved.RaiseFenceFloor(ctx, max(oldFloor, oldMax))
	if err != nil {
		log.Fatal(err)
	}
	l, err := moved.TryAcquire(ctx, "invoice:inv_72", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	fmt.Println("old table's highest fence:", oldMax, "new floor:", floor, "next fence:", l.Fence())
	// Output: old table's highest fence: 3 new floor: 3 next fence: 4
}

// Prune deletes the rows of keys nobody used for a while; the floor keeps
// a pruned key's next fence above its old ones.
func ExampleClient_Prune() {
	dir, _ := os.MkdirTemp("", "fenced-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	client, err := fenced.Open(ctx, "sqlite://"+filepath.Join(dir, "leases.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	for range 2 {
		l, err := client.TryAcquire(ctx, "report:2024", nil)
		if err != nil {
			log.Fatal(err)
		}
		l.Release(ctx)
	}
	deleted, floor, err := client.Prune(ctx, 30*24*time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	l, err := client.TryAcquire(ctx, "report:2024", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	fmt.Println("pruned:", deleted, "floor:", floor, "next fence:", l.Fence())
	// Stores that keep no row per key (Redis, etcd, ZooKeeper) have nothing
	// to prune and return ErrUnsupported.
	// Output: pruned: 1 floor: 2 next fence: 3
}

// An operator lists the held leases, breaks a wedged holder's lease and
// reads the audit log. The holder's next renewal is refused, and the next
// grant of the key gets a higher fence.
func ExampleClient_Break() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, "mem://example-break", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.TryAcquire(ctx, "job:nightly", nil); err != nil {
		log.Fatal(err)
	}

	held, err := client.List(ctx, "job:")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held:", held[0].Key, "fence", held[0].Fence)

	broken, err := client.Break(ctx, "job:nightly", "host wedged, OPS-12", "alice")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("broke fence", broken.Fence)

	recs, err := client.Breaks(ctx, "job:nightly")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("audit: %s broke %s: %s\n", recs[0].By, recs[0].Key, recs[0].Reason)

	_, err = client.Break(ctx, "job:nightly", "again", "alice")
	fmt.Println("nothing held:", errors.Is(err, fenced.ErrNotHeld))
	// Output:
	// held: job:nightly fence 1
	// broke fence 1
	// audit: alice broke job:nightly: host wedged, OPS-12
	// nothing held: true
}
