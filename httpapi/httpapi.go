// Package httpapi is the HTTP service behind `fenced serve`: a versioned
// JSON API over one lease store, Prometheus metrics, and a live dashboard
// (server-rendered HTML with a little JavaScript, every asset embedded).
//
// The API (docs/http-api.md has curl examples):
//
//	GET  /api/v1/leases[?prefix=P]        held leases: key, fence, owner digest, TTL, time left, held since
//	GET  /api/v1/leases/{key}             one key: holder, fence, time left, grant history, recorded breaks
//	POST /api/v1/leases/{key}/break       {"reason": "..."}; admin token; audited with the token's name
//	POST /api/v1/leases/{key}/acquire     {"ttl_ms": 30000, "wait_ms": 0}; client or admin token
//	POST /api/v1/leases/{key}/renew       {"owner": "...", "fence": 7}; client or admin token
//	POST /api/v1/leases/{key}/release     {"owner": "...", "fence": 7}; client or admin token
//	GET  /api/v1/partitions/{group}       a partition group: members, each partition's owner and fence
//	GET  /api/v1/plan?ttl=30s&renew_every=10s&max_pause=45s&backend=etcd   the lease trade-off
//	POST /api/v1/scenario                 {"fence": true}: runs the billing scenario; client or admin token
//	GET  /metrics                         Prometheus: fenced_* of the server's client and fenced_store_*
//	GET  /healthz                         200 when the store answers, 503 otherwise
//
// Keys travel in one path segment, so a '/' in a key is sent as %2F.
//
// # Security
//
// Every POST needs "Authorization: Bearer <token>": 401 without one, 403
// with an unknown token or a client token where an admin token is needed.
// Secrets are compared in constant time (over their SHA-256 digests, so
// their length does not show either). Requests are checked in this order,
// and a refused request changes nothing: authorization, key, body (at
// most MaxBody bytes, one JSON object without unknown fields). Bad input
// gets a 4xx with a JSON error ({"error": code, "message": text}), never a
// 500; an unreachable store gets 503.
//
// Owner tokens prove ownership, so they leave the server only in the answer
// to the acquire that created them, to the client that acquired. Listings
// name holders by owner digest (fence.OwnerDigest, what fence guards record
// beside the fence), never by token.
//
// With Config.LoopbackOnly the server also refuses requests whose Host is
// not a loopback name or address (a web page in the operator's browser
// cannot reach it through DNS rebinding). `fenced serve` sets it when it
// listens on loopback, and refuses to listen elsewhere without a token.
// HTML pages are served with a Content-Security-Policy that allows only
// the server's own scripts and styles.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/cli/leaseplan"
	"github.com/fenced-dev/fenced/internal/core/capability"
)

// Defaults of Config.
const (
	DefaultMaxBody   = 64 << 10
	DefaultMaxWait   = time.Minute
	DefaultPollEvery = time.Second
	DefaultMaxLeases = 10000
)

// ScenarioEvent is one step of the billing scenario, for the timeline.
type ScenarioEvent struct {
	// AtMS is the time since the scenario started, in milliseconds.
	AtMS int64 `json:"at_ms"`
	// Worker is the worker's name, or "demo" for the scenario's own steps
	// (freezing and resuming a worker).
	Worker string `json:"worker"`
	// Kind is wait, acquired, render, sending, freeze, resume, or an
	// outcome: sent, refused, nothing, not_sending, gave_up, error, log.
	Kind  string `json:"kind"`
	Fence uint64 `json:"fence,omitempty"`
	Text  string `json:"text"`
}

// ScenarioResult is the outcome of the billing scenario.
type ScenarioResult struct {
	Fenced bool            `json:"fenced"`
	Events []ScenarioEvent `json:"events"`
	// Sends are the invoices the resource recorded as sent.
	Sends []ScenarioSend `json:"sends"`
	// Frozen is the worker that was frozen after its last check of the
	// lease.
	Frozen string `json:"frozen"`
	// OK reports that the scenario showed what it should: one invoice with
	// the fence, the double send without it.
	OK      bool   `json:"ok"`
	Verdict string `json:"verdict"`
}

// ScenarioSend is an invoice the resource recorded as sent.
type ScenarioSend struct {
	Worker string `json:"worker"`
	Fence  uint64 `json:"fence"`
}

// ScenarioFunc runs the billing scenario, with or without the fence
// guard. `fenced serve` runs `fenced demo`'s workers.
type ScenarioFunc func(ctx context.Context, fenced bool) (ScenarioResult, error)

