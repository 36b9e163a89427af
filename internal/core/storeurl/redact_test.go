package storeurl

import (
	"strings"
	"testing"
)

func TestRedactNestedURLs(t *testing.T) {
	for _, raw := range []string{
		"redlock://:outer-pw@h1:1,h2:2/0?fence=redis%3A%2F%2F%3Ainner-pw%40h3%3A3%2F0",
		"postgres://u@h/db?password=inner-pw&sslmode=disable",
		"redis://:outer-pw@h:1/0",
	} {
		got := Redact(raw)
		if strings.Contains(got, "inner-pw") || strings.Contains(got, "outer-pw") {
			t.Errorf("Redact(%q) = %q reveals a password", raw, got)
		}
	}
	if got := Redact("redis://h:1/0?prefix=a&budget=250ms"); got != "redis://h:1/0?prefix=a&budget=250ms" {
		t.Errorf("Redact changed a URL without passwords: %q", got)
	}
}
