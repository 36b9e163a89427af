package zookeeper_test

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testenv"
)

// isMulti reports whether a client chunk starts with a ZooKeeper multi
// request (length, xid, opcode 14), which is how the driver creates lock
// nodes.
func isMulti(chunk []byte) bool {
	return len(chunk) >= 12 && binary.BigEndian.Uint32(chunk[8:12]) == 14
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
