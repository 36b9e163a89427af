package clock

import (
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// bootSlack is how far ahead of CLOCK_BOOTTIME a reading of Real may be.
const bootSlack = 50 * time.Microsecond

func boottime(t *testing.T) time.Duration {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// TestRealReadsBoottime checks that Real's readings are CLOCK_BOOTTIME's:
// each reading lies between two clock_gettime(CLOCK_BOOTTIME) calls made
// around it, on the same origin, or at most bootSlack ahead (the time
// suspended is read a few microseconds after the monotonic clock, on the
// side that shortens validity). (No machine here can be suspended for a
// test, and on one never suspended CLOCK_MONOTONIC reads the same; the
// suspend itself is acted out in TestTimerFiresAfterSuspend.)
func TestRealReadsBoottime(t *testing.T) {
	if !bootClock {
		t.Fatal("CLOCK_BOOTTIME could not be read: Real fell back to the monotonic clock")
	}
	c := Real()
	for range 100 {
		before := boottime(t)
		got := c.Now().Sub(start) + bootStart
		after := boottime(t)
		if got < before || got > after+bootSlack {
			t.Fatalf("Real().Now() is %v on CLOCK_BOOTTIME's scale, outside [%v, %v] read around it", got, before, after)
		}
	}
}

// TestTimerFiresAfterSuspend acts out a suspend: the boot clock jumps an
// hour ahead while Go's timers, which run on CLOCK_MONOTONIC, see nothing.
// A Real timer for half an hour then fires within MaxTimerStep, and Local
// moves readings back by the hour, so they compare with time.Now.
func TestTimerFiresAfterSuspend(t *testing.T) {
	var jump atomic.Int64
	suspended = func(now time.Time) time.Duration { return suspendedSince(now) + time.Duration(jump.Load()) }
	t.Cleanup(func() { suspended = suspendedSince })
	c := Real()
	tm := c.NewTimer(30 * time.Minute)
	before := c.Now()
	jump.Store(int64(time.Hour))
	resumed := time.Now()
	select {
	case <-tm.C():
		if late := time.Since(resumed); late > MaxTimerStep+250*time.Millisecond {
			t.Fatalf("fired %v after the resume, want within MaxTimerStep (%v)", late, MaxTimerStep)
		}
	case <-time.After(MaxTimerStep + 2*time.Second):
		t.Fatal("a half-hour timer did not fire after an hour's suspend")
	}
	if d := c.Now().Sub(before); d < time.Hour {
		t.Fatalf("Real measured %v across an hour's suspend", d)
	}
	if d := time.Until(Local(c, c.Now())); d > time.Millisecond || d < -time.Millisecond {
		t.Fatalf("Local(Real reading) is %v off time.Now after the suspend", d)
	}
	if tm.Stop() {
		t.Fatal("Stop after firing reported true")
	}
	// A timer stopped before its deadline never fires.
	tm = c.NewTimer(20 * time.Millisecond)
	if !tm.Stop() {
		t.Fatal("Stop before firing reported false")
	}
	select {
	case <-tm.C():
		t.Fatal("a stopped timer fired")
	case <-time.After(100 * time.Millisecond):
	}
}
