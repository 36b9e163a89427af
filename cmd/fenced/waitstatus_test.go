package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/core/token"
)

// On a terminal, fenced run --wait shows who holds the key, its fence, its
// time left and how long it has waited, and erases the line when the wait
// ends; on a pipe it says nothing of the sort.
func TestRunWaitStatusLine(t *testing.T) {
	store := tempStore(t)
	ctx := context.Background()
	l, err := client(t, store).TryAcquire(ctx, "job:busy", &fenced.LeaseOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	// Not a terminal: no status line. What this run takes beyond its
	// --wait is what a fenced process costs this machine now (start, open,
	// exit): the bounds below are made of it.
	began := time.Now()
	r := cli(t, store, "run", "--wait", "1500ms", "job:busy", "--", "true")
	if r.code != exitHeld || strings.Contains(r.stderr, "waiting for") || strings.Contains(r.stderr, "\x1b[K") {
		t.Fatalf("on a pipe: exit %d, stderr %q; want 75 and no status line", r.code, r.stderr)
	}
	cost := max(time.Since(began)-1500*time.Millisecond, 0)

	cmd, _, shown := startOnTerminal(t, store, "run", "--wait", "20s", "job:busy", "--", "true")
	digest := token.Digest(l.Owner())[:12]
	line := regexp.MustCompile(`fenced: waiting for job:busy held by ` + digest + `… \(fence ` + strconv.FormatUint(l.Fence(), 10) + `\), \d+(\.\d)?s left; waited \d+s of 20s`)
	// The line comes statusDelay after fenced starts to wait, with what an
	// Inspect read (one that timed out is asked again statusInspect
	// later): bound = 4 × (cost + statusDelay + 2 × statusInspect), at
	// least 10 s.
	bound := max(4*(cost+statusDelay+2*statusInspect), 10*time.Second)
	eventually(t, bound, fmt.Sprintf("no status line on the terminal (bound %v: a fenced process cost %v)", bound, cost),
		func() bool { return line.MatchString(shown()) })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 0 {
		t.Fatalf("exit %d after the key was released; terminal:\n%q", code, shown())
	}
	// fenced wrote the erase before it exited, but this process reads the
	// terminal in a goroutine of its own, which a busy machine may run
	// after waitExit returned: the erase is looked for until the reader
	// has had the bound (as above) to catch up.
	erased := func() bool {
		out := shown()
		return strings.Contains(out[strings.LastIndex(out, "waiting for"):], "\r\x1b[K")
	}
	for deadline := time.Now().Add(bound); !erased() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if !erased() {
		t.Fatalf("the status line was not erased (looked for %v after fenced exited): %q", bound, shown())
	}
}
