package fencedzookeeper_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/drivertest"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// testSessionOutlivesValidity renews a lease held through a follower and
// then cuts that follower off (SIGSTOP: it can neither serve the client nor
// tell the leader about the renewal), the client with it. The leader
// expires the session from the last activity the follower reported at its
// pings; the lease's local validity must end before the leader deletes the
// node (issue 9 item 13). The renewal is sent after the client has been
// quiet for a while, the worst case: the leader's news of the session are
// then as old as they get. Before the fix the session timeout equalled the
// TTL, and the node went up to a client ping interval (a third of the TTL)
// before the holder stopped trusting its lease.
func testSessionOutlivesValidity(t *testing.T, ens *testenv.ZKEnsemble) {
	leader, follower := leaderAndFollower(t, ens)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	proxy := testenv.StartProxy(t, follower.Addr) // the client reaches this follower only
	c, err := fenced.Open(ctx, "zk://"+proxy.Addr+"/headroom", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The renewal comes a client ping (a third of the session) and a
	// quarter TTL after the grant: on a busy machine 3 s can run out
	// before it, so the TTL follows the machine's slowest grant.
	ttl := drivertest.MeasuredTTL(t, 3*time.Second, c)
	l, err := c.TryAcquire(ctx, "k", &fenced.LeaseOptions{TTL: ttl, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}

	observer, _, err := zk.Connect([]string{leader.Addr}, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close()
	kids, _, err := observer.Children("/headroom/k")
	if err != nil || len(kids) != 1 {
		t.Fatalf("lock nodes %v, %v; want the holder's", kids, err)
	}
	gone := deletedAt(observer, "/headroom/k/"+kids[0])

	// Renew a while after a ping of the client library (it pings every
	// third of the session timeout), so that the renewal is the first
	// request for a while unless the driver keeps the session busier.
	pinged := make(chan struct{}, 1)
	proxy.Observe(func(chunk []byte) {
		if isPing(chunk) {
			select {
			case pinged <- struct{}{}:
			default:
			}
		}
	})
	<-pinged
	proxy.Observe(nil)
	time.Sleep(ttl / 4)
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := follower.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	defer func() {
		if err := follower.Process().Signal(syscall.SIGCONT); err != nil {
			t.Error(err)
		}
		follower.WaitReady()
	}()
	checkValidityEndsFirst(t, l, stopped, gone)
}

// leaderAndFollower returns the leader of ens and one of its followers.
func leaderAndFollower(t *testing.T, ens *testenv.ZKEnsemble) (leader, follower *testenv.ZKNode) {
	t.Helper()
	for _, n := range ens.Nodes {
		switch mode, _ := n.Mode(); mode {
		case "leader":
			leader = n
		case "follower":
			follower = n
		}
	}
	if leader == nil || follower == nil {
		t.Fatal("no leader and follower found")
	}
	return leader, follower
}

// deletedAt reports when observer sees the node at path deleted.
func deletedAt(observer *zk.Conn, path string) <-chan time.Time {
	gone := make(chan time.Time, 1)
	go func() {
		for {
			ok, _, ch, err := observer.ExistsW(path)
			if err == nil && !ok {
				gone <- time.Now()
				return
			}
			if err != nil {
				if errors.Is(err, zk.ErrClosing) {
					return
				}
				time.Sleep(10 * time.Millisecond)
				continue
			}
			<-ch
		}
	}()
	return gone
}

// checkValidityEndsFirst checks that l, cut off from the ensemble at
// stopped, stops trusting itself before the leader deletes its node
// (reported on gone), and ends as expired.
func checkValidityEndsFirst(t *testing.T, l *fenced.Lease, stopped time.Time, gone <-chan time.Time) {
	t.Helper()
	validUntil := rootaccess.ValidUntil(l)
	var goneAt time.Time
	select {
	case goneAt = <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the session never expired at the leader")
	}
	select {
	case <-l.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease never ended")
	}
	t.Logf("local validity ended %v after the cut; the leader deleted the node %v after it",
		validUntil.Sub(stopped).Round(time.Millisecond), goneAt.Sub(stopped).Round(time.Millisecond))
	if !validUntil.Before(goneAt) {
		t.Fatalf("the leader expired the session %v before the holder's local validity ended", validUntil.Sub(goneAt).Round(time.Millisecond))
	}
	if !errors.Is(l.Err(), fenced.ErrExpired) {
		t.Fatalf("the cut-off lease ended with %v, want ErrExpired", l.Err())
	}
}

// testWaiterSessionOutlivesValidity is testSessionOutlivesValidity for a
// grant made to a waiter: its look after the wake-up stands on its own
// create (leaderProof, no sync), and the follower serving it is cut off
// right after the grant. The lease's validity, counted from the create,
// must end before the leader deletes the node.
func testWaiterSessionOutlivesValidity(t *testing.T, ens *testenv.ZKEnsemble) {
	leader, follower := leaderAndFollower(t, ens)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	proxy := testenv.StartProxy(t, follower.Addr) // the waiter reaches this follower only
	waiter, err := fenced.Open(ctx, "zk://"+proxy.Addr+"/headroom-wait", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close()
	holder, err := fenced.Open(ctx, "zk://"+leader.Addr+"/headroom-wait", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	const ttl = 3 * time.Second
	opts := &fenced.LeaseOptions{TTL: ttl, ManualRenew: true, MaxWait: 30 * time.Second}
	h, err := holder.TryAcquire(ctx, "k", opts)
	if err != nil {
		t.Fatal(err)
	}
	observer, _, err := zk.Connect([]string{leader.Addr}, 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close()
	type result struct {
		l   *fenced.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "k", opts)
		got <- result{l, err}
	}()
	var kids []string
	for deadline := time.Now().Add(10 * time.Second); len(kids) < 2; time.Sleep(5 * time.Millisecond) {
		if kids, _, err = observer.Children("/headroom-wait/k"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter's node never appeared: %v", kids)
		}
	}
	// Released well within writeProofAge (TTL/32) of the waiter's create.
	time.Sleep(20 * time.Millisecond)
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if err := follower.Process().Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	defer func() {
		if err := follower.Process().Signal(syscall.SIGCONT); err != nil {
			t.Error(err)
		}
		follower.WaitReady()
	}()
	if r.err != nil {
		t.Fatal(r.err)
	}
	kids, _, err = observer.Children("/headroom-wait/k")
	if err != nil || len(kids) != 1 {
		t.Fatalf("lock nodes %v, %v; want the waiter's", kids, err)
	}
	checkValidityEndsFirst(t, r.l, stopped, deletedAt(observer, "/headroom-wait/k/"+kids[0]))
}
