package wakeup

import (
	"testing"
)

func pending(s *Sub) bool {
	select {
	case <-s.C():
		return true
	default:
		return false
	}
}

func TestWakeOnlyThatKey(t *testing.T) {
	var r Registry
	a1, a2, b := r.Subscribe("a"), r.Subscribe("a"), r.Subscribe("b")
	r.Wake("a")
	r.Wake("a") // a second wake-up while one is pending is absorbed
	if !pending(a1) || !pending(a2) {
		t.Fatal("a waiter of the woken key was not woken")
	}
	if pending(a1) || pending(b) {
		t.Fatal("a wake-up was delivered twice, or to another key's waiter")
	}
}

func TestWakeOneOldestFirst(t *testing.T) {
	var r Registry
	a1, a2 := r.Subscribe("a"), r.Subscribe("a")
	if !r.WakeOne("a") || !pending(a1) || pending(a2) {
		t.Fatal("WakeOne did not wake exactly the oldest waiter")
	}
	r.WakeOne("a")
	r.WakeOne("a") // a1 has none pending again, so it gets this one
	if !pending(a1) || !pending(a2) {
		t.Fatal("WakeOne skipped a waiter with no wake-up pending")
	}
}

func TestCloseHandsOnUnconsumedWake(t *testing.T) {
	var idle []string
	r := Registry{Idle: func(k string) { idle = append(idle, k) }, PassOn: true}
	a1, a2 := r.Subscribe("a"), r.Subscribe("a")
	r.WakeOne("a") // to a1, which leaves without looking
	a1.Close()
	a1.Close() // idempotent
	if !pending(a2) {
		t.Fatal("a wake-up left unconsumed by a closed waiter was lost")
	}
	if len(idle) != 0 || !r.Waiting("a") {
		t.Fatalf("idle = %v with a waiter left", idle)
	}
	a2.Close()
	if len(idle) != 1 || idle[0] != "a" || r.Waiting("a") || r.Len() != 0 {
		t.Fatalf("after the last waiter left: idle = %v, waiting %v, len %d", idle, r.Waiting("a"), r.Len())
	}
}

func TestWakeEvery(t *testing.T) {
	var r Registry
	a, b := r.Subscribe("a"), r.Subscribe("b")
	if got := len(r.Keys()); got != 2 {
		t.Fatalf("Keys has %d keys, want 2", got)
	}
	r.WakeEvery()
	if !pending(a) || !pending(b) {
		t.Fatal("WakeEvery missed a waiter")
	}
}

func TestCloseWithoutPassOnKeepsOthersAsTheyAre(t *testing.T) {
	var r Registry
	a1, a2 := r.Subscribe("a"), r.Subscribe("a")
	r.WakeOne("a") // to a1, which leaves without looking
	a1.Close()
	if pending(a2) {
		t.Fatal("a registry without PassOn handed on a wake-up")
	}
}

func TestForwardHandsAConsumedWakeUpOn(t *testing.T) {
	r := Registry{PassOn: true}
	a1, a2 := r.Subscribe("a"), r.Subscribe("a")
	r.WakeOne("a")
	if !pending(a1) {
		t.Fatal("WakeOne did not wake the oldest waiter")
	}
	// a1 consumed its wake-up and gives up without acting on it.
	a1.Forward()
	a1.Close()
	if !pending(a2) {
		t.Fatal("a consumed wake-up forwarded by a waiter that gave up did not reach the next waiter")
	}
	if pending(a1) {
		t.Fatal("Forward woke the forwarding waiter itself")
	}
}

func TestForwardWithoutPassOnWakesNobody(t *testing.T) {
	var r Registry
	a1, a2 := r.Subscribe("a"), r.Subscribe("a")
	a1.Forward()
	if pending(a1) || pending(a2) {
		t.Fatal("Forward woke a waiter of a registry that wakes every waiter anyway")
	}
}

func TestObserverNeverTakesAWaitersWakeUp(t *testing.T) {
	r := Registry{PassOn: true}
	o := r.Observe("a") // oldest, as an observer started first would be
	w := r.Subscribe("a")
	if r.Waiting("b") || !r.Observed("a") {
		t.Fatal("Observed or Waiting wrong")
	}
	if !r.WakeOne("a") || !pending(w) || !pending(o) {
		t.Fatal("WakeOne did not wake the waiter and the observer")
	}
	r.WakeOne("a")
	o.Forward() // an observer's wake-up was never a waiter's
	o.Close()   // nor is one left unconsumed
	if !pending(w) {
		t.Fatal("the waiter's wake-up was lost")
	}
	if pending(w) {
		t.Fatal("an observer handed a wake-up on to the waiter")
	}
	w.Close()
	if r.Len() != 0 {
		t.Fatalf("Len = %d after every subscriber left", r.Len())
	}
	o2 := r.Observe("b")
	if r.Waiting("b") || r.Len() != 1 {
		t.Fatal("an observer counts as a waiter")
	}
	r.WakeObservers("b")
	if !pending(o2) {
		t.Fatal("WakeObservers did not wake the observer")
	}
}
