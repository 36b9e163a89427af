package main

import (
	"context"
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
	cmd, _, shown := startOnTerminal(t, store, "run", "--wait", "20s", "job:busy", "--", "true")
	digest := token.Digest(l.Owner())[:12]
	line := regexp.MustCompile(`fenced: waiting for job:busy held by ` + digest + `… \(fence ` + strconv.FormatUint(l.Fence(), 10) + `\), \d+(\.\d)?s left; waited \d+s of 20s`)
	eventually(t, 10*time.Second, "no status line on the terminal", func() bool { return line.MatchString(shown()) })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second); code != 0 {
		t.Fatalf("exit %d after the key was released; terminal:\n%q", code, shown())
	}
	out := shown()
	if last := strings.LastIndex(out, "waiting for"); !strings.Contains(out[last:], "\r\x1b[K") {
		t.Fatalf("the status line was not erased: %q", out)
	}

	// Not a terminal: no status line.
	if _, err := client(t, store).TryAcquire(ctx, "job:busy", nil); err != nil {
		t.Fatal(err)
	}
	r := cli(t, store, "run", "--wait", "1500ms", "job:busy", "--", "true")
	if r.code != exitHeld || strings.Contains(r.stderr, "waiting for") || strings.Contains(r.stderr, "\x1b[K") {
		t.Fatalf("on a pipe: exit %d, stderr %q; want 75 and no status line", r.code, r.stderr)
	}
}
