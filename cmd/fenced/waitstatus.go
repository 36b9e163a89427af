package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/fenced-dev/fenced"
)

// The live status line of `fenced run --wait` on a terminal: who holds the
// key, its fence, its time left, and how long we have waited, rewritten in
// place while the wait lasts and erased when it ends. It is drawn only when
// stderr is a terminal, so scripts and logs never see it.

const (
	// statusDelay keeps the line away from waits that end at once.
	statusDelay = 300 * time.Millisecond
	// statusEvery is how often the line is redrawn, and statusInspect how
	// often the holder is asked for.
	statusEvery   = 250 * time.Millisecond
	statusInspect = time.Second
)

// showWaitStatus draws the status line of a wait of up to wait for keys on
// w until the returned stop is called; stop erases the line. It does
// nothing unless w is a terminal and the run waits.
func showWaitStatus(ctx context.Context, w io.Writer, c *fenced.Client, keys []string, wait time.Duration) (stop func()) {
	f, ok := w.(*os.File)
	if !ok || wait == 0 || !isTerminal(f) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		drawWaitStatus(ctx, f, c, keys, wait)
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func drawWaitStatus(ctx context.Context, f *os.File, c *fenced.Client, keys []string, wait time.Duration) {
	start := time.Now()
	select {
	case <-ctx.Done():
		return
	case <-time.After(statusDelay):
	}
	var (
		info     fenced.LeaseInfo
		asked    time.Time // when info was read
		drawn    bool
		tick     = time.NewTicker(statusEvery)
		lastSeen time.Time
	)
	defer tick.Stop()
	for {
		if time.Since(lastSeen) >= statusInspect {
			lastSeen = time.Now()
			info = holderOf(ctx, c, keys)
			asked = time.Now()
		}
		line := waitStatusLine(keys, info, time.Since(asked), time.Since(start), wait)
		if width := terminalWidth(f); width > 1 {
			line = truncate(line, width-1) // a wrapped line cannot be rewritten in place
		}
		fmt.Fprint(f, "\r\033[K"+line)
		drawn = true
		select {
		case <-ctx.Done():
			if drawn {
				fmt.Fprint(f, "\r\033[K")
			}
			return
		case <-tick.C:
		}
	}
}

// holderOf returns the first of keys that someone holds, as the store
// describes it, or a zero LeaseInfo when none is held or the store does not
// say (the name of a semaphore is not itself a key).
func holderOf(ctx context.Context, c *fenced.Client, keys []string) fenced.LeaseInfo {
	ictx, cancel := context.WithTimeout(ctx, statusInspect)
	defer cancel()
	for _, k := range keys {
		if info, err := c.Inspect(ictx, k); err == nil && info.Held {
			return info
		}
	}
	return fenced.LeaseInfo{}
}

// waitStatusLine is the line drawn after waiting waited of wait, with info
// read since ago.
func waitStatusLine(keys []string, info fenced.LeaseInfo, since, waited, wait time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "fenced: waiting for %s", strings.Join(keys, ", "))
	if info.Held {
		if info.Key != "" && len(keys) > 1 {
			fmt.Fprintf(&b, ": %s", info.Key)
		}
		holder := info.OwnerDigest
		if holder == "" {
			holder = info.Owner
		} else if len(holder) > 12 {
			holder = holder[:12] + "…"
		}
		fmt.Fprintf(&b, " held by %s (fence %d)", holder, info.Fence)
		if info.Remaining > 0 {
			left := max(0, info.Remaining-since)
			fmt.Fprintf(&b, ", %v left", left.Round(100*time.Millisecond))
		}
	}
	fmt.Fprintf(&b, "; waited %v", waited.Round(time.Second))
	if wait > 0 {
		fmt.Fprintf(&b, " of %v", wait)
	}
	return b.String()
}

func terminalWidth(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}

// truncate cuts s to at most n runes, marking the cut.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n || n < 1 {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
