package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
)

// kvGuard adapts the Redis and etcd guards to one test suite. A resource
// has a status and a note; put sets the note, and, when ifStatus is not
// empty, the status to newStatus only if it is ifStatus.
type kvGuard interface {
	claim(ctx context.Context, res string, t fence.Token) (fence.Result, error)
	put(ctx context.Context, res string, t fence.Token, note, ifStatus, newStatus string) (fence.Result, error)
	note(ctx context.Context, res string) string
	status(ctx context.Context, res string) string
	current(ctx context.Context, res string) (uint64, string)
}

// kvOpts are the options every KV guard offers.
type kvOpts struct {
	hooks    func(fenced.Event)
	check    fence.Checker
	leaseKey func(resource string) string
}

func runKVGuardTests(t *testing.T, newGuard func(t *testing.T, o kvOpts) kvGuard) {
	t.Run("Semantics", func(t *testing.T) { testKVSemantics(t, newGuard) })
	t.Run("Orderings", func(t *testing.T) { testKVOrderings(t, newGuard(t, kvOpts{})) })
	t.Run("BadTokens", func(t *testing.T) { testKVBadTokens(t, newGuard(t, kvOpts{})) })
	t.Run("WrongKey", func(t *testing.T) { testKVWrongKey(t, newGuard(t, kvOpts{})) })
	t.Run("LeaseKey", func(t *testing.T) { testKVLeaseKey(t, newGuard) })
	t.Run("SignedTokens", func(t *testing.T) { testKVSignedTokens(t, newGuard) })
	t.Run("PropertySequential", func(t *testing.T) { testKVPropertySequential(t, newGuard(t, kvOpts{})) })
	t.Run("PropertyConcurrent", func(t *testing.T) { testKVPropertyConcurrent(t, newGuard(t, kvOpts{})) })
}

var resSeq = map[string]int{}
var resMu sync.Mutex

func newRes(t *testing.T) string {
	resMu.Lock()
	defer resMu.Unlock()
	resSeq[t.Name()]++
	return fmt.Sprintf("res/%s/%d/%d", t.Name(), time.Now().UnixNano(), resSeq[t.Name()])
}

func testKVSemantics(t *testing.T, newGuard func(t *testing.T, o kvOpts) kvGuard) {
	ctx := context.Background()
	var mu sync.Mutex
	var stale []fenced.Event
	g := newGuard(t, kvOpts{hooks: func(e fenced.Event) {
		if e.Kind == fenced.EventStaleWrite {
			mu.Lock()
			stale = append(stale, e)
			mu.Unlock()
		}
	}})
	res := newRes(t)
	a, b := tok(41, "owner-a"), tok(42, "owner-b")
	// A resource never written accepts the first holder, many times.
	for i := 0; i < 3; i++ {
		if r, err := g.put(ctx, res, a, fmt.Sprint("a", i), "", ""); err != nil || !r.Applied() || r.Current != 41 {
			t.Fatalf("write %d by 41: %+v %v", i, r, err)
		}
	}
	if r, err := g.claim(ctx, res, a); err != nil || !r.Applied() {
		t.Fatalf("re-claim by 41: %+v %v", r, err)
	}
	if r, err := g.claim(ctx, res, b); err != nil || !r.Applied() {
		t.Fatalf("claim by 42: %+v %v", r, err)
	}
	r, err := g.put(ctx, res, a, "late", "", "")
	if err != nil || r.Outcome != fence.Stale || r.Current != 42 || !errors.Is(r.Err(), fenced.ErrStaleFence) {
		t.Fatalf("late write by 41: %+v %v", r, err)
	}
	r, err = g.put(ctx, res, tok(42, "owner-z"), "impostor", "", "")
	if err != nil || r.Outcome != fence.Stale || !r.SameFenceOtherOwner {
		t.Fatalf("equal fence, other owner: %+v %v", r, err)
	}
	if n := g.note(ctx, res); n != "a2" {
		t.Fatalf("note %q after refused writes, want a2", n)
	}
	// Preconditions: "" -> SENT once.
	if r, err := g.put(ctx, res, b, "sent", "", ""); err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	if r, err := g.put(ctx, res, b, "send", "PENDING", "SENT"); err != nil || r.Outcome != fence.PreconditionFailed || r.Current != 42 {
		t.Fatalf("precondition on a missing status: %+v %v", r, err)
	}
	res2 := newRes(t)
	if r, err := g.put(ctx, res2, b, "init", "", ""); err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	setStatus(t, g, res2, b, "PENDING")
	if r, err := g.put(ctx, res2, b, "send", "PENDING", "SENT"); err != nil || !r.Applied() {
		t.Fatalf("send: %+v %v", r, err)
	}
	if r, err := g.put(ctx, res2, tok(43, "owner-c"), "send again", "PENDING", "SENT"); err != nil || r.Outcome != fence.PreconditionFailed || r.Current != 42 {
		t.Fatalf("second send by 43: %+v %v, want PreconditionFailed(42)", r, err)
	}
	if s := g.status(ctx, res2); s != "SENT" {
		t.Fatalf("status %q", s)
	}
	if f, o := g.current(ctx, res2); f != 42 || o != "owner-b" {
		t.Fatalf("current %d %q: a write that did not apply must not raise the fence", f, o)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stale) != 2 || stale[0].Fence != 41 || stale[0].Current != 42 || stale[0].Resource != res {
		t.Fatalf("stale reports %+v", stale)
	}
}

