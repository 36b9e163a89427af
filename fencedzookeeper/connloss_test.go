package fencedzookeeper_test

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedzookeeper"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// isRequest returns a matcher for client chunks that start with a
// ZooKeeper request (length, xid, opcode) of opcode op with a positive xid,
// which tells requests from pings, watch resets and connect handshakes.
func isRequest(op int32) func(chunk []byte) bool {
	return func(chunk []byte) bool {
		return len(chunk) >= 12 && int32(binary.BigEndian.Uint32(chunk[4:8])) > 0 && int32(binary.BigEndian.Uint32(chunk[8:12])) == op
	}
}

// opMulti is the opcode of a multi request, which is how the driver
// creates lock nodes.
const opMulti = 14

// isMulti matches a chunk that starts with a multi request.
var isMulti = isRequest(opMulti)

// isPing matches a chunk that starts with a ping (xid -2, opcode 11).
func isPing(chunk []byte) bool {
	return len(chunk) >= 12 && int32(binary.BigEndian.Uint32(chunk[4:8])) == -2 && binary.BigEndian.Uint32(chunk[8:12]) == 11
}

// testConnectionLossOnCreate cuts the connection after the server received
// the create of a lock node and before its reply arrives, as Curator's
// protected mode guards against: the driver must find its node by the
// protected prefix and use it, leaving no second node and no orphan.
func testConnectionLossOnCreate(t *testing.T, ens *testenv.ZKEnsemble) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	proxy := testenv.StartProxy(t, ens.Servers()[0])
	c, err := fenced.Open(ctx, "zk://"+proxy.Addr+"/connloss", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opts := &fenced.LeaseOptions{TTL: 10 * time.Second}
	warm, err := c.TryAcquire(ctx, "warm-up", opts) // opens the 10s session
	if err != nil {
		t.Fatal(err)
	}
	warm.Release(ctx)

	proxy.CutAfter(isMulti)
	l, err := c.TryAcquire(ctx, "cut", opts)
	if err != nil {
		t.Fatalf("TryAcquire across a connection loss during create: %v", err)
	}
	if proxy.Cuts() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.Cuts())
	}
	conn, _, err := zk.Connect(ens.Servers(), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kids, _, err := conn.Children("/connloss/cut")
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 1 {
		t.Fatalf("lock nodes after the lost create: %v, want exactly one (ours)", kids)
	}
	_, st, err := conn.Get("/connloss/cut/" + kids[0])
	if err != nil {
		t.Fatal(err)
	}
	if uint64(st.Czxid) != l.Fence() {
		t.Fatalf("the lease's fence %d is not its node's czxid %d", l.Fence(), st.Czxid)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if kids, _, _ := conn.Children("/connloss/cut"); len(kids) != 0 {
		t.Fatalf("nodes left after release: %v", kids)
	}
}

// testConnectionLossOnCreateAndLookup cuts the connection after the server
// received the create of a lock node, and keeps the server unreachable
// until the create has been reported as an unknown outcome, so the lookup
// by protected prefix fails too. The owner's retry must then find the node
// and take it over whole: renewals succeed (the node's session is known),
// and release leaves nothing behind. Before issue 9 item 8 was fixed the
// retry left the session unset, so the first renewal failed and the node
// stayed on the live session, locking the key out.
func testConnectionLossOnCreateAndLookup(t *testing.T, ens *testenv.ZKEnsemble) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	proxy := testenv.StartProxy(t, ens.Servers()[0])
	d := openDriver(t, "zk://"+proxy.Addr+"/connloss")
	defer d.Close()
	const ttl = 10 * time.Second
	// The warm-up opens the session and makes the lock path, so that the
	// cut create is applied.
	warm := driver.Grant{Key: "cut-lookup", Owner: strings.Repeat("1", 32)}
	var err error
	if warm.Fence, err = d.TryAcquire(ctx, warm.Key, warm.Owner, ttl); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, warm); err != nil {
		t.Fatal(err)
	}

	g := driver.Grant{Key: "cut-lookup", Owner: strings.Repeat("2", 32), TTL: ttl}
	proxy.SetDown(true) // the connection in use stays; reconnects fail
	proxy.CutAfter(isMulti)
	_, err = d.TryAcquire(ctx, g.Key, g.Owner, ttl)
	if !errors.Is(err, fenced.ErrUnknownOutcome) {
		t.Fatalf("TryAcquire with the create cut and the lookup failing: %v, want ErrUnknownOutcome", err)
	}
	if proxy.Cuts() != 1 {
		t.Fatalf("the proxy cut %d connections, want 1", proxy.Cuts())
	}
	proxy.SetDown(false)
	// Retry as fenced.Client does; a request queued while the client
	// library is still between connection attempts can fail once more.
	for attempt := 1; ; attempt++ {
		g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, ttl)
		if err == nil {
			break
		}
		if !errors.Is(err, fenced.ErrUnavailable) || attempt == 5 {
			t.Fatalf("retried TryAcquire (attempt %d) after the unknown outcome: %v", attempt, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	conn, _, err := zk.Connect(ens.Servers(), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kids, _, err := conn.Children("/connloss/cut-lookup")
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 1 {
		t.Fatalf("lock nodes after the retry: %v, want exactly one (ours)", kids)
	}
	if _, st, err := conn.Get("/connloss/cut-lookup/" + kids[0]); err != nil || uint64(st.Czxid) != g.Fence {
		t.Fatalf("the grant's fence %d is not its node's czxid (%+v, %v)", g.Fence, st, err)
	}
	if err := d.Renew(ctx, g); err != nil {
		t.Fatalf("renewing the grant found again by the retry: %v", err)
	}
	if err := d.Release(ctx, g); err != nil {
		t.Fatal(err)
	}
	if kids, _, _ := conn.Children("/connloss/cut-lookup"); len(kids) != 0 {
		t.Fatalf("nodes left after release: %v", kids)
	}
}

// testCreateAbandoned ends an acquisition's context while its create is at
// a stopped server: the call returns at once, and once the server answers,
// the node it created is deleted, so that it cannot hold the key for as
// long as the session lives.
func testCreateAbandoned(t *testing.T, ens *testenv.ZKEnsemble) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d := openDriver(t, ens.URL("/abandoned", ""))
	defer d.Close()
	q := d.(driver.TimedQueuer)
	const ttl = 5 * time.Second
	// Opens the session and makes the lock path.
	f0, _, err := q.AcquireTimed(ctx, "k", "owner-warm-up-0000000000000000000", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, driver.Grant{Key: "k", Owner: "owner-warm-up-0000000000000000000", Fence: f0, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	server := ens.Nodes[0].Process()
	if err := server.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			server.Signal(syscall.SIGCONT)
		}
	}()
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	began := time.Now()
	_, _, err = q.AcquireTimed(short, "k", "owner-abandoned-000000000000000000", ttl)
	cancelShort()
	if took := time.Since(began); err == nil || took > 2*time.Second {
		t.Fatalf("acquire at a stopped server: %v after %v, want the context's error at once", err, took)
	}
	if err := server.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	conn, _, err := zk.Connect(ens.Servers(), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lockPath := d.(*fencedzookeeper.Driver).LockPath("k")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		names, _, err := conn.Children(lockPath)
		if err == nil && len(names) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock nodes left under %s after the abandoned create: %v, %v", lockPath, names, err)
		}
	}
	// The create was applied (the lock path records its fence) and then
	// deleted: the key is free and its next fence is higher still.
	info, err := d.Inspect(ctx, "k")
	if err != nil || info.Held || info.Fence <= f0 {
		t.Fatalf("Inspect after the abandoned create = %+v, %v; want free with a fence above %d", info, err, f0)
	}
	f, _, err := q.AcquireTimed(ctx, "k", "owner-after-0000000000000000000000", ttl)
	if err != nil || f <= info.Fence {
		t.Fatalf("acquire after the abandoned create: fence %d, %v; want above %d", f, err, info.Fence)
	}
}

