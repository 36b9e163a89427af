package zk

// Upstream's tests (zk_test.go and cluster_test.go of go-zookeeper/zk
// v1.0.4) of the calls fenced keeps, against the real server main_test.go
// starts. Changes are marked where a test calls what fenced trimmed.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestIntegration_StateChanges is upstream's, on the event channel alone
// (fenced does not use upstream's WithEventCallback).
func TestIntegration_StateChanges(t *testing.T) {
	zk, eventChan := connect(t)

	verifyEventOrder := func(c <-chan Event, expectedStates []State, source string) {
		for _, state := range expectedStates {
			for {
				event, ok := <-c
				if !ok {
					t.Fatalf("unexpected channel close for %s", source)
				}

				if event.Type != EventSession {
					continue
				}

				if event.State != state {
					t.Fatalf("mismatched state order from %s, expected %v, received %v", source, state, event.State)
				}
				break
			}
		}
	}

	states := []State{StateConnecting, StateConnected, StateHasSession}
	verifyEventOrder(eventChan, states, "event channel")

	zk.Close()
	verifyEventOrder(eventChan, []State{StateDisconnected}, "event channel")
}

func TestIntegration_Create(t *testing.T) {
	zk, _ := connect(t)

	tests := []struct {
		name          string
		createFlags   int32
		specifiedPath string
		wantErr       string
	}{
		{
			name:        "valid create persistant",
			createFlags: FlagPersistent,
		},
		{
			name:        "valid container from Create",
			createFlags: FlagContainer,
			// NOTE for v2: we dont need CreateContainer method.
		},
		{
			name:          "invalid path",
			specifiedPath: "not/valid",
			wantErr:       "zk: invalid path",
		},
		{
			name:        "invalid create ttl",
			createFlags: FlagTTL,
			wantErr:     "zk: invalid flags specified",
		},

		{
			name:        "invalid flag for create mode",
			createFlags: 999,
			wantErr:     "invalid flag value: [999]",
		},
	}

	const testPath = "/ttl_znode_tests"
	// create sub node to create per test in avoiding using the root path.
	_, err := zk.Create(testPath, nil /* data */, FlagPersistent, WorldACL(PermAll))
	requireNoErrorf(t, err)

	for idx, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(testPath, fmt.Sprint(idx))
			if tt.specifiedPath != "" {
				path = tt.specifiedPath
			}

			_, err := zk.Create(path, []byte{12}, tt.createFlags, WorldACL(PermAll))
			if tt.wantErr == "" {
				requireNoErrorf(t, err, fmt.Sprintf("error not expected: path; %q; flags %v", path, tt.createFlags))
				return
			}

			// want an error
			if err == nil {
				t.Fatalf("did not get expected error: %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("wanted error not found: %v; got: %v", tt.wantErr, err.Error())
			}
		})
	}
}

func TestIntegration_OpsAfterCloseDontDeadlock(t *testing.T) {
	zk, _ := connect(t)
	zk.Close()

	path := "/gozk-test"

	ch := make(chan struct{})
	go func() {
		defer close(ch)
		for range make([]struct{}, 30) {
			if _, err := zk.Create(path, []byte{1, 2, 3, 4}, 0, WorldACL(PermAll)); err == nil {
				t.Error("Create did not return error") // upstream: t.Fatal, which vet refuses off the test's goroutine
				return
			}
		}
	}()
	select {
	case <-ch:
		// expected
	case <-time.After(10 * time.Second):
		t.Fatal("ZK connection deadlocked when executing ops after a Close operation")
	}
}

func TestIntegration_Multi(t *testing.T) {
	zk, _ := connect(t)

	path := "/gozk-test"

	if err := zk.Delete(path, -1); err != nil && err != ErrNoNode {
		t.Fatalf("Delete returned error: %+v", err)
	}
	ops := []interface{}{
		&CreateRequest{Path: path, Data: []byte{1, 2, 3, 4}, ACL: WorldACL(PermAll)},
		&SetDataRequest{Path: path, Data: []byte{1, 2, 3, 4}, Version: -1},
	}
	if res, err := zk.Multi(ops...); err != nil {
		t.Fatalf("Multi returned error: %+v", err)
	} else if len(res) != 2 {
		t.Fatalf("Expected 2 responses got %d", len(res))
	} else {
		t.Logf("%+v", res)
	}
	if data, stat, err := zk.Get(path); err != nil {
		t.Fatalf("Get returned error: %+v", err)
	} else if stat == nil {
		t.Fatal("Get returned nil stat")
	} else if len(data) < 4 {
		t.Fatal("Get returned wrong size data")
	}
}

