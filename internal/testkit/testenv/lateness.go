package testenv

import (
	"sync"
	"time"
)

// Lateness samples how late this process's timers fire while a test runs.
// On a busy machine a goroutine that sleeps wakes late. Every bound on time
// the test asserts must allow for that. Time bounds derived from Max hold
// on a busy machine and stay tight on a quiet one.
type Lateness struct {
	mu   sync.Mutex
	max  time.Duration
	stop chan struct{}
	done chan struct{}
}

// SampleLateness starts sampling, with a 5 ms timer run over and over,
// until Stop.
func SampleLateness() *Lateness {
	s := &Lateness{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		const tick = 5 * time.Millisecond
		t := time.NewTimer(tick)
		defer t.Stop()
		for {
			at := time.Now()
			t.Reset(tick)
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			late := time.Since(at) - tick
			s.mu.Lock()
			s.max = max(s.max, late)
			s.mu.Unlock()
		}
	}()
	return s
}

// Max returns the latest a timer fired so far.
func (s *Lateness) Max() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max
}

// Stop ends the sampling. It may be called more than once.
func (s *Lateness) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}
