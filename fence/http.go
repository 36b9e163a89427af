package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/fenced-dev/fenced"
)

// HTTP header names carrying a token. They are sent by Transport and read by
// Middleware; other languages' clients set them the same way.
//
//	Fenced-Key:   invoice:inv_72                     the lease key
//	Fenced-Fence: 42                                 decimal, 1..9223372036854775807
//	Fenced-Owner: 3f1c9a0d5e7b2c4a8f6e1d0c9b8a7f6e   OwnerDigest of the lease's owner
const (
	HeaderKey   = "Fenced-Key"
	HeaderFence = "Fenced-Fence"
	HeaderOwner = "Fenced-Owner"
)

// ErrNoToken means a request that needs a token carried none.
var ErrNoToken = errors.New("fence: no token")

// Error codes in the body of the standard error response, with their HTTP
// status.
const (
	CodeMissing      = "fence_missing"      // 428 Precondition Required: no token headers
	CodeMalformed    = "fence_malformed"    // 400 Bad Request: headers present but invalid
	CodeWrongKey     = "fence_wrong_key"    // 403 Forbidden: token for another lease key
	CodeStale        = "fence_stale"        // 409 Conflict: a newer holder exists
	CodePrecondition = "fence_precondition" // 412 Precondition Failed: work already done
)

// HTTPError is the standard error response of Middleware and WriteError,
// sent as a JSON object with Content-Type application/json, for example:
//
//	HTTP/1.1 409 Conflict
//	{"error":"fence_stale","message":"...","key":"invoice:inv_72","presented":41,"current":42}
//
// ResponseError turns such a response back into an *HTTPError, which matches
// ErrStale, ErrPrecondition, ErrInvalidToken or ErrNoToken with errors.Is.
type HTTPError struct {
	Status    int    `json:"-"`
	Code      string `json:"error"`
	Message   string `json:"message"`
	Key       string `json:"key,omitempty"`
	Presented uint64 `json:"presented,omitempty"`
	Current   uint64 `json:"current,omitempty"`
}

// Error implements error.
func (e *HTTPError) Error() string {
	return fmt.Sprintf("fence: HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Unwrap maps the code to this package's sentinel errors.
func (e *HTTPError) Unwrap() error {
	switch e.Code {
	case CodeMissing:
		return ErrNoToken
	case CodeMalformed, CodeWrongKey:
		return ErrInvalidToken
	case CodeStale:
		return ErrStale
	case CodePrecondition:
		return ErrPrecondition
	}
	return nil
}

// SetHeaders validates t and sets its headers on h.
func SetHeaders(h http.Header, t Token) error {
	if err := fenced.ValidateKey(t.Key); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidToken, err)
	}
	if err := t.Validate(); err != nil {
		return err
	}
	h.Set(HeaderKey, t.Key)
	h.Set(HeaderFence, strconv.FormatUint(t.Fence, 10))
	h.Set(HeaderOwner, t.Owner)
	return nil
}

// ParseHeaders reads a token from h. It returns an error matching ErrNoToken
// when none of the headers is present, and ErrInvalidToken when some are
// missing, repeated or invalid (a fence that is not a plain decimal in
// 1..MaxFence, such as "-1", "+5", "0x2a", "007" or a value that overflows).
func ParseHeaders(h http.Header) (Token, error) {
	keys, fences, owners := h.Values(HeaderKey), h.Values(HeaderFence), h.Values(HeaderOwner)
	if len(keys)+len(fences)+len(owners) == 0 {
		return Token{}, fmt.Errorf("%w: headers %s, %s and %s are missing", ErrNoToken, HeaderKey, HeaderFence, HeaderOwner)
	}
	for _, c := range []struct {
		name string
		vals []string
	}{{HeaderKey, keys}, {HeaderFence, fences}, {HeaderOwner, owners}} {
		if len(c.vals) != 1 {
			return Token{}, fmt.Errorf("%w: header %s given %d times, want once", ErrInvalidToken, c.name, len(c.vals))
		}
	}
	t := Token{Key: keys[0], Owner: owners[0]}
	if err := fenced.ValidateKey(t.Key); err != nil {
		return Token{}, fmt.Errorf("%w: header %s: %v", ErrInvalidToken, HeaderKey, err)
	}
	f, err := parseFence(fences[0])
	if err != nil {
		return Token{}, fmt.Errorf("%w: header %s: %v", ErrInvalidToken, HeaderFence, err)
	}
	t.Fence = f
	if err := t.Validate(); err != nil {
		return Token{}, fmt.Errorf("header %s or %s: %w", HeaderFence, HeaderOwner, err)
	}
	return t, nil
}