// testLossWatchAcrossRestart checks that a held lease's loss watch (a
// function-delivered exists watch, zk.Conn.ExistsWFunc) survives the
// connection's loss: the server is killed and restarted (the session
// survives, its timeout being longer), the connection reconnects and sets
// its watches again, and a break by an admin then ends the lease with
// ErrLost long before its local validity would (it is not renewed).
func testLossWatchAcrossRestart(t *testing.T, ens *testenv.ZKEnsemble) {
	ctx := context.Background()
	c, err := fenced.Open(ctx, ens.URL("/losswatch-restart", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Acquire(ctx, "k", &fenced.LeaseOptions{TTL: 30 * time.Second, ManualRenew: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the loss watch starts
	n := ens.Nodes[0]
	restarted := time.Now()
	n.Kill()
	n.Start()
	n.WaitReady()
	operator, err := fenced.Open(ctx, ens.URL("/losswatch-restart", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Close()
	// The holder's connection reconnects on its own schedule; the break
	// is reported once it has.
	if _, err := operator.Break(ctx, "k", "test", "testLossWatchAcrossRestart"); err != nil {
		t.Fatal(err)
	}
	// The holder reconnects as the operator did: the bound follows how
	// long the restart, the operator's open and its break took here.
	took := time.Since(restarted)
	bound := max(15*time.Second, 3*took)
	select {
	case <-l.Context().Done():
	case <-time.After(bound):
		t.Fatalf("the broken lease was not ended within %v of the break after a restart (restart, open and break took %v)",
			bound, took.Round(time.Millisecond))
	}
	if err := l.Err(); !errors.Is(err, fenced.ErrLost) {
		t.Fatalf("lease ended with %v, want ErrLost", err)
	}
}