// setStatus sets the status through the guard with precondition-free put.
func setStatus(t *testing.T, g kvGuard, res string, tk fence.Token, status string) {
	t.Helper()
	if sg, ok := g.(interface {
		setStatus(context.Context, string, fence.Token, string) error
	}); ok {
		if err := sg.setStatus(context.Background(), res, tk, status); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("guard cannot set status")
}

func testKVOrderings(t *testing.T, g kvGuard) {
	ctx := context.Background()
	for _, claim := range []bool{false, true} {
		res := newRes(t)
		a, b := tok(41, "owner-a"), tok(42, "owner-b")
		setStatus(t, g, res, a, "PENDING")
		if claim {
			if r, err := g.claim(ctx, res, b); err != nil || !r.Applied() {
				t.Fatal(r, err)
			}
		}
		ra, err := g.put(ctx, res, a, "A", "PENDING", "SENT")
		if err != nil {
			t.Fatal(err)
		}
		rb, err := g.put(ctx, res, b, "B", "PENDING", "SENT")
		if err != nil {
			t.Fatal(err)
		}
		if !claim && (!ra.Applied() || rb.Outcome != fence.PreconditionFailed || g.note(ctx, res) != "A") {
			t.Fatalf("claiming off: A %+v, B %+v, note %q; want the stale write accepted", ra, rb, g.note(ctx, res))
		}
		if claim && (ra.Outcome != fence.Stale || !rb.Applied() || g.note(ctx, res) != "B") {
			t.Fatalf("claiming on: A %+v, B %+v, note %q; want the stale write refused", ra, rb, g.note(ctx, res))
		}
	}
}

func testKVBadTokens(t *testing.T, g kvGuard) {
	ctx := context.Background()
	res := newRes(t)
	if r, err := g.put(ctx, res, tok(5, "owner-a"), "ok", "", ""); err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	for _, bad := range []fence.Token{tok(0, "o"), tok(math.MaxInt64+1, "o"), tok(math.MaxUint64, "o"), tok(9, ""), tok(9, "a b")} {
		if _, err := g.claim(ctx, res, bad); !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("claim %v: %v", bad, err)
		}
		if _, err := g.put(ctx, res, bad, "bad", "", ""); !errors.Is(err, fence.ErrInvalidToken) {
			t.Errorf("put %v: %v", bad, err)
		}
	}
	if f, o := g.current(ctx, res); f != 5 || o != "owner-a" || g.note(ctx, res) != "ok" {
		t.Fatalf("bad tokens changed the resource: %d %q %q", f, o, g.note(ctx, res))
	}
	// Fences beyond 2^53 (where floating point loses precision) and up to
	// MaxInt64 compare exactly.
	big := newRes(t)
	for _, c := range []struct {
		f    uint64
		want fence.Outcome
	}{{1 << 60, fence.Applied}, {1<<60 - 1, fence.Stale}, {1<<60 + 1, fence.Applied}, {math.MaxInt64, fence.Applied}, {math.MaxInt64 - 1, fence.Stale}} {
		r, err := g.claim(ctx, big, tok(c.f, "o"))
		if err != nil || r.Outcome != c.want {
			t.Fatalf("claim %d: %+v %v, want %v", c.f, r, err, c.want)
		}
	}
}

