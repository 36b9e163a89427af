package zookeeper_test

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
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
	if !errors.Is(err, driver.ErrUnknownOutcome) {
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
		if !errors.Is(err, driver.ErrUnavailable) || attempt == 5 {
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