// parseFence accepts only canonical decimals: digits, no sign, no leading
// zero, at most MaxFence.
func parseFence(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("empty")
	}
	if len(s) > 19 {
		return 0, fmt.Errorf("%.24q is too long for a fence (max %d)", s, uint64(MaxFence))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a plain decimal number", s)
		}
	}
	if s[0] == '0' && len(s) > 1 {
		return 0, fmt.Errorf("%q has a leading zero", s)
	}
	f, err := strconv.ParseUint(s, 10, 64)
	if err != nil || f > MaxFence {
		return 0, fmt.Errorf("%q overflows a signed 64-bit integer (max %d)", s, uint64(MaxFence))
	}
	return f, nil
}

// Transport is an http.RoundTripper that adds the token carried by each
// request's context (WithLease or WithToken) as headers. A request without a
// token fails with ErrNoToken before anything is sent, so a forgotten
// WithLease cannot send an unguarded write; a request with an invalid token
// fails with ErrInvalidToken. Requests are cloned, never modified.
//
// The headers only help if the server checks them atomically with its
// write: Middleware with a Store, or a handler that passes TokenFrom's
// result to a SQL guard in its transaction.
type Transport struct {
	// Base sends the request; nil means http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody := func() {
		if req.Body != nil {
			req.Body.Close()
		}
	}
	tok, ok := TokenFrom(req.Context())
	if !ok {
		closeBody()
		return nil, fmt.Errorf("%w in the request context (use fence.WithLease)", ErrNoToken)
	}
	r := req.Clone(req.Context())
	if err := SetHeaders(r.Header, tok); err != nil {
		closeBody()
		return nil, err
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// ResponseError returns nil unless resp is a fence error response (a 4xx
// status with a body whose "error" is one of the Code constants); then it
// reads and closes the body and returns the *HTTPError.
func ResponseError(resp *http.Response) error {
	if resp.StatusCode < 400 || resp.StatusCode >= 500 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("fence: read error response: %w", err)
	}
	e := &HTTPError{Status: resp.StatusCode}
	if err := json.Unmarshal(body, e); err != nil || !strings.HasPrefix(e.Code, "fence_") {
		return &HTTPError{Status: resp.StatusCode, Code: "http_error", Message: strings.TrimSpace(string(body))}
	}
	return e
}