// Config configures a Server.
type Config struct {
	// Client is the store to serve. Required. The server never closes it.
	Client *fenced.Client
	// Store is the store's URL with any password redacted, shown on the
	// dashboard; Scheme its scheme, which picks the backend's rounding in
	// the lease trade-off.
	Store, Scheme string
	// AdminTokens may break leases and do what client tokens do;
	// ClientTokens may acquire, renew and release leases and run the
	// scenario. Without tokens every POST is refused.
	AdminTokens, ClientTokens []Token
	// Registry receives the store-level collector and is what /metrics
	// serves; register the client's fencedprom collector on it too. Nil:
	// a new registry with only the store-level series.
	Registry *prometheus.Registry
	// Scenario runs the billing scenario for the timeline; nil disables it
	// (501).
	Scenario ScenarioFunc
	// LoopbackOnly refuses requests whose Host header is not a loopback
	// name or address.
	LoopbackOnly bool
	// PollEvery is how often the store is listed to follow grants for the
	// history and the owner-change counter. Default DefaultPollEvery.
	PollEvery time.Duration
	// MaxBody bounds request bodies, in bytes. Default DefaultMaxBody.
	MaxBody int64
	// MaxWait caps the wait_ms of an acquire. Default DefaultMaxWait.
	MaxWait time.Duration
	// MaxLeases caps the leases held through the API at once (429 beyond).
	// Default DefaultMaxLeases.
	MaxLeases int
	// Logger receives the audit records (breaks, API grants and releases)
	// and refused requests. Default slog.Default().
	Logger *slog.Logger
	// Now is the wall clock, for tests. Default time.Now.
	Now func() time.Time
}

// Server serves the API and the dashboard. Create it with New, start its
// poller with Run, and serve it with an http.Server.
type Server struct {
	cfg  Config
	keys *keyring
	obs  *observer
	log  *slog.Logger
	mux  *http.ServeMux
	auth leaseplan.Authority

	mu       sync.Mutex
	leases   map[string]*fenced.Lease // API-held leases by owner token
	scenario sync.Mutex               // one scenario at a time
}

// New checks cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("httpapi: Config.Client is nil")
	}
	keys, err := newKeyring(cfg.AdminTokens, cfg.ClientTokens)
	if err != nil {
		return nil, err
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = DefaultPollEvery
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.MaxLeases <= 0 {
		cfg.MaxLeases = DefaultMaxLeases
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &Server{cfg: cfg, keys: keys, log: cfg.Logger, leases: map[string]*fenced.Lease{}}
	s.obs = newObserver(cfg.Client, cfg.Now)
	s.auth = leaseplan.ForScheme(cfg.Scheme)
	s.auth = s.auth.WithBounds(capability.TTLBounds(cfg.Client.Capabilities(), s.auth.MinTTL, s.auth.MaxTTL))
	if err := cfg.Registry.Register(collector{s.obs}); err != nil {
		return nil, fmt.Errorf("httpapi: register the store collector: %w", err)
	}
	s.routes()
	return s, nil
}

// Run follows the store (the grant history and the owner-change counter)
// until ctx ends.
func (s *Server) Run(ctx context.Context) { s.obs.poll(ctx, s.cfg.PollEvery) }

func (s *Server) routes() {
	m := http.NewServeMux()
	m.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{Registry: s.cfg.Registry}))
	m.HandleFunc("GET /healthz", s.healthz)
	m.HandleFunc("/api/v1/leases", methods(map[string]http.HandlerFunc{"GET": s.listLeases}))
	m.HandleFunc("/api/v1/leases/{key}", methods(map[string]http.HandlerFunc{"GET": s.getLease}))
	m.HandleFunc("/api/v1/leases/{key}/break", methods(map[string]http.HandlerFunc{"POST": s.breakLease}))
	m.HandleFunc("/api/v1/leases/{key}/acquire", methods(map[string]http.HandlerFunc{"POST": s.acquireLease}))
	m.HandleFunc("/api/v1/leases/{key}/renew", methods(map[string]http.HandlerFunc{"POST": s.renewLease}))
	m.HandleFunc("/api/v1/leases/{key}/release", methods(map[string]http.HandlerFunc{"POST": s.releaseLease}))
	m.HandleFunc("/api/v1/partitions/{group...}", methods(map[string]http.HandlerFunc{"GET": s.getGroup}))
	m.HandleFunc("/api/v1/plan", methods(map[string]http.HandlerFunc{"GET": s.plan}))
	m.HandleFunc("/api/v1/scenario", methods(map[string]http.HandlerFunc{"POST": s.runScenario}))
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, Code: "not_found", Message: "no such API endpoint: " + r.URL.Path})
	})
	m.HandleFunc("GET /{$}", s.dashboard)
	m.HandleFunc("GET /keys/{key}", s.keyPage)
	m.HandleFunc("GET /partitions/{group...}", s.groupPage)
	m.Handle("GET /static/", staticHandler())
	s.mux = m
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.cfg.LoopbackOnly && !loopbackHost(r.Host) {
		s.log.Warn("fenced serve: refused a request for a non-loopback host", "host", r.Host, "remote", r.RemoteAddr)
		writeError(w,
			&apiError{status: http.StatusMisdirectedRequest, Code: "misdirected",
				Message: fmt.Sprintf("this server answers only to localhost, 127.0.0.1 or [::1], not to Host %q", r.Host)})
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// loopbackHost reports whether a Host header names the loopback interface.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// methods dispatches on the request method and answers others with a JSON
// 405.
func methods(hs map[string]http.HandlerFunc) http.HandlerFunc {
	var allow []string
	for m := range hs {
		allow = append(allow, m)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if h, ok := hs[r.Method]; ok {
			h(w, r)
			return
		}
		if r.Method == http.MethodHead && hs["GET"] != nil {
			hs["GET"](w, r)
			return
		}
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w,
			&apiError{status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
				Message: fmt.Sprintf("%s is not allowed here (allowed: %s)", r.Method, strings.Join(allow, ", "))})
	}
}

