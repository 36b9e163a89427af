package s3fence_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/fence/s3fence"
)

const bucket = "fenced-test"

// startS3 serves the S3 API with gofakes3 (in memory) on a loopback port
// and returns a client for it with the test bucket created.
func startS3(t *testing.T) *s3.Client {
	t.Helper()
	srv := httptest.NewServer(gofakes3.New(s3mem.New()).Server())
	t.Cleanup(srv.Close)
	client := s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
	if _, err := client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatal(err)
	}
	return client
}

func guard(t *testing.T, client *s3.Client) *fence.Object {
	t.Helper()
	g, err := fence.NewObject(s3fence.New(client, bucket), nil)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func tok(f uint64, owner string) fence.Token {
	return fence.Token{Key: "invoice:inv_72", Fence: f, Owner: owner}
}

// The server under test must refuse a conditional PUT whose condition does
// not hold; otherwise the guard's tests below would prove nothing.
func TestServerHonoursPreconditions(t *testing.T) {
	ctx := context.Background()
	client := startS3(t)
	put := func(ifMatch, ifNoneMatch *string) error {
		_, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("probe"),
			Body: strings.NewReader("x"), IfMatch: ifMatch, IfNoneMatch: ifNoneMatch})
		return err
	}
	if err := put(nil, aws.String("*")); err != nil {
		t.Fatalf("create with If-None-Match: *: %v", err)
	}
	if err := put(nil, aws.String("*")); err == nil {
		t.Fatal("second create with If-None-Match: * succeeded; the server ignores the precondition")
	}
	if err := put(aws.String(`"00000000000000000000000000000000"`), nil); err == nil {
		t.Fatal("PUT with a wrong If-Match succeeded; the server ignores the precondition")
	}
}

func TestNewerAdmittedOlderRefused(t *testing.T) {
	ctx := context.Background()
	g := guard(t, startS3(t))
	const name = "inv_72.json"
	if r, err := g.Write(ctx, name, tok(5, "a"), []byte("five")); err != nil || !r.Applied() {
		t.Fatalf("first write: %+v %v", r, err)
	}
	if r, err := g.Write(ctx, name, tok(5, "a"), []byte("five again")); err != nil || !r.Applied() {
		t.Fatalf("same holder writing again: %+v %v", r, err)
	}
	if r, err := g.Write(ctx, name, tok(5, "b"), []byte("same fence, other owner")); err != nil || r.Outcome != fence.Stale || !r.SameFenceOtherOwner {
		t.Fatalf("equal fence from another owner: %+v %v; want Stale", r, err)
	}
	if r, err := g.Write(ctx, name, tok(7, "c"), []byte("seven")); err != nil || !r.Applied() || r.Current != 7 {
		t.Fatalf("newer write: %+v %v", r, err)
	}
	r, err := g.Write(ctx, name, tok(6, "b"), []byte("stale"))
	if err != nil || r.Outcome != fence.Stale || r.Current != 7 || !errors.Is(r.Err(), fence.ErrStale) {
		t.Fatalf("older write: %+v %v; want Stale with current 7", r, err)
	}
	body, f, owner, err := g.Read(ctx, name)
	if err != nil || string(body) != "seven" || f != 7 || owner != "c" {
		t.Fatalf("read: %q fence %d owner %q %v", body, f, owner, err)
	}
	r, err = g.Update(ctx, name, tok(7, "c"), func(cur []byte, exists bool) ([]byte, error) {
		return nil, fmt.Errorf("already sent: %w", fence.ErrPrecondition)
	})
	if err != nil || r.Outcome != fence.PreconditionFailed || r.Current != 7 {
		t.Fatalf("update whose own condition fails: %+v %v", r, err)
	}
	if _, _, _, err := g.Read(ctx, "never"); !errors.Is(err, fence.ErrObjectNotFound) {
		t.Fatalf("read of a missing object: %v", err)
	}
}