// testKVPropertySequential drives one resource with random tokens and checks
// every decision against a model, and then what the resource really holds
// (its recorded fence and owner, and the note of the last write the model
// says was applied), so a guard that reports one thing and stores another
// fails.
// testKVWrongKey: fences are comparable only within one lease key, so a
// resource written under invoice:inv_72 refuses a token for batch:all
// whatever its fence, changes nothing, and its real holder keeps writing.
func testKVWrongKey(t *testing.T, g kvGuard) {
	ctx := context.Background()
	res := newRes(t)
	inv := fence.Token{Key: "invoice:inv_72", Fence: 5, Owner: "owner-a"}
	if r, err := g.put(ctx, res, inv, "a", "", ""); err != nil || !r.Applied() {
		t.Fatal(r, err)
	}
	batch := fence.Token{Key: "batch:all", Fence: 900, Owner: "owner-b"}
	if r, err := g.claim(ctx, res, batch); !errors.Is(err, fence.ErrWrongKey) || r.Applied() {
		t.Errorf("claim with a token for another key: %+v %v, want ErrWrongKey", r, err)
	}
	if r, err := g.put(ctx, res, batch, "batch", "", ""); !errors.Is(err, fence.ErrWrongKey) || r.Applied() {
		t.Errorf("write with a token for another key: %+v %v, want ErrWrongKey", r, err)
	} else if !strings.Contains(err.Error(), "batch:all") || !strings.Contains(err.Error(), "invoice:inv_72") {
		t.Errorf("error %q does not name both keys", err)
	}
	if f, o := g.current(ctx, res); f != 5 || o != "owner-a" || g.note(ctx, res) != "a" {
		t.Fatalf("token for another key changed the resource: fence %d owner %q note %q", f, o, g.note(ctx, res))
	}
	next := fence.Token{Key: "invoice:inv_72", Fence: 6, Owner: "owner-c"}
	if r, err := g.put(ctx, res, next, "c", "", ""); err != nil || !r.Applied() {
		t.Fatalf("the key's next holder after a wrong-key token: %+v %v", r, err)
	}
}

// testKVLeaseKey: with LeaseKey set, a token for another key is refused
// before anything is sent, even on a resource never written (which the
// recorded key cannot protect: the first write would bind it).
func testKVLeaseKey(t *testing.T, newGuard func(t *testing.T, o kvOpts) kvGuard) {
	ctx := context.Background()
	g := newGuard(t, kvOpts{leaseKey: func(res string) string { return "lease:" + res }})
	res := newRes(t)
	if r, err := g.claim(ctx, res, fence.Token{Key: "batch:all", Fence: 900, Owner: "o"}); !errors.Is(err, fence.ErrWrongKey) || r.Applied() {
		t.Fatalf("token for another key on a fresh resource: %+v %v, want ErrWrongKey", r, err)
	}
	if f, _ := g.current(ctx, res); f != 0 {
		t.Fatalf("refused token recorded fence %d", f)
	}
	if r, err := g.put(ctx, res, fence.Token{Key: "lease:" + res, Fence: 1, Owner: "o"}, "ok", "", ""); err != nil || !r.Applied() {
		t.Fatalf("token for the derived key: %+v %v", r, err)
	}
}