func TestIntegration_MultiFailures(t *testing.T) {
	// This test case ensures that we return the errors associated with each
	// opeThis in the event a call to Multi() fails.
	const firstPath = "/gozk-test-first"
	const secondPath = "/gozk-test-second"
	zk, _ := connect(t)

	// Ensure firstPath doesn't exist and secondPath does. This will cause the
	// 2nd operation in the Multi() to fail.
	if err := zk.Delete(firstPath, -1); err != nil && err != ErrNoNode {
		t.Fatalf("Delete returned error: %+v", err)
	}
	if _, err := zk.Create(secondPath, nil /* data */, 0, WorldACL(PermAll)); err != nil {
		t.Fatalf("Create returned error: %+v", err)
	}

	ops := []interface{}{
		&CreateRequest{Path: firstPath, Data: []byte{1, 2}, ACL: WorldACL(PermAll)},
		&CreateRequest{Path: secondPath, Data: []byte{3, 4}, ACL: WorldACL(PermAll)},
	}
	res, err := zk.Multi(ops...)
	if err != ErrNodeExists {
		t.Fatalf("Multi() didn't return correct error: %+v", err)
	}
	if len(res) != 2 {
		t.Fatalf("Expected 2 responses received %d", len(res))
	}
	if res[0].Error != nil {
		t.Fatalf("First operation returned an unexpected error %+v", res[0].Error)
	}
	if res[1].Error != ErrNodeExists {
		t.Fatalf("Second operation returned incorrect error %+v", res[1].Error)
	}
	if _, _, err := zk.Get(firstPath); err != ErrNoNode {
		t.Fatalf("Node %s was incorrectly created: %+v", firstPath, err)
	}
}

func TestIntegration_Children(t *testing.T) {
	zk, _ := connect(t)

	deleteNode := func(node string) {
		if err := zk.Delete(node, -1); err != nil && err != ErrNoNode {
			t.Fatalf("Delete returned error: %+v", err)
		}
	}

	deleteNode("/gozk-test-big")

	if path, err := zk.Create("/gozk-test-big", []byte{1, 2, 3, 4}, 0, WorldACL(PermAll)); err != nil {
		t.Fatalf("Create returned error: %+v", err)
	} else if path != "/gozk-test-big" {
		t.Fatalf("Create returned different path '%s' != '/gozk-test-big'", path)
	}

	rb := make([]byte, 1000)
	hb := make([]byte, 2000)
	prefix := []byte("/gozk-test-big/")
	// 1000 nodes where upstream makes 10000: the listing (2 MB) still
	// outgrows the 1.5 MB receive buffer, in a tenth of the time.
	for i := 0; i < 1000; i++ {
		_, err := rand.Read(rb) // upstream: math/rand.Read, deprecated
		if err != nil {
			t.Fatal("Cannot create random znode name")
		}
		hex.Encode(hb, rb)

		expect := string(append(prefix, hb...))
		if path, err := zk.Create(expect, []byte{1, 2, 3, 4}, 0, WorldACL(PermAll)); err != nil {
			t.Fatalf("Create returned error: %+v", err)
		} else if path != expect {
			t.Fatalf("Create returned different path '%s' != '%s'", path, expect)
		}
		defer deleteNode(string(expect))
	}

	children, _, err := zk.Children("/gozk-test-big")
	if err != nil {
		t.Fatalf("Children returned error: %+v", err)
	} else if len(children) != 1000 {
		t.Fatal("Children returned wrong number of nodes")
	}
}

