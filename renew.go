package fenced

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced/clock"
	"github.com/fenced-dev/fenced/driver"
)

// renewer is the one schedule of every lease of one client: a min-heap of
// the moment each lease needs looking at next (its next automatic renewal,
// or the end of its local validity, whichever comes first), serviced by one
// goroutine with one timer. A lease costs no goroutine and no timer of its
// own, so a client can hold hundreds of thousands of them, and granting or
// releasing a lease is a heap insertion or removal under one lock; the loop
// is woken only when a new deadline comes before the one its timer is set
// for.
//
// When a renewal falls due, the loop renews, together, every lease whose
// renewal falls within half a period of it. Leases renewed together stay
// together (they are next due a period after their batch began), so a
// client holding many leases converges to one batch per period, and a
// driver that implements driver.BatchRenewer gets each batch in calls of
// thousands of grants (see renewBatch).
//
// Local validity is the schedule's other duty: a lease whose validity runs
// out (no renewal confirmed in time, MaxHold reached, or ManualRenew) is
// ended by the loop the moment its deadline passes, whether or not a
// renewal of it is in flight. The loop only cancels the contexts of the
// leases it ends: what follows (the Lost hooks, and the driver's part,
// stopping the loss watch) is handed to the client's cleanup workers (see
// cleaner), so neither a driver call that blocks (a Send on a stream
// whose peer stopped reading) nor the hooks of thousands of leases delay
// another lease's end.
type renewer struct {
	c *Client

	// ctx bounds every renewal request; stop cancels it, since the leases
	// are ended (their contexts cancelled) before the renewer stops.
	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	heap []*Lease // min-heap on Lease.wake; Lease.heapIdx is each one's index
	// armed is the moment the loop's timer is set for: the loop need not
	// be woken for a lease whose wake is no earlier. It is loopBusy while
	// the loop is looking at the heap (it looks again before it sleeps)
	// and loopIdle when the loop sleeps without a timer.
	armed time.Duration
	// lingerUntil is, once the loop has found the schedule empty, when it
	// stops keeping its timer for leases to come (see idleLinger); zero
	// while it has not. It stays set after that moment, so the loop, woken
	// again with nothing new, sleeps without a timer, and is cleared when
	// a lease is added that wakes the loop, or the loop finds one.
	lingerUntil time.Duration
	// loops counts the loop's looks at the schedule, for tests.
	loops atomic.Int64
	// late and busy are the most the loop woke after the moment its timer
	// was set for, and the longest one look took: what a lease that ended
	// after its validity waited for (see rootaccess.ScheduleDelays).
	late, busy atomic.Int64

	started bool
	stopped bool
	kick    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup

	// cleanup runs the driver's part of ending leases, off the schedule.
	cleanup cleaner
	// gate holds renewals back while they are paused (PauseRenewals).
	gate renewGate
}

const (
	loopBusy time.Duration = math.MinInt64
	loopIdle time.Duration = math.MaxInt64
)

// idleLinger is how long the loop keeps a timer after it finds the
// schedule empty. A client that takes and releases leases one after the
// other (a lock around short work) empties the schedule between them; a
// loop sleeping without a timer then had to be woken for each new lease
// (a goroutine wake-up per acquisition, which on a busy machine cost tens
// of microseconds). With the timer kept, a lease whose first event comes
// later than it wakes nobody: the loop sees it when the timer fires (a
// lease renewed every TTL/3 gains from it when its TTL is over 3 s, the
// default 30 s among them); one whose first event comes sooner wakes the
// loop as before (add compares it with armed, the linger's moment). An
// idle client's loop wakes once more, idleLinger after its last lease,
// and then sleeps without a timer.
const idleLinger = time.Second

