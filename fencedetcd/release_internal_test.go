package fencedetcd

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// grpcCalls returns how many requests of each gRPC method the member has
// received (grpc_server_msg_received_total from its /metrics).
func grpcCalls(t *testing.T, m *testenv.EtcdMember) map[string]int64 {
	t.Helper()
	resp, err := http.Get(m.ClientURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	calls := map[string]int64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "grpc_server_msg_received_total{") {
			continue
		}
		i := strings.Index(line, `grpc_method="`)
		if i < 0 {
			continue
		}
		method, _, _ := strings.Cut(line[i+len(`grpc_method="`):], `"`)
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		calls[method] += int64(v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return calls
}

// TestReleaseIsOneDelete checks the request a tracked grant's release
// sends: one DeleteRange, as etcd's Mutex unlocks, and no transaction
// (etcd 3.4's transactions cost the server far more; see releaseTracked).
// The key is gone afterwards and the fence record still tells the fence.
func TestReleaseIsOneDelete(t *testing.T) {
	d, cli, cluster := newTestCluster(t)
	ctx := context.Background()
	const ttl = 10 * time.Second
	g := driver.Grant{Key: "one-delete", Owner: "owner-a", TTL: ttl}
	var err error
	if g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	key := d.grants.Lookup(g.Key, g.Owner).etcdKey
	before := grpcCalls(t, cluster.Members[0])
	if err := d.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	after := grpcCalls(t, cluster.Members[0])
	if n, txn := after["DeleteRange"]-before["DeleteRange"], after["Txn"]-before["Txn"]; n != 1 || txn != 0 {
		t.Fatalf("release sent %d DeleteRange and %d Txn requests, want 1 and 0", n, txn)
	}
	if resp, err := cli.Get(ctx, key); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("key %s after release: %v, %v", key, resp, err)
	}
	info, err := d.Inspect(ctx, g.Key)
	if err != nil || info.Held || info.Fence != g.Fence {
		t.Fatalf("Inspect after release = %+v, %v; want free with fence %d", info, err, g.Fence)
	}
	if err := d.Release(ctx, g); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
}

// TestReleaseSparesTheNextKeyOfItsName orders, with the release hook, the
// interleaving in which a release's plain delete is on its way while its
// grant ends behind its back (the reaper, or an abandoned acquisition,
// deletes the key and forgets the grant) and another owner of the same
// driver acquires the same key. Key names are reused on a session (see
// waiterKey), so if the ended grant's name were given back to its session
// at once, the other owner's key would carry the same name, and the late
// delete would remove it: two owners would believe they held the lock in
// turn while the second had lost it. The name stays pinned until the delete
// is answered: the other owner's key lands on another session and
// survives, and the release reports ErrNotHeld.
func TestReleaseSparesTheNextKeyOfItsName(t *testing.T) {
	d, cli := newTestDriver(t)
	ctx := context.Background()
	const ttl = 10 * time.Second
	a := driver.Grant{Key: "k", Owner: "owner-a", TTL: ttl}
	b := driver.Grant{Key: "k", Owner: "owner-b", TTL: ttl}
	var err error
	if a.Fence, err = d.TryAcquire(ctx, a.Key, a.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	var hookErr error
	var bKey string
	d.releaseHook = func(e *entry) {
		d.releaseHook = nil
		d.grants.EndNow(e) // deletes a's key and forgets a
		if b.Fence, hookErr = d.TryAcquire(ctx, b.Key, b.Owner, ttl); hookErr != nil {
			return
		}
		bKey = d.grants.Lookup(b.Key, b.Owner).etcdKey
	}
	if err := d.Release(ctx, a); !errors.Is(err, fenced.ErrNotHeld) {
		t.Fatalf("release of a grant ended meanwhile: %v, want ErrNotHeld", err)
	}
	if hookErr != nil {
		t.Fatalf("acquisition by owner-b while a's release was on its way: %v", hookErr)
	}
	resp, err := cli.Get(ctx, bKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 || uint64(resp.Kvs[0].CreateRevision) != b.Fence {
		t.Fatalf("owner-b's key %s (fence %d) after a's late release: %v; the release deleted the next grant's key", bKey, b.Fence, resp.Kvs)
	}
	if err := d.Renew(ctx, b); err != nil {
		t.Fatalf("renewal of owner-b's grant after a's late release: %v", err)
	}
	// a's name is given back once its delete was answered.
	ea := d.grants.Lookup(b.Key, b.Owner)
	if err := d.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, list := range d.sessions {
		for _, s := range list {
			if s.names[ea.name] || s.releasing[ea.name] != 0 {
				t.Fatalf("session %x still reserves %s (releasing %d) after both releases", int64(s.id), ea.name, s.releasing[ea.name])
			}
		}
	}
}

// TestReleaseReportsAForeignKeyDeleted: a client that puts a key on the
// driver's own etcd lease, under the name of a grant that was broken, has
// that key deleted by the grant's late release (the release is a plain
// delete, see releaseTracked). The release says so rather than report a
// success.
func TestReleaseReportsAForeignKeyDeleted(t *testing.T) {
	d, cli := newTestDriver(t)
	ctx := context.Background()
	const ttl = 10 * time.Second
	a := driver.Grant{Key: "foreign", Owner: "owner-a", TTL: ttl}
	var err error
	if a.Fence, err = d.TryAcquire(ctx, a.Key, a.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	e := d.grants.Lookup(a.Key, a.Owner)
	if _, err := d.Break(ctx, a.Key, "test", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, e.etcdKey, "", clientv3.WithLease(e.s.id)); err != nil {
		t.Fatal(err)
	}
	err = d.Release(ctx, a)
	if !errors.Is(err, fenced.ErrNotHeld) || !strings.Contains(err.Error(), "deleted instead: another client's key") {
		t.Fatalf("release over a foreign key on the driver's lease: %v, want ErrNotHeld naming the deletion", err)
	}
}