// An object is bound to the lease key of its first admitted write; a token
// of another key is refused whatever its fence, and keys that are not
// ASCII survive the trip through S3 metadata.
func TestObjectIsBoundToOneLeaseKey(t *testing.T) {
	ctx := context.Background()
	g := guard(t, startS3(t))
	const name = "bound.json"
	key := "facture:numéro 72"
	if r, err := g.Write(ctx, name, fence.Token{Key: key, Fence: 3, Owner: "a"}, []byte("x")); err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	_, err := g.Write(ctx, name, fence.Token{Key: "other", Fence: 99, Owner: "b"}, []byte("y"))
	if !errors.Is(err, fence.ErrWrongKey) {
		t.Fatalf("token of another key: %v; want ErrWrongKey", err)
	}
	if r, err := g.Write(ctx, name, fence.Token{Key: key, Fence: 4, Owner: "b"}, []byte("z")); err != nil || !r.Applied() {
		t.Fatalf("next holder of the bound key: %+v %v", r, err)
	}
	if body, f, _, _ := g.Read(ctx, name); string(body) != "z" || f != 4 {
		t.Fatalf("object: %q fence %d", body, f)
	}
}

// A new holder claims the object first; the old holder's late write is then
// refused although nothing else was written.
func TestClaimLocksOutTheOldHolder(t *testing.T) {
	ctx := context.Background()
	g := guard(t, startS3(t))
	const name = "job.json"
	if r, err := g.Write(ctx, name, tok(1, "old"), []byte("state")); err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	if r, err := g.Claim(ctx, name, tok(2, "new")); err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	if body, f, _, _ := g.Read(ctx, name); string(body) != "state" || f != 2 {
		t.Fatalf("claim changed the content or missed the fence: %q %d", body, f)
	}
	if r, err := g.Write(ctx, name, tok(1, "old"), []byte("late")); err != nil || r.Outcome != fence.Stale || r.Current != 2 {
		t.Fatalf("old holder's late write: %+v %v; want Stale", r, err)
	}
}

// ABA: a stale writer reads version V, then a newer holder writes other
// content and then V's exact content again. An ETag check alone would let
// the stale write through (same bytes, same MD5 ETag); the nonce makes the
// condition fail, and the guard, reading again, refuses the stale token.
func TestSameContentAgainDoesNotLetAStaleWriteThrough(t *testing.T) {
	ctx := context.Background()
	client := startS3(t)
	g, newer := guard(t, client), guard(t, client)
	const name = "toggle"
	if r, err := g.Write(ctx, name, tok(5, "a"), []byte("off")); err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	calls := 0
	r, err := g.Update(ctx, name, tok(5, "a"), func(cur []byte, _ bool) ([]byte, error) {
		calls++
		if calls == 1 {
			// Paused after its read: the newer holder toggles twice.
			for _, v := range []string{"on", "off"} {
				if r, err := newer.Write(ctx, name, tok(6, "b"), []byte(v)); err != nil || !r.Applied() {
					return nil, fmt.Errorf("newer holder: %v %v", r, err)
				}
			}
		}
		return []byte("stale-on"), nil
	})
	if err != nil || r.Outcome != fence.Stale || r.Current != 6 {
		t.Fatalf("stale writer after an A-B-A of the content: %+v %v; want Stale with current 6", r, err)
	}
	if body, f, _, _ := g.Read(ctx, name); !bytes.Equal(body, []byte("off")) || f != 6 {
		t.Fatalf("object after the stale attempt: %q fence %d; want the newer holder's \"off\" at 6", body, f)
	}
}

// Writers racing with different fences: the object ends with the highest
// fence that wrote, its fence never goes back, and every refusal names a
// newer fence.
func TestRacingWriters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := guard(t, startS3(t))
	const name = "raced"
	var wg sync.WaitGroup
	var mu sync.Mutex
	applied := map[uint64]bool{}
	for f := uint64(1); f <= 12; f++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := g.Write(ctx, name, tok(f, fmt.Sprint("w", f)), []byte(fmt.Sprint(f)))
			if err != nil {
				t.Error(err)
				return
			}
			if r.Outcome == fence.Stale && r.Current <= f {
				t.Errorf("fence %d refused with current %d", f, r.Current)
			}
			mu.Lock()
			applied[f] = r.Applied()
			mu.Unlock()
		}()
	}
	wg.Wait()
	body, f, _, err := g.Read(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var highest uint64
	for fe, ok := range applied {
		if ok && fe > highest {
			highest = fe
		}
	}
	if f != highest || string(body) != fmt.Sprint(highest) {
		t.Fatalf("object has fence %d body %q; the highest applied write was %d", f, body, highest)
	}
}
