package proof

import (
	"context"
	"errors"
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
		_, i, err := r.waitEvent(ctx, from, r.longWait(), func(e Event) bool {
			if e.Kind == WriteOK {
				n++
			}
			return n >= 2
		})
		return i, err
	}
	from, voids := 0, 0
	for k := 0; k < r.cfg.Injections; k++ {
		if _, err := progress(from); err != nil {
			return fmt.Errorf("proof: no progress before injection %d of %s: %w", k+1, r.cfg.Fault, err)
		}
		r.cfg.Logf("inject %s (%s) #%d", r.cfg.Fault.Name(), r.cfg.Fault, k+1)
		err := r.inject(ctx)
		from = r.eventCount()
		if errors.Is(err, errVoidInjection) && voids < maxVoids {
			voids++
			k-- // it tested nothing: inject again
			continue
		}
		if err != nil && !errors.Is(err, errVoidInjection) {
			return fmt.Errorf("proof: injection %d of %s: %w", k+1, r.cfg.Fault, err)
		}
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

// errVoidInjection means an injection made no hand-over to test: M1's or
// M13's stopped holder kept SQLite's write lock (stopped mid-renewal), so
// nobody else could take the key. The nemesis injects again, up to maxVoids times.
var errVoidInjection = errors.New("proof: the injection made no hand-over")

const maxVoids = 3

// longWait bounds a wait for an event the workload brings in any run.
func (r *run) longWait() time.Duration { return 20*r.cfg.TTL + 20*time.Second }

// inject injects the run's fault once, with one method per fault.
func (r *run) inject(ctx context.Context) error {
	from := r.eventCount()
	switch f := r.cfg.Fault; f {
	case None:
		return nil
	case PauseHolder, ReorderWrites:
		return r.pauseHolder(ctx, f, from)
	case DelayWrite:
		return r.delayWrite(ctx, from)
	case KillHolder:
		return r.killHolder(ctx, from)
	case CutHolder:
		return r.cutHolder(ctx, from)
	case PauseMidAcquire:
		return r.pauseMidAcquire(ctx, from)
	case PauseAuthority:
		return r.pauseAuthority()
	case CrashAuthority, CrashLeader:
		return r.crashAuthority(f)
	case FailoverReplica, StepNodeClock, PartitionPastSession, StepAuthorityClock, PartitionMinority, SkewClockRate, LoseHolderPackets:
		return r.holdAcross(ctx, f)
	default:
		return fmt.Errorf("fault %s is not one the nemesis injects", f)
	}
}

// pauseHolder has a holder A stop itself (SIGSTOP) before its write.
// M1 continues A once another worker wrote; M13 reorders the writes.
func (r *run) pauseHolder(ctx context.Context, f Fault, from int) error {
	if err := r.arm("before-write", -1, string(f)+" stop"); err != nil {
		return err
	}
	a, at, err := r.waitEvent(ctx, from, r.longWait(), func(e Event) bool { return e.Kind == FaultStart && e.Fault == string(f) })
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
	if f == ReorderWrites {
		return r.reorderWrites(ctx, a, at, grant, cont)
	}
	// Continue A once another worker has been granted the key and
	// has written.
	// If none does within 8 TTLs (A may have stopped holding the
	// SQLite authority's write lock in a renewal, which stalls the
	// others), continue A anyway: the run then has no stale write.
	_, _, err = r.waitEvent(ctx, at, 8*r.cfg.TTL, func(e Event) bool {
		return e.Kind == WriteOK && e.Key == grant.Key && e.Worker != a.Worker
	})
	if err != nil && ctx.Err() == nil {
		r.cfg.Logf("M1: no other worker wrote while worker %d was stopped: %v", a.Worker, err)
		return errVoidInjection
	}
	return err
}

// reorderWrites (M13) holds the new holder B between its read and its
// write, then continues the stopped A (cont) so A's stale write lands first.
func (r *run) reorderWrites(ctx context.Context, a Event, at int, grant Event, cont func()) error {
	long := r.longWait()
	// As in M1: if nobody is granted the key within 8 TTLs (A stopped
	// holding SQLite's write lock, mid-renewal), the injection is void.
	b, bat, err := r.waitEvent(ctx, at, 8*r.cfg.TTL, func(e Event) bool {
		return e.Kind == AcquireOK && e.Key == grant.Key && e.Worker != a.Worker
	})
	if err != nil && ctx.Err() == nil {
		r.cfg.Logf("M13: no other worker was granted the key while worker %d was stopped: %v", a.Worker, err)
		return errVoidInjection
	}
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
}

// delayWrite (M2) delays a holder's write by 3 TTLs, and waits for it to land.
func (r *run) delayWrite(ctx context.Context, from int) error {
	ttl := r.cfg.TTL
	if err := r.arm("before-write", -1, fmt.Sprintf("M2 delay %s", 3*ttl)); err != nil {
		return err
	}
	_, _, err := r.waitEvent(ctx, from, r.longWait()+3*ttl,
		func(e Event) bool { return e.Kind == FaultEnd && e.Fault == string(DelayWrite) })
	return err
}

// killHolder (M3) kills a holder before its write, then starts it again.
func (r *run) killHolder(ctx context.Context, from int) error {
	if err := r.arm("before-write", -1, "M3 kill"); err != nil {
		return err
	}
	a, _, err := r.waitEvent(ctx, from, r.longWait(), func(e Event) bool { return e.Kind == FaultStart && e.Fault == string(KillHolder) })
	if err != nil {
		r.disarm("before-write", -1)
		return err
	}
	_, exited := r.worker(a.Worker)
	<-exited
	r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(KillHolder)})
	return r.startWorker(a.Worker)
}

