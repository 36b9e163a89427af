// Package faulttest holds fault-injection tests shared by the consensus
// backends' test packages: a holder paused with SIGSTOP past its session,
// and a cluster losing a member while a lease is held and waiters wait.
// The holder process is crashtest's: call crashtest.MaybeRunHolder first in
// TestMain.
package faulttest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/testkit/crashtest"
)

// PausedHolderLosesLease re-executes the test binary as a child that holds
// key on url with ttl. It stops the child with SIGSTOP for well past its
// session. It checks that another client gets the key with a higher fence
// meanwhile. And it checks that the child, once continued, finds its lease
// ended (context cancelled with ErrLost or ErrExpired).
func PausedHolderLosesLease(t *testing.T, url, key string, ttl time.Duration) {
	cmd := crashtest.HolderCommand(url, key, ttl)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(timeout time.Duration) string {
		select {
		case l := <-lines:
			return l
		case <-time.After(timeout):
			t.Fatalf("child said nothing within %v", timeout)
		}
		return ""
	}
	first := next(60 * time.Second)
	f, ok := strings.CutPrefix(first, "FENCE ")
	if !ok {
		t.Fatalf("child: %s", first)
	}
	childFence, _ := strconv.ParseUint(f, 10, 64)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := fenced.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: ttl}); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("TryAcquire while the child holds: %v, want ErrHeld", err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MaxWait: 30 * time.Second})
	if err != nil {
		t.Fatalf("acquire while the holder is paused: %v", err)
	}
	defer l.Release(context.Background())
	t.Logf("new holder got the key %v after the pause began", time.Since(paused).Round(time.Millisecond))
	if l.Fence() <= childFence {
		t.Fatalf("new holder's fence %d not above the paused holder's %d", l.Fence(), childFence)
	}
	// Stay paused a little longer, then let the child run again.
	time.Sleep(ttl / 2)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	ended := next(30 * time.Second)
	if !strings.HasPrefix(ended, "ENDED lost") && !strings.HasPrefix(ended, "ENDED expired") {
		t.Fatalf("paused holder after SIGCONT: %q, want its lease ended with ErrLost or ErrExpired", ended)
	}
	t.Logf("paused holder: %s", ended)
	if info, err := c.Inspect(ctx, key); err != nil || !info.Held || info.Fence != l.Fence() {
		t.Fatalf("after the paused holder resumed: %+v, %v; want the new holder with fence %d", info, err, l.Fence())
	}
}

// Disrupt is called while a lease is held and waiters wait; it injects the
// fault (kill a leader, kill a node).
type Disrupt func(t *testing.T)

// NoTwoHolders has one client hold key and waiters clients queue for it,
// injects a fault, and then lets every client take the key in turn. No two
// holders may overlap and fences must strictly increase.
func NoTwoHolders(t *testing.T, url, key string, waiters int, ttl time.Duration, fault Disrupt) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	open := func() *fenced.Client {
		c, err := fenced.Open(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var inside atomic.Int32
	var mu sync.Mutex
	var fences []uint64
	hold := func(l *fenced.Lease, d time.Duration) error {
		if n := inside.Add(1); n != 1 {
			return fmt.Errorf("%d holders at once", n)
		}
		mu.Lock()
		fences = append(fences, l.Fence())
		mu.Unlock()
		time.Sleep(d)
		inside.Add(-1)
		return l.Release(ctx)
	}
	first, err := open().TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, waiters)
	for i := 0; i < waiters; i++ {
		c := open()
		go func() {
			l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MaxWait: 60 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			errs <- hold(l, 50*time.Millisecond)
		}()
	}
	time.Sleep(500 * time.Millisecond) // let the waiters queue
	inside.Add(1)
	mu.Lock()
	fences = append(fences, first.Fence())
	mu.Unlock()
	fault(t)
	// The fault lasted less than the TTL: the holder's lease must survive
	// it (renewals ride out a failover) and release cleanly.
	if err := first.Err(); err != nil {
		t.Errorf("the holder's lease ended during a fault shorter than its TTL: %v", err)
	}
	inside.Add(-1)
	if err := first.Release(ctx); err != nil {
		t.Errorf("the holder's release after the fault: %v", err)
	}
	for i := 0; i < waiters; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences %v do not strictly increase", fences)
		}
	}
	t.Logf("fences in grant order: %v", fences)
}
