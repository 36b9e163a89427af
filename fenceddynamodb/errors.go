package fenceddynamodb

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptrace"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/backend/errclass"
)

// noRetry turns the SDK's own retries off for one call. A driver does one
// thing per call and never retries; the portable client decides. A retried
// conditional write is worse than none. If the first attempt was applied and
// its response lost, the retry fails its condition. It reports a refusal for
// a write that happened (a release would say ErrNotHeld).
func noRetry(o *dynamodb.Options) {
	o.Retryer = aws.NopRetryer{}
	o.RetryMaxAttempts = 0
}

// call runs one request against DynamoDB under the driver's limit on
// requests in flight. It reports whether the request was written to the
// network. That tells an unknown outcome (sent, no answer) from a request
// that never left (nothing applied).
func (d *Driver) call(ctx context.Context, fn func(ctx context.Context) error) (sent bool, err error) {
	select {
	case d.inflight <- struct{}{}:
	case <-ctx.Done():
		return false, context.Cause(ctx)
	}
	defer func() { <-d.inflight }()
	var wrote atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		// Called once the request was written, or its write failed part
		// way; either way the server may have it.
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) },
	})
	err = fn(ctx)
	return wrote.Load(), err
}

// classify maps an error of one DynamoDB request onto the driver's
// sentinels, with errclass.Wrap and the hook sentinel. Only a write that
// was sent (write && sent) can have an unknown outcome. A read, or a request
// that never left, applied nothing (ErrUnavailable). Conditional-check
// failures are refusals and are handled by the callers before classify.
func (d *Driver) classify(op, key string, write, sent bool, err error) error {
	where := op
	if key != "" {
		where = fmt.Sprintf("%s %q", op, key)
	}
	return fmt.Errorf("dynamodb: %s: %w", where, errclass.Wrap(err, write && sent, d.sentinel))
}

// sentinel is DynamoDB's errclass.Func. Throttling and credential or
// table problems were refused before anything was applied (ErrUnavailable).
// A server error (5xx), or a request without an answer, may or may not have
// been applied (ErrUnknownOutcome). Any other API error is reported as it
// is.
func (d *Driver) sentinel(err error) error {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return fmt.Errorf("request sent, no answer: %w", fenced.ErrUnknownOutcome)
	}
	switch apiErr.ErrorCode() {
	case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded", "LimitExceededException":
		return fmt.Errorf("throttled: %w", fenced.ErrUnavailable)
	case "ResourceNotFoundException":
		return fmt.Errorf("table %q not found: %w", d.table, fenced.ErrUnavailable)
	case "UnrecognizedClientException", "AccessDeniedException", "InvalidSignatureException", "IncompleteSignature",
		"MissingAuthenticationToken", "ExpiredTokenException", "InvalidClientTokenId":
		return fmt.Errorf("credentials refused: %w", fenced.ErrUnavailable)
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
		// InternalServerError, ServiceUnavailable: DynamoDB documents
		// that the request may or may not have been applied.
		return fenced.ErrUnknownOutcome
	}
	return nil
}
