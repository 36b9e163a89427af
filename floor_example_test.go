package fenced_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/mem"
	_ "github.com/fenced-dev/fenced/sqlite"
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
	info, err := old.FenceFloor(ctx)
	if err != nil {
		log.Fatal(err)
	}

	moved, err := fenced.Open(ctx, file+"?table=leases_v2", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer moved.Close()
	floor, err := moved.RaiseFenceFloor(ctx, max(info.Floor, info.MaxFence))
	if err != nil {
		log.Fatal(err)
	}
	l, err := moved.TryAcquire(ctx, "invoice:inv_72", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	fmt.Println("old table's highest fence:", info.MaxFence, "new floor:", floor, "next fence:", l.Fence())
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
	res, err := client.Prune(ctx, 30*24*time.Hour)
	if err != nil {
		log.Fatal(err)
	}
	l, err := client.TryAcquire(ctx, "report:2024", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	fmt.Println("pruned:", res.Deleted, "floor:", res.Floor, "next fence:", l.Fence())
	// Stores that keep no row per key (Redis, etcd, ZooKeeper) have nothing
	// to prune and return ErrUnsupported.
	// Output: pruned: 1 floor: 2 next fence: 3
}
