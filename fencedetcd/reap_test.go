package fencedetcd

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fenced-dev/fenced/driver"
)

// txnRequests reads how many Txn requests the member at endpoint has
// received (its grpc_server_msg_received_total).
func txnRequests(t *testing.T, endpoint string) int {
	t.Helper()
	resp, err := http.Get("http://" + endpoint + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "grpc_server_msg_received_total{") && strings.Contains(line, `grpc_method="Txn"`) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
	}
	t.Fatalf("%s reports no Txn requests", endpoint)
	return 0
}

// TestReapAfterOutageInBatches: 2 000 grants that nobody renews fall due
// while etcd is stopped (SIGSTOP), and their session stays alive (another
// grant renews it). Once etcd runs again the driver deletes them in
// batches, not a request per key: after an outage a driver holding many
// thousands of grants finds them all due at once, and on a loaded store a
// request per key would leave keys standing long after it is back.
//
// Granting 2 000 keys one request at a time takes from a second on a quiet
// machine to tens of seconds on a busy one, longer than their TTL. So the
// keys granted so far are renewed in one batch whenever the oldest renewal
// is half a TTL old, and all of them once more at the end: every grant then
// falls due at the same moment (the last renewal's start plus the TTL),
// however long granting took, and a stop of 0.7 s covers every deadline
// and ends long before the session (TTL 6 s) expires.
func TestReapAfterOutageInBatches(t *testing.T) {
	if testing.Short() {
		t.Skip("long: 2000 grants and a SIGSTOP of etcd; run without -short")
	}
	d, cli, cluster := newTestCluster(t)
	ctx := context.Background()
	const n, ttl = 2000, 5 * time.Second
	grants := make([]driver.Grant, 0, n)
	first := time.Now()
	var renewed time.Time // start of the last renewal of every grant so far
	var longest time.Duration
	renewAll := func() {
		start := time.Now()
		errs, err := d.RenewBatch(ctx, grants)
		if err != nil {
			t.Fatal(err)
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("renewing %s, %v after the previous renewal began (a step took up to %v on this machine; the renewals come every %v): %v", grants[i].Key, start.Sub(renewed).Round(time.Millisecond), longest.Round(time.Millisecond), ttl/2, err)
			}
		}
		renewed = start
	}
	for i := range n {
		step := time.Now()
		g := driver.Grant{Key: fmt.Sprintf("j%d", i), Owner: "o", TTL: ttl}
		var err error
		if g.Fence, err = d.TryAcquire(ctx, g.Key, g.Owner, ttl); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			renewed = step
		}
		grants = append(grants, g)
		if time.Since(renewed) > ttl/2 {
			renewAll()
		}
		longest = max(longest, time.Since(step))
	}
	granted := time.Since(first)
	renewAll()
	// The keeper's grant shares the session: renewing it keeps the session
	// alive, so only the driver's own deletes can end the others.
	kctx, stopKeeper := context.WithCancel(ctx)
	defer stopKeeper()
	keeperDone := make(chan struct{})
	var keeperCalls atomic.Int64
	go func() {
		defer close(keeperDone)
		for kctx.Err() == nil {
			rctx, cancel := context.WithTimeout(kctx, time.Second)
			keeperCalls.Add(1)
			_, _ = d.TryAcquire(rctx, "keeper", "o", ttl)
			cancel()
			time.Sleep(200 * time.Millisecond)
		}
	}()
	// Stop etcd from half a second before the grants' deadline to just
	// after it: every grant falls due while it is stopped, and the session
	// (TTL 6 s, kept alive until the stop) outlives the stop.
	time.Sleep(time.Until(renewed.Add(ttl - 500*time.Millisecond)))
	member := cluster.Members[0]
	pid := member.Process().Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(renewed.Add(ttl + 200*time.Millisecond)))
	resumed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	before, keeperBefore := txnRequests(t, member.Endpoint), keeperCalls.Load()
	// Deleting the keys a batch per request must not take longer than
	// granting them a request per key took on this machine (30 s at least).
	drainBound := max(30*time.Second, granted)
	left := n
	for deadline := time.Now().Add(drainBound); left > 0; time.Sleep(20 * time.Millisecond) {
		resp, err := cli.Get(ctx, d.LockName("j"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		left = 0
		for _, kv := range resp.Kvs {
			if strings.Count(strings.TrimPrefix(string(kv.Key), d.LockName("")), "/") == 1 {
				left++ // a waiter key (the lock name's record has no '/')
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d unrenewed keys still there %v after etcd resumed (granting them took %v)", left, n, drainBound.Round(time.Millisecond), granted.Round(time.Millisecond))
		}
	}
	drained := time.Since(resumed)
	stopKeeper()
	<-keeperDone
	// The keys went by the driver's deletes, not by the session's expiry.
	if s := d.grants.Lookup("keeper", "o"); s == nil {
		t.Fatal("the keeper's grant is gone")
	} else if r, err := cli.TimeToLive(ctx, s.s.id); err != nil || r.TTL <= 0 {
		t.Fatalf("the session expired (TTL %d, %v): the keys may have gone with it", r.TTL, err)
	}
	// The keeper's calls (one Txn each) are counted apart: on a busy
	// machine the drain takes longer, and the keeper calls more often.
	keeper := int(keeperCalls.Load() - keeperBefore)
	txns := txnRequests(t, member.Endpoint) - before - keeper
	t.Logf("%d keys granted in %v (a step took up to %v); deleted %v after etcd resumed, with %d Txn requests besides the keeper's %d", n, granted.Round(time.Millisecond), longest.Round(time.Millisecond), drained.Round(time.Millisecond), txns, keeper)
	// One request per batch of reapBatch keys (a failed one sent again);
	// one per key would be 2 000.
	if txns > n/reapBatch*2 {
		t.Fatalf("%d Txn requests besides the keeper's to delete %d keys: not batched", txns, n)
	}
}