func newRenewer(c *Client) *renewer {
	r := &renewer{c: c, kick: make(chan struct{}, 1), done: make(chan struct{}), armed: loopIdle}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// add puts l on the schedule. The caller (Client.register) holds c.mu and
// has checked that Close has not begun, so the renewer has not stopped.
//
// A lease whose local validity ran out while it was being granted (the
// request was sent more than a validity ago: a slow authority, a long
// wait for a response on a loaded machine) is ended here, its context
// cancelled before it is handed out, rather than put on the schedule: the
// loop, however promptly woken, would end it only after the caller got a
// live context past its local deadline. Its Lost hook and the rest of its end
// run on the cleanup workers, since the caller holds c.mu.
func (r *renewer) add(l *Lease) {
	l.mu.Lock()
	wake := l.nextEvent()
	over := r.c.now() >= l.validUntil
	l.mu.Unlock()
	if over {
		if e, ok := l.expire(false); ok {
			r.cleanup.do(e.finish)
		}
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l.wake = wake
	r.push(l)
	if !r.started {
		r.started = true
		r.wg.Add(1)
		go r.loop()
	}
	if wake < r.armed {
		r.lingerUntil = 0
		r.wake()
	}
}

// remove takes l off the schedule, if it is on it.
func (r *renewer) remove(l *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l.heapIdx >= 0 {
		r.removeAt(l.heapIdx)
	}
}

// reschedule moves l's place on the schedule to its next event, after a
// renewal's outcome changed it.
func (r *renewer) reschedule(leases ...*Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Many leases at once (a large batch) are cheaper to place by
	// rebuilding the heap than one by one.
	bulk := len(leases) > len(r.heap)/4
	for _, l := range leases {
		if l.heapIdx < 0 {
			continue // ended meanwhile
		}
		l.mu.Lock()
		wake := l.nextEvent()
		l.mu.Unlock()
		if wake == l.wake {
			continue
		}
		l.wake = wake
		if !bulk {
			r.fix(l.heapIdx)
		}
	}
	if bulk {
		r.heapify()
	}
	if len(r.heap) > 0 && r.heap[0].wake < r.armed {
		r.wake()
	}
}

// held returns the leases on the schedule: every lease of the client that
// has not ended.
func (r *renewer) held() []*Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*Lease(nil), r.heap...)
}

func (r *renewer) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// stop stops scheduling renewals and cancels those in flight. It returns
// at once, with a channel closed when the renewer's goroutines are gone
// (which a driver that ignores its context can delay).
func (r *renewer) stop() <-chan struct{} {
	r.mu.Lock()
	if !r.stopped {
		r.stopped = true
		close(r.done)
		r.cancel()
	}
	r.mu.Unlock()
	r.gate.wake()
	gone := make(chan struct{})
	go func() {
		r.wg.Wait()
		r.cleanup.wait()
		close(gone)
	}()
	return gone
}

func (r *renewer) loop() {
	defer r.wg.Done()
	for {
		select {
		case <-r.done:
			return
		default:
		}
		r.loops.Add(1)
		began := r.c.now()
		expired, batch, next := r.due()
		// Every expired lease's context is cancelled before anything else
		// is done about any of them (hooks, the driver's cleanup), and
		// the rest is done off the loop, on the cleanup workers: the Lost
		// hooks of thousands of leases take long enough (hundreds of
		// milliseconds on a loaded machine) that the leases due meanwhile
		// would outlive their validity.
		ends := make([]lossEnd, 0, len(expired))
		for _, l := range expired {
			if e, ok := l.expire(false); ok { // due took it off the heap
				ends = append(ends, e)
			}
		}
		if len(ends) > 0 {
			r.cleanup.do(func() {
				for _, e := range ends {
					e.finish()
				}
			})
		}
		if len(batch) > 0 {
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.renewBatch(batch)
			}()
		}
		storeMax(&r.busy, r.c.now()-began)
		var timerC <-chan time.Time
		var t interface{ Stop() bool }
		if next != loopIdle {
			tm := clock.NewTimerAt(r.c.clock, r.c.at(next))
			timerC, t = tm.C(), tm
		}
		select {
		case <-timerC:
			storeMax(&r.late, r.c.now()-next)
		case <-r.kick:
		case <-r.done:
		}
		if t != nil {
			t.Stop()
		}
	}
}

// storeMax raises v to d if d is greater.
func storeMax(v *atomic.Int64, d time.Duration) {
	for old := v.Load(); int64(d) > old && !v.CompareAndSwap(old, int64(d)); old = v.Load() {
	}
}

