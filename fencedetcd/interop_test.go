package fencedetcd_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/fencedetcd"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/fenced-dev/fenced/recipe"
)

// etcdctlLock starts `etcdctl lock name` running a shell that prints
// ETCD_LOCK_REV and then holds the lock until unlock is called (etcdctl
// gives its child no stdin, so a file's existence is the signal).
func etcdctlLock(t *testing.T, c *testenv.EtcdCluster, name string) (revs <-chan int64, unlock func(), done <-chan struct{}) {
	t.Helper()
	bin := testenv.EtcdctlBinary(t)
	cmd := exec.Command(bin, "--endpoints="+strings.Join(c.Endpoints(), ","), "lock", "--ttl=5", name, "--",
		"sh", "-c", `echo "REV=$ETCD_LOCK_REV"; while [ -e "$HOLD" ]; do sleep 0.05; done`)
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(cmd.Environ(), "ETCDCTL_API=3", "HOLD="+hold)
	unlock = func() { os.Remove(hold) }
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testenv.SafeBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan int64, 1)
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "REV="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Errorf("etcdctl exported ETCD_LOCK_REV=%q", v)
				}
				ch <- n
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		unlock()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("etcdctl stderr: %s", stderr.String())
		}
	})
	return ch, unlock, exited
}

// TestEtcdctlLockInterop proves that `etcdctl lock` and fenced exclude each
// other in both directions on the same lock name, and that fenced's fence
// is the revision etcdctl exports as ETCD_LOCK_REV.
func TestEtcdctlLockInterop(t *testing.T) {
	cluster := testenv.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := fenced.Open(ctx, cluster.URL("prefix=locks/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	name := rootaccess.Driver(client).(*fencedetcd.Driver).LockName("invoice:inv_72")
	if name != "locks/invoice:inv_72" {
		t.Fatalf("lock name %q", name)
	}

	t.Run("EtcdctlHoldsFencedWaits", func(t *testing.T) {
		revs, unlock, _ := etcdctlLock(t, cluster, name)
		var rev int64
		select {
		case rev = <-revs:
		case <-time.After(20 * time.Second):
			t.Fatal("etcdctl lock did not run its command")
		}
		if _, err := client.TryAcquire(ctx, "invoice:inv_72", nil); !errors.Is(err, fenced.ErrHeld) {
			t.Fatalf("fenced TryAcquire while etcdctl holds: %v, want ErrHeld", err)
		}
		info, err := client.Inspect(ctx, "invoice:inv_72")
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held || info.Fence != uint64(rev) {
			t.Fatalf("Inspect while etcdctl holds = %+v; want held with fence = ETCD_LOCK_REV %d", info, rev)
		}
		got := make(chan *fenced.Lease, 1)
		go func() {
			l, err := client.Acquire(ctx, "invoice:inv_72", &fenced.LeaseOptions{MaxWait: 30 * time.Second, TTL: 5 * time.Second})
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		select {
		case <-got:
			t.Fatal("fenced acquired while etcdctl held the lock")
		case <-time.After(time.Second):
		}
		unlock()
		l := <-got
		if l == nil {
			return
		}
		defer l.Release(ctx)
		if l.Fence() <= uint64(rev) {
			t.Fatalf("fenced fence %d after etcdctl's %d", l.Fence(), rev)
		}
	})

	t.Run("FencedHoldsEtcdctlWaits", func(t *testing.T) {
		l, err := client.TryAcquire(ctx, "invoice:inv_72", &fenced.LeaseOptions{TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		revs, unlock, _ := etcdctlLock(t, cluster, name)
		select {
		case rev := <-revs:
			t.Fatalf("etcdctl lock ran its command (rev %d) while fenced held fence %d", rev, l.Fence())
		case <-time.After(1500 * time.Millisecond):
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case rev := <-revs:
			if uint64(rev) <= l.Fence() {
				t.Fatalf("etcdctl's ETCD_LOCK_REV %d not above fenced's fence %d", rev, l.Fence())
			}
			// etcdctl waited, so it exports the revision at which it got the
			// lock; the fence fenced reports for its hold is its key's create
			// revision, between fenced's fence and that revision.
			info, err := client.Inspect(ctx, "invoice:inv_72")
			if err != nil || !info.Held || info.Fence <= l.Fence() || info.Fence > uint64(rev) {
				t.Fatalf("Inspect = %+v, %v; want etcdctl's hold with a fence in (%d, %d]", info, err, l.Fence(), rev)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("etcdctl lock did not get the lock after fenced released")
		}
		unlock()
	})
}

// TestElectionValueInEtcdLayout checks the driver.Valuer hook: a fenced
// leader's proclaimed value is the value of its key in etcd's election
// layout (what `etcdctl elect -l` prints), and the grant keeps renewing
// and releases normally once its owner token is no longer the key's value.
func TestElectionValueInEtcdLayout(t *testing.T) {
	cluster := testenv.StartEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := fenced.Open(ctx, cluster.URL("prefix=elections/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// A TTL this machine renews in time: under the hog (run 1 of
	// 2026-12-07) etcd took 470 ms to apply a read, and a 1 s lease ran
	// out before the proclaim.
	ttl := drivertest.MeasuredTTL(t, time.Second, client)
	el, err := recipe.NewElection(client, "svc", &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ld, err := el.Campaign(ctx, "10.0.0.7:8080")
	if err != nil {
		t.Fatal(err)
	}
	cli := rootaccess.Driver(client).(*fencedetcd.Driver).Client()
	resp, err := cli.Get(ctx, "elections/svc/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "10.0.0.7:8080" || uint64(resp.Kvs[0].CreateRevision) != ld.Fence() {
		t.Fatalf("etcd keys %v, %v; want one key with the value and create revision %d", resp, err, ld.Fence())
	}
	if err := ld.SetValue(ctx, "10.0.0.8:8080"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * ttl / 2) // several renewals
	if err := ld.Err(); err != nil {
		t.Fatalf("leadership ended after proclaiming: %v", err)
	}
	l, err := el.Leader(ctx)
	if err != nil || !l.Present || l.Epoch != ld.Fence() || l.Value != "10.0.0.8:8080" {
		t.Fatalf("Leader = %v, %v", l, err)
	}
	if err := ld.Release(ctx); err != nil {
		t.Fatalf("Resign after proclaiming: %v", err)
	}
	if l, err := el.Leader(ctx); err != nil || l.Present {
		t.Fatalf("Leader after Resign = %v, %v", l, err)
	}

	// A lock holder's key holds its owner token, which Value never shows.
	lease, err := client.TryAcquire(ctx, "lock", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	lockEl, _ := recipe.NewElection(client, "lock", nil)
	if l, err := lockEl.Leader(ctx); err != nil || !l.Present || l.Value != "" || strings.Contains(l.Owner, lease.Owner()) {
		t.Fatalf("Leader of a lock = %+v, %v; want held, no value, no owner token", l, err)
	}
}
