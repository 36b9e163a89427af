// Package payprovider is a small payment provider served over real HTTP,
// for examples and tests of side effects a fence cannot reach. Like real
// providers it honours an Idempotency-Key header: a repeated key returns the
// original result instead of paying again, and a lookup by key tells what
// happened to an attempt whose response was lost.
//
//	POST /payouts  {"payout_id":"po_1","amount_cents":500}
//	               Idempotency-Key: K (optional; without it every request pays)
//	               201 {"ref":"pay_1"}          paid
//	               422 {"error":"..."}          rejected
//	               a repeat of K replays the first answer with its status (a
//	               payment's 201 as 200) and header Idempotent-Replayed: true
//	GET  /payouts?idempotency_key=K
//	               200 {"ref":"pay_1"} | 422 {"error":"..."} | 404
package payprovider

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// Payout is one payment the provider made.
type Payout struct {
	Ref         string
	PayoutID    string
	AmountCents int64
	Key         string
}

type result struct {
	status int
	body   []byte
}

// Provider is the server. Create it with Start.
type Provider struct {
	srv *httptest.Server

	// RespondAfter, when set, delays the response to a payment it has just
	// made: the payout happens, the caller waits (and may time out).
	RespondAfter func(n int) time.Duration

	mu      sync.Mutex
	payouts []Payout
	byKey   map[string]*keyState
}

type keyState struct {
	mu  sync.Mutex // held while a request with this key is processed
	res *result
}

// Start serves a new provider on a loopback port until Close.
func Start() *Provider {
	p := &Provider{byKey: map[string]*keyState{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payouts", p.pay)
	mux.HandleFunc("GET /payouts", p.lookup)
	p.srv = httptest.NewServer(mux)
	return p
}

// URL is the provider's base URL.
func (p *Provider) URL() string { return p.srv.URL }

// Close stops the server.
func (p *Provider) Close() { p.srv.Close() }

// Payouts returns every payment made so far.
func (p *Provider) Payouts() []Payout {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Payout(nil), p.payouts...)
}

func (p *Provider) pay(w http.ResponseWriter, r *http.Request) {
	var req struct {
		PayoutID    string `json:"payout_id"`
		AmountCents int64  `json:"amount_cents"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, &result{http.StatusBadRequest, mustJSON(map[string]string{"error": err.Error()})})
		return
	}
	key := r.Header.Get("Idempotency-Key")
	var ks *keyState
	if key != "" {
		p.mu.Lock()
		ks = p.byKey[key]
		if ks == nil {
			ks = &keyState{}
			p.byKey[key] = ks
		}
		p.mu.Unlock()
		ks.mu.Lock()
		defer ks.mu.Unlock()
		if ks.res != nil {
			// A replay repeats the original answer, status included, as
			// real providers do: a rejection stays a rejection. Only a
			// payment's 201 becomes 200, since nothing is created now.
			w.Header().Set("Idempotent-Replayed", "true")
			writeJSON(w, ks.res.replayed())
			return
		}
	}
	var res *result
	var n int
	if req.AmountCents <= 0 {
		res = &result{http.StatusUnprocessableEntity,
			mustJSON(map[string]string{"error": fmt.Sprintf("amount %d is not positive", req.AmountCents)})}
	} else {
		p.mu.Lock()
		n = len(p.payouts) + 1
		ref := fmt.Sprintf("pay_%d", n)
		p.payouts = append(p.payouts, Payout{Ref: ref, PayoutID: req.PayoutID, AmountCents: req.AmountCents, Key: key})
		p.mu.Unlock()
		res = &result{http.StatusCreated, mustJSON(map[string]string{"ref": ref})}
	}
	if ks != nil {
		ks.res = res
	}
	if p.RespondAfter != nil && n > 0 {
		time.Sleep(p.RespondAfter(n))
	}
	writeJSON(w, res)
}

func (p *Provider) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	p.mu.Lock()
	ks := p.byKey[key]
	p.mu.Unlock()
	if ks == nil {
		http.NotFound(w, r)
		return
	}
	ks.mu.Lock()
	res := ks.res
	ks.mu.Unlock()
	if res == nil {
		http.NotFound(w, r)
		return
	}
	writeJSON(w, res.replayed())
}

// replayed is the answer to a repeat of the request that produced r: the
// same status and body, except that a payment's 201 Created becomes 200 OK.
func (r *result) replayed() *result {
	if r.status == http.StatusCreated {
		return &result{http.StatusOK, r.body}
	}
	return r
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func writeJSON(w http.ResponseWriter, r *result) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(r.status)
	w.Write(r.body)
}

// ErrRejected means the provider refused the payment for good.
var ErrRejected = errors.New("payprovider: payment rejected")

// ErrNotFound means the provider has no record of an idempotency key.
var ErrNotFound = errors.New("payprovider: no such idempotency key")

// Client calls a provider.
type Client struct {
	URL  string
	HTTP *http.Client // nil: http.DefaultClient
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// Pay asks for a payout and returns its reference. key "" sends no
// Idempotency-Key header.
func (c *Client) Pay(ctx context.Context, key, payoutID string, amountCents int64) (string, error) {
	body := mustJSON(map[string]any{"payout_id": payoutID, "amount_cents": amountCents})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/payouts", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return c.do(req)
}

// Lookup returns the reference of the payment made under key, or an error
// matching ErrNotFound or ErrRejected.
func (c *Client) Lookup(ctx context.Context, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+"/payouts?idempotency_key="+key, nil)
	if err != nil {
		return "", err
	}
	return c.do(req)
}

func (c *Client) do(req *http.Request) (string, error) {
	resp, err := c.http().Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Ref   string `json:"ref"`
		Error string `json:"error"`
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated:
		if err := json.Unmarshal(b, &out); err != nil {
			return "", fmt.Errorf("payprovider: bad response: %w", err)
		}
		if out.Ref == "" {
			return "", fmt.Errorf("payprovider: HTTP %d without a reference: %s", resp.StatusCode, b)
		}
		return out.Ref, nil
	case http.StatusNotFound:
		return "", ErrNotFound
	case http.StatusUnprocessableEntity:
		_ = json.Unmarshal(b, &out)
		return "", fmt.Errorf("%w: %s", ErrRejected, out.Error)
	}
	return "", fmt.Errorf("payprovider: HTTP %d: %s", resp.StatusCode, b)
}