// cutHolder cuts the next holder off from the authority for 3 TTLs.
func (r *run) cutHolder(ctx context.Context, from int) error {
	a, _, err := r.waitEvent(ctx, from, r.longWait(), func(e Event) bool { return e.Kind == AcquireOK })
	if err != nil {
		return err
	}
	r.record(Event{Kind: FaultStart, Worker: a.Worker, Fault: string(CutHolder)})
	if err := r.cutOff(a.Worker, true); err != nil {
		return err
	}
	time.Sleep(3 * r.cfg.TTL)
	if err := r.cutOff(a.Worker, false); err != nil {
		return err
	}
	r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(CutHolder)})
	return nil
}

// pauseMidAcquire stops a worker right after it sent an acquire, for 2 TTLs.
func (r *run) pauseMidAcquire(ctx context.Context, from int) error {
	long := r.longWait()
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
	time.Sleep(2 * r.cfg.TTL)
	cmd.Process.Signal(syscall.SIGCONT)
	r.record(Event{Kind: FaultEnd, Worker: a.Worker, Fault: string(PauseMidAcquire)})
	return nil
}

// pauseAuthority pauses the authority for 2 TTLs.
func (r *run) pauseAuthority() error {
	if err := r.cfg.Server.Pause(); err != nil {
		return err
	}
	r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(PauseAuthority)})
	time.Sleep(2 * r.cfg.TTL)
	err := r.cfg.Server.Resume()
	r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(PauseAuthority)})
	return err
}

// crashAuthority kills the authority (or its leader) and restarts it.
func (r *run) crashAuthority(f Fault) error {
	if err := r.cfg.Server.Crash(); err != nil {
		return err
	}
	r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(f)})
	err := r.cfg.Server.Restart()
	r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(f)})
	return err
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
	start := Now()
	if f == FailoverReplica {
		if err := r.cfg.Failover.CutReplica(); err != nil {
			return err
		}
		start = Now()
		r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(f)})
	}
	ungate, err := r.gateUnholdable(f)
	if err != nil {
		return err
	}
	defer ungate()
	a, err := r.holdGrant(ctx, f, start)
	if err != nil {
		return err
	}
	defer r.disarm("before-write", a.Worker)
	defer removeHolding(r.cfg.Dir, a.Worker)
	ungate()
	if err := r.startHeldFault(f, a); err != nil {
		return err
	}
	from := r.eventCount()
	if _, _, err := r.waitEvent(ctx, from, heldFor(f, r.cfg.TTL), func(e Event) bool {
		return e.Kind == WriteOK && e.Key == a.Key && e.Worker != a.Worker
	}); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.cfg.Logf("%s: no other worker wrote while worker %d was held: %v", f, a.Worker, err)
	}
	if err := r.endHeldFault(f, a); err != nil {
		return err
	}
	removeHolding(r.cfg.Dir, a.Worker)
	_, _, err = r.waitEvent(ctx, from, r.longWait(), func(e Event) bool {
		return e.Worker == a.Worker && (e.Kind == WriteOK || e.Kind == WriteRefused || e.Kind == WriteFail)
	})
	return err
}

