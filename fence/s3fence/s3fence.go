// Package s3fence lets the object guard of package fence protect objects
// in an S3-compatible object store (aws-sdk-go-v2), with conditional PUTs:
//
//	guard, _ := fence.NewObject(s3fence.New(client, "invoices"), nil)
//	res, err := guard.Write(ctx, "inv_72.json", fence.From(lease), body)
//	// res.Outcome == fence.Stale: a newer holder has written; give up.
//
// Each write reads the object (GetObject), checks the token against the
// fence recorded in its metadata (x-amz-meta-fenced-fence and
// x-amz-meta-fenced-owner), and writes with If-Match on the ETag it read,
// or If-None-Match: * when there was no object. A write that lands in
// between makes the PUT fail with 412, and the guard reads and decides
// again.
//
// # Object format
//
// S3's ETag of a single PUT is the MD5 of the body. Two writes of the same
// bytes have the same ETag. So a PUT conditioned on an old ETag could
// overwrite a newer version that happens to have the old content (ABA), and
// a stale writer would get through. So Store makes every write's content
// unique: the stored object is one header line
//
//	fenced/1 <32 hex digits of a random nonce>\n
//
// followed by the content. Get strips it; objects without it (written by
// something else) are read as they are. Readers that do not use the guard
// must skip the first line.
//
// # Requirements on the store
//
// The store must honour If-Match and If-None-Match on PutObject
// atomically (Amazon S3 does since 2024, MinIO and others do). A store that
// silently ignores them makes the guard unsafe: check yours with a PUT
// carrying a wrong If-Match, which must fail with 412. Tested against
// gofakes3 v1.2.0.
package s3fence

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/fenced-dev/fenced/fence"
)

// headerPrefix starts the header line Store puts before every object's
// content.
const headerPrefix = "fenced/1 "

// headerLen is the header line's length: the prefix, 32 hex digits and a
// newline.
const headerLen = len(headerPrefix) + 32 + 1

// Store is a bucket of an S3-compatible store as a fence.ObjectStore.
type Store struct {
	client *s3.Client
	bucket string
}

var _ fence.ObjectStore = (*Store)(nil)

// New returns the bucket of client as a fence.ObjectStore.
func New(client *s3.Client, bucket string) *Store { return &Store{client: client, bucket: bucket} }

// Get implements fence.ObjectStore with one GetObject.
func (s *Store) Get(ctx context.Context, name string) (fence.ObjectVersion, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(name)})
	if err != nil {
		var nsk *types.NoSuchKey
		if errors.As(err, &nsk) || apiCode(err) == "NotFound" {
			return fence.ObjectVersion{}, fmt.Errorf("s3fence: %s/%s: %w", s.bucket, name, fence.ErrObjectNotFound)
		}
		return fence.ObjectVersion{}, fmt.Errorf("s3fence: get %s/%s: %w", s.bucket, name, err)
	}
	defer out.Body.Close()
	body, err := io.ReadAll(out.Body)
	if err != nil {
		return fence.ObjectVersion{}, fmt.Errorf("s3fence: get %s/%s: %w", s.bucket, name, err)
	}
	if len(body) >= headerLen && bytes.HasPrefix(body, []byte(headerPrefix)) && body[headerLen-1] == '\n' {
		body = body[headerLen:]
	}
	meta := make(map[string]string, len(out.Metadata))
	for k, v := range out.Metadata {
		meta[strings.ToLower(k)] = v
	}
	return fence.ObjectVersion{Body: body, Metadata: meta, Tag: aws.ToString(out.ETag)}, nil
}

// Put implements fence.ObjectStore with one conditional PutObject whose
// content starts with a fresh nonce (see the package documentation).
func (s *Store) Put(ctx context.Context, name string, v fence.ObjectVersion, ifTag string) (string, error) {
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", fmt.Errorf("s3fence: nonce: %w", err)
	}
	body := make([]byte, 0, headerLen+len(v.Body))
	body = append(body, headerPrefix...)
	body = hex.AppendEncode(body, nonce[:])
	body = append(body, '\n')
	body = append(body, v.Body...)
	in := &s3.PutObjectInput{
		Bucket:   aws.String(s.bucket),
		Key:      aws.String(name),
		Body:     bytes.NewReader(body),
		Metadata: v.Metadata,
	}
	if ifTag == "" {
		in.IfNoneMatch = aws.String("*")
	} else {
		in.IfMatch = aws.String(ifTag)
	}
	out, err := s.client.PutObject(ctx, in)
	if err != nil {
		switch apiCode(err) {
		case "PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "NotFound":
			// 412; 409 for a concurrent conditional write; 404 when an
			// If-Match object was deleted meanwhile.
			return "", fmt.Errorf("s3fence: put %s/%s: %w: %v", s.bucket, name, fence.ErrObjectChanged, err)
		}
		return "", fmt.Errorf("s3fence: put %s/%s: %w", s.bucket, name, err)
	}
	return aws.ToString(out.ETag), nil
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}
