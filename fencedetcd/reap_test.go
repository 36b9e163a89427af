package fencedetcd

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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
func TestReapAfterOutageInBatches(t *testing.T) {
	d, cli, cluster := newTestCluster(t)
	ctx := context.Background()
	const n, ttl = 2000, 5 * time.Second
	first := time.Now()
	for i := range n {
		if _, err := d.TryAcquire(ctx, fmt.Sprintf("j%d", i), "o", ttl); err != nil {
			t.Fatal(err)
		}
	}
	// The keeper's grant shares the session: renewing it keeps the session
	// alive, so only the driver's own deletes can end the others.
	kctx, stopKeeper := context.WithCancel(ctx)
	defer stopKeeper()
	keeperDone := make(chan struct{})
	go func() {
		defer close(keeperDone)
		for kctx.Err() == nil {
			rctx, cancel := context.WithTimeout(kctx, time.Second)
			_, _ = d.TryAcquire(rctx, "keeper", "o", ttl)
			cancel()
			time.Sleep(200 * time.Millisecond)
		}
	}()
	last := time.Now()
	if last.Sub(first) > 4*time.Second {
		t.Fatalf("granting %d keys took %v: the stop below could not both cover every deadline and end before the session (TTL 6 s) expires", n, last.Sub(first))
	}
	// Stop etcd from half a second before the first grant's deadline to
	// just after the last one's: every grant falls due while it is
	// stopped, and the session (TTL 6 s, kept alive until the stop)
	// outlives the stop.
	time.Sleep(time.Until(first.Add(ttl - 500*time.Millisecond)))
	member := cluster.Members[0]
	pid := member.Process().Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(last.Add(ttl + 200*time.Millisecond)))
	resumed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	before := txnRequests(t, member.Endpoint)
	left := n
	for deadline := time.Now().Add(30 * time.Second); left > 0; time.Sleep(20 * time.Millisecond) {
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
			t.Fatalf("%d of %d unrenewed keys still there 30s after etcd resumed", left, n)
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
	txns := txnRequests(t, member.Endpoint) - before
	t.Logf("%d unrenewed keys deleted %v after etcd resumed, with %d Txn requests", n, drained.Round(time.Millisecond), txns)
	// One request per batch of reapBatch keys, plus the keeper's and this
	// test's reads; one per key would be 2 000.
	if txns > n/reapBatch*3 {
		t.Fatalf("%d Txn requests to delete %d keys: not batched", txns, n)
	}
}
