package fencedredlock_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced"
)

// TestPrefixNames: redlock follows the Redis backends' rule for key
// prefixes (rediskit.CheckPrefix; the accepted forms are used in the
// redis package's TestPrefixNames) and refuses a bad prefix before
// connecting to any node, naming it and the rule.
func TestPrefixNames(t *testing.T) {
	for _, p := range []string{"a{b:", "a}b:", "{app}:", "tab\t:", "nl\n:", "del\x7f:"} {
		_, err := fenced.Open(context.Background(), "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?prefix="+url.QueryEscape(p), nil)
		if !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), "may not contain { or }") {
			t.Errorf("prefix %q: %v, want ErrInvalidURL stating the rule", p, err)
		}
	}
}
