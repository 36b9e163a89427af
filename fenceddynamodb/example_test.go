package fenceddynamodb_test

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fenceddynamodb"
)

// Open a DynamoDB lease table by URL and run work under a lease, passing
// its fence to the protected write. In production the URL is
// dynamodb:///TABLE?region=R with the AWS default credentials; the tests
// set FENCED_DYNAMODB_URL to the local server they started.
func Example() {
	ctx := context.Background()
	client, err := fenced.Open(ctx, os.Getenv("FENCED_DYNAMODB_URL"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	g := client.Capabilities()
	fmt.Println("fence:", g.Fence, "server clock:", g.ServerClock)

	// A waiter can take over a dead holder only after watching it for a
	// whole TTL: give MaxWait at least the TTL.
	err = client.Do(ctx, "invoice:inv_72", &fenced.LeaseOptions{TTL: 30 * time.Second, MaxWait: time.Minute},
		func(ctx context.Context, l *fenced.Lease) error {
			// Every write to the protected resource carries l.Fence().
			fmt.Println("holding with a fence:", l.Fence() > 0)
			return nil
		})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// fence: strict server clock: false
	// holding with a fence: true
}

// Build a driver over a DynamoDB client the application already has.
func ExampleNew() {
	ctx := context.Background()
	u, err := url.Parse(os.Getenv("FENCED_DYNAMODB_URL"))
	if err != nil {
		log.Fatal(err)
	}
	// With the AWS default chain: cfg, _ := config.LoadDefaultConfig(ctx);
	// db := awsdynamodb.NewFromConfig(cfg).
	db := awsdynamodb.New(awsdynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String("http://" + u.Host),
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	drv, err := fenceddynamodb.New(ctx, db, &fenceddynamodb.Options{Table: "example_leases", Create: true})
	if err != nil {
		log.Fatal(err)
	}
	client := fenced.NewClient(drv, nil)
	defer client.Close()
	l, err := client.TryAcquire(ctx, "report:daily", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	fmt.Println("fence:", l.Fence())
	// Output:
	// fence: 1
}
