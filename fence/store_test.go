package fence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fence"
)

// hangLimit bounds waits that only end if the code under test does not hang;
// it is a deadlock detector, not a speed assertion.
const hangLimit = 30 * time.Second

func ledgerKey(r *http.Request) (string, error) {
	return "ledger:" + strings.TrimPrefix(r.URL.Path, "/"), nil
}

// sendToken posts body to url with t's headers and returns the status.
func sendToken(t *testing.T, ctx context.Context, url string, tk fence.Token, body io.Reader) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := fence.SetHeaders(req.Header, tk); err != nil {
		t.Fatal(err)
	}
	return http.DefaultClient.Do(req)
}

// TestMemoryStoreCurrentFromHandler: a handler behind Middleware may ask
// the store what it holds for its own key; that used to deadlock, because
// Current waited for the key's lock, which the handler's own request held.
func TestMemoryStoreCurrentFromHandler(t *testing.T) {
	store := fence.NewMemoryStore()
	srv := httptest.NewServer(fence.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tk, _ := fence.TokenFrom(r.Context())
		f, o := store.Current(tk.Key)
		fmt.Fprintf(w, "%d %s", f, o)
	}), &fence.MiddlewareOptions{Store: store, Key: ledgerKey}))
	ctx, cancel := context.WithTimeout(context.Background(), hangLimit)
	defer cancel()
	resp, err := sendToken(t, ctx, srv.URL+"/acct1", fence.Token{Key: "ledger:acct1", Fence: 3, Owner: "o3"}, nil)
	if err != nil {
		// The server is left running: closing it would wait for the
		// deadlocked handler.
		t.Fatalf("handler calling Current: %v (deadlock)", err)
	}
	defer srv.Close()
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); string(b) != "3 o3" {
		t.Fatalf("Current from the handler = %q, want \"3 o3\"", b)
	}
}

// TestMemoryStoreStalledBody: an older holder whose request body stalls
// (the client paused mid-upload) must not hold the key: the middleware
// reads the body before admission, so a newer holder is served at once
// and the stalled request, when its body finally arrives, is refused as
// stale. Before, the newer holder waited for as long as the body stalled.
func TestMemoryStoreStalledBody(t *testing.T) {
	store := fence.NewMemoryStore()
	var bodies []string
	srv := httptest.NewServer(fence.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		bodies = append(bodies, string(b)) // serialized by the store
	}), &fence.MiddlewareOptions{Store: store, Key: ledgerKey}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangLimit)
	defer cancel()

	old := fence.Token{Key: "ledger:acct1", Fence: 1, Owner: "old"}
	if resp, err := sendToken(t, ctx, srv.URL+"/acct1", old, strings.NewReader("first")); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("old holder's first write: %v %v", resp, err)
	}
	pr, pw := io.Pipe()
	stalled := make(chan *http.Response, 1)
	go func() {
		resp, err := sendToken(t, ctx, srv.URL+"/acct1", old, pr)
		if err != nil {
			t.Error(err)
		}
		stalled <- resp
	}()
	if _, err := pw.Write([]byte("late-")); err != nil { // headers and part of the body are sent
		t.Fatal(err)
	}
	resp, err := sendToken(t, ctx, srv.URL+"/acct1", fence.Token{Key: "ledger:acct1", Fence: 2, Owner: "new"}, strings.NewReader("second"))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("newer holder while an older request's body stalls: %v %v (it waited for the stalled body)", resp, err)
	}
	pw.Write([]byte("write"))
	pw.Close()
	r := <-stalled
	if r == nil || r.StatusCode != http.StatusConflict {
		t.Fatalf("stalled older request after the newer holder: %v, want 409", r)
	}
	if got := strings.Join(bodies, ","); got != "first,second" {
		t.Fatalf("writes %s, want first,second", got)
	}
}

// TestMemoryStoreZeroValue: a zero MemoryStore is ready to use (it used to
// panic on the first Admit).
func TestMemoryStoreZeroValue(t *testing.T) {
	var s fence.MemoryStore
	tk := fence.Token{Key: "k", Fence: 4, Owner: "o"}
	r, done, err := s.Admit(context.Background(), tk)
	if err != nil || !r.Applied() {
		t.Fatalf("zero MemoryStore: %+v %v", r, err)
	}
	done()
	if f, o := s.Current("k"); f != 4 || o != "o" {
		t.Fatalf("Current = %d %s", f, o)
	}
	if r, _, err := s.Admit(context.Background(), fence.Token{Key: "k", Fence: 3, Owner: "o"}); err != nil || r.Outcome != fence.Stale {
		t.Fatalf("older token: %+v %v", r, err)
	}
	var none fence.MemoryStore
	if f, o := none.Current("k"); f != 0 || o != "" {
		t.Fatalf("Current on an empty store = %d %q", f, o)
	}
	_ = errors.New
}
