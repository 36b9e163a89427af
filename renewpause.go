package fenced

import (
	"sync"
)

// pause waits for the renewals in flight to end, and starts no other
// until resume is called (see rootaccess.PauseRenewals). Leases are not
// renewed meanwhile; they end when their validity runs out. resume may be
// called more than once; the first call counts. Close does not wait for it.
func (r *renewer) pause() (resume func()) {
	r.gate.mu.Lock()
	if r.gate.cond == nil {
		r.gate.cond = sync.NewCond(&r.gate.mu)
	}
	r.gate.paused++
	for r.gate.inFlight > 0 {
		r.gate.cond.Wait()
	}
	r.gate.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.gate.mu.Lock()
			r.gate.paused--
			r.gate.cond.Broadcast()
			r.gate.mu.Unlock()
		})
	}
}

// renewGate holds renewals back while the client's renewals are paused
// (PauseRenewals), and counts those in flight.
type renewGate struct {
	mu       sync.Mutex
	cond     *sync.Cond // made on first use, with mu
	paused   int        // PauseRenewals calls not yet resumed
	inFlight int        // renewal batches past the gate
}

// enter waits while renewals are paused, unless the renewer has stopped
// (done is closed), then counts a batch in flight. It reports false when
// the renewer stopped: the batch must not be sent.
func (g *renewGate) enter(done <-chan struct{}) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.paused > 0 {
		select {
		case <-done:
			return false
		default:
		}
		g.cond.Wait()
	}
	g.inFlight++
	return true
}

// leave counts a batch out, and wakes a PauseRenewals waiting for it.
func (g *renewGate) leave() {
	g.mu.Lock()
	g.inFlight--
	if g.inFlight == 0 && g.cond != nil {
		g.cond.Broadcast()
	}
	g.mu.Unlock()
}

// wake wakes the batches waiting at the gate, so that they see the
// renewer stop.
func (g *renewGate) wake() {
	g.mu.Lock()
	if g.cond != nil {
		g.cond.Broadcast()
	}
	g.mu.Unlock()
}
