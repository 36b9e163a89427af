// Package clock abstracts the local clock fenced measures validity with, so
// tests can drive lease expiry without sleeping.
//
// Real returns the process's clock. Durations between its readings are
// immune to wall-clock jumps and, on Linux, include the time the machine
// spent suspended: they are read on CLOCK_BOOTTIME. Package time's
// monotonic clock (CLOCK_MONOTONIC on Linux, which Go's timers also run
// on) stops while a VM or laptop is suspended, so a lease measured on it
// would still look valid after a resume although wall time passed and the
// authority expired it. Elsewhere Real is package time's monotonic clock;
// Go's monotonic clock does not count suspended time on most systems
// (golang/go#24595), so there a suspend overstates a lease's validity by
// the time suspended, and only the fence protects the resource.
//
// Fake is a manual clock for tests; it only moves when Advance is called.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock is the subset of the time package fenced uses.
type Clock interface {
	// Now returns the current time. Only durations between readings of
	// the same clock mean anything; for Real they carry a monotonic
	// reading.
	Now() time.Time
	// NewTimer returns a timer that fires once after d, measured on the
	// clock.
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer, like *time.Timer.
type Timer interface {
	// C delivers the time the timer fired.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// Real returns the clock fenced uses by default. Its Now is the time the
// process started plus the time elapsed since on the boot clock (Linux:
// CLOCK_BOOTTIME, suspended time included; elsewhere package time's
// monotonic clock). A reading carries the monotonic reading of that
// start moved by the same amount, so until the machine is first suspended
// it agrees with time.Now. After a suspend it is ahead of time.Now by the
// time suspended. Use Local to compare a reading with time.Now.
//
// Its timers fire after d has passed on the same clock. On Linux a timer
// wakes at least every MaxTimerStep of Go's (suspend-blind) timer time to
// look at the boot clock. So after a resume it fires within MaxTimerStep
// instead of after the whole of d again.
func Real() Clock { return realClock{} }

// MaxTimerStep is the longest a Real timer sleeps on Go's runtime timer
// before it looks at the boot clock again (Linux only). It is how late
// it may fire after the machine resumes from a suspend.
const MaxTimerStep = 500 * time.Millisecond

// start is when the process started, on both clocks.
var start = time.Now()

// suspended returns the time the machine has spent suspended since the
// process started, as of now (a reading of time.Now); tests replace it to
// act out a suspend.
var suspended = suspendedSince

// elapsed returns the time since the process started on the boot clock.
func elapsed() time.Duration {
	now := time.Now()
	return now.Sub(start) + suspended(now)
}

type realClock struct{}

func (realClock) Now() time.Time { return start.Add(elapsed()) }

// Local converts t, a reading of c, into a time comparable with time.Now.
// For Real, it is t moved back by the time the machine has spent suspended
// since the process started (zero except on Linux). Other clocks' readings
// are returned as they are. Converting one reading again gives the same
// time until the machine is next suspended (to within microseconds when
// the time suspended is read again, at least once a second). This holds
// however long the caller is descheduled while it converts.
func Local(c Clock, t time.Time) time.Time {
	if _, ok := c.(realClock); ok {
		return t.Add(-suspended(time.Now()))
	}
	return t
}

func (realClock) NewTimer(d time.Duration) Timer {
	if !bootClock {
		return stdTimer{time.NewTimer(d)}
	}
	t := &bootTimer{c: make(chan time.Time, 1), deadline: elapsed() + d}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.t = time.AfterFunc(min(d, MaxTimerStep), t.fire)
	return t
}

type stdTimer struct{ t *time.Timer }

func (t stdTimer) C() <-chan time.Time { return t.t.C }
func (t stdTimer) Stop() bool          { return t.t.Stop() }

// bootTimer fires once the boot clock reaches deadline, looking at it at
// least every MaxTimerStep.
type bootTimer struct {
	c        chan time.Time
	deadline time.Duration // on elapsed's scale

	mu   sync.Mutex
	t    *time.Timer
	done bool // fired or stopped
}

func (t *bootTimer) fire() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	now := elapsed()
	if left := t.deadline - now; left > 0 {
		t.t.Reset(min(left, MaxTimerStep))
		return
	}
	t.done = true
	t.c <- start.Add(now)
}

func (t *bootTimer) C() <-chan time.Time { return t.c }

func (t *bootTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	t.t.Stop()
	return true
}

// Fake is a manual clock. Its zero value is not usable; call NewFake.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

// NewFake returns a Fake clock reading start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the clock has been advanced by d.
// A timer with d <= 0 fires at once.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.arm(f.now.Add(d))
}

// arm returns a timer firing when the clock reaches at. f.mu is held.
func (f *Fake) arm(at time.Time) Timer {
	t := &fakeTimer{f: f, at: at, c: make(chan time.Time, 1)}
	if !at.After(f.now) {
		t.c <- f.now
		t.fired = true
		return t
	}
	f.timers = append(f.timers, t)
	return t
}

// Advance moves the clock forward by d and fires every timer that is due,
// in deadline order. Negative d is ignored.
func (f *Fake) Advance(d time.Duration) {
	if d < 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].at.Before(f.timers[j].at) })
	kept := f.timers[:0]
	for _, t := range f.timers {
		if !t.at.After(f.now) {
			t.fired = true
			t.c <- f.now
			continue
		}
		kept = append(kept, t)
	}
	f.timers = kept
}

// Timers returns how many timers are waiting to fire. Tests use it to know
// that a goroutine has reached its wait before advancing the clock.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

type fakeTimer struct {
	f     *Fake
	at    time.Time
	c     chan time.Time
	fired bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	if t.fired {
		return false
	}
	for i, o := range t.f.timers {
		if o == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			break
		}
	}
	t.fired = true
	return true
}