// TestIntegration_SetWatchers is upstream's with ExistsW in place of GetW
// and ChildrenW (which fenced does not call): a data watch on each node and
// an exist watch on a missing one.
func TestIntegration_SetWatchers(t *testing.T) {
	if testing.Short() {
		t.Skip("long: reconnects with thousands of watches; run without -short")
	}
	latch := make(chan struct{})
	var setWatchReqs atomic.Value
	var l links
	// The session outlives the cut below by far: the 1000 deletes made
	// while it is cut took 15 s on a busy machine (CI, 2026-12-07), and a
	// session expired by then re-sets no watch. The server allows 2 min.
	session := ens.MaxSessionTimeout
	zk, _ := connectFor(t, session, withReconnectLatch(latch), l.option(), func(c *Conn) {
		c.setWatchLimit = 1024 // break up set-watch step into 1k requests
		c.setWatchCallback = func(reqs []*setWatchesRequest) {
			setWatchReqs.Store(reqs)
		}
	})
	zk2, _ := connect(t)

	if err := zk.Delete("/gozk-test", -1); err != nil && err != ErrNoNode {
		t.Fatalf("Delete returned error: %+v", err)
	}

	testPaths := map[string]<-chan Event{}
	defer func() {
		// clean up all of the test paths we create
		for p := range testPaths {
			zk2.Delete(p, -1)
		}
	}()

	// we create lots of paths to watch, to make sure a "set watches" request
	// on re-create will be too big and be required to span multiple packets
	for i := 0; i < 1000; i++ {
		testPath, err := zk.Create(fmt.Sprintf("/gozk-test-%d", i), []byte{}, 0, WorldACL(PermAll))
		if err != nil {
			t.Fatalf("Create returned: %+v", err)
		}
		testPaths[testPath] = nil
		_, _, testEvCh, err := zk.ExistsW(testPath)
		if err != nil {
			t.Fatalf("ExistsW returned: %+v", err)
		}
		testPaths[testPath] = testEvCh
	}

	exists, _, childCh, err := zk.ExistsW("/gozk-test")
	if err != nil {
		t.Fatalf("ExistsW returned error: %+v", err)
	} else if exists {
		t.Fatal("ExistsW found /gozk-test, deleted above")
	}

	// Simulate network error by brutally closing the network connection.
	l.cut(t)
	cutAt := time.Now()
	for p := range testPaths {
		if err := zk2.Delete(p, -1); err != nil && err != ErrNoNode {
			t.Fatalf("Delete returned error: %+v", err)
		}
	}
	if path, err := zk2.Create("/gozk-test", []byte{1, 2, 3, 4}, 0, WorldACL(PermAll)); err != nil {
		t.Fatalf("Create returned error: %+v", err)
	} else if path != "/gozk-test" {
		t.Fatalf("Create returned different path '%s' != '/gozk-test'", path)
	}

	time.Sleep(100 * time.Millisecond)

	// zk should still be waiting to reconnect, so none of the watches should have been triggered
	for p, ch := range testPaths {
		select {
		case <-ch:
			t.Fatalf("ExistsW watcher for %q should not have triggered yet", p)
		default:
		}
	}
	select {
	case <-childCh:
		t.Fatalf("ExistsW watcher of /gozk-test should not have triggered yet")
	default:
	}

	// now we let the reconnect occur and make sure it resets watches
	if cut := time.Since(cutAt); cut >= session {
		t.Fatalf("the link was cut for %v, not shorter than the session (%v): a reconnect would find it expired", cut, session)
	}
	close(latch)

	for p, ch := range testPaths {
		select {
		case ev := <-ch:
			if ev.Err != nil {
				t.Fatalf("ExistsW watcher error %+v", ev.Err)
			}
			if ev.Path != p {
				t.Fatalf("ExistsW watcher wrong path %s instead of %s", ev.Path, p)
			}
		case <-time.After(30 * time.Second): // liveness only; upstream waits 2s
			t.Fatal("ExistsW watcher timed out")
		}
	}

	select {
	case ev := <-childCh:
		if ev.Err != nil {
			t.Fatalf("Exist watcher error %+v", ev.Err)
		}
		if ev.Path != "/gozk-test" || ev.Type != EventNodeCreated {
			t.Fatalf("Exist watcher got %v on %s instead of EventNodeCreated on /gozk-test", ev.Type, ev.Path)
		}
	case <-time.After(30 * time.Second): // liveness only; upstream waits 2s
		t.Fatal("Exist watcher timed out")
	}

	// Yay! All watches fired correctly. Now we also inspect the actual set-watch request objects
	// to ensure they didn't exceed the expected packet set.
	buf := make([]byte, bufferSize)
	totalWatches := 0
	actualReqs := setWatchReqs.Load().([]*setWatchesRequest)
	if len(actualReqs) < 12 {
		// sanity check: we should have generated *at least* 12 requests to reset watches
		t.Fatalf("too few setWatchesRequest messages: %d", len(actualReqs))
	}
	for _, r := range actualReqs {
		totalWatches += len(r.ChildWatches) + len(r.DataWatches) + len(r.ExistWatches)
		n, err := encodePacket(buf, r)
		if err != nil {
			t.Fatalf("encodePacket failed: %v! request:\n%+v", err, r)
		} else if n > 1024 {
			t.Fatalf("setWatchesRequest exceeded allowed size (%d > 1024)! request:\n%+v", n, r)
		}
	}

	if totalWatches != len(testPaths)+1 {
		t.Fatalf("setWatchesRequests did not include all expected watches; expecting %d, got %d", len(testPaths)+1, totalWatches)
	}
}

