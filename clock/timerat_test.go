package clock

import (
	"testing"
	"time"
)

// TestNewTimerAtIgnoresArmingPause: a clock that moves between the read
// of a deadline and the arming of its timer does not make it late. The
// renewer's loop hung on a Fake that advanced in that gap.
func TestNewTimerAtIgnoresArmingPause(t *testing.T) {
	f := NewFake(time.Unix(1000, 0))
	at := f.Now().Add(time.Second)
	f.Advance(time.Minute) // the pause, after the deadline was read
	select {
	case <-NewTimerAt(f, at).C():
	default:
		t.Fatal("a Fake timer armed past its deadline did not fire at once")
	}
	later := NewTimerAt(f, f.Now().Add(time.Second))
	f.Advance(999 * time.Millisecond)
	select {
	case <-later.C():
		t.Fatal("a Fake timer fired before its deadline")
	default:
	}
	f.Advance(time.Millisecond)
	select {
	case <-later.C():
	default:
		t.Fatal("a Fake timer did not fire at its deadline")
	}
}

// TestNewTimerAtRealIgnoresArmingPause: on the Real clock, a timer armed
// a pause after its deadline was read still fires at the deadline.
func TestNewTimerAtRealIgnoresArmingPause(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: sleeps 1.5s")
	}
	const pause = 1500 * time.Millisecond
	c := Real()
	at := c.Now().Add(pause + 100*time.Millisecond)
	time.Sleep(pause)
	tm := NewTimerAt(c, at)
	fired := <-tm.C()
	if fired.Before(at) {
		t.Fatalf("fired %v before its deadline", at.Sub(fired))
	}
	// NewTimer(at minus the reading before the pause) would fire a whole
	// pause late; a timer's own lateness on a busy machine is far less.
	if late := c.Now().Sub(at); late >= pause/2 {
		t.Fatalf("fired %v after its deadline: the pause before arming made it late", late)
	}
}

// plainClock has no deadline timers of its own.
type plainClock struct{ f *Fake }

func (p plainClock) Now() time.Time                 { return p.f.Now() }
func (p plainClock) NewTimer(d time.Duration) Timer { return p.f.NewTimer(d) }

func TestNewTimerAtFallsBack(t *testing.T) {
	p := plainClock{NewFake(time.Unix(1000, 0))}
	if _, ok := Clock(p).(deadlineClock); ok {
		t.Fatal("plainClock must not arm on deadlines, or the fallback is not tested")
	}
	tm := NewTimerAt(p, p.Now().Add(time.Second))
	p.f.Advance(time.Second)
	select {
	case <-tm.C():
	default:
		t.Fatal("the fallback timer did not fire at its deadline")
	}
}
