// Package crashtest holds fault-injection tests shared by the backends that
// keep leases in a durable server: a holder process killed with SIGKILL is
// replaced after its TTL with a higher fence, and a server killed and
// restarted keeps every fence counter and every live grant.
//
// The holder is the test binary itself, run again as a child process: the
// backend's TestMain calls MaybeRunHolder first, which does the holder's
// work and exits when the child's environment asks for it.
package crashtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fence"
	"github.com/fenced-dev/fenced/internal/core/capability"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

const (
	envURL   = "FENCED_CRASHTEST_URL"
	envKey   = "FENCED_CRASHTEST_KEY"
	envTTL   = "FENCED_CRASHTEST_TTL"
	envGuard = "FENCED_CRASHTEST_GUARD"
)

// MaybeRunHolder runs the holder and exits the process if this process was
// started by HolderCommand; otherwise it returns at once. Call it first in
// TestMain.
//
// The holder takes the lease, prints "FENCE <n>", keeps renewing it, and
// when the lease ends prints "ENDED <lost|expired|other> <cause>".
//
// Started by GuardedHolderCommand, it also writes to a fenced HTTP resource
// with its lease's token in a loop, whatever its lease says. It acts as a
// worker paused between its check and its write would. It prints "WRITE <i>
// applied" for each accepted write, until a write is refused as stale
// ("REFUSED <i> <error>"). Once the lease has ended, it waits for that
// refusal (10s at most) before printing ENDED and exiting.
func MaybeRunHolder() {
	url := os.Getenv(envURL)
	if url == "" {
		return
	}
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		fmt.Println("HOLDER ERROR bad TTL:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := fenced.Open(ctx, url, nil)
	if err != nil {
		fmt.Println("HOLDER ERROR", err)
		os.Exit(2)
	}
	l, err := c.TryAcquire(ctx, os.Getenv(envKey), &fenced.LeaseOptions{TTL: ttl})
	if err != nil {
		fmt.Println("HOLDER ERROR", err)
		os.Exit(2)
	}
	// The lease renews itself until the process is killed or paused.
	fmt.Printf("FENCE %d\n", l.Fence())
	refused := make(chan struct{})
	if guard := os.Getenv(envGuard); guard != "" {
		go writeGuarded(guard, l, refused)
	} else {
		close(refused)
	}
	<-l.Context().Done()
	select {
	case <-refused:
	case <-time.After(10 * time.Second):
	}
	cause := "other"
	switch {
	case errors.Is(l.Err(), fenced.ErrLost):
		cause = "lost"
	case errors.Is(l.Err(), fenced.ErrExpired):
		cause = "expired"
	}
	fmt.Println("ENDED", cause, strings.ReplaceAll(l.Err().Error(), "\n", " "))
	os.Exit(3)
}

// HolderCommand returns the command that re-executes the test binary as a
// holder of key on url with ttl (see MaybeRunHolder).
func HolderCommand(url, key string, ttl time.Duration) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envURL+"="+url, envKey+"="+key, envTTL+"="+ttl.String())
	return cmd
}

// GuardedHolderCommand is HolderCommand for a holder that also writes to
// the fenced HTTP resource at guardURL (served with fence.Middleware) in a
// loop; see MaybeRunHolder.
func GuardedHolderCommand(url, key string, ttl time.Duration, guardURL string) *exec.Cmd {
	cmd := HolderCommand(url, key, ttl)
	cmd.Env = append(cmd.Env, envGuard+"="+guardURL)
	return cmd
}

