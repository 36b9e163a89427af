package fencedzookeeper_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/fencedzookeeper/internal/zk"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/rootaccess"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// packetsReceived returns the server's count of packets received from
// clients (four-letter word mntr, zk_packets_received).
func packetsReceived(t *testing.T, addr string) int64 {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("mntr")); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range testenv.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "zk_packets_received\t"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("mntr from %s has no zk_packets_received:\n%s", addr, b)
	return 0
}

// testHandoverRequests hands one key around a line of waiters that each
// have their own Client (so their own driver and sessions, as separate
// processes would), every releaser joining the back of the line again,
// and counts the requests the server receives per handover. Each handover
// is the release, the next waiter's look after its wake-up (a listing,
// with a sync before it when the waiter's session made no write lately),
// and the releaser's create, look and watch: a handful of requests,
// whatever the length of the line. A newcomer that reads the czxid of
// every node ahead of it (the herd this checks for) costs one more
// request per waiter.
func testHandoverRequests(t *testing.T, ens *testenv.ZKEnsemble) {
	const (
		waiters   = 24
		handovers = 20
		// Expected: delete, listing (sync + listing at worst), create,
		// listing, watch = 5 or 6; the rest is slack for the sessions'
		// keep-alives and pings.
		maxPerHandover = 10
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	addr := ens.Servers()[0]
	conn, _, err := zk.Connect(ens.Servers(), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	type grant struct {
		l      *fenced.Lease
		rejoin chan struct{}
	}
	grants := make(chan grant)
	opts := &fenced.LeaseOptions{TTL: 10 * time.Second, MaxWait: fenced.WaitForever}
	participate := func(c *fenced.Client) {
		rejoin := make(chan struct{})
		for {
			l, err := c.Acquire(ctx, "k", opts)
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("Acquire: %v", err)
				}
				return
			}
			select {
			case grants <- grant{l, rejoin}:
			case <-ctx.Done():
				l.Release(context.Background())
				return
			}
			select {
			case <-rejoin:
			case <-ctx.Done():
				return
			}
		}
	}
	clients := make([]*fenced.Client, waiters+1)
	for i := range clients {
		c, err := fenced.Open(ctx, ens.URL("/herd", ""), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	lockPath := rootaccess.Driver(clients[0]).(interface{ LockPath(string) string }).LockPath("k")
	// lineFull waits until every participant has a node under the lock
	// path, and returns how many listings that took.
	lineFull := func() int64 {
		var polls int64
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			kids, _, err := conn.Children(lockPath)
			polls++
			if err == nil && len(kids) == waiters+1 {
				return polls
			}
			if time.Now().After(deadline) {
				t.Fatalf("the line never filled: %v, %v", kids, err)
			}
		}
	}
	go participate(clients[0])
	cur := <-grants
	for _, c := range clients[1:] {
		go participate(c)
	}
	lineFull()
	before := packetsReceived(t, addr)
	prevFence := cur.l.Fence()
	for range handovers {
		if err := cur.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		cur.rejoin <- struct{}{}
		cur = <-grants
		if f := cur.l.Fence(); f <= prevFence {
			t.Fatalf("fence %d after %d", f, prevFence)
		}
		prevFence = cur.l.Fence()
	}
	polls := lineFull()
	after := packetsReceived(t, addr)
	// The counting itself: the listings above and one mntr connection
	// (counted or not, depending on the server version).
	perHandover := float64(after-before-polls) / handovers
	t.Logf("%d waiters on separate clients: %.1f requests per handover (%d packets, %d of them our own listings, over %d handovers)", waiters, perHandover, after-before, polls, handovers)
	if perHandover > maxPerHandover {
		t.Errorf("%.1f requests per handover with %d waiters on separate clients, want at most %d: the cost of a handover grows with the line", perHandover, waiters, maxPerHandover)
	}
	cur.l.Release(ctx)
	cancel()
}