// TestIntegration_ExpiringWatch is upstream's with ExistsW in place of
// ChildrenW; it cuts the link through links and sets the session ID
// atomically, where upstream writes both fields (a data race under -race).
func TestIntegration_ExpiringWatch(t *testing.T) {
	var l links
	zk, _ := connect(t, l.option())

	if err := zk.Delete("/gozk-test", -1); err != nil && err != ErrNoNode {
		t.Fatalf("Delete returned error: %+v", err)
	}

	exists, _, childCh, err := zk.ExistsW("/gozk-test")
	if err != nil {
		t.Fatalf("ExistsW returned error: %+v", err)
	} else if exists {
		t.Fatal("ExistsW found /gozk-test, deleted above")
	}

	atomic.StoreInt64(&zk.sessionID, 99999)
	l.cut(t)

	select {
	case ev := <-childCh:
		if ev.Err != ErrSessionExpired {
			t.Fatalf("Child watcher error %+v instead of expected ErrSessionExpired", ev.Err)
		}
		if ev.Path != "/gozk-test" {
			t.Fatalf("Child watcher wrong path %s instead of %s", ev.Path, "/gozk-test")
		}
	case <-time.After(30 * time.Second): // liveness only; upstream waits 2s
		t.Fatal("Child watcher timed out")
	}
}

func TestRequestFail(t *testing.T) {
	// If connecting fails to all servers in the list then pending requests
	// should be errored out so they don't hang forever.

	zk, _, err := Connect([]string{"127.0.0.1:32444"}, time.Second*15)
	if err != nil {
		t.Fatal(err)
	}
	defer zk.Close()

	ch := make(chan error)
	go func() {
		_, _, err := zk.Get("/blah")
		ch <- err
	}()
	select {
	case err := <-ch:
		if err == nil {
			t.Fatal("Expected non-nil error on failed request due to connection failure")
		}
	case <-time.After(time.Second * 2):
		t.Fatal("Get hung when connection could not be made")
	}
}

func TestIdempotentClose(t *testing.T) {
	zk, _, err := Connect([]string{"127.0.0.1:32444"}, time.Second*15)
	if err != nil {
		t.Fatal(err)
	}
	// multiple calls to Close() should not panic
	zk.Close()
	zk.Close()
}

// TestIntegration_WaitForClose is upstream's (cluster_test.go).
func TestIntegration_WaitForClose(t *testing.T) {
	zk, events := connect(t)
	timeout := time.After(30 * time.Second)
CONNECTED:
	for {
		select {
		case ev := <-events:
			if ev.State == StateConnected {
				break CONNECTED
			}
		case <-timeout:
			zk.Close()
			t.Fatal("Timeout")
		}
	}
	zk.Close()
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("Timeout")
		}
	}
}

// TestIntegration_BadSession is upstream's (cluster_test.go); it cuts the
// link through links, where upstream closes the Conn's field.
func TestIntegration_BadSession(t *testing.T) {
	var l links
	zk, _ := connect(t, l.option())

	if err := zk.Delete("/gozk-test", -1); err != nil && err != ErrNoNode {
		t.Fatalf("Delete returned error: %+v", err)
	}

	l.cut(t)
	time.Sleep(time.Millisecond * 100)

	if err := zk.Delete("/gozk-test", -1); err != nil && err != ErrNoNode {
		t.Fatalf("Delete returned error: %+v", err)
	}
}
