package fence_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fence"
)

// storeUnderTest is a Store with a uniform Current for the shared tests.
type storeUnderTest interface {
	fence.Store
	current(t *testing.T, key string) (uint64, string)
}

type memStore struct{ *fence.MemoryStore }

func (m memStore) current(t *testing.T, key string) (uint64, string) { return m.Current(key) }

type sqlStore struct{ *fence.SQLStore }

func (s sqlStore) current(t *testing.T, key string) (uint64, string) {
	f, o, err := s.Current(context.Background(), key)
	if err != nil {
		t.Error(err)
	}
	return f, o
}

// runStoreTests runs the tests every Store passes; newStore returns a store
// with no keys.
func runStoreTests(t *testing.T, newStore func(t *testing.T) storeUnderTest) {
	t.Run("Semantics", func(t *testing.T) { testStoreSemantics(t, newStore(t)) })
	t.Run("WaitEndsWithContext", func(t *testing.T) { testStoreWaitEndsWithContext(t, newStore(t)) })
	t.Run("PropertyConcurrent", func(t *testing.T) { testStoreProperty(t, newStore(t)) })
	t.Run("CurrentFromHandler", func(t *testing.T) { testStoreCurrentFromHandler(t, newStore(t)) })
	t.Run("StalledBody", func(t *testing.T) { testStoreStalledBody(t, newStore(t)) })
}

func TestMemoryStore(t *testing.T) {
	runStoreTests(t, func(t *testing.T) storeUnderTest { return memStore{fence.NewMemoryStore()} })
}

func testStoreSemantics(t *testing.T, s storeUnderTest) {
	ctx := context.Background()
	admit := func(f uint64, owner string) (fence.Result, func()) {
		t.Helper()
		r, done, err := s.Admit(ctx, fence.Token{Key: "job:1", Fence: f, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		if r.Applied() != (done != nil) {
			t.Fatalf("result %+v with done %v", r, done != nil)
		}
		if done != nil {
			done()
			done() // idempotent
		}
		return r, done
	}
	if r, _ := admit(5, "a"); !r.Applied() || r.Current != 5 {
		t.Fatalf("first token: %+v", r)
	}
	if r, _ := admit(5, "a"); !r.Applied() {
		t.Fatalf("same token again: %+v", r)
	}
	if r, _ := admit(5, "b"); r.Outcome != fence.Stale || !r.SameFenceOtherOwner || r.Current != 5 {
		t.Fatalf("equal fence, other owner: %+v", r)
	}
	if r, _ := admit(4, "c"); r.Outcome != fence.Stale || r.SameFenceOtherOwner || r.Current != 5 {
		t.Fatalf("older fence: %+v", r)
	}
	if f, o := s.current(t, "job:1"); f != 5 || o != "a" {
		t.Fatalf("after refusals: %d %s", f, o)
	}
	if r, _ := admit(fence.MaxFence, "d"); !r.Applied() {
		t.Fatalf("MaxFence: %+v", r)
	}
	if f, o := s.current(t, "job:1"); f != fence.MaxFence || o != "d" {
		t.Fatalf("after MaxFence: %d %s", f, o)
	}
	if f, o := s.current(t, "job:other"); f != 0 || o != "" {
		t.Fatalf("unknown key: %d %q", f, o)
	}
	for _, bad := range []fence.Token{{Key: "job:1", Fence: 0, Owner: "o"}, {Key: "", Fence: 1, Owner: "o"}, {Key: "job:1", Fence: 1, Owner: ""}} {
		if _, _, err := s.Admit(ctx, bad); !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("%+v: %v, want ErrInvalidToken", bad, err)
		}
	}
}

// testStoreWaitEndsWithContext: a request waiting for a key held by
// another gives up when its context ends, and leaves nothing held behind.
func testStoreWaitEndsWithContext(t *testing.T, s storeUnderTest) {
	ctx := context.Background()
	r, done, err := s.Admit(ctx, fence.Token{Key: "job:w", Fence: 1, Owner: "a"})
	if err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	cause := errors.New("client went away")
	wctx, cancel := context.WithCancelCause(ctx)
	go func() { time.Sleep(50 * time.Millisecond); cancel(cause) }()
	if _, _, err := s.Admit(wctx, fence.Token{Key: "job:w", Fence: 2, Owner: "b"}); !errors.Is(err, cause) {
		t.Fatalf("waiting admission after its context ended: %v, want the cause", err)
	}
	done()
	hctx, hcancel := context.WithTimeout(ctx, hangLimit)
	defer hcancel()
	r, done, err = s.Admit(hctx, fence.Token{Key: "job:w", Fence: 2, Owner: "b"})
	if err != nil || !r.Applied() {
		t.Fatalf("after the holder finished: %+v %v", r, err)
	}
	done()
}

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

// testStoreCurrentFromHandler: a handler behind Middleware may ask the
// store what it holds for its own key; with MemoryStore that used to
// deadlock, because Current waited for the key's lock, which the handler's
// own request held.
func testStoreCurrentFromHandler(t *testing.T, store storeUnderTest) {
	srv := httptest.NewServer(fence.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tk, _ := fence.TokenFrom(r.Context())
		f, o := store.current(t, tk.Key)
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

// testStoreStalledBody: an older holder whose request body stalls (the
// client paused mid-upload) must not hold the key: the middleware reads
// the body before admission, so a newer holder is served at once and the
// stalled request, when its body finally arrives, is refused as stale.
// Before, the newer holder waited for as long as the body stalled.
func testStoreStalledBody(t *testing.T, store storeUnderTest) {
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
}

// testStoreProperty: concurrent requests with random (fence, owner) are
// admitted in an order that never goes back, one at a time per key, and
// the store ends with the last one admitted.
func testStoreProperty(t *testing.T, s storeUnderTest) {
	var inside atomic.Int32
	var mu sync.Mutex
	var order []fence.Token
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < 300; i++ {
				tk := fence.Token{Key: "k", Fence: 1 + rng.Uint64N(50), Owner: fmt.Sprint("o", rng.IntN(2))}
				r, done, err := s.Admit(context.Background(), tk)
				if err != nil {
					t.Error(err)
					return
				}
				if r.Applied() {
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d admitted requests for one key at once", n)
					}
					mu.Lock()
					order = append(order, tk)
					mu.Unlock()
					inside.Add(-1)
					done()
				} else if r.Outcome != fence.Stale || done != nil {
					t.Errorf("refusal %+v", r)
				}
			}
		}(w)
	}
	wg.Wait()
	if len(order) == 0 {
		t.Fatal("nothing admitted")
	}
	for i := 1; i < len(order); i++ {
		p, c := order[i-1], order[i]
		if c.Fence < p.Fence || (c.Fence == p.Fence && c.Owner != p.Owner) {
			t.Fatalf("admitted %v after %v", c, p)
		}
	}
	if f, o := s.current(t, "k"); f != order[len(order)-1].Fence || o != order[len(order)-1].Owner {
		t.Fatalf("Current = %d %s", f, o)
	}
}