// WriteError writes the standard response for err: 428 for ErrNoToken, 400
// for ErrInvalidToken, 409 for ErrStale, 412 for ErrPrecondition (an
// *HTTPError is written as is). It returns false, writing nothing, for
// other errors. t, when known, fills the key and presented fence; current
// is the resource's fence for a stale refusal.
func WriteError(w http.ResponseWriter, err error, t Token, current uint64) bool {
	var he *HTTPError
	if !errors.As(err, &he) {
		he = &HTTPError{Message: err.Error(), Key: t.Key, Presented: t.Fence}
		switch {
		case errors.Is(err, ErrNoToken):
			he.Status, he.Code = http.StatusPreconditionRequired, CodeMissing
		case errors.Is(err, ErrInvalidToken):
			he.Status, he.Code = http.StatusBadRequest, CodeMalformed
		case errors.Is(err, ErrStale):
			he.Status, he.Code, he.Current = http.StatusConflict, CodeStale, current
		case errors.Is(err, ErrPrecondition):
			he.Status, he.Code, he.Current = http.StatusPreconditionFailed, CodePrecondition, current
		default:
			return false
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(he.Status)
	_ = json.NewEncoder(w).Encode(he)
	return true
}

// Store records the newest token admitted per key, for Middleware.
type Store interface {
	// Admit waits until no other admitted request for t.Key is in progress,
	// then compares t with the newest token recorded for t.Key. If t is
	// admitted it is recorded and Admit returns a done func that the caller
	// must call when its write is finished; until then other requests for
	// the key wait, so admission and write are atomic together. If t is
	// refused, Admit returns the Stale result and a nil done.
	Admit(ctx context.Context, t Token) (Result, func(), error)
}

// MemoryStore is a Store in process memory, for a resource served by one
// process: it serializes the writes of each key and remembers the newest
// token per key until the process exits. A restart forgets every fence, so
// a resource whose state outlives the process should record the fence with
// the state (a SQL guard in the handler's transaction).
type MemoryStore struct {
	mu   sync.Mutex
	keys map[string]*memEntry
}

type memEntry struct {
	sem   chan struct{} // one slot: held while an admitted write runs
	fence uint64
	owner string
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{keys: map[string]*memEntry{}} }

// Admit implements Store.
func (s *MemoryStore) Admit(ctx context.Context, t Token) (Result, func(), error) {
	if err := t.Validate(); err != nil {
		return Result{}, nil, err
	}
	s.mu.Lock()
	e := s.keys[t.Key]
	if e == nil {
		e = &memEntry{sem: make(chan struct{}, 1)}
		s.keys[t.Key] = e
	}
	s.mu.Unlock()
	select {
	case e.sem <- struct{}{}:
	case <-ctx.Done():
		return Result{}, nil, context.Cause(ctx)
	}
	if !t.admits(e.fence, e.owner) {
		r := classify(t, e.fence, e.owner)
		<-e.sem
		return r, nil, nil
	}
	e.fence, e.owner = t.Fence, t.Owner
	var once sync.Once
	return Result{Outcome: Applied, Current: t.Fence}, func() { once.Do(func() { <-e.sem }) }, nil
}

// Current returns the newest fence and owner recorded for key.
func (s *MemoryStore) Current(key string) (fence uint64, owner string) {
	s.mu.Lock()
	e := s.keys[key]
	s.mu.Unlock()
	if e == nil {
		return 0, ""
	}
	e.sem <- struct{}{}
	defer func() { <-e.sem }()
	return e.fence, e.owner
}

// MiddlewareOptions configure Middleware. nil gives the defaults.
type MiddlewareOptions struct {
	// Store, when set, admits each request's token before the handler runs
	// and holds the key until it returns (see Store), refusing stale tokens
	// with 409. When nil the middleware only parses and validates the token
	// and the handler must check it atomically with its write, for example
	// with a SQL guard in its transaction, answering with WriteError.
	Store Store
	// Key, when set, returns the lease key a request must carry (for
	// example derived from its path); a token for another key is refused
	// with 403 and code fence_wrong_key.
	Key func(r *http.Request) (string, error)
	// Hooks receive a StaleWrite event for every refused stale token.
	Hooks fenced.Hooks
}

// Middleware checks the token headers of every request before next runs,
// and hands the token to next in the request context (TokenFrom). Refusals
// use the standard error response: 428 fence_missing, 400 fence_malformed,
// 403 fence_wrong_key, 409 fence_stale. opts may be nil.
func Middleware(next http.Handler, opts *MiddlewareOptions) http.Handler {
	var o MiddlewareOptions
	if opts != nil {
		o = *opts
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, err := ParseHeaders(r.Header)
		if err != nil {
			WriteError(w, err, Token{}, 0)
			return
		}
		if o.Key != nil {
			want, err := o.Key(r)
			if err != nil {
				WriteError(w, fmt.Errorf("%w: %v", ErrInvalidToken, err), t, 0)
				return
			}
			if want != t.Key {
				WriteError(w, &HTTPError{Status: http.StatusForbidden, Code: CodeWrongKey,
					Message: fmt.Sprintf("token is for lease key %q, this resource needs %q", t.Key, want), Key: t.Key, Presented: t.Fence}, t, 0)
				return
			}
		}
		if o.Store != nil {
			res, done, err := o.Store.Admit(r.Context(), t)
			if err != nil {
				http.Error(w, "fence store: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			if !res.Applied() {
				report(o.Hooks, t, res, r.URL.Path)
				WriteError(w, res.Err(), t, res.Current)
				return
			}
			defer done()
		}
		next.ServeHTTP(w, r.WithContext(WithToken(r.Context(), t)))
	})
}
