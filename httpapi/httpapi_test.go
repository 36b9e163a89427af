package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	_ "github.com/fenced-dev/fenced/fencedetcd" // the plan of another backend (its registered rounding)
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	"github.com/fenced-dev/fenced/httpapi"
	"github.com/fenced-dev/fenced/internal/core/token"
)

const (
	adminSecret  = "admin-secret-0123456789abcdef"
	clientSecret = "client-secret-0123456789abcdef"
)

type fixture struct {
	store  string
	client *fenced.Client
	srv    *httptest.Server
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	store := "sqlite://" + filepath.Join(t.TempDir(), "leases.db")
	f := &fixture{store: store, client: open(t, store)}
	f.srv = httptest.NewServer(server(t, f.client))
	t.Cleanup(f.srv.Close)
	return f
}

func open(t *testing.T, store string) *fenced.Client {
	t.Helper()
	c, err := fenced.Open(context.Background(), store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func server(t *testing.T, c *fenced.Client) *httpapi.Server {
	t.Helper()
	s, err := httpapi.New(httpapi.Config{
		Client: c, Store: "sqlite:test", Scheme: "sqlite",
		AdminTokens:  []httpapi.Token{{Name: "alice", Secret: adminSecret}},
		ClientTokens: []httpapi.Token{{Name: "bot", Secret: clientSecret}},
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type reply struct {
	status int
	body   string
	json   map[string]any
	header http.Header
}

func (f *fixture) do(t *testing.T, method, path, body string, header ...string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	r := reply{status: res.StatusCode, body: string(b), header: res.Header}
	_ = json.Unmarshal(b, &r.json)
	return r
}

func bearer(secret string) []string { return []string{"Authorization", "Bearer " + secret} }

// A refused request changes nothing: without a token (401), with a wrong
// or a client token (403), with bad input (4xx, JSON, never 5xx). Then the
// admin's break ends the holder's lease, which names the token in its
// cause.
func TestBreakRefusalsChangeNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	holder := open(t, f.store)
	l, err := holder.TryAcquire(ctx, "job:nightly", &fenced.LeaseOptions{TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	unchanged := func(what string) {
		t.Helper()
		info, err := f.client.Inspect(ctx, "job:nightly")
		if err != nil || !info.Held || info.Fence != l.Fence() || l.Err() != nil {
			t.Fatalf("after %s: %+v, %v; lease err %v: want the lease untouched", what, info, err, l.Err())
		}
		if recs, _ := f.client.Breaks(ctx, ""); len(recs) != 0 {
			t.Fatalf("after %s: breaks recorded: %+v", what, recs)
		}
	}
	path := "/api/v1/leases/job:nightly/break"
	good := `{"reason":"test"}`
	for _, tc := range []struct {
		name   string
		method string
		path   string
		body   string
		header []string
		status int
		code   string
	}{
		{"no token", "POST", path, good, nil, 401, "unauthorized"},
		{"not bearer", "POST", path, good, []string{"Authorization", "Basic " + adminSecret}, 401, "unauthorized"},
		{"empty bearer", "POST", path, good, []string{"Authorization", "Bearer "}, 401, "unauthorized"},
		{"wrong token", "POST", path, good, bearer(adminSecret + "x"), 403, "forbidden"},
		{"prefix of the token", "POST", path, good, bearer(adminSecret[:20]), 403, "forbidden"},
		{"client token", "POST", path, good, bearer(clientSecret), 403, "forbidden"},
		{"key with leading space", "POST", "/api/v1/leases/%20job/break", good, bearer(adminSecret), 400, "invalid_key"},
		{"key too long", "POST", "/api/v1/leases/" + strings.Repeat("k", 300) + "/break", good, bearer(adminSecret), 400, "invalid_key"},
		{"non-printable key", "POST", "/api/v1/leases/job%07/break", good, bearer(adminSecret), 400, "invalid_key"},
		{"bad JSON", "POST", path, `{"reason":`, bearer(adminSecret), 400, "bad_json"},
		{"not an object", "POST", path, `["test"]`, bearer(adminSecret), 400, "bad_json"},
		{"unknown field", "POST", path, `{"reason":"x","force":true}`, bearer(adminSecret), 400, "bad_json"},
		{"trailing data", "POST", path, good + `{}`, bearer(adminSecret), 400, "bad_json"},
		{"empty body", "POST", path, "", bearer(adminSecret), 400, "bad_json"},
		{"missing reason", "POST", path, `{}`, bearer(adminSecret), 400, "missing_reason"},
		{"control character in reason", "POST", path, `{"reason":"a\u0007b"}`, bearer(adminSecret), 400, "invalid_reason"},
		{"oversized body", "POST", path, `{"reason":"` + strings.Repeat("x", 70<<10) + `"}`, bearer(adminSecret), 413, "too_large"},
		{"key not held", "POST", "/api/v1/leases/job:other/break", good, bearer(adminSecret), 404, "not_held"},
		{"wrong method", "GET", path, "", bearer(adminSecret), 405, "method_not_allowed"},
		{"unknown endpoint", "POST", "/api/v1/leases/job:nightly/steal", good, bearer(adminSecret), 404, "not_found"},
		{"unknown key", "GET", "/api/v1/leases/job:never", "", nil, 404, "not_found"},
		{"bad prefix", "GET", "/api/v1/leases?prefix=%07", "", nil, 400, "invalid_prefix"},
	} {
		r := f.do(t, tc.method, tc.path, tc.body, tc.header...)
		if r.status != tc.status || r.json["error"] != tc.code || r.json["message"] == "" {
			t.Errorf("%s: %d %s, want %d with JSON error %q", tc.name, r.status, r.body, tc.status, tc.code)
		}
		if !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
			t.Errorf("%s: Content-Type %q", tc.name, r.header.Get("Content-Type"))
		}
		if tc.status == 401 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: 401 without WWW-Authenticate", tc.name)
		}
		unchanged(tc.name)
	}

	r := f.do(t, "POST", path, `{"reason":"host wedged, OPS-12"}`, bearer(adminSecret)...)
	if r.status != 200 || r.json["by"] != "http:alice" {
		t.Fatalf("break with the admin token: %d %s", r.status, r.body)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the holder did not lose its broken lease")
	}
	if !errors.Is(l.Err(), fenced.ErrBroken) || !strings.Contains(l.Err().Error(), "http:alice") || !strings.Contains(l.Err().Error(), "host wedged") {
		t.Fatalf("holder's cause %v: want a break by http:alice", l.Err())
	}
	recs, err := f.client.Breaks(ctx, "job:nightly")
	if err != nil || len(recs) != 1 || recs[0].By != "http:alice" || recs[0].Reason != "host wedged, OPS-12" {
		t.Fatalf("audit: %+v, %v", recs, err)
	}
}

// Listings and the key view name the holder by owner digest, never by the
// owner token or a prefix of it.
func TestListingsShowDigestsOnly(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	l, err := open(t, f.store).TryAcquire(ctx, "job:a", nil)
	if err != nil {
		t.Fatal(err)
	}
	digest := token.Digest(l.Owner())
	for _, path := range []string{"/api/v1/leases", "/api/v1/leases?prefix=job:", "/api/v1/leases/job:a", "/", "/keys/job:a"} {
		r := f.do(t, "GET", path, "")
		if r.status != 200 {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
		if strings.Contains(r.body, l.Owner()[:8]) && !strings.Contains(digest, l.Owner()[:8]) {
			t.Errorf("GET %s reveals (a prefix of) the owner token", path)
		}
		if !strings.Contains(r.body, digest[:12]) {
			t.Errorf("GET %s does not name the holder by its owner digest %s", path, digest)
		}
	}
	r := f.do(t, "GET", "/api/v1/leases", "")
	leases, _ := r.json["leases"].([]any)
	if len(leases) != 1 {
		t.Fatalf("leases: %s", r.body)
	}
	got := leases[0].(map[string]any)
	if got["key"] != "job:a" || got["fence"] != float64(l.Fence()) || got["owner_digest"] != digest || got["remaining_ms"].(float64) <= 0 || got["held_since"] == nil || got["ttl_ms"].(float64) <= 0 {
		t.Fatalf("lease view %v", got)
	}
	if r := f.do(t, "GET", "/api/v1/leases?prefix=other:", ""); !strings.Contains(r.body, `"leases": []`) {
		t.Fatalf("prefix filter: %s", r.body)
	}
}

// Clients in other languages acquire, renew and release through the API;
// the owner token comes back only from acquire.
func TestAcquireRenewRelease(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	path := "/api/v1/leases/queue%2Fjob:7" // a '/' in a key travels as %2F
	if r := f.do(t, "POST", path+"/acquire", `{"ttl_ms":5000}`); r.status != 401 {
		t.Fatalf("acquire without a token: %d", r.status)
	}
	r := f.do(t, "POST", path+"/acquire", `{"ttl_ms":5000}`, bearer(clientSecret)...)
	if r.status != 200 {
		t.Fatalf("acquire: %d %s", r.status, r.body)
	}
	owner, _ := r.json["owner"].(string)
	fence := r.json["fence"].(float64)
	if len(owner) != 32 || fence < 1 || r.json["ttl_ms"] != 5000.0 || r.json["valid_for_ms"].(float64) <= 0 || r.json["owner_digest"] != token.Digest(owner) {
		t.Fatalf("acquire answer %s", r.body)
	}
	info, err := f.client.Inspect(ctx, "queue/job:7")
	if err != nil || !info.Held || info.Fence != uint64(fence) {
		t.Fatalf("store after acquire: %+v %v", info, err)
	}
	if r := f.do(t, "POST", path+"/acquire", ``, bearer(clientSecret)...); r.status != 409 || r.json["error"] != "held" {
		t.Fatalf("second acquire: %d %s", r.status, r.body)
	}
	if r := f.do(t, "GET", "/api/v1/leases", ""); strings.Contains(r.body, owner) || !strings.Contains(r.body, `"via_api": true`) {
		t.Fatalf("listing after acquire: %s", r.body)
	}
	for _, bad := range []struct{ body, code string }{
		{`{"owner":"` + strings.Repeat("0", 32) + `","fence":1}`, "not_held"},
		{`{"owner":"` + owner + `","fence":99}`, "not_held"},
		{`{"fence":1}`, "missing_owner"},
		{`{"owner":"` + owner + `","fence":-1}`, "bad_json"},
	} {
		if r := f.do(t, "POST", path+"/renew", bad.body, bearer(clientSecret)...); r.status/100 != 4 || r.json["error"] != bad.code {
			t.Errorf("renew %s: %d %s, want %s", bad.body, r.status, r.body, bad.code)
		}
	}
	grant := fmt.Sprintf(`{"owner":%q,"fence":%d}`, owner, int64(fence))
	if r := f.do(t, "POST", path+"/renew", grant, bearer(clientSecret)...); r.status != 200 || r.json["owner"] != nil || r.json["valid_for_ms"].(float64) <= 0 {
		t.Fatalf("renew: %d %s (want 200, no owner token in the answer)", r.status, r.body)
	}
	if r := f.do(t, "POST", path+"/release", grant, bearer(clientSecret)...); r.status != 200 || r.json["released"] != true {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	if info, _ := f.client.Inspect(ctx, "queue/job:7"); info.Held {
		t.Fatal("still held after release")
	}
	if r := f.do(t, "POST", path+"/release", grant, bearer(clientSecret)...); r.status != 409 || r.json["error"] != "not_held" {
		t.Fatalf("second release: %d %s", r.status, r.body)
	}

	// After a restart of the server the authority still judges renew and
	// release by owner and fence.
	r = f.do(t, "POST", path+"/acquire", `{"ttl_ms":5000}`, bearer(clientSecret)...)
	owner, fence = r.json["owner"].(string), r.json["fence"].(float64)
	grant = fmt.Sprintf(`{"owner":%q,"fence":%d,"ttl_ms":5000}`, owner, int64(fence))
	restarted := httptest.NewServer(server(t, open(t, f.store)))
	defer restarted.Close()
	f2 := &fixture{store: f.store, client: f.client, srv: restarted}
	wrong := fmt.Sprintf(`{"owner":%q,"fence":%d}`, strings.Repeat("1", 32), int64(fence))
	if r := f2.do(t, "POST", path+"/renew", wrong, bearer(clientSecret)...); r.status != 409 {
		t.Fatalf("renew by another owner after a restart: %d %s", r.status, r.body)
	}
	if r := f2.do(t, "POST", path+"/renew", grant, bearer(clientSecret)...); r.status != 200 || r.json["valid_for_ms"].(float64) <= 0 {
		t.Fatalf("renew after a restart: %d %s", r.status, r.body)
	}
	if r := f2.do(t, "POST", path+"/release", grant, bearer(clientSecret)...); r.status != 200 {
		t.Fatalf("release after a restart: %d %s", r.status, r.body)
	}
	if info, _ := f.client.Inspect(ctx, "queue/job:7"); info.Held {
		t.Fatal("still held after release through the restarted server")
	}
}

func TestAcquireBadInput(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct{ body, code string }{
		{`{"ttl_ms":-1}`, "invalid_ttl"},
		{`{"ttl_ms":1}`, "invalid_ttl"},
		{`{"wait_ms":-5}`, "invalid_wait"},
		{`{"wait_ms":3600000}`, "invalid_wait"},
		{`{"min_fence":"best"}`, "invalid_min_fence"},
		{`{"ttl_ms":"30s"}`, "bad_json"},
	} {
		if r := f.do(t, "POST", "/api/v1/leases/job:x/acquire", tc.body, bearer(clientSecret)...); r.status != 400 || r.json["error"] != tc.code {
			t.Errorf("acquire %s: %d %s, want 400 %s", tc.body, r.status, r.body, tc.code)
		}
	}
	if l, _ := f.client.List(context.Background(), ""); len(l) != 0 {
		t.Fatalf("refused acquires left leases: %+v", l)
	}
}

func TestMetricsHealthAndPlan(t *testing.T) {
	f := newFixture(t)
	if _, err := open(t, f.store).TryAcquire(context.Background(), "job:a", nil); err != nil {
		t.Fatal(err)
	}
	r := f.do(t, "GET", "/metrics", "")
	for _, want := range []string{`fenced_store_up 1`, `fenced_store_leases_held{key_group="job"} 1`, `fenced_store_leases_expiring{key_group="job"} 0`, `fenced_store_owner_changes_total{key_group="job"} 0`, `fenced_serve_breaks_total{key_group="job"} 0`} {
		if !strings.Contains(r.body, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, r.body)
		}
	}
	if r := f.do(t, "GET", "/healthz", ""); r.status != 200 || r.json["status"] != "ok" {
		t.Fatalf("healthz: %d %s", r.status, r.body)
	}
	r = f.do(t, "GET", "/api/v1/plan?ttl=1500ms&backend=etcd&max_pause=5s", "")
	if r.status != 200 || r.json["authority_ttl_ms"] != 3000.0 || r.json["stale_window_ms"] != 2500.0 {
		t.Fatalf("plan: %d %s", r.status, r.body)
	}
	for _, q := range []string{"ttl=soon", "ttl=1ms", "backend=floppy", "renew_every=1h"} {
		if r := f.do(t, "GET", "/api/v1/plan?"+q, ""); r.status != 400 {
			t.Errorf("plan?%s: %d %s", q, r.status, r.body)
		}
	}
	if r := f.do(t, "POST", "/api/v1/scenario", `{}`, bearer(clientSecret)...); r.status != 501 {
		t.Fatalf("scenario without a runner: %d %s", r.status, r.body)
	}
}

// Bound to loopback, the server refuses other Host names (DNS rebinding).
func TestLoopbackOnlyRefusesOtherHosts(t *testing.T) {
	c := open(t, "sqlite://"+filepath.Join(t.TempDir(), "l.db"))
	s, err := httpapi.New(httpapi.Config{Client: c, Scheme: "sqlite", LoopbackOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]int{"127.0.0.1:7420": 200, "localhost:7420": 200, "[::1]:7420": 200, "evil.example:7420": 421, "10.0.0.1": 421} {
		req := httptest.NewRequest("GET", "/healthz", nil)
		req.Host = host
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != want {
			t.Errorf("Host %s: %d, want %d", host, w.Code, want)
		}
	}
}

func TestTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	toks, err := httpapi.ReadTokenFile(write("ok", "# ops\nalice "+adminSecret+"\n\n"+clientSecret+"\n", 0o600), "admin")
	if err != nil || len(toks) != 2 || toks[0].Name != "alice" || toks[1].Name != "admin" || toks[1].Secret != clientSecret {
		t.Fatalf("tokens %+v, %v", toks, err)
	}
	for name, tc := range map[string]struct {
		content string
		mode    os.FileMode
		want    string
	}{
		"readable": {adminSecret, 0o644, "chmod 600"},
		"short":    {"alice tooshort", 0o600, "shorter than 16"},
		"fields":   {"a b c", 0o600, "fields"},
		"empty":    {"# nothing\n", 0o600, "no token"},
		"twice":    {"a " + adminSecret + "\nb " + adminSecret, 0o600, "twice"},
	} {
		if _, err := httpapi.ReadTokenFile(write(name, tc.content, tc.mode), "admin"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
	c := open(t, "sqlite://"+filepath.Join(dir, "l.db"))
	if _, err := httpapi.New(httpapi.Config{Client: c, AdminTokens: []httpapi.Token{{Name: "a", Secret: adminSecret}}, ClientTokens: []httpapi.Token{{Name: "b", Secret: adminSecret}}}); err == nil {
		t.Fatal("the same secret as admin and client token was accepted")
	}
}
