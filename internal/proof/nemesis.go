package proof

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"
)

// nemesis injects the run's fault Injections times, each once the workload
// has made progress (two accepted writes) since the previous one, and then
// lets the workload run on for two TTLs.
func (r *run) nemesis(ctx context.Context) error {
	ttl := r.cfg.TTL
	progress := func(from int) (int, error) {
		n := 0
		_, i, err := r.waitEvent(ctx, from, 20*ttl+20*time.Second, func(e Event) bool {
			if e.Kind == WriteOK {
				n++
			}
			return n >= 2
		})
		return i, err
	}
	from := 0
	for k := 0; k < r.cfg.Injections; k++ {
		if _, err := progress(from); err != nil {
			return fmt.Errorf("proof: no progress before injection %d of %s: %w", k+1, r.cfg.Fault, err)
		}
		r.cfg.Logf("inject %s (%s) #%d", r.cfg.Fault.Name(), r.cfg.Fault, k+1)
		if err := r.inject(ctx); err != nil {
			return fmt.Errorf("proof: injection %d of %s: %w", k+1, r.cfg.Fault, err)
		}
		from = r.eventCount()
	}
	_, err := progress(from)
	if err != nil {
		return fmt.Errorf("proof: no progress after the last injection of %s: %w", r.cfg.Fault, err)
	}
	select {
	case <-time.After(2 * ttl):
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (r *run) inject(ctx context.Context) error {
	ttl := r.cfg.TTL
	long := 20*ttl + 20*time.Second
	from := r.eventCount()
	switch f := r.cfg.Fault; f {
	case None:
		return nil
	case PauseHolder, ReorderWrites:
		if err := r.arm("before-write", -1, string(f)+" stop"); err != nil {
			return err
		}
		a, at, err := r.waitEvent(ctx, from, long, func(e Event) bool { return e.Kind == FaultStart && e.Fault == string(f) })
		if err != nil {
			r.disarm("before-write", -1)
			return err
		}
		cmd, _ := r.worker(a.Worker)
		for !isStopped(cmd.Process.Pid) {
			time.Sleep(time.Millisecond)
		}
		grant, _ := r.lastGrant(a.Worker, at)
		continued := false
		cont := func() {
			if !continued {
				continued = true
				cmd.Process.Signal(syscall.SIGCONT)
				r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(f)})
			}
		}
		defer cont()
		if f == PauseHolder {
			// Continue A once another worker has been granted the key and
			// has written.
			// If none does within 8 TTLs (A may have stopped holding the
			// SQLite authority's write lock in a renewal, which stalls the
			// others), continue A anyway: the run then has no stale write.
			_, _, err := r.waitEvent(ctx, at, 8*ttl, func(e Event) bool {
				return e.Kind == WriteOK && e.Key == grant.Key && e.Worker != a.Worker
			})
			if err != nil && ctx.Err() == nil {
				r.cfg.Logf("M1: no other worker wrote while worker %d was stopped: %v", a.Worker, err)
				return nil
			}
			return err
		}
		// M13: hold the new holder B between its read and its write, then
		// let A's stale write land first.
		b, bat, err := r.waitEvent(ctx, at, long, func(e Event) bool {
			return e.Kind == AcquireOK && e.Key == grant.Key && e.Worker != a.Worker
		})
		if err != nil {
			return err
		}
		if err := r.arm("before-write", b.Worker, "M13 hold"); err != nil {
			return err
		}
		if _, _, err := r.waitEvent(ctx, bat, long, func(e Event) bool {
			return (e.Kind == Held && e.Worker == b.Worker) || (e.Worker == b.Worker && (e.Kind == ReleaseInvoke || e.Kind == Abandon))
		}); err != nil {
			r.disarm("before-write", b.Worker)
			return err
		}
		r.disarm("before-write", b.Worker)
		cont()
		_, _, err = r.waitEvent(ctx, at, long, func(e Event) bool {
			return e.Worker == a.Worker && (e.Kind == WriteOK || e.Kind == WriteRefused || e.Kind == WriteFail)
		})
		removeHolding(r.cfg.Dir, b.Worker)
		return err
	case DelayWrite:
		if err := r.arm("before-write", -1, fmt.Sprintf("M2 delay %s", 3*ttl)); err != nil {
			return err
		}
		_, _, err := r.waitEvent(ctx, from, long+3*ttl, func(e Event) bool { return e.Kind == FaultEnd && e.Fault == string(DelayWrite) })
		return err
	case KillHolder:
		if err := r.arm("before-write", -1, "M3 kill"); err != nil {
			return err
		}
		a, _, err := r.waitEvent(ctx, from, long, func(e Event) bool { return e.Kind == FaultStart && e.Fault == string(KillHolder) })
		if err != nil {
			r.disarm("before-write", -1)
			return err
		}
		_, exited := r.worker(a.Worker)
		<-exited
		r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(KillHolder)})
		return r.startWorker(a.Worker)
	case CutHolder:
		a, _, err := r.waitEvent(ctx, from, long, func(e Event) bool { return e.Kind == AcquireOK })
		if err != nil {
			return err
		}
		r.record(Event{Kind: FaultStart, Worker: a.Worker, Fault: string(CutHolder)})
		if err := r.cutOff(a.Worker, true); err != nil {
			return err
		}
		time.Sleep(3 * ttl)
		if err := r.cutOff(a.Worker, false); err != nil {
			return err
		}
		r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(CutHolder)})
		return nil
	case PauseMidAcquire:
		a, _, err := r.waitEvent(ctx, from, long, func(e Event) bool { return e.Kind == ReleaseDone })
		if err != nil {
			return err
		}
		cmd, _ := r.worker(a.Worker)
		if r.cfg.Partition != nil {
			if err := r.stopAfterSend(a.Worker, long); err != nil {
				return err
			}
		} else if err := r.stopAfterProxySend(a.Worker, cmd, long); err != nil {
			return err
		}
		time.Sleep(2 * ttl)
		cmd.Process.Signal(syscall.SIGCONT)
		r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(PauseMidAcquire)})
		return nil
	case PauseAuthority:
		if err := r.cfg.Server.Pause(); err != nil {
			return err
		}
		r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(PauseAuthority)})
		time.Sleep(2 * ttl)
		err := r.cfg.Server.Resume()
		r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(PauseAuthority)})
		return err
	case CrashAuthority, CrashLeader:
		if err := r.cfg.Server.Crash(); err != nil {
			return err
		}
		r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(f)})
		err := r.cfg.Server.Restart()
		r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(f)})
		return err
	case FailoverReplica, StepNodeClock, PartitionPastSession, StepAuthorityClock, PartitionMinority, SkewClockRate, LoseHolderPackets:
		return r.holdAcross(ctx, f)
	default:
		return fmt.Errorf("fault %s is not one the nemesis injects", f)
	}
}

