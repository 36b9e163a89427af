package fence

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/fenced-dev/fenced"
)

// HTTP header names carrying a token. They are sent by Transport and read by
// Middleware; other languages' clients and shell scripts set them the same
// way (a child of `fenced run` finds the values in FENCED_KEY, FENCED_FENCE
// and FENCED_OWNER; see TokenFromEnv).
//
//	Fenced-Key:       invoice:inv_72                     the lease key
//	Fenced-Fence:     42                                 decimal, 1..9223372036854775807
//	Fenced-Owner:     3f1c9a0d5e7b2c4a8f6e1d0c9b8a7f6e   OwnerDigest of the lease's owner
//	Fenced-Signature: k2026.Zm9vYmFy…                    optional, Token.Sig (see Signer)
const (
	HeaderKey       = "Fenced-Key"
	HeaderFence     = "Fenced-Fence"
	HeaderOwner     = "Fenced-Owner"
	HeaderSignature = "Fenced-Signature"
)

// ErrNoToken means a request that needs a token carried none.
var ErrNoToken = errors.New("fence: no token")

// Error codes in the body of the standard error response, with their HTTP
// status.
const (
	CodeMissing      = "fence_missing"      // 428 Precondition Required: no token headers
	CodeMalformed    = "fence_malformed"    // 400 Bad Request: headers present but invalid
	CodeWrongKey     = "fence_wrong_key"    // 403 Forbidden: token for another lease key
	CodeUnverified   = "fence_unverified"   // 403 Forbidden: the Checker refused the token (unsigned, bad signature, never granted)
	CodeStale        = "fence_stale"        // 409 Conflict: a newer holder exists
	CodePrecondition = "fence_precondition" // 412 Precondition Failed: work already done
)

// HTTPError is the standard error response of Middleware and WriteError.
// It is sent as a JSON object with Content-Type application/json, for
// example:
//
//	HTTP/1.1 409 Conflict
//	{"error":"fence_stale","message":"...","key":"invoice:inv_72","presented":41,"current":42}
//
// ResponseError turns such a response back into an *HTTPError. It matches
// ErrStale, ErrPrecondition, ErrInvalidToken, ErrWrongKey, ErrUnverified or
// ErrNoToken with errors.Is.
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
	case CodeMalformed:
		return ErrInvalidToken
	case CodeWrongKey:
		return ErrWrongKey
	case CodeUnverified:
		return ErrUnverified
	case CodeStale:
		return ErrStale
	case CodePrecondition:
		return ErrPrecondition
	}
	return nil
}

// SetHeaders validates t and sets its headers on h: the signature header
// when t is signed, and otherwise none (an old one is removed).
func SetHeaders(h http.Header, t Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	h.Set(HeaderKey, t.Key)
	h.Set(HeaderFence, strconv.FormatUint(t.Fence, 10))
	h.Set(HeaderOwner, t.Owner)
	if t.Sig != "" {
		h.Set(HeaderSignature, t.Sig)
	} else {
		h.Del(HeaderSignature)
	}
	return nil
}

