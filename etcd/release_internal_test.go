package etcd

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// TestReleaseHoldsTheName checks what makes a release's plain delete safe:
// while a release holds a grant's name, the grant's being forgotten (the
// reaper ending it, a renewal finding it gone) does not free the name on
// its session, so no new grant of the driver puts a key of that name
// until the release is over; and a release of a grant already forgotten
// holds nothing.
func TestReleaseHoldsTheName(t *testing.T) {
	cluster := testenv.StartEtcd(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	d, err := New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	const ttl = 5 * time.Second
	if _, err := d.TryAcquire(ctx, "k", "owner-a", ttl); err != nil {
		t.Fatal(err)
	}
	e := d.grants.Lookup("k", "owner-a")
	if !d.holdName(e) {
		t.Fatal("holdName of a tracked grant failed")
	}
	d.grants.Forget(e) // as the reaper does, mid-release
	s, err := d.reserve(ctx, ttl, e.name)
	if err != nil {
		t.Fatal(err)
	}
	if s == e.s {
		t.Fatal("the name of a grant being released was handed out again on its session")
	}
	d.unreserve(s, e.name)
	d.unholdName(e)
	s, err = d.reserve(ctx, ttl, e.name)
	if err != nil {
		t.Fatal(err)
	}
	if s != e.s {
		t.Fatal("the name was not freed on its session once the release was over")
	}
	d.unreserve(s, e.name)
	if d.holdName(e) {
		t.Fatal("holdName of a forgotten grant succeeded")
	}
}
