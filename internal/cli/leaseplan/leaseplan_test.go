package leaseplan

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
	// The backends whose registered rounding the tests figure with.
	_ "github.com/fenced-dev/fenced/fenceddynamodb"
	_ "github.com/fenced-dev/fenced/fencedetcd"
	_ "github.com/fenced-dev/fenced/fencedpostgres"
	_ "github.com/fenced-dev/fenced/fencedredis"
	_ "github.com/fenced-dev/fenced/fencedsqlite"
	_ "github.com/fenced-dev/fenced/fencedzookeeper"
)

func TestDefaultsOnSQLite(t *testing.T) {
	p, err := Compute(Input{TTL: 30 * time.Second, Authority: ForScheme("sqlite")})
	if err != nil {
		t.Fatal(err)
	}
	want := Plan{
		AuthorityTTL:            30 * time.Second,
		LocalValidity:           30*time.Second - 302*time.Millisecond,
		FreezeAbsorbed:          20*time.Second - 302*time.Millisecond,
		RegrantAfter:            20 * time.Second,
		RecoveryBest:            20 * time.Second,
		RecoveryWorst:           30 * time.Second,
		RenewalsPerSecond:       0.1,
		FailedRenewalsTolerated: 1,
	}
	if p.RenewEvery != 10*time.Second || p.AuthorityTTL != want.AuthorityTTL || p.LocalValidity != want.LocalValidity ||
		p.FreezeAbsorbed != want.FreezeAbsorbed || p.RegrantAfter != want.RegrantAfter || p.RecoveryBest != want.RecoveryBest ||
		p.RecoveryWorst != want.RecoveryWorst || p.RenewalsPerSecond != want.RenewalsPerSecond ||
		p.FailedRenewalsTolerated != want.FailedRenewalsTolerated || p.StaleWindow != 0 || p.RecommendedTTL != 0 {
		t.Fatalf("plan %+v", p)
	}
	if len(p.Advice) == 0 || !strings.Contains(p.Advice[0], "--max-pause") {
		t.Fatalf("advice without a max pause should ask for one: %q", p.Advice)
	}
}

func TestLongPauseGetsStaleWindowAndRecommendation(t *testing.T) {
	p, err := Compute(Input{TTL: 30 * time.Second, MaxPause: 45 * time.Second, Authority: ForScheme("postgres")})
	if err != nil {
		t.Fatal(err)
	}
	if p.StaleWindow != 25*time.Second {
		t.Fatalf("stale window %v, want 25s (45s pause − 20s until another worker may be granted the key)", p.StaleWindow)
	}
	// 69s − 0.692s margin − 23s renewal = 45.308s > 45s; 68s absorbs only 44.318s.
	if p.RecommendedTTL != 69*time.Second {
		t.Fatalf("recommended TTL %v, want 69s", p.RecommendedTTL)
	}
	all := strings.Join(p.Advice, "\n")
	for _, w := range []string{"NOT absorbed", "25s", "TTL 1m9s", "fence", "recovery after a crash of up to 1m9s"} {
		if !strings.Contains(all, w) {
			t.Errorf("advice lacks %q:\n%s", w, all)
		}
	}
	// A pause between the absorbed freeze and the regrant loses the lease
	// without a stale window.
	p, _ = Compute(Input{TTL: 30 * time.Second, MaxPause: 19900 * time.Millisecond, Authority: ForScheme("postgres")})
	if p.StaleWindow != 0 || p.RecommendedTTL == 0 || !strings.Contains(strings.Join(p.Advice, " "), "safely") {
		t.Fatalf("19.9s pause: %+v", p)
	}
	p, _ = Compute(Input{TTL: 30 * time.Second, MaxPause: 5 * time.Second, Authority: ForScheme("postgres")})
	if p.RecommendedTTL != 0 || !strings.HasPrefix(p.Advice[0], "OK") {
		t.Fatalf("5s pause: %+v", p)
	}
}