// ParseHeaders reads a token from h. It returns an error matching ErrNoToken
// when none of the headers is present. It returns ErrInvalidToken when some
// are missing, repeated or invalid. A fence is invalid unless it is a plain
// decimal in 1..MaxFence: "-1", "+5", "0x2a", "007" and a value that
// overflows are refused. The signature header is optional; given, it must
// appear once. ParseHeaders does not verify the signature (see Verifier).
func ParseHeaders(h http.Header) (Token, error) {
	keys, fences, owners, sigs := h.Values(HeaderKey), h.Values(HeaderFence), h.Values(HeaderOwner), h.Values(HeaderSignature)
	if len(keys)+len(fences)+len(owners)+len(sigs) == 0 {
		return Token{}, fmt.Errorf("%w: headers %s, %s and %s are missing", ErrNoToken, HeaderKey, HeaderFence, HeaderOwner)
	}
	if len(sigs) > 1 {
		return Token{}, fmt.Errorf("%w: header %s given %d times, want at most once", ErrInvalidToken, HeaderSignature, len(sigs))
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
	if len(sigs) == 1 {
		t.Sig = sigs[0]
	}
	if err := fenced.ValidateKey(t.Key); err != nil {
		return Token{}, fmt.Errorf("%w: header %s: %v", ErrInvalidToken, HeaderKey, err)
	}
	f, err := parseFence(fences[0])
	if err != nil {
		return Token{}, fmt.Errorf("%w: header %s: %v", ErrInvalidToken, HeaderFence, err)
	}
	t.Fence = f
	if err := t.Validate(); err != nil {
		return Token{}, fmt.Errorf("header %s, %s or %s: %w", HeaderFence, HeaderOwner, HeaderSignature, err)
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
// WithLease cannot send an unguarded write. A request with an invalid token
// fails with ErrInvalidToken. Requests are cloned, never modified.
//
// The headers only help if the server checks them atomically with its
// write: Middleware with a Store, or a handler that passes TokenFrom's
// result to a SQL guard in its transaction.
type Transport struct {
	// Base sends the request; nil means http.DefaultTransport.
	Base http.RoundTripper
	// Signer, when set, signs each request's token before it is sent (for
	// resources whose Middleware checks signatures with a Verifier).
	Signer *Signer
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
	if t.Signer != nil {
		var err error
		if tok, err = t.Signer.Sign(tok); err != nil {
			closeBody()
			return nil, err
		}
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
// status with a body whose "error" is one of the Code constants). Then it
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
// for ErrInvalidToken, 403 for ErrWrongKey and ErrUnverified, 409 for
// ErrStale, 412 for ErrPrecondition (an *HTTPError is written as is). It returns false, writing nothing, for
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
		case errors.Is(err, ErrWrongKey):
			he.Status, he.Code = http.StatusForbidden, CodeWrongKey
		case errors.Is(err, ErrUnverified):
			he.Status, he.Code = http.StatusForbidden, CodeUnverified
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

// DefaultMaxBodyBytes is the request body size MiddlewareOptions.MaxBodyBytes
// means when zero.
const DefaultMaxBodyBytes = 1 << 20

// MiddlewareOptions configure Middleware. Key is required.
type MiddlewareOptions struct {
	// Key returns the lease key that guards the resource a request writes,
	// typically derived from its route (for example "invoice:" +
	// r.PathValue("id")); FixedKey serves a resource with one key. A token
	// for another key is refused with 403 and code fence_wrong_key, and an
	// error from Key with 400. It is required: fences are only comparable
	// within one key, so a middleware that took the key from the client's
	// own Fenced-Key header would let a token for any key (with any fence)
	// through. A resource that really accepts whatever key the client names
	// (because the handler's own guard checks it) must say so by returning
	// r.Header.Get(HeaderKey).
	Key func(r *http.Request) (string, error)
	// Store, when set, admits each request's token before the handler runs
	// and holds the key until it returns (see Store), refusing stale tokens
	// with 409. When nil the middleware only parses and checks the token
	// and the handler must compare it atomically with its write, for
	// example with a SQL guard in its transaction, answering with
	// WriteError.
	Store Store
	// Check, when set, must accept each token (for example a *Verifier for
	// signed tokens, or a *Sequencer). A refusal is answered before the
	// store or the handler sees the request: 403 fence_unverified, 409
	// fence_stale when the error matches ErrStale, or 503 for other errors.
	Check Checker
	// MaxBodyBytes bounds the request body the middleware reads before a
	// Store admits the token (0 means DefaultMaxBodyBytes; a larger body is
	// refused with 413). The body is read first so that a client that
	// stalls mid-body (paused, cut off) never holds the key while newer
	// holders wait. A negative value streams the body to the handler
	// instead, while the key is held: then set the server's ReadTimeout, or
	// a stalled body blocks the key's newer holders for as long as it
	// stalls. Without a Store the body is never read here.
	MaxBodyBytes int64
	// Hook receives an EventStaleWrite for every refused stale token
	// (when nil, the hook of the client that issued the token).
	Hook func(fenced.Event)
}

// FixedKey returns a MiddlewareOptions.Key for a resource guarded by one
// lease key.
func FixedKey(key string) func(*http.Request) (string, error) {
	return func(*http.Request) (string, error) { return key, nil }
}

// Middleware checks the token headers of every request before next runs,
// and hands the token to next in the request context (TokenFrom). Refusals
// use the standard error response: 428 fence_missing, 400 fence_malformed,
// 403 fence_wrong_key or fence_unverified, 409 fence_stale. A store that
// fails answers 503. It panics if opts or opts.Key is nil, a programming
// error found when the handler is built rather than a hole found later.
func Middleware(next http.Handler, opts *MiddlewareOptions) http.Handler {
	if opts == nil || opts.Key == nil {
		panic("fence: Middleware needs MiddlewareOptions.Key, the lease key that guards each request's resource " +
			"(fence.FixedKey(key) for one key)")
	}
	o := *opts
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, err := ParseHeaders(r.Header)
		if err != nil {
			WriteError(w, err, Token{}, 0)
			return
		}
		want, err := o.Key(r)
		if err != nil {
			WriteError(w, fmt.Errorf("%w: %v", ErrInvalidToken, err), t, 0)
			return
		}
		if err := checkKey(want, t.Key); err != nil {
			WriteError(w, err, t, 0)
			return
		}
		if o.Check != nil {
			if err := o.Check.Check(r.Context(), t); err != nil {
				if !WriteError(w, err, t, 0) {
					http.Error(w, "fence check: "+err.Error(), http.StatusServiceUnavailable)
				}
				return
			}
		}
		if o.Store != nil {
			if o.MaxBodyBytes > 0 && r.Body != nil && r.Body != http.NoBody {
				body, err := io.ReadAll(io.LimitReader(r.Body, o.MaxBodyBytes+1))
				r.Body.Close()
				switch {
				case err != nil:
					http.Error(w, "fence: reading the request body: "+err.Error(), http.StatusBadRequest)
					return
				case int64(len(body)) > o.MaxBodyBytes:
					http.Error(w, fmt.Sprintf("fence: request body is larger than %d bytes (MiddlewareOptions.MaxBodyBytes)",
						o.MaxBodyBytes), http.StatusRequestEntityTooLarge)
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
				r.ContentLength = int64(len(body))
			}
			res, done, err := o.Store.Admit(r.Context(), t)
			if err != nil {
				http.Error(w, "fence store: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			if !res.Applied() {
				report(o.Hook, t, res, r.URL.Path)
				WriteError(w, res.Err(), t, res.Current)
				return
			}
			defer done()
		}
		next.ServeHTTP(w, r.WithContext(WithToken(r.Context(), t)))
	})
}