// holdAcross injects a fault that takes a holder's lease away behind its
// back (M7, M8, M11, M12, M14, M15, P1): a holder A, granted after the fault began (M7:
// after the replica was cut off, so on the primary alone), is held before
// its write (M14: the skewed worker if its clock is slow, another if it is
// fast, the others kept from starting a round until it is found); the
// nemesis fails the primary over (M7), steps the wall clock
// (M8, M12), partitions A (M11, P1) or makes its link lossy (M15), or
// lets the skewed clock do its work (M14); once another worker has written
// to the key (or after 8 TTLs: the authority kept A's grant), the
// partition heals (the lossy link too)
// and A is let go and writes, stale if the authority granted the key again.
func (r *run) holdAcross(ctx context.Context, f Fault) error {
	ttl := r.cfg.TTL
	long := 20*ttl + 20*time.Second
	start := Now()
	if f == FailoverReplica {
		if err := r.cfg.Failover.CutReplica(); err != nil {
			return err
		}
		start = Now()
		r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(f)})
	}
	// Under M14 only some workers may be A (holdable), and a worker that
	// releases asks for the key again at once, so it nearly always wins it
	// back: the key changes hands only when a waiter's poll falls in the
	// few milliseconds it is free, which with worker 0 polling on a slow
	// clock can take longer than the wait below. The other workers start
	// no new round until A is found: the holder's round ends and a
	// holdable worker takes the free key. They are let go once A is held,
	// before the fault window.
	gated := false
	for w := range r.cfg.Workers {
		if !r.holdable(f, w) {
			if err := os.WriteFile(gatePath(r.cfg.Dir, w), nil, 0o644); err != nil {
				return err
			}
			gated = true
		}
	}
	ungate := func() {
		if gated {
			for w := range r.cfg.Workers {
				os.Remove(gatePath(r.cfg.Dir, w))
			}
			gated = false
		}
	}
	defer ungate()
	// A: a grant whose acquire began after start, held before its write.
	var a Event
	for from, attempt := r.eventCount(), 0; ; attempt++ {
		if attempt == 5 {
			return fmt.Errorf("no holder reached its write to be held in 5 grants")
		}
		invoked := map[int64]bool{}
		g, at, err := r.waitEvent(ctx, from, long, func(e Event) bool {
			if e.Kind == AcquireInvoke && e.T > start {
				invoked[e.Op] = true
			}
			return e.Kind == AcquireOK && invoked[e.Op] && r.holdable(f, e.Worker)
		})
		if err != nil {
			return err
		}
		if err := r.arm("before-write", g.Worker, string(f)+" hold"); err != nil {
			return err
		}
		e, i, err := r.waitEvent(ctx, at, long, func(e Event) bool {
			return e.Worker == g.Worker && (e.Kind == Held || e.Kind == ReleaseInvoke || e.Kind == Abandon)
		})
		if err != nil {
			r.disarm("before-write", g.Worker)
			return err
		}
		if e.Kind == Held {
			a = g
			break
		}
		// A lost its lease before its write (and released): another grant.
		r.disarm("before-write", g.Worker)
		removeHolding(r.cfg.Dir, g.Worker)
		from = i
	}
	defer r.disarm("before-write", a.Worker)
	defer removeHolding(r.cfg.Dir, a.Worker)
	ungate()
	switch f {
	case FailoverReplica:
		if err := r.cfg.Failover.Failover(); err != nil {
			return err
		}
		r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(f)})
	case StepNodeClock, StepAuthorityClock:
		r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(f)})
		r.cfg.Clock.Step(10 * ttl)
		r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(f)})
	case SkewClockRate:
		r.record(Event{Kind: FaultStart, Worker: 0, Fault: string(f)})
	case PartitionPastSession, PartitionMinority:
		r.record(Event{Kind: FaultStart, Worker: a.Worker, Fault: string(f)})
		if err := r.cutOff(a.Worker, true); err != nil {
			return err
		}
	case LoseHolderPackets:
		r.record(Event{Kind: FaultStart, Worker: a.Worker, Fault: string(f)})
		if err := r.cfg.Partition.Lose(a.Worker, lossyPercent); err != nil {
			return err
		}
	}
	from := r.eventCount()
	if _, _, err := r.waitEvent(ctx, from, heldFor(f, ttl), func(e Event) bool {
		return e.Kind == WriteOK && e.Key == a.Key && e.Worker != a.Worker
	}); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.cfg.Logf("%s: no other worker wrote while worker %d was held: %v", f, a.Worker, err)
	}
	if f == PartitionPastSession || f == PartitionMinority {
		if err := r.cutOff(a.Worker, false); err != nil {
			return err
		}
		r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(f)})
	}
	if f == LoseHolderPackets {
		if err := r.cfg.Partition.Lose(a.Worker, 0); err != nil {
			return err
		}
		r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(f)})
	}
	if f == SkewClockRate {
		r.record(Event{Kind: FaultEnd, Worker: 0, Fault: string(f)})
	}
	removeHolding(r.cfg.Dir, a.Worker)
	_, _, err := r.waitEvent(ctx, from, long, func(e Event) bool {
		return e.Worker == a.Worker && (e.Kind == WriteOK || e.Kind == WriteRefused || e.Kind == WriteFail)
	})
	return err
}

// holdable reports whether worker w's grant may be the one holdAcross
// holds under f: under SkewClockRate, the skewed worker 0 if its clock is
// slow, any other if it is fast.
func (r *run) holdable(f Fault, w int) bool {
	if f != SkewClockRate {
		return true
	}
	return (w == 0) == (r.cfg.ClockRate < 1)
}

// lastGrant returns worker w's last grant before index before.
func (r *run) lastGrant(w, before int) (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := min(before, len(r.events)-1); i >= 0; i-- {
		if e := r.events[i]; e.Worker == w && e.Kind == AcquireOK {
			return e, true
		}
	}
	return Event{}, false
}

// lossyPercent is the share of packets LoseHolderPackets drops.
const lossyPercent = 40
