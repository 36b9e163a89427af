package fence_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/mem"
)

func randomKey(t *testing.T, id string) fence.SigningKey {
	t.Helper()
	secret := make([]byte, fence.MinSecretLen)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	return fence.SigningKey{ID: id, Secret: secret}
}

// testKeys returns a Signer and a Verifier sharing a fresh random key.
func testKeys(t *testing.T) (*fence.Signer, *fence.Verifier) {
	t.Helper()
	k := randomKey(t, "k1")
	s, err := fence.NewSigner(k)
	if err != nil {
		t.Fatal(err)
	}
	v, err := fence.NewVerifier(k)
	if err != nil {
		t.Fatal(err)
	}
	return s, v
}

// TestHTTPForgedFenceRefused: anyone who can reach a resource can send
// Fenced-Fence: 9223372036854775807, which used to lock the key's real
// holders out for good. With a Verifier only tokens signed with the shared
// key are admitted; the forged one is refused with 403 fence_unverified
// and the real holder keeps writing.
func TestHTTPForgedFenceRefused(t *testing.T) {
	ctx := context.Background()
	leases := fenced.NewClient(mem.NewStore(nil).Driver(), nil)
	defer leases.Close()
	signer, verifier := testKeys(t)
	store := fence.NewMemoryStore()
	srv := httptest.NewServer(fence.Middleware(led(), &fence.MiddlewareOptions{
		Key: fence.FixedKey("ledger:acct1"), Store: store, Check: verifier,
	}))
	defer srv.Close()

	forge := func(sig string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("forged"))
		req.Header.Set(fence.HeaderKey, "ledger:acct1")
		req.Header.Set(fence.HeaderFence, "9223372036854775807")
		req.Header.Set(fence.HeaderOwner, fence.OwnerDigest("mallory"))
		if sig != "" {
			req.Header.Set(fence.HeaderSignature, sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	l, err := leases.TryAcquire(ctx, "ledger:acct1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	real, _ := signer.Sign(fence.From(l))
	for name, sig := range map[string]string{"unsigned": "", "real signature on a forged fence": real.Sig, "garbage": "k1.AAAA", "unknown key id": "k9." + strings.SplitN(real.Sig, ".", 2)[1]} {
		resp := forge(sig)
		err := fence.ResponseError(resp)
		if resp.StatusCode != http.StatusForbidden || !errors.Is(err, fence.ErrUnverified) {
			t.Errorf("%s: %d %v, want 403 fence_unverified", name, resp.StatusCode, err)
		}
	}
	if f, _ := store.Current("ledger:acct1"); f != 0 {
		t.Fatalf("a forged token was recorded: fence %d", f)
	}

	// The holder signs on the client side (Transport.Signer).
	client := &http.Client{Transport: &fence.Transport{Signer: signer}}
	req, _ := http.NewRequestWithContext(fence.WithLease(ctx, l), http.MethodPost, srv.URL, strings.NewReader("real"))
	resp, err := client.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("signed request from the holder: %v %v", resp, err)
	}
	resp.Body.Close()
	// Without the Signer the same holder is refused: signatures are required.
	req, _ = http.NewRequestWithContext(fence.WithLease(ctx, l), http.MethodPost, srv.URL, strings.NewReader("unsigned"))
	resp, err = (&http.Client{Transport: &fence.Transport{}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if err := fence.ResponseError(resp); !errors.Is(err, fence.ErrUnverified) {
		t.Fatalf("unsigned request from the holder: %v, want ErrUnverified", err)
	}
}

func led() http.Handler { return &ledger{} }

// TestSigningKeyRotation: a Verifier holding the old and the new key
// accepts both while Signers move over; once the old key is dropped, its
// signatures are refused.
func TestSigningKeyRotation(t *testing.T) {
	ctx := context.Background()
	oldK, newK := randomKey(t, "2025"), randomKey(t, "2026")
	oldS, _ := fence.NewSigner(oldK)
	newS, _ := fence.NewSigner(newK)
	both, err := fence.NewVerifier(oldK, newK)
	if err != nil {
		t.Fatal(err)
	}
	onlyNew, _ := fence.NewVerifier(newK)
	tk := fence.Token{Key: "k", Fence: 3, Owner: "o"}
	byOld, _ := oldS.Sign(tk)
	byNew, _ := newS.Sign(tk)
	if !strings.HasPrefix(byOld.Sig, "2025.") || !strings.HasPrefix(byNew.Sig, "2026.") {
		t.Fatalf("signatures %q %q do not name their key", byOld.Sig, byNew.Sig)
	}
	for _, s := range []fence.Token{byOld, byNew} {
		if err := both.Check(ctx, s); err != nil {
			t.Errorf("during rotation %q: %v", s.Sig, err)
		}
	}
	if err := onlyNew.Check(ctx, byNew); err != nil {
		t.Error(err)
	}
	if err := onlyNew.Check(ctx, byOld); !errors.Is(err, fence.ErrUnverified) || !strings.Contains(err.Error(), "2025") {
		t.Errorf("old key after rotation: %v, want ErrUnverified naming key 2025", err)
	}
	// Each signed field is covered.
	for name, alter := range map[string]func(*fence.Token){
		"key":   func(t *fence.Token) { t.Key = "k2" },
		"fence": func(t *fence.Token) { t.Fence = 4 },
		"owner": func(t *fence.Token) { t.Owner = "p" },
	} {
		x := byNew
		alter(&x)
		if err := onlyNew.Check(ctx, x); !errors.Is(err, fence.ErrUnverified) {
			t.Errorf("altered %s: %v", name, err)
		}
	}
}

func TestSigningKeyValidation(t *testing.T) {
	good := randomKey(t, "k1")
	for name, k := range map[string]fence.SigningKey{
		"short secret": {ID: "k1", Secret: make([]byte, fence.MinSecretLen-1)},
		"empty id":     {ID: "", Secret: good.Secret},
		"dot in id":    {ID: "a.b", Secret: good.Secret},
		"long id":      {ID: strings.Repeat("a", 33), Secret: good.Secret},
	} {
		if _, err := fence.NewSigner(k); err == nil {
			t.Errorf("NewSigner %s: accepted", name)
		}
		if _, err := fence.NewVerifier(k); err == nil {
			t.Errorf("NewVerifier %s: accepted", name)
		}
	}
	if _, err := fence.NewVerifier(good, good); err == nil {
		t.Error("NewVerifier with a repeated id: accepted")
	}
	if _, err := fence.NewVerifier(); err == nil {
		t.Error("NewVerifier with no keys: accepted")
	}
	s, _ := fence.NewSigner(good)
	v, _ := fence.NewVerifier(good)
	if _, err := s.Sign(fence.Token{Key: "k", Fence: 0, Owner: "o"}); !errors.Is(err, fence.ErrInvalidToken) {
		t.Errorf("signing fence 0: %v", err)
	}
	// The secrets are copied: the caller reusing its slice changes nothing.
	good.Secret[0] ^= 0xff
	tk, _ := s.Sign(fence.Token{Key: "k", Fence: 1, Owner: "o"})
	if err := v.Check(context.Background(), tk); err != nil {
		t.Errorf("after the caller changed its secret slice: %v", err)
	}
}

// TestSequencer: the resource asks the lease store whether the token's
// fence is the key's current grant: a forged fence above every grant is
// refused as unverified, a superseded or released one as stale.
func TestSequencer(t *testing.T) {
	ctx := context.Background()
	leases := fenced.NewClient(mem.NewStore(nil).Driver(), nil)
	defer leases.Close()
	seq, err := fence.NewSequencer(leases)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fence.NewSequencer(nil); err == nil {
		t.Fatal("NewSequencer(nil) accepted")
	}
	if err := seq.Check(ctx, fence.Token{Key: "job:never", Fence: 1, Owner: "o"}); !errors.Is(err, fence.ErrUnverified) {
		t.Fatalf("key never granted: %v, want ErrUnverified", err)
	}
	a, err := leases.TryAcquire(ctx, "job:x", &fenced.LeaseOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ta := fence.From(a)
	if err := seq.Check(ctx, ta); err != nil {
		t.Fatalf("current grant: %v", err)
	}
	forged := ta
	forged.Fence = fence.MaxFence
	if err := seq.Check(ctx, forged); !errors.Is(err, fence.ErrUnverified) {
		t.Fatalf("forged fence: %v, want ErrUnverified", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := seq.Check(ctx, ta); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("released grant: %v, want ErrStale", err)
	}
	b, err := leases.TryAcquire(ctx, "job:x", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if err := seq.Check(ctx, ta); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("superseded grant: %v, want ErrStale", err)
	}
	// Behind Middleware: the forged fence gets 403, the holder gets through.
	srv := httptest.NewServer(fence.Middleware(led(), &fence.MiddlewareOptions{
		Key: fence.FixedKey("job:x"), Store: fence.NewMemoryStore(), Check: seq,
	}))
	defer srv.Close()
	client := &http.Client{Transport: &fence.Transport{}}
	for _, c := range []struct {
		tk     fence.Token
		status int
	}{{forged, http.StatusForbidden}, {ta, http.StatusConflict}, {fence.From(b), http.StatusNoContent}} {
		req, _ := http.NewRequestWithContext(fence.WithToken(ctx, c.tk), http.MethodPost, srv.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%v: HTTP %d, want %d", c.tk, resp.StatusCode, c.status)
		}
	}
}

// TestFromNilLeaseIsRefused checks that the token of a nil lease is the
// zero Token, which Validate refuses, instead of a panic.
func TestFromNilLeaseIsRefused(t *testing.T) {
	tok := fence.From(nil)
	if tok != (fence.Token{}) {
		t.Fatalf("From(nil) = %+v; want the zero Token", tok)
	}
	if err := tok.Validate(); !errors.Is(err, fence.ErrInvalidToken) {
		t.Fatalf("From(nil).Validate() = %v; want ErrInvalidToken", err)
	}
}