// due takes off the heap the leases whose validity has run out, and marks
// as renewing (and returns) the leases to renew now: once one lease's
// renewal is due, every lease whose renewal falls within half a period of
// now. It returns when the loop must look again (loopIdle for never), and
// arms the schedule for it.
func (r *renewer) due() (expired, batch []*Lease, next time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// A wake-up asked for before now is answered by this look: drop it,
	// lest the loop look again for nothing (and, finding the schedule
	// still empty, end its linger early).
	select {
	case <-r.kick:
	default:
	}
	r.armed = loopBusy
	now := r.c.now()
	horizon := r.horizon(now)
	looked := r.upTo(horizon, nil)
	// Many leases at once (a large batch) are cheaper to put back in order
	// by rebuilding the heap than one by one.
	bulk := len(looked) > len(r.heap)/4
	if !bulk {
		for _, l := range looked {
			r.removeAt(l.heapIdx)
		}
	}
	for _, l := range looked {
		l.mu.Lock()
		if now >= l.validUntil {
			l.mu.Unlock()
			expired = append(expired, l)
			l.heapIdx = -1 // taken off below (bulk) or already
			continue
		}
		if l.renewsNext() && l.nextRenew <= now+l.spec.RenewEvery/2 && (l.nextRenew <= now || horizon > now) {
			if l.spec.MaxHold != holdForever && now+l.spec.TTL-l.acquired > l.spec.MaxHold {
				// Renewing would extend the lease past MaxHold: stop here and
				// let it expire.
				l.maxHoldHit = true
			} else {
				l.renewing = true
				batch = append(batch, l)
			}
		}
		l.wake = l.nextEvent()
		l.mu.Unlock()
		if !bulk {
			r.push(l)
		}
	}
	if bulk {
		kept := r.heap[:0]
		for _, l := range r.heap {
			if l.heapIdx >= 0 {
				l.heapIdx = len(kept)
				kept = append(kept, l)
			}
		}
		clear(r.heap[len(kept):])
		r.heap = kept
		r.heapify()
	}
	next = loopIdle
	switch {
	case len(r.heap) > 0:
		next, r.lingerUntil = r.heap[0].wake, 0
	case r.lingerUntil == 0:
		r.lingerUntil = now + idleLinger
		next = r.lingerUntil
	case now < r.lingerUntil:
		next = r.lingerUntil
	}
	r.armed = next
	return expired, batch, next
}

// horizon returns how far ahead due looks: now, or, once a lease's
// renewal is due, half its period ahead, so that the leases due within it
// are renewed together with it. In the common case the heap's top lease is
// due; otherwise the leases whose wake has come are looked at until one is.
func (r *renewer) horizon(now time.Duration) time.Duration {
	if len(r.heap) == 0 || r.heap[0].wake > now {
		return now
	}
	stack := []int{0}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		l := r.heap[i]
		l.mu.Lock()
		due := now < l.validUntil && l.renewsNext() && l.nextRenew <= now
		l.mu.Unlock()
		if due {
			return now + l.spec.RenewEvery/2
		}
		for _, child := range [2]int{2*i + 1, 2*i + 2} {
			if child < len(r.heap) && r.heap[child].wake <= now {
				stack = append(stack, child)
			}
		}
	}
	return now
}

// upTo appends to dst the leases on the heap whose wake is no later than
// limit: a subtree at the heap's top, found without looking further.
func (r *renewer) upTo(limit time.Duration, dst []*Lease) []*Lease {
	if len(r.heap) == 0 || r.heap[0].wake > limit {
		return dst
	}
	stack := []int{0}
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		dst = append(dst, r.heap[i])
		for _, child := range [2]int{2*i + 1, 2*i + 2} {
			if child < len(r.heap) && r.heap[child].wake <= limit {
				stack = append(stack, child)
			}
		}
	}
	return dst
}

// The heap: a binary min-heap on Lease.wake that keeps Lease.heapIdx.
// r.mu must be held.

// push adds l to the heap.
func (r *renewer) push(l *Lease) {
	l.heapIdx = len(r.heap)
	r.heap = append(r.heap, l)
	r.up(l.heapIdx)
}

func (r *renewer) removeAt(i int) {
	h := r.heap
	last := len(h) - 1
	gone := h[i]
	if i != last {
		h[i] = h[last]
		h[i].heapIdx = i
	}
	h[last] = nil
	r.heap = h[:last]
	gone.heapIdx = -1
	if i != last {
		r.fix(i)
	}
}

func (r *renewer) heapify() {
	for i := len(r.heap)/2 - 1; i >= 0; i-- {
		r.down(i)
	}
}

func (r *renewer) fix(i int) {
	if !r.down(i) {
		r.up(i)
	}
}

func (r *renewer) up(i int) {
	h := r.heap
	for i > 0 {
		parent := (i - 1) / 2
		if h[parent].wake <= h[i].wake {
			break
		}
		h[parent], h[i] = h[i], h[parent]
		h[parent].heapIdx, h[i].heapIdx = parent, i
		i = parent
	}
}

