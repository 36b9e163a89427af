package fencedetcd_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced"
)

// TestPutOnExpiredSessionStartsOver: an acquisition whose put reached
// etcd after its session's lease had expired (the process was stopped
// while it waited for the reply) starts over with a new session. Before,
// one that took longer than the session's TTL failed with "session
// expired": a member of a partitions group stopped during its join
// exited by itself.
func TestPutOnExpiredSessionStartsOver(t *testing.T) {
	cluster, proxy, c := openThroughProxy(t)
	direct, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()

	// The put names the key; from it on, the connection is held: the put
	// and the session's keep-alives alike, so the session's lease expires.
	proxy.Hold(func(chunk []byte) bool { return bytes.Contains(chunk, []byte("slowput")) })
	type result struct {
		fence uint64
		err   error
	}
	done := make(chan result, 1)
	go func() {
		l, err := c.TryAcquire(context.Background(), "slowput", &fenced.LeaseOptions{TTL: time.Second})
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{fence: l.Fence()}
	}()
	for deadline := time.Now().Add(10 * time.Second); proxy.Held() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the put was not held within 10 s")
		}
	}
	// Wait until etcd has no lease left: the session expired.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ls, err := direct.Leases(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(ls.Leases) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session's lease has not expired 30 s into the hold: %v", ls.Leases)
		}
	}
	proxy.Hold(nil)
	if err := proxy.ReleaseHeld(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("an acquisition whose put met an expired session: %v, want a grant on a new session", r.err)
		}
		t.Logf("granted fence %d on a new session", r.fence)
	case <-time.After(30 * time.Second):
		t.Fatal("the acquisition did not return within 30 s of the release")
	}
}
