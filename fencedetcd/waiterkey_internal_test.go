package fencedetcd

import (
	"fmt"
	"math"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWaiterKeyAsTheMutexNamesIt checks that a waiter key is named as
// etcd's concurrency.Mutex names its key (the lock name, a '/', and the
// lease ID by fmt's %x), for any lease ID the server may hand out.
func TestWaiterKeyAsTheMutexNamesIt(t *testing.T) {
	for _, id := range []int64{1, 0x694d9a1b2c3d4e5f, math.MaxInt64, -1, -0x7a6b, math.MinInt64} {
		s := &session{id: clientv3.LeaseID(id)}
		if got, want := waiterKey("fenced/k", s), fmt.Sprintf("%s/%x", "fenced/k", clientv3.LeaseID(id)); got != want {
			t.Errorf("waiterKey for lease %d = %q, want %q", id, got, want)
		}
	}
}
