package fence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/mem"
)

// ledger is a resource served over HTTP: it appends the body of each
// admitted POST.
type ledger struct {
	mu      sync.Mutex
	entries []string
	tokens  []fence.Token
	calls   atomic.Int64
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.calls.Add(1)
	tok, ok := fence.TokenFrom(r.Context())
	if !ok {
		http.Error(w, "no token in context", http.StatusInternalServerError)
		return
	}
	body, _ := io.ReadAll(r.Body)
	l.mu.Lock()
	l.entries = append(l.entries, string(body))
	l.tokens = append(l.tokens, tok)
	l.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (l *ledger) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.entries...)
}

func post(ctx context.Context, c *http.Client, url, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}

func TestHTTPStaleHolderRefused(t *testing.T) {
	ctx := context.Background()
	leases := fenced.NewClient(mem.NewStore(nil).Driver(), nil)
	defer leases.Close()
	var stale []fenced.Event
	var mu sync.Mutex
	led := &ledger{}
	srv := httptest.NewServer(fence.Middleware(led, &fence.MiddlewareOptions{
		Store: fence.NewMemoryStore(),
		Key:   func(r *http.Request) (string, error) { return "ledger:" + strings.TrimPrefix(r.URL.Path, "/"), nil },
		Hook: func(e fenced.Event) {
			if e.Kind == fenced.EventStaleWrite {
				mu.Lock()
				stale = append(stale, e)
				mu.Unlock()
			}
		},
	}))
	defer srv.Close()
	client := &http.Client{Transport: &fence.Transport{}}

	// A holds a short lease without renewal and lets it run out.
	a, err := leases.Acquire(ctx, "ledger:acct1", &fenced.LeaseOptions{TTL: 100 * time.Millisecond, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	aCtx := fence.WithLease(ctx, a)
	resp, err := post(aCtx, client, srv.URL+"/acct1", "a1")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("A's first write: %v %v", resp, err)
	}
	resp.Body.Close()
	<-a.Context().Done()
	b, err := leases.Acquire(ctx, "ledger:acct1", &fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Fence() <= a.Fence() {
		t.Fatalf("fences %d then %d", a.Fence(), b.Fence())
	}
	resp, err = post(fence.WithLease(ctx, b), client, srv.URL+"/acct1", "b1")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("B's write: %v %v", resp, err)
	}
	resp.Body.Close()
	// A, paused past its lease, writes late: refused with the standard 409.
	resp, err = post(aCtx, client, srv.URL+"/acct1", "a2-late")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("late write by A: status %d, want 409", resp.StatusCode)
	}
	herr := fence.ResponseError(resp)
	var he *fence.HTTPError
	if !errors.As(herr, &he) || !errors.Is(herr, fenced.ErrStaleFence) || he.Code != fence.CodeStale ||
		he.Presented != a.Fence() || he.Current != b.Fence() || he.Key != "ledger:acct1" {
		t.Fatalf("late write by A: %#v, want fence_stale presented %d current %d", herr, a.Fence(), b.Fence())
	}
	// B keeps writing with its fence.
	resp, err = post(fence.WithLease(ctx, b), client, srv.URL+"/acct1", "b2")
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("B's second write: %v %v", resp, err)
	}
	resp.Body.Close()
	if got := strings.Join(led.snapshot(), ","); got != "a1,b1,b2" {
		t.Fatalf("ledger = %s, want a1,b1,b2", got)
	}
	// A's token on another resource key is refused as the wrong key.
	resp, err = post(fence.WithLease(ctx, b), client, srv.URL+"/acct2", "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := fence.ResponseError(resp); resp.StatusCode != http.StatusForbidden || !errors.Is(err, fence.ErrWrongKey) {
		t.Fatalf("token for another key: %d %v", resp.StatusCode, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stale) != 1 || stale[0].Fence != a.Fence() || stale[0].Current != b.Fence() || stale[0].Resource != "/acct1" {
		t.Fatalf("stale reports %+v", stale)
	}
}