func TestBackendRounding(t *testing.T) {
	// etcd: whole seconds plus the session's extra second, revoked up to
	// 500ms late.
	p, err := Compute(Input{TTL: 1500 * time.Millisecond, Authority: ForScheme("etcd")})
	if err != nil {
		t.Fatal(err)
	}
	if p.AuthorityTTL != 3*time.Second || p.RecoveryWorst != 3500*time.Millisecond || !strings.Contains(p.Advice[0], "whole seconds") {
		t.Fatalf("etcd 1.5s: %+v", p)
	}
	if p.RegrantAfter != 2500*time.Millisecond {
		t.Fatalf("etcd regrant after %v, want 2.5s", p.RegrantAfter)
	}
	// A recommendation on etcd is whole seconds.
	p, _ = Compute(Input{TTL: 2 * time.Second, MaxPause: 3 * time.Second, Authority: ForScheme("etcd")})
	if p.RecommendedTTL%time.Second != 0 || p.RecommendedTTL < 4600*time.Millisecond {
		t.Fatalf("etcd recommendation %v", p.RecommendedTTL)
	}
	// ZooKeeper: (TTL + tick)·8/7 in milliseconds (as the driver asks for
	// it), at least two ticks, expired on a tick.
	p, _ = Compute(Input{TTL: 30 * time.Second, Authority: ForScheme("zk")})
	if want := 36572 * time.Millisecond; p.AuthorityTTL != want || p.RecoveryWorst != p.AuthorityTTL+2*time.Second {
		t.Fatalf("zk 30s: keeps %v, worst recovery %v", p.AuthorityTTL, p.RecoveryWorst)
	}
	// DynamoDB: observed expiry. Another worker may take the key over a TTL
	// after the holder's last renewal, as on a store with a clock, but a
	// crashed holder's grant may stand twice the TTL (a waiter first saw
	// it just before the crash).
	p, _ = Compute(Input{TTL: 9 * time.Second, Authority: ForScheme("dynamodb")})
	if p.AuthorityTTL != 9*time.Second || p.RegrantAfter != 6*time.Second || p.RecoveryWorst != 18*time.Second || strings.Contains(p.Authority.Note, "unknown") {
		t.Fatalf("dynamodb 9s: keeps %v, regrant after %v, worst recovery %v (%s)", p.AuthorityTTL, p.RegrantAfter, p.RecoveryWorst, p.Authority.Note)
	}
	if _, err := Compute(Input{TTL: 40 * time.Second, Authority: ForScheme("zk")}); !errors.Is(err, ErrInput) {
		t.Fatalf("zk 40s: %v, want ErrInput (above the default maxSessionTimeout's TTL)", err)
	}
	if a := ForScheme("zk").WithBounds(0, 10*time.Second); a.MaxTTL != 10*time.Second {
		t.Fatalf("WithBounds: %v", a.MaxTTL)
	}
}

func TestRenewalChoices(t *testing.T) {
	p, _ := Compute(Input{TTL: 10 * time.Second, RenewEvery: 5 * time.Second, Authority: ForScheme("redis")})
	if p.FailedRenewalsTolerated != 0 || !strings.Contains(strings.Join(p.Advice, " "), "tolerates no failed renewal") {
		t.Fatalf("renew at half: %+v", p)
	}
	p, _ = Compute(Input{TTL: 10 * time.Second, RenewEvery: 500 * time.Millisecond, Authority: ForScheme("redis")})
	if p.RenewalsPerSecond != 2 || p.FailedRenewalsTolerated != 18 || !strings.Contains(strings.Join(p.Advice, " "), "2.0 requests/s") {
		t.Fatalf("renew every 500ms: %+v", p)
	}
}

func TestBadInput(t *testing.T) {
	for _, in := range []Input{
		{TTL: 30 * time.Second},
		{TTL: time.Millisecond, Authority: ForScheme("sqlite")},
		{TTL: 500 * time.Millisecond, Authority: ForScheme("etcd")},
		{TTL: 30 * time.Second, RenewEvery: 30 * time.Second, Authority: ForScheme("sqlite")},
		{TTL: 30 * time.Second, RenewEvery: -time.Second, Authority: ForScheme("sqlite")},
		{TTL: 30 * time.Second, MaxPause: -time.Second, Authority: ForScheme("sqlite")},
		{TTL: 30 * time.Second, SafetyMargin: 31 * time.Second, Authority: ForScheme("sqlite")},
	} {
		if _, err := Compute(in); !errors.Is(err, ErrInput) {
			t.Errorf("Compute(%+v) = %v, want ErrInput", in, err)
		}
	}
}

// A backend registered with a zero Expiry keeps grants exactly their TTL,
// and plans name it by its scheme.
func TestZeroExpiry(t *testing.T) {
	fenced.Register("zeroexpiry", func(context.Context, *url.URL) (driver.Driver, error) { return nil, errors.ErrUnsupported }, driver.Expiry{})
	a, ok := Authorities()["zeroexpiry"]
	if !ok || a.Name != "zeroexpiry" || a.MinTTL != ttlrule.Min || a.MaxTTL != ttlrule.Max {
		t.Fatalf("Authorities()[zeroexpiry] = %+v, %v; want it named after its scheme, with the portable bounds", a, ok)
	}
	p, err := Compute(Input{TTL: 10 * time.Second, Authority: ForScheme("zeroexpiry")})
	if err != nil || p.AuthorityTTL != 10*time.Second || p.RecoveryWorst != 10*time.Second {
		t.Fatalf("plan on a zero Expiry: %+v, %v; want the grant kept exactly its TTL", p, err)
	}
}
