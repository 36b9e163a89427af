package fence_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/fence"
)

// curlChild is the request docs/guards.md shows for a shell child of
// `fenced run`, run here exactly as written.
const curlChild = `curl -sS -o /dev/null -w "%{http_code}" -X POST \
  -H "Fenced-Key: $FENCED_KEY" -H "Fenced-Fence: $FENCED_FENCE" -H "Fenced-Owner: $FENCED_OWNER" \
  "$URL"`

// TestShellChildToken: two children given equal fences by a fence source
// that repeated a number (an asynchronous failover) but different owners
// (FENCED_OWNER) are told apart at the resource: the first to write wins
// and the other is refused, from a shell child with curl and from a Go
// child with TokenFromEnv alike. Before FENCED_OWNER a child could not
// build a token at all (the owner header is required).
func TestShellChildToken(t *testing.T) {
	store := fence.NewMemoryStore()
	srv := httptest.NewServer(fence.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		&fence.MiddlewareOptions{Store: store, Key: fence.FixedKey("invoice:inv_72")}))
	defer srv.Close()
	a := fence.Token{Key: "invoice:inv_72", Fence: 7, Owner: fence.OwnerDigest("owner-token-of-a")}
	b := fence.Token{Key: "invoice:inv_72", Fence: 7, Owner: fence.OwnerDigest("owner-token-of-b")}

	shell := func(tk fence.Token) string {
		cmd := exec.Command("sh", "-c", curlChild)
		cmd.Env = append(append(os.Environ(), fence.Environ(tk)...), "URL="+srv.URL+"/invoices/inv_72")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("curl child: %v %s", err, out)
		}
		return string(out)
	}
	if code := shell(a); code != "200" {
		t.Fatalf("child A: HTTP %s, want 200", code)
	}
	if code := shell(a); code != "200" {
		t.Fatalf("child A again: HTTP %s, want 200 (same fence, same owner)", code)
	}
	if code := shell(b); code != "409" {
		t.Fatalf("child B with A's fence and its own owner: HTTP %s, want 409", code)
	}

	// A Go child reads the same variables.
	for _, kv := range fence.Environ(b) {
		name, value, _ := strings.Cut(kv, "=")
		t.Setenv(name, value)
	}
	tk, err := fence.TokenFromEnv()
	if err != nil || tk != b {
		t.Fatalf("TokenFromEnv = %+v %v, want %+v", tk, err, b)
	}
	c := &http.Client{Transport: &fence.Transport{}}
	req, _ := http.NewRequestWithContext(fence.WithToken(context.Background(), tk), http.MethodPost, srv.URL, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var he *fence.HTTPError
	if err := fence.ResponseError(resp); !errors.As(err, &he) || he.Status != http.StatusConflict || !errors.Is(err, fence.ErrStale) {
		t.Fatalf("Go child B: %v, want 409 fence_stale", err)
	}
	if f, o := store.Current("invoice:inv_72"); f != 7 || o != a.Owner {
		t.Fatalf("store holds %d %s, want A's", f, o)
	}
}

func TestTokenFromEnvErrors(t *testing.T) {
	for _, name := range []string{fence.EnvKey, fence.EnvFence, fence.EnvOwner, fence.EnvSignature} {
		t.Setenv(name, "")
		os.Unsetenv(name)
	}
	if _, err := fence.TokenFromEnv(); !errors.Is(err, fence.ErrNoToken) {
		t.Fatalf("nothing set: %v, want ErrNoToken", err)
	}
	t.Setenv(fence.EnvKey, "job:x")
	t.Setenv(fence.EnvFence, "3")
	if _, err := fence.TokenFromEnv(); !errors.Is(err, fence.ErrInvalidToken) || !strings.Contains(err.Error(), fence.EnvOwner) {
		t.Fatalf("no owner: %v, want ErrInvalidToken naming %s", err, fence.EnvOwner)
	}
	t.Setenv(fence.EnvOwner, fence.OwnerDigest("o"))
	for _, bad := range []string{"0", "-1", "03", "x", "9223372036854775808"} {
		t.Setenv(fence.EnvFence, bad)
		if _, err := fence.TokenFromEnv(); !errors.Is(err, fence.ErrInvalidToken) || !strings.Contains(err.Error(), fence.EnvFence) {
			t.Errorf("fence %q: %v, want ErrInvalidToken naming %s", bad, err, fence.EnvFence)
		}
	}
	t.Setenv(fence.EnvFence, "3")
	t.Setenv(fence.EnvSignature, "k1.abc")
	if tk, err := fence.TokenFromEnv(); err != nil || tk.Sig != "k1.abc" || tk.Fence != 3 || tk.Key != "job:x" {
		t.Fatalf("signed: %+v %v", tk, err)
	}
}