func TestHTTPBadHeaders(t *testing.T) {
	led := &ledger{}
	srv := httptest.NewServer(fence.Middleware(led, &fence.MiddlewareOptions{Store: fence.NewMemoryStore(), Key: fence.FixedKey("k")}))
	defer srv.Close()
	owner := fence.OwnerDigest("x")
	for _, c := range []struct {
		name    string
		headers map[string][]string
		status  int
		code    string
		want    string
	}{
		{"none", nil, 428, fence.CodeMissing, "missing"},
		{"fence only", map[string][]string{fence.HeaderFence: {"5"}}, 400, fence.CodeMalformed, "given 0 times"},
		{"no owner", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"5"}}, 400, fence.CodeMalformed, fence.HeaderOwner},
		{"fence zero", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"0"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "fence is 0"},
		{"negative", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"-1"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "not a plain decimal"},
		{"plus sign", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"+5"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "not a plain decimal"},
		{"hex", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"0x2a"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "not a plain decimal"},
		{"leading zero", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"007"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "leading zero"},
		{"overflow int64", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"9223372036854775808"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "overflows"},
		{"overflow uint64", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"18446744073709551616"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "too long"},
		{"space", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"5 6"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "not a plain decimal"},
		{"twice", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"5", "6"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "2 times"},
		{"bad key", map[string][]string{fence.HeaderKey: {strings.Repeat("k", 300)}, fence.HeaderFence: {"5"}, fence.HeaderOwner: {owner}}, 400, fence.CodeMalformed, "invalid key"},
		{"bad owner", map[string][]string{fence.HeaderKey: {"k"}, fence.HeaderFence: {"5"}, fence.HeaderOwner: {strings.Repeat("a", 65)}}, 400, fence.CodeMalformed, "longer than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/x", strings.NewReader("bad"))
			for k, vs := range c.headers {
				for _, v := range vs {
					req.Header.Add(k, v)
				}
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != c.status {
				t.Errorf("status %d, want %d", resp.StatusCode, c.status)
			}
			err = fence.ResponseError(resp)
			var he *fence.HTTPError
			if !errors.As(err, &he) || he.Code != c.code || !strings.Contains(he.Message, c.want) {
				t.Errorf("response %v, want code %s mentioning %q", err, c.code, c.want)
			}
		})
	}
	if n := led.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for bad requests", n)
	}
}

func TestTransportRefusesWithoutToken(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	c := &http.Client{Transport: &fence.Transport{}}
	if _, err := post(context.Background(), c, srv.URL, "x"); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("no token: %v, want ErrNoToken", err)
	}
	bad := fence.WithToken(context.Background(), fence.Token{Key: "k", Fence: 0, Owner: "o"})
	if _, err := post(bad, c, srv.URL, "x"); !errors.Is(err, fence.ErrInvalidToken) {
		t.Fatalf("fence 0: %v, want ErrInvalidToken", err)
	}
	if hits.Load() != 0 {
		t.Fatal("a request without a valid token reached the server")
	}
}

// TestHTTPHandlerChecksToken: without a Store the middleware hands the
// parsed token to the handler, which checks it in its own write.
func TestHTTPHandlerChecksToken(t *testing.T) {
	store := fence.NewMemoryStore()
	var got fence.Token
	h := fence.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = fence.TokenFrom(r.Context())
		res, done, err := store.Admit(r.Context(), got)
		if err != nil {
			fence.WriteError(w, err, got, 0)
			return
		}
		if !res.Applied() {
			fence.WriteError(w, res.Err(), got, res.Current)
			return
		}
		done()
	}), &fence.MiddlewareOptions{Key: fence.FixedKey("k")})
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := &http.Client{Transport: &fence.Transport{}}
	send := func(f uint64) *http.Response {
		resp, err := post(fence.WithToken(context.Background(), fence.Token{Key: "k", Fence: f, Owner: fmt.Sprint("o", f)}), c, srv.URL, "")
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := send(7); resp.StatusCode != 200 || got.Fence != 7 || got.Key != "k" || got.Owner != "o7" {
		t.Fatalf("status %d token %+v", resp.StatusCode, got)
	}
	resp := send(6)
	if err := fence.ResponseError(resp); resp.StatusCode != 409 || !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale through handler: %d %v", resp.StatusCode, err)
	}
}

