package sqlident

import "testing"

func TestCheck(t *testing.T) {
	for _, ok := range []string{"fenced_leases", "_t", "T1", "a234567890123456789012345678901234567890123456789012345678901x"} {
		if err := Check("table", ok); err != nil {
			t.Errorf("Check(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "1abc", "a-b", "a b", "x;drop table y", `a"b`, "t.x", "é", "a2345678901234567890123456789012345678901234567890123456789012345"} {
		if err := Check("table", bad); err == nil {
			t.Errorf("Check(%q) = nil, want an error", bad)
		}
	}
}

func TestQuote(t *testing.T) {
	if got := QuoteANSI(`a"b`); got != `"a""b"` {
		t.Errorf("QuoteANSI = %s", got)
	}
	if got := QuoteMySQL("a`b"); got != "`a``b`" {
		t.Errorf("QuoteMySQL = %s", got)
	}
}
