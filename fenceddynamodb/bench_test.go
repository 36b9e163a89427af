package fenceddynamodb_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fenceddynamodb"
	"github.com/fenced-dev/fenced/internal/testkit/leasebench"
)

// benchClient opens a client over its own DynamoDB client whose
// connections count round trips (HTTP requests) in rt (nil: not counted).
func benchClient(b *testing.B, rt *leasebench.RoundTrips) *fenced.Client {
	b.Helper()
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.MaxIdleConnsPerHost = fenceddynamodb.DefaultMaxInFlight
		if rt != nil {
			tr.DialContext = rt.Dial
		}
	})
	client := awsdynamodb.New(awsdynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(server.Endpoint()),
		Credentials:  credentials.NewStaticCredentialsProvider("bench", "bench", ""),
		HTTPClient:   httpClient,
	})
	d, err := fenceddynamodb.New(ctxT(b), client, &fenceddynamodb.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	return fenced.NewClient(d, nil)
}

// BenchmarkAcquireRelease: uncontended TryAcquire + Release of one key.
func BenchmarkAcquireRelease(b *testing.B) {
	var rt leasebench.RoundTrips
	c := benchClient(b, &rt)
	defer c.Close()
	leasebench.AcquireRelease(b, c, &rt)
}

// BenchmarkHandover: release to next grant with 1, 8 and 64 waiters, each
// its own client, polling (DynamoDB cannot notify).
func BenchmarkHandover(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			leasebench.Handover(b, n, func(b *testing.B) *fenced.Client { return benchClient(b, nil) })
		})
	}
}

// BenchmarkRenewals: requests per renewal period for M = 10 000 leases on
// one client. There is no conditional batch write, so each lease costs one
// conditional UpdateItem per period. Run with -benchtime=1x.
func BenchmarkRenewals(b *testing.B) {
	var rt leasebench.RoundTrips
	c := benchClient(b, &rt)
	defer c.Close()
	leasebench.RenewalRequests(b, c, &rt, 10000, time.Minute)
}