// down sifts h[i] down and reports whether it moved.
func (r *renewer) down(i int) bool {
	h := r.heap
	start := i
	for {
		least := i
		if l := 2*i + 1; l < len(h) && h[l].wake < h[least].wake {
			least = l
		}
		if rt := 2*i + 2; rt < len(h) && h[rt].wake < h[least].wake {
			least = rt
		}
		if least == i {
			return i != start
		}
		h[least], h[i] = h[i], h[least]
		h[least].heapIdx, h[i].heapIdx = least, i
		i = least
	}
}

// maxRenewers bounds the renewal requests a batch sends at once to a driver
// without driver.BatchRenewer, so a client with many leases neither starts
// a goroutine per lease nor floods its store.
const maxRenewers = 64

// renewBatch renews batch, most urgent first (the leases whose validity
// ends soonest): in calls of up to maxBatchGrants grants to a
// driver.BatchRenewer, up to maxBatchCalls of them at a time, or with up to
// maxRenewers single renewals at a time. Calls of bounded size keep a slow
// or failed call from holding up, or failing, every lease of a client at
// once, and still give a store that renews many grants in one request
// thousands at a time.
func (r *renewer) renewBatch(batch []*Lease) {
	if !r.gate.enter(r.done) {
		return // stopped while paused: Close ends the leases
	}
	defer r.gate.leave()
	began := r.c.now()
	items := make([]renewal, len(batch))
	for i, l := range batch {
		l.mu.Lock()
		items[i] = renewal{l: l, until: l.validUntil}
		l.mu.Unlock()
	}
	slices.SortFunc(items, func(a, b renewal) int { return cmp.Compare(a.until, b.until) })
	if br := r.c.ops().BatchRenewer; br != nil && len(items) > 1 {
		calls := (len(items) + maxBatchGrants - 1) / maxBatchGrants
		inParallel(min(calls, maxBatchCalls), calls, func(i int) {
			r.renewCall(br, began, items[i*maxBatchGrants:min((i+1)*maxBatchGrants, len(items))])
		})
		return
	}
	ctx, cancel := r.renewContext(items[len(items)-1].until)
	defer cancel()
	inParallel(min(len(items), maxRenewers), len(items), func(i int) {
		l := items[i].l
		sent := r.c.now()
		if l.applyRenew(began, sent, r.c.drv.Renew(ctx, l.grant())) {
			r.reschedule(l)
		}
	})
}

// renewal is a lease to renew and the end of its validity when its renewal
// began.
type renewal struct {
	l     *Lease
	until time.Duration
}

// Batched renewal: at most maxBatchGrants grants per driver.BatchRenewer
// call, and at most maxBatchCalls calls at a time.
const (
	maxBatchGrants = 4096
	maxBatchCalls  = 4
)

// renewCall renews items, sorted by validity, in one call to br, as part
// of a batch that began at began.
func (r *renewer) renewCall(br driver.BatchRenewer, began time.Duration, items []renewal) {
	ctx, cancel := r.renewContext(items[len(items)-1].until)
	defer cancel()
	grants := make([]driver.Grant, len(items))
	for i, it := range items {
		grants[i] = it.l.grant()
	}
	sent := r.c.now()
	errs, err := br.RenewBatch(ctx, grants)
	if err == nil && len(errs) != len(grants) {
		err = fmt.Errorf("%w: the driver's RenewBatch returned %d results for %d grants", ErrUnknownOutcome, len(errs), len(grants))
	}
	kept := make([]*Lease, 0, len(items))
	for i, it := range items {
		e := err
		if e == nil {
			e = errs[i]
		}
		if it.l.applyRenew(began, sent, e) {
			kept = append(kept, it.l)
		}
	}
	r.reschedule(kept...)
}

// renewContext bounds renewal requests for leases whose validity ends by
// until at the latest: a renewal confirmed after that is useless, so a
// request may take that long (but at least a little), and no longer.
func (r *renewer) renewContext(until time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.ctx, max(until-r.c.now(), 50*time.Millisecond))
}

// inParallel calls fn(i) for every i in [0, n) on workers goroutines.
func inParallel(workers, n int, fn func(i int)) {
	var (
		wg   sync.WaitGroup
		next atomic.Int64
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
