package fencedmysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedmysql"
)

// Open a MySQL/MariaDB lease table by URL and run work under a lease. (The
// tests set DATABASE_URL to the server they started.)
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, os.Getenv("DATABASE_URL")+"?table=example_leases", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	caps := client.Capabilities()
	fmt.Println("notified waiters:", caps.Subscribe || caps.Queue)
	err = client.Do(ctx, "invoice:inv_72", &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: 10 * time.Second},
		func(ctx context.Context, l *fenced.Lease) error {
			fmt.Println("holding with a fence:", l.Fence() > 0)
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// notified waiters: true
	// holding with a fence: true
}

// Build a driver over a *sql.DB the application already has.
func ExampleNew() {
	ctx := context.Background()
	db, err := sql.Open("mysql", os.Getenv("MYSQL_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv, err := fencedmysql.New(ctx, db, &fencedmysql.Options{Table: "example_leases"})
	if err != nil {
		log.Fatal(err)
	}
	client := fenced.NewClient(drv, nil)
	defer client.Close()
	fmt.Println("fence strength:", client.Capabilities().Fence)
	// Output: fence strength: strict
}