// writeGuarded posts to guardURL with l's token every 10ms until a write
// is refused as stale, then closes refused.
func writeGuarded(guardURL string, l *fenced.Lease, refused chan<- struct{}) {
	defer close(refused)
	client := &http.Client{Transport: &fence.Transport{}, Timeout: 10 * time.Second}
	ctx := fence.WithLease(context.Background(), l)
	for i := 0; ; i++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, guardURL, nil)
		if err != nil {
			fmt.Println("WRITE", i, "error", err)
			return
		}
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println("WRITE", i, "error", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err := fence.ResponseError(resp); err != nil {
			if errors.Is(err, fence.ErrStale) {
				fmt.Println("REFUSED", i, err)
				return
			}
			fmt.Println("WRITE", i, "error", err)
		} else {
			resp.Body.Close()
			fmt.Println("WRITE", i, "applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// KilledHolderIsReplaced starts a child process that takes a lease on a
// fresh key with a short TTL and keeps renewing it. It checks that the key
// is held and kills the child with SIGKILL (no release, no goodbye). Then
// it checks that a waiter in this process gets the key, with a higher
// fence, once the TTL has run out. The waiter's fallback poll is set to a
// minute. So it must be woken by the remaining time the authority reports,
// not by polling.
func KilledHolderIsReplaced(t *testing.T, url string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := fmt.Sprintf("crashtest:killed:%d", time.Now().UnixNano())
	const ttl = 3 * time.Second
	holder := testenv.Start(t, "holder", HolderCommand(url, key, ttl))
	holder.WaitLog(t, "FENCE ", time.Minute)
	var holderFence uint64
	for _, line := range testenv.Lines(holder.Log.String()) {
		if f, ok := strings.CutPrefix(line, "FENCE "); ok {
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				t.Fatalf("holder printed %q", line)
			}
			holderFence = n
		}
	}
	c, err := fenced.Open(ctx, url, &fenced.Options{FallbackPoll: time.Minute, MinBackoff: time.Minute, MaxBackoff: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Outlive several renewals: the holder keeps the key.
	time.Sleep(2 * ttl)
	if _, err := c.TryAcquire(ctx, key, &fenced.LeaseOptions{TTL: ttl}); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("while the holder renews: TryAcquire = %v, want ErrHeld", err)
	}
	info, err := c.Inspect(ctx, key)
	if err != nil || !info.Held || info.Fence != holderFence {
		t.Fatalf("Inspect while held = %+v, %v; want held with the holder's fence %d", info, err, holderFence)
	}
	holder.Kill()
	killed := time.Now()
	l, err := c.Acquire(ctx, key, &fenced.LeaseOptions{TTL: ttl, MaxWait: 30 * time.Second})
	if err != nil {
		t.Fatalf("waiter after the holder was killed: %v", err)
	}
	defer l.Release(ctx)
	if l.Fence() <= holderFence {
		t.Fatalf("replacement fence %d, want > the killed holder's %d", l.Fence(), holderFence)
	}
	t.Logf("holder (fence %d) killed; replaced %v later with fence %d", holderFence, time.Since(killed).Round(time.Millisecond), l.Fence())
}

// Server is what RestartKeepsFences needs of a test server.
type Server interface {
	// Restart kills the server with SIGKILL and starts it again on the
	// same data.
	Restart(t testing.TB)
}

// RestartKeepsFences takes keys through grant, release, expiry and break.
// It leaves one key held with a long TTL, kills the server with SIGKILL and
// restarts it. Then it checks with a newly opened driver that every key's
// counter survived: the next grant is higher than every fence before the
// crash. It also checks that the live grant is still held by its owner.
func RestartKeepsFences(t *testing.T, srv Server, open func(t *testing.T) driver.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := open(t)
	prefix := fmt.Sprintf("crashtest:restart:%d:", time.Now().UnixNano())
	last := map[string]uint64{}
	acquire := func(d driver.Driver, key, owner string, ttl time.Duration) uint64 {
		t.Helper()
		f, err := d.TryAcquire(ctx, key, owner, ttl)
		if err != nil {
			t.Fatalf("acquire %s: %v", key, err)
		}
		return f
	}
	// Several grants per key, so the counters are well above 1.
	for i := 0; i < 3; i++ {
		for _, k := range []string{"released", "expired", "broken", "held"} {
			o := fmt.Sprintf("owner-%s-%d", k, i)
			f := acquire(d, prefix+k, o, time.Minute)
			last[k] = f
			if err := d.Release(ctx, driver.Grant{Key: prefix + k, Owner: o, Fence: f}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const expiring = 200 * time.Millisecond
	last["expired"] = acquire(d, prefix+"expired", "owner-expiring", expiring)
	expired := time.Now().Add(expiring)
	last["broken"] = acquire(d, prefix+"broken", "owner-broken", time.Minute)
	if _, err := d.Break(ctx, prefix+"broken", "crashtest", "crashtest"); err != nil {
		t.Fatal(err)
	}
	held := driver.Grant{Key: prefix + "held", Owner: "owner-held-live", TTL: 2 * time.Minute}
	held.Fence = acquire(d, held.Key, held.Owner, held.TTL)
	last["held"] = held.Fence
	d.Close()

	srv.Restart(t)

	d2 := open(t)
	defer d2.Close()
	if _, err := d2.TryAcquire(ctx, held.Key, "someone-else", time.Minute); !errors.Is(err, fenced.ErrHeld) {
		t.Fatalf("after restart, acquiring the live grant's key: %v, want ErrHeld", err)
	}
	if err := d2.Renew(ctx, held); err != nil {
		t.Fatalf("after restart, the live grant's owner cannot renew: %v", err)
	}
	if err := d2.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	// A fast restart can come back before the expiring grant ran out.
	time.Sleep(time.Until(expired) + 50*time.Millisecond)
	for k, before := range last {
		f := acquire(d2, prefix+k, "owner-after-restart", time.Minute)
		if f <= before {
			t.Errorf("key %s: fence %d after restart, want > %d from before the crash", k, f, before)
		}
	}
	if bl := capability.Of(d2).BreakLogger; bl != nil {
		recs, err := bl.Breaks(ctx, prefix+"broken")
		if err != nil || len(recs) != 1 || recs[0].Fence != last["broken"] {
			t.Errorf("audit of the break after restart = %+v, %v", recs, err)
		}
	}
}

// Stoppable is a test server that can be killed and started again.
type Stoppable interface {
	Kill()
	StartAgain(t testing.TB)
}

// ServerDownThenBack kills the server under a live driver. It checks that
// every operation then fails with an error the portable client can act on.
// That is ErrUnavailable (nothing applied) or ErrUnknownOutcome (maybe
// applied); never a refusal, never success. It checks that the same driver
// works again once the server is back, and that the fence counter carried
// on.
func ServerDownThenBack(t *testing.T, srv Stoppable, d driver.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := fmt.Sprintf("crashtest:down:%d", time.Now().UnixNano())
	g := driver.Grant{Key: key, Owner: "owner-before", TTL: time.Minute}
	var err error
	if g.Fence, err = d.TryAcquire(ctx, key, g.Owner, g.TTL); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	actionable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, fenced.ErrUnavailable) && !errors.Is(err, fenced.ErrUnknownOutcome) {
			t.Errorf("%s while the server is down: %v; want ErrUnavailable or ErrUnknownOutcome", what, err)
		}
	}
	for i := range 2 { // the second round finds the pool's connections dead
		_, err := d.TryAcquire(ctx, key+"-other", "owner-down", time.Minute)
		actionable(fmt.Sprintf("TryAcquire #%d", i+1), err)
		actionable(fmt.Sprintf("Renew #%d", i+1), d.Renew(ctx, g))
	}
	srv.StartAgain(t)
	deadline := time.Now().Add(time.Minute)
	for {
		err = d.Renew(ctx, g)
		if err == nil {
			break
		}
		actionable("Renew while reconnecting", err)
		if time.Now().After(deadline) {
			t.Fatalf("the driver did not recover after the server came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := d.Release(ctx, g); err != nil {
		t.Fatalf("release after the server came back: %v", err)
	}
	f, err := d.TryAcquire(ctx, key, "owner-after", time.Minute)
	if err != nil || f <= g.Fence {
		t.Fatalf("acquire after the server came back: fence %d, %v; want > %d", f, err, g.Fence)
	}
}
