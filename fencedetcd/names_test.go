package fencedetcd_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestPrefixNames opens stores through the URL opener with key prefixes
// etcd takes (any bytes but NUL), which must be used, and with prefixes
// the backend refuses, which must be refused before connecting.
func TestPrefixNames(t *testing.T) {
	ctx := context.Background()
	cluster := testenv.StartEtcd(t)
	for _, p := range []string{"fenced/", "app-locks/", "a b/", "ü/", "no-slash"} {
		c, err := fenced.Open(ctx, cluster.URL("prefix="+url.QueryEscape(p)), nil)
		if err != nil {
			t.Errorf("prefix %q: %v, want it accepted", p, err)
			continue
		}
		l, err := c.TryAcquire(ctx, "names:k", &fenced.LeaseOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Errorf("prefix %q: TryAcquire: %v", p, err)
		} else {
			l.Release(ctx)
		}
		c.Close()
	}
	for _, tc := range []struct{ prefix, want string }{
		{"", "prefix is empty"},
		{"a\x00b", "NUL"},
	} {
		_, err := fenced.Open(ctx, "etcd://127.0.0.1:1/?prefix="+url.QueryEscape(tc.prefix), nil)
		if !errors.Is(err, driver.ErrInvalidURL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("prefix %q: %v, want ErrInvalidURL saying %q", tc.prefix, err, tc.want)
		}
	}
}