// gateUnholdable keeps the workers that may not be A from starting a round.
// It returns the function that lets them go; calling it again does nothing.
//
// Under M14 only some workers may be A (holdable), and a worker that
// releases asks for the key again at once, so it nearly always wins it
// back: the key changes hands only when a waiter's poll falls in the
// few milliseconds it is free, which with worker 0 polling on a slow
// clock can take longer than the wait in holdGrant. The other workers
// start no new round until A is found: the holder's round ends and a
// holdable worker takes the free key. They are let go once A is held,
// before the fault window.
func (r *run) gateUnholdable(f Fault) (func(), error) {
	gated := false
	for w := range r.cfg.Workers {
		if !r.holdable(f, w) {
			if err := os.WriteFile(gatePath(r.cfg.Dir, w), nil, 0o644); err != nil {
				return nil, err
			}
			gated = true
		}
	}
	return func() {
		if gated {
			for w := range r.cfg.Workers {
				os.Remove(gatePath(r.cfg.Dir, w))
			}
			gated = false
		}
	}, nil
}

// holdGrant returns A: a grant whose acquire began after start, held
// before its write. It tries up to 5 grants.
func (r *run) holdGrant(ctx context.Context, f Fault, start int64) (Event, error) {
	long := r.longWait()
	for from, attempt := r.eventCount(), 0; ; attempt++ {
		if attempt == 5 {
			return Event{}, fmt.Errorf("no holder reached its write to be held in 5 grants")
		}
		invoked := map[int64]bool{}
		g, at, err := r.waitEvent(ctx, from, long, func(e Event) bool {
			if e.Kind == AcquireInvoke && e.T > start {
				invoked[e.Op] = true
			}
			return e.Kind == AcquireOK && invoked[e.Op] && r.holdable(f, e.Worker)
		})
		if err != nil {
			return Event{}, err
		}
		if err := r.arm("before-write", g.Worker, string(f)+" hold"); err != nil {
			return Event{}, err
		}
		e, i, err := r.waitEvent(ctx, at, long, func(e Event) bool {
			return e.Worker == g.Worker && (e.Kind == Held || e.Kind == ReleaseInvoke || e.Kind == Abandon)
		})
		if err != nil {
			r.disarm("before-write", g.Worker)
			return Event{}, err
		}
		if e.Kind == Held {
			return g, nil
		}
		// A lost its lease before its write (and released): another grant.
		r.disarm("before-write", g.Worker)
		removeHolding(r.cfg.Dir, g.Worker)
		from = i
	}
}

// startHeldFault starts fault f while A is held before its write.
func (r *run) startHeldFault(f Fault, a Event) error {
	switch f {
	case FailoverReplica:
		if err := r.cfg.Failover.Failover(); err != nil {
			return err
		}
		r.record(Event{Kind: FaultEnd, Worker: -1, Fault: string(f)})
	case StepNodeClock, StepAuthorityClock:
		r.record(Event{Kind: FaultStart, Worker: -1, Fault: string(f)})
		r.cfg.Clock.Step(10 * r.cfg.TTL)
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
	return nil
}

// endHeldFault ends the faults that last while A is held: it heals the
// partition or the lossy link, and ends the clock skew.
func (r *run) endHeldFault(f Fault, a Event) error {
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
	return nil
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
