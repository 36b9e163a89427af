package leasejob

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/childproc"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// Fault is what a test does to the run in progress, whose process is victim
// and whose fence is fence. It breaks the run's lease, or stops its process
// past the TTL. It returns when the fault is over (the process continued).
type Fault func(t testing.TB, victim *testenv.Process, fence uint64)

// Stop is the Fault that SIGSTOPs the victim until another run has written
// with a newer fence, then SIGCONTs it. That needs the victim's lease to
// expire and be granted again, which takes at least the TTL.
func Stop(out string, ttl time.Duration) Fault {
	return func(t testing.TB, victim *testenv.Process, f uint64) {
		t.Helper()
		if err := victim.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer victim.Signal(syscall.SIGCONT)
		// Liveness only: the TTL, then a grant on a busy machine.
		waitFor(t, out, 2*ttl+30*time.Second, "a newer run's applied write", func(ls lines) bool {
			return ls.newerWrite(f) != nil
		})
	}
}

type line struct {
	kind    string
	pid     int
	fence   uint64
	at      time.Time // start and ended
	outcome string    // write
	live    bool      // write
	cause   string    // ended
}

type lines []line

func read(t testing.TB, out string) lines {
	t.Helper()
	var ls lines
	for _, f := range childproc.Lines(t, out) {
		if len(f) < 4 {
			t.Fatalf("bad line %q", f)
		}
		l := line{kind: f[0]}
		pid, err1 := strconv.Atoi(f[1])
		fence, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad line %q", f)
		}
		l.pid, l.fence = pid, fence
		switch {
		case l.kind == "write" && len(f) == 5:
			l.outcome, l.live = f[3], f[4] == "1"
		case (l.kind == "start" || l.kind == "ended") && len(f) >= 4:
			ns, err := strconv.ParseInt(f[3], 10, 64)
			if err != nil {
				t.Fatalf("bad line %q", f)
			}
			l.at = time.Unix(0, ns)
			if l.kind == "ended" && len(f) == 5 {
				l.cause = f[4]
			}
		default:
			t.Fatalf("bad line %q", f)
		}
		ls = append(ls, l)
	}
	return ls
}

func (ls lines) find(ok func(line) bool) *line {
	for i := range ls {
		if ok(ls[i]) {
			return &ls[i]
		}
	}
	return nil
}

// tail formats the last n lines.
func (ls lines) tail(n int) string {
	var b strings.Builder
	for _, l := range ls[max(0, len(ls)-n):] {
		switch l.kind {
		case "write":
			fmt.Fprintf(&b, "write pid %d fence %d %s live=%t\n", l.pid, l.fence, l.outcome, l.live)
		default:
			fmt.Fprintf(&b, "%s pid %d fence %d at %s %s\n", l.kind, l.pid, l.fence, l.at.Format("15:04:05.000"), l.cause)
		}
	}
	return b.String()
}

// newerWrite returns the first applied write with a fence above f.
func (ls lines) newerWrite(f uint64) *line {
	return ls.find(func(l line) bool { return l.kind == "write" && l.outcome == "applied" && l.fence > f })
}

func waitFor(t testing.TB, out string, timeout time.Duration, what string, ok func(lines) bool) lines {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ls := read(t, out)
		if ok(ls) {
			return ls
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v; %d lines, the last ones:\n%s", what, timeout, len(ls), ls.tail(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Judge waits for a run of the children procs (writing to out) to write
// under its lease, applies fault to it, and checks, with ttl the lease's
// TTL:
//   - the run's context ended, with one of wantCauses;
//   - after it ended, its late write was refused by the guard as stale;
//   - a newer run (a higher fence) wrote;
//   - the resource took its writes in fence order (never an older fence
//     after a newer one);
//   - each lease ran one run (no fence started twice), and no other run
//     started while the first held its lease, before the fault.
func Judge(t testing.TB, res *Resource, procs []*testenv.Process, out string, ttl time.Duration, fault Fault, wantCauses ...string) {
	t.Helper()
	// Liveness only: the first tick and grant on a busy machine.
	ls := waitFor(t, out, 60*time.Second, "applied write", func(ls lines) bool {
		return ls.find(func(l line) bool { return l.kind == "write" && l.outcome == "applied" }) != nil
	})
	first := ls.find(func(l line) bool { return l.kind == "write" && l.outcome == "applied" })
	var victim *testenv.Process
	for _, p := range procs {
		if p.Cmd.Process.Pid == first.pid {
			victim = p
		}
	}
	if victim == nil {
		t.Fatalf("write by pid %d, not a child", first.pid)
	}
	f := first.fence
	faultAt := time.Now()
	fault(t, victim, f)
	// Liveness only: a loss is seen within the TTL (local validity), and
	// the newer run writes after its tick; LateFor bounds the late writes.
	ls = waitFor(t, out, 2*ttl+LateFor+30*time.Second, "refused late write by the broken run", func(ls lines) bool {
		return ls.find(func(l line) bool {
			return l.kind == "write" && l.pid == first.pid && l.fence == f && !l.live && l.outcome == "stale"
		}) != nil
	})
	ended := ls.find(func(l line) bool { return l.kind == "ended" && l.pid == first.pid && l.fence == f })
	if ended == nil {
		t.Fatalf("the run with fence %d wrote as ended but logged no end", f)
	}
	if !slices.Contains(wantCauses, ended.cause) {
		t.Errorf("the run's context ended with cause %q, want one of %q", ended.cause, wantCauses)
	}
	next := ls.find(func(l line) bool { return l.kind == "start" && l.fence > f })
	if next == nil || ls.newerWrite(f) == nil {
		t.Fatalf("no newer run wrote after fence %d", f)
	}
	for _, l := range ls {
		if l.kind == "write" && l.pid == first.pid && l.fence == f && !l.live && l.outcome == "applied" {
			t.Logf("a write of fence %d after its context ended was applied before the newer holder's first write (allowed: "+
				"nothing newer yet)", f)
			break
		}
	}
	starts := map[uint64]int{}
	for _, l := range ls {
		if l.kind != "start" {
			continue
		}
		starts[l.fence]++
		if starts[l.fence] > 1 {
			t.Errorf("fence %d started %d runs", l.fence, starts[l.fence])
		}
		if l.fence != f && l.fence < f {
			t.Errorf("a run with fence %d started before the run with fence %d", l.fence, f)
		}
		if l.fence > f && l.at.Before(faultAt) {
			t.Errorf("a run with fence %d started at %v, before the fault at %v, while fence %d held the lease", l.fence, l.at, faultAt, f)
		}
	}
	h := res.History(t)
	for i := 1; i < len(h); i++ {
		if h[i] < h[i-1] {
			t.Errorf("the resource took fence %d after fence %d: history %v", h[i], h[i-1], h)
		}
	}
	t.Logf("fence %d: context ended %v after the fault (%s); the next run (fence %d) started %v after the fault; %d writes taken, "+
		"fences %v..%v",
		f, ended.at.Sub(faultAt).Round(time.Millisecond), ended.cause, next.fence, next.at.Sub(faultAt).Round(time.Millisecond), len(h),
		h[0], h[len(h)-1])
}
