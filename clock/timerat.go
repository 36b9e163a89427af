package clock

import "time"

// NewTimerAt returns a timer of c that fires once c reads at or later.
// A deadline already passed fires at once.
//
// Unlike c.NewTimer(at.Sub(c.Now())), it is not made late by a pause
// between reading the clock and arming the timer: Real and Fake arm it
// on the deadline itself. Other clocks get that fallback.
func NewTimerAt(c Clock, at time.Time) Timer {
	if d, ok := c.(deadlineClock); ok {
		return d.newTimerAt(at)
	}
	return c.NewTimer(at.Sub(c.Now()))
}

// deadlineClock is a clock that arms a timer on its deadline.
type deadlineClock interface {
	newTimerAt(at time.Time) Timer
}

func (realClock) newTimerAt(at time.Time) Timer {
	if !bootClock {
		return stdTimer{time.NewTimer(time.Until(at))}
	}
	t := &bootTimer{c: make(chan time.Time, 1), deadline: at.Sub(start)}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.t = time.AfterFunc(min(max(t.deadline-elapsed(), 0), MaxTimerStep), t.fire)
	return t
}

func (f *Fake) newTimerAt(at time.Time) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.arm(at)
}