// testKVSignedTokens: with a Verifier as Check, an unsigned or forged
// token is refused with ErrUnverified and changes nothing, so a forged
// fence far above the real ones cannot lock the key's holders out; a token
// signed with the shared key is applied.
func testKVSignedTokens(t *testing.T, newGuard func(t *testing.T, o kvOpts) kvGuard) {
	ctx := context.Background()
	signer, verifier := testKeys(t)
	g := newGuard(t, kvOpts{check: verifier})
	res := newRes(t)
	good, err := signer.Sign(fence.Token{Key: "invoice:inv_72", Fence: 5, Owner: "owner-a"})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := g.put(ctx, res, good, "a", "", ""); err != nil || !r.Applied() {
		t.Fatalf("signed token: %+v %v", r, err)
	}
	forged := fence.Token{Key: "invoice:inv_72", Fence: math.MaxInt64, Owner: "mallory"}
	altered := good
	altered.Fence = math.MaxInt64
	otherSigner, _ := testKeys(t)
	foreign, _ := otherSigner.Sign(forged)
	for name, bad := range map[string]fence.Token{"unsigned": forged, "altered fence": altered, "other secret": foreign} {
		if r, err := g.claim(ctx, res, bad); !errors.Is(err, fence.ErrUnverified) || r.Applied() {
			t.Errorf("%s: %+v %v, want ErrUnverified", name, r, err)
		}
	}
	if f, o := g.current(ctx, res); f != 5 || o != "owner-a" || g.note(ctx, res) != "a" {
		t.Fatalf("refused tokens changed the resource: %d %q %q", f, o, g.note(ctx, res))
	}
	next, _ := signer.Sign(fence.Token{Key: "invoice:inv_72", Fence: 6, Owner: "owner-b"})
	if r, err := g.put(ctx, res, next, "b", "", ""); err != nil || !r.Applied() {
		t.Fatalf("next signed holder: %+v %v", r, err)
	}
}

func testKVPropertySequential(t *testing.T, g kvGuard) {
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 2))
	for round := 0; round < 20; round++ {
		res := newRes(t)
		var mf uint64
		var mo, note string
		for step := 0; step < 25; step++ {
			tk := fence.Token{Key: res, Fence: 1 + rng.Uint64N(8), Owner: fmt.Sprint("o", rng.IntN(3))}
			var r fence.Result
			var err error
			claim := rng.IntN(3) == 0
			if claim {
				r, err = g.claim(ctx, res, tk)
			} else {
				r, err = g.put(ctx, res, tk, fmt.Sprint(step), "", "")
			}
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			want := tk.Fence > mf || (tk.Fence == mf && tk.Owner == mo)
			if r.Applied() != want || (!want && (r.Outcome != fence.Stale || r.Current != mf)) {
				t.Fatalf("seed %d: %v on (%d,%s): %+v, want applied=%v", seed, tk, mf, mo, r, want)
			}
			if want {
				mf, mo = tk.Fence, tk.Owner
				if !claim {
					note = fmt.Sprint(step)
				}
			}
			if f, o := g.current(ctx, res); f != mf || o != mo {
				t.Fatalf("seed %d step %d: resource records (%d,%s), model (%d,%s)", seed, step, f, o, mf, mo)
			}
			if n := g.note(ctx, res); n != note {
				t.Fatalf("seed %d step %d: resource note %q, want %q (the last applied write)", seed, step, n, note)
			}
		}
	}
}

// testKVPropertyConcurrent: concurrent writers; whenever an accepted write
// completed before another write started, a later acceptance never goes back
// in fence order (real-time order is respected), and the resource ends with
// the largest accepted token.
func testKVPropertyConcurrent(t *testing.T, g kvGuard) {
	ctx := context.Background()
	res := newRes(t)
	type op struct {
		tk         fence.Token
		start, end time.Time
		applied    bool
	}
	var mu sync.Mutex
	var ops []op
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; i < 30; i++ {
				tk := fence.Token{Key: res, Fence: 1 + rng.Uint64N(60), Owner: fmt.Sprint("w", rng.IntN(2))}
				start := time.Now()
				r, err := g.put(ctx, res, tk, fmt.Sprint(tk.Fence, tk.Owner), "", "")
				end := time.Now()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ops = append(ops, op{tk, start, end, r.Applied()})
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	var best fence.Token
	for _, x := range ops {
		if !x.applied {
			continue
		}
		if x.tk.Fence > best.Fence {
			best = x.tk
		}
		for _, y := range ops {
			if y.applied && y.end.Before(x.start) && (x.tk.Fence < y.tk.Fence || (x.tk.Fence == y.tk.Fence && x.tk.Owner != y.tk.Owner)) {
				t.Fatalf("accepted %v after %v had been accepted", x.tk, y.tk)
			}
		}
	}
	if f, _ := g.current(ctx, res); f != best.Fence {
		t.Fatalf("resource fence %d, largest accepted %d", f, best.Fence)
	}
}