// apiError is a refusal, sent as {"error": Code, "message": Message}.
type apiError struct {
	status  int
	Code    string `json:"error"`
	Message string `json:"message"`
}

func (e *apiError) Error() string { return e.Message }

func writeError(w http.ResponseWriter, e *apiError) {
	if e.status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fenced"`)
	}
	writeJSON(w, e.status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// storeError maps an error of the client to a refusal. Only errors that
// say the store did not answer are 5xx (503).
func storeError(err error) *apiError {
	e := &apiError{status: http.StatusBadRequest, Code: "bad_request", Message: strings.TrimPrefix(err.Error(), "fenced: ")}
	switch {
	case errors.Is(err, fenced.ErrInvalidKey):
		e.status, e.Code = http.StatusBadRequest, "invalid_key"
	case errors.Is(err, fenced.ErrInvalidTTL):
		e.status, e.Code = http.StatusBadRequest, "invalid_ttl"
	case errors.Is(err, fenced.ErrNotFound):
		e.status, e.Code = http.StatusNotFound, "not_found"
	case errors.Is(err, fenced.ErrHeld):
		e.status, e.Code = http.StatusConflict, "held"
	case errors.Is(err, fenced.ErrNotHeld), errors.Is(err, fenced.ErrLost), errors.Is(err, fenced.ErrExpired):
		e.status, e.Code = http.StatusConflict, "not_held"
	case errors.Is(err, fenced.ErrNoFence):
		e.status, e.Code = http.StatusUnprocessableEntity, "no_fence"
	case errors.Is(err, fenced.ErrUnsupported):
		e.status, e.Code = http.StatusNotImplemented, "unsupported"
	case errors.Is(err, fenced.ErrUnavailable), errors.Is(err, fenced.ErrUnknownOutcome), errors.Is(err, fenced.ErrClosed),
		errors.Is(err, context.DeadlineExceeded):
		e.status, e.Code = http.StatusServiceUnavailable, "unavailable"
	case errors.Is(err, context.Canceled):
		e.status, e.Code = 499, "canceled"
	default:
		// An error the store reported that no sentinel classifies: the
		// store answered, but not as expected.
		e.status, e.Code = http.StatusBadGateway, "store_error"
	}
	return e
}

// decode reads r's body (at most MaxBody bytes) as one JSON object into v.
// An empty body leaves v alone when allowEmpty is set.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any, allowEmpty bool) *apiError {
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("more than one JSON value")
	}
	if err == nil {
		// Nothing but white space may follow the object.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON object")
		}
	}
	var tooBig *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF) && allowEmpty:
		return nil
	case errors.As(err, &tooBig):
		return &apiError{status: http.StatusRequestEntityTooLarge, Code: "too_large",
			Message: fmt.Sprintf("the body is larger than %d bytes", s.cfg.MaxBody)}
	case errors.Is(err, io.EOF):
		return &apiError{status: http.StatusBadRequest, Code: "bad_json", Message: "the body is empty; want a JSON object"}
	}
	return &apiError{status: http.StatusBadRequest, Code: "bad_json", Message: "the body is not the expected JSON object: " + err.Error()}
}
