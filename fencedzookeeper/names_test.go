package fencedzookeeper_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestChrootNames opens stores through the URL opener with chroots
// ZooKeeper's path rule allows, which must be used, and with ones it
// refuses, which must be refused before connecting, naming the chroot.
func TestChrootNames(t *testing.T) {
	ctx := context.Background()
	ens := testenv.StartZooKeeper(t)
	for _, root := range []string{"/fenced", "/app/locks", "/a-b.c_d", "/%C3%BC", "/a%20b"} {
		c, err := fenced.Open(ctx, ens.URL(root, ""), nil)
		if err != nil {
			t.Errorf("chroot %q: %v, want it accepted", root, err)
			continue
		}
		l, err := c.TryAcquire(ctx, "names:k", &fenced.LeaseOptions{TTL: 10 * time.Second})
		if err != nil {
			t.Errorf("chroot %q: TryAcquire: %v", root, err)
		} else {
			l.Release(ctx)
		}
		c.Close()
	}
	for _, tc := range []struct{ root, want string }{
		{"/a//b", "absolute path"},
		{"/a/./b", `"."`},
		{"/a/../b", `".."`},
		{"/zookeeper", "reserves"},
		{"/zookeeper/locks", "reserves"},
		{"/a%01b", "ZooKeeper refuses in a path"},
		{"/a%7Fb", "ZooKeeper refuses in a path"},
		{"/a%EF%BF%BFb", "ZooKeeper refuses in a path"},
	} {
		_, err := fenced.Open(ctx, "zk://127.0.0.1:1"+tc.root, nil)
		if !errors.Is(err, driver.ErrInvalidURL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("chroot %q: %v, want ErrInvalidURL saying %q", tc.root, err, tc.want)
		}
	}
}
