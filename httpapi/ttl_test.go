package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestTTLBounded checks that ttl_ms is bounded like every TTL (the
// client's Resolve), in acquire and in a renew of a lease this server does
// not know (after a restart), and that the refusal is a 400 naming ttl_ms.
func TestTTLBounded(t *testing.T) {
	f := newFixture(t)
	bad := []string{"0", "-1", "-9223372036854775808", "604800001", "31536000000", "9223372036854775807"}
	for _, ms := range bad {
		body := `{"ttl_ms":` + ms + `}`
		r := f.do(t, "POST", "/api/v1/leases/ttl:acquire/acquire", body, bearer(clientSecret)...)
		if r.status != 400 || r.json["error"] != "invalid_ttl" || !strings.Contains(fmt.Sprint(r.json["message"]), "ttl_ms "+ms) {
			t.Errorf("acquire %s: %d %s, want 400 invalid_ttl naming ttl_ms", body, r.status, r.body)
		}
	}
	// A renew this server cannot match to a lease it holds goes to the
	// store with ttl_ms: unbounded before.
	for _, ms := range bad {
		body := fmt.Sprintf(`{"owner":%q,"fence":1,"ttl_ms":%s}`, strings.Repeat("ab", 16), ms)
		r := f.do(t, "POST", "/api/v1/leases/ttl:renew/renew", body, bearer(clientSecret)...)
		if r.status != 400 || r.json["error"] != "invalid_ttl" || !strings.Contains(fmt.Sprint(r.json["message"]), "ttl_ms "+ms) {
			t.Errorf("renew %s: %d %s, want 400 invalid_ttl naming ttl_ms", body, r.status, r.body)
		}
	}
	// A TTL within bounds, and none at all, still work.
	for _, body := range []string{`{"ttl_ms":5000}`, `{}`} {
		if r := f.do(t, "POST", "/api/v1/leases/ttl:ok"+fmt.Sprint(len(body))+"/acquire", body, bearer(clientSecret)...); r.status != 200 {
			t.Errorf("acquire %s: %d %s", body, r.status, r.body)
		}
	}
}