// FuzzParseHeaders: any header values, each given once or twice, either
// parse to exactly the token the headers spell (the fence is the header's
// number, written canonically) or give an error matching ErrInvalidToken
// or ErrNoToken; and they parse exactly when an independent reading of the
// rules says they should.
func FuzzParseHeaders(f *testing.F) {
	for _, s := range []struct {
		key, fence, owner, sig string
		dup                    uint8
	}{
		{"invoice:1", "42", fence.OwnerDigest("x"), "", 0},
		{"invoice:1", "42", fence.OwnerDigest("x"), "k1.c2ln", 0},
		{"k", "-1", "o", "", 0}, {"k", "9223372036854775807", "o", "", 0}, {"k", "9223372036854775808", "o", "", 0},
		{"", "", "", "", 0}, {"k", "0", "o", "", 0}, {"k", "1e3", "o", "", 0}, {"k", "007", "o", "", 0},
		{"k", "+5", "o", "", 0}, {"k", " 5", "o", "", 0}, {"k", "5", "o p", "", 0}, {" k", "5", "o", "", 0},
		{"k", "5", "o", "", 1}, {"k", "5", "o", "", 2}, {"k", "5", "o", "", 4}, {"k", "5", "o", "s", 8}, {"k", "5", "o", "", 8},
	} {
		f.Add(s.key, s.fence, s.owner, s.sig, s.dup)
	}
	f.Fuzz(func(t *testing.T, key, fenceVal, owner, sig string, dup uint8) {
		h := http.Header{}
		dupd := false
		for i, kv := range [][2]string{{fence.HeaderKey, key}, {fence.HeaderFence, fenceVal}, {fence.HeaderOwner, owner}, {fence.HeaderSignature, sig}} {
			if kv[1] == "" {
				continue
			}
			h.Add(kv[0], kv[1])
			if dup&(1<<i) != 0 {
				h.Add(kv[0], kv[1])
				dupd = true
			}
		}
		tk, err := fence.ParseHeaders(h)
		want := !dupd && key != "" && owner != "" && fenced.ValidateKey(key) == nil &&
			canonicalFence(fenceVal) && plainASCII(owner, fence.MaxOwnerLen) && (sig == "" || plainASCII(sig, fence.MaxSigLen))
		if err != nil {
			if !errors.Is(err, fence.ErrInvalidToken) && !errors.Is(err, fence.ErrNoToken) {
				t.Fatalf("error %v matches neither sentinel", err)
			}
			if want {
				t.Fatalf("valid headers %q %q %q %q refused: %v", key, fenceVal, owner, sig, err)
			}
			return
		}
		if !want {
			t.Fatalf("invalid headers %q %q %q %q (dup %b) accepted as %+v", key, fenceVal, owner, sig, dup, tk)
		}
		if tk.Key != key || tk.Owner != owner || tk.Sig != sig || strconv.FormatUint(tk.Fence, 10) != fenceVal {
			t.Fatalf("headers %q %q %q %q parsed as %+v", key, fenceVal, owner, sig, tk)
		}
		h2 := http.Header{}
		if err := fence.SetHeaders(h2, tk); err != nil {
			t.Fatal(err)
		}
		if back, err := fence.ParseHeaders(h2); err != nil || back != tk {
			t.Fatalf("round trip %+v -> %+v %v", tk, back, err)
		}
	})
}

// canonicalFence reports whether s is a fence written as the guards want
// it: decimal digits without sign or leading zero, 1..MaxFence.
func canonicalFence(s string) bool {
	if s == "" || s[0] == '0' || strings.Trim(s, "0123456789") != "" {
		return false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return err == nil && n <= fence.MaxFence
}

// plainASCII reports whether s has 1..max bytes, all printable ASCII
// other than space.
func plainASCII(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
