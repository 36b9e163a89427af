package fencedredis_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestPrefixNames opens stores through the URL opener with key prefixes
// the Redis backends' rule allows (any bytes but braces and control
// characters), which must be used, and with prefixes it refuses, which
// must be refused before connecting, naming the prefix and the rule
// (redlock's test refuses the same ones).
func TestPrefixNames(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, testenv.RedisConfig{NoPersistence: true})
	for _, p := range []string{"fenced:", "app/locks:", "a b:", "ünï:", "x*?[]:", strings.Repeat("p", 300)} {
		c, err := fenced.Open(ctx, srv.URL()+"?prefix="+url.QueryEscape(p), nil)
		if err != nil {
			t.Errorf("prefix %q: %v, want it accepted", p, err)
			continue
		}
		l, err := c.TryAcquire(ctx, "names:k", &fenced.LeaseOptions{TTL: 10 * time.Second, MinFence: fenced.FenceRepeatable})
		if err != nil {
			t.Errorf("prefix %q: TryAcquire: %v", p, err)
		} else if infos, err := c.List(ctx, "names:"); err != nil || len(infos) != 1 {
			t.Errorf("prefix %q: List = %v, %v; want the one lease", p, infos, err)
		} else {
			l.Release(ctx)
		}
		c.Close()
	}
	for _, p := range []string{"a{b:", "a}b:", "{app}:", "tab\t:", "nl\n:", "del\x7f:"} {
		_, err := fenced.Open(ctx, "redis://127.0.0.1:1/0?prefix="+url.QueryEscape(p), nil)
		if !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), "may not contain { or }") {
			t.Errorf("prefix %q: %v, want ErrInvalidURL stating the rule", p, err)
		}
	}
}