// TestMemoryStoreMaxKeys: the store remembers at most MaxKeys keys and then
// refuses new keys rather than forgetting a fence (which would let that
// key's stale holders write again); known keys keep working.
func TestMemoryStoreMaxKeys(t *testing.T) {
	ctx := context.Background()
	s := &fence.MemoryStore{MaxKeys: 3}
	for i := range 3 {
		r, done, err := s.Admit(ctx, fence.Token{Key: fmt.Sprint("k", i), Fence: 1, Owner: "o"})
		if err != nil || !r.Applied() {
			t.Fatal(r, err)
		}
		done()
	}
	if _, _, err := s.Admit(ctx, fence.Token{Key: "k3", Fence: 1, Owner: "o"}); !errors.Is(err, fence.ErrStoreFull) || !strings.Contains(err.Error(), "MaxKeys") {
		t.Fatalf("fourth key: %v, want ErrStoreFull naming MaxKeys", err)
	}
	if r, done, err := s.Admit(ctx, fence.Token{Key: "k1", Fence: 2, Owner: "o"}); err != nil || !r.Applied() {
		t.Fatalf("known key when full: %+v %v", r, err)
	} else {
		done()
	}
	if r, _, err := s.Admit(ctx, fence.Token{Key: "k1", Fence: 1, Owner: "o"}); err != nil || r.Outcome != fence.Stale {
		t.Fatalf("stale token for a known key when full: %+v %v", r, err)
	}
	if n := s.Len(); n != 3 {
		t.Fatalf("Len = %d", n)
	}
	// Behind Middleware a full store answers 503 and the handler never runs.
	led := &ledger{}
	srv := httptest.NewServer(fence.Middleware(led, &fence.MiddlewareOptions{Store: s, Key: ledgerKey}))
	defer srv.Close()
	resp, err := sendToken(t, ctx, srv.URL+"/new", fence.Token{Key: "ledger:new", Fence: 1, Owner: "o"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || led.calls.Load() != 0 {
		t.Fatalf("new key on a full store: HTTP %d, handler ran %d times", resp.StatusCode, led.calls.Load())
	}
	unbounded := &fence.MemoryStore{MaxKeys: -1}
	for i := range fence.DefaultMaxKeys + 1 {
		_, done, err := unbounded.Admit(ctx, fence.Token{Key: fmt.Sprint("k", i), Fence: 1, Owner: "o"})
		if err != nil {
			t.Fatalf("MaxKeys -1, key %d: %v", i, err)
		}
		done()
	}
}
