package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// config sizes the workloads; quickConfig and fullConfig are the two.
type config struct {
	// Uncontended: rounds (after one warm-up round) of perRound
	// acquire+release pairs per implementation.
	uncontendedRounds, uncontendedPerRound int
	// Handover: rounds (after a warm-up round) of perRound handovers per
	// implementation, for each number of waiters.
	handoverRounds, handoversPerRound int
	waiters                           []int
	// Throughput (W3): for each K keys and C clients, rounds (after a
	// warm-up window) of one window per implementation.
	keys, clients    []int
	throughputRounds int
	// throughputOn are the backends W3 runs on (nil: all).
	throughputOn       []string
	window, warmWindow time.Duration
	// Renewal (W4): numbers of leases held and renewal periods counted.
	renewalM []int
	periods  int
}

var quickConfig = config{
	uncontendedRounds: 100, uncontendedPerRound: 10,
	handoverRounds: 3, handoversPerRound: 8, waiters: []int{1, 8, 64},
	keys: []int{1, 100, 10000}, clients: []int{1, 8, 64},
	throughputRounds: 2, window: 400 * time.Millisecond, warmWindow: 100 * time.Millisecond,
	throughputOn: []string{"redis", "etcd", "zookeeper", "postgres"},
	renewalM:     []int{10000}, periods: 2,
}

var fullConfig = config{
	uncontendedRounds: 200, uncontendedPerRound: 10,
	handoverRounds: 6, handoversPerRound: 20, waiters: []int{1, 8, 64},
	keys: []int{1, 100, 10000}, clients: []int{1, 8, 64},
	throughputRounds: 3, window: 2 * time.Second, warmWindow: 500 * time.Millisecond,
	renewalM: []int{10000, 100000}, periods: 3,
}

// settle is how long a holder waits, once every other participant is
// inside its lock call, before releasing: time for a waiter to be in line
// (its watch, subscription or queue entry in place). With 2 ms, waiters
// that take several round trips to get in line (go-zookeeper's Lock: a
// create, a listing, an exists watch) were often still on their way when
// the holder released, and then found the key free instead of being
// handed it, which is no handover.
const settle = 20 * time.Millisecond

// settleJitter is the most a holder waits on top of settle, at random: a
// fixed wait would be in phase with a waiter that polls at a fixed period
// (redislock's 10 ms retry), which then finds the key free just after
// each release, every time. Uniform over 20 ms, the release falls at a
// random point of such a waiter's period, as it would in use.
const settleJitter = 20 * time.Millisecond

// roundTimeout bounds one implementation's round; past it the
// implementation is dropped from the workload with an error row.
const roundTimeout = 3 * time.Minute

// handoverTimeout bounds one implementation's handover round: 8–20
// handovers of 20–40 ms settle each, or a few redsync retries (up to
// 250 ms) each, finish well inside it; a round past it has a waiter that
// missed every wake-up (rueidislock-1key, with waiters in processes of
// their own, did at 8 and 64 waiters: timed out after 3 minutes).
const handoverTimeout = 30 * time.Second

// counter returns a server-side count of requests so far, corrected for
// the requests it makes itself; nil when the backend has none.
type counter func() (int64, error)

// delta calls count around f and returns the requests f caused (0 when
// there is no counter or it fails).
func delta(count counter, f func()) int64 {
	if count == nil {
		f()
		return 0
	}
	before, err := count()
	f()
	after, err2 := count()
	if err != nil || err2 != nil {
		return 0
	}
	return after - before
}

// opened is one implementation's processes for a workload.
type opened struct {
	impl    impl
	procs   []process
	workers []locker
	lat     []time.Duration
	ops     int
	reqs    int64
	elapsed time.Duration
	err     error
}

func (o *opened) close() {
	for _, p := range o.procs {
		p.close()
	}
}

// openAll opens, for each implementation, procs processes with workers
// workers spread over them (one per process when procs == workers).
func openAll(ctx context.Context, impls []impl, procs, workers int) []*opened {
	var out []*opened
	for _, im := range impls {
		o := &opened{impl: im}
		for range procs {
			p, err := im.open(ctx)
			if err != nil {
				o.err = err
				break
			}
			o.procs = append(o.procs, p)
		}
		for i := 0; o.err == nil && i < workers; i++ {
			w, err := o.procs[i%procs].worker()
			if err != nil {
				o.err = err
				break
			}
			o.workers = append(o.workers, w)
		}
		out = append(out, o)
	}
	return out
}

// interleave runs rounds+1 rounds; in each, every implementation still
// without an error runs once, in a fresh random order, so that load from
// elsewhere on the machine hits them alike. Round 0 is the warm-up: run
// is told so and its figures are to be discarded.
func interleave(all []*opened, rounds int, run func(o *opened, warm bool) error) {
	for r := 0; r <= rounds; r++ {
		for _, i := range rand.Perm(len(all)) {
			o := all[i]
			if o.err != nil {
				continue
			}
			if err := run(o, r == 0); err != nil {
				o.err = fmt.Errorf("round %d: %w", r, err)
			}
		}
	}
}

// errTimeout is the error of a round that did not finish in time.
var errTimeout = errors.New("timed out")

// withTimeout runs f and gives up waiting after d (f keeps running; the
// implementation is dropped).
func withTimeout(d time.Duration, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return fmt.Errorf("%w after %v", errTimeout, d)
	}
}

var keySeq atomic.Int64

func uniqueKey(parts ...any) string {
	return fmt.Sprintf("bench/%s/%d", fmt.Sprint(parts...), keySeq.Add(1))
}

// uncontended measures acquire+release pairs on a free key.
func (s *suite) uncontended(ctx context.Context, b *backend) {
	all := openAll(ctx, b.impls, 1, 1)
	defer closeAll(all)
	keys := map[*opened]string{}
	for _, o := range all {
		keys[o] = uniqueKey("unc-", o.impl.name)
	}
	interleave(all, s.cfg.uncontendedRounds, func(o *opened, warm bool) error {
		var err error
		n := delta(b.count, func() {
			err = withTimeout(roundTimeout, func() error {
				for range s.cfg.uncontendedPerRound {
					t0 := time.Now()
					unlock, err := o.workers[0].lock(ctx, keys[o])
					if err != nil {
						return err
					}
					if err := unlock(ctx); err != nil {
						return err
					}
					if !warm {
						o.lat = append(o.lat, time.Since(t0))
					}
				}
				return nil
			})
		})
		if !warm {
			o.reqs += n
			o.ops += s.cfg.uncontendedPerRound
		}
		return err
	})
	for _, o := range all {
		s.add(latencyRow("uncontended", b.name, o, map[string]any{"ttl_ms": benchTTL.Milliseconds()}))
	}
}

// handover measures, with waiters participants waiting on one key (each
// its own process), the time from the holder's release call to the next
// holder's lock returning.
func (s *suite) handover(ctx context.Context, b *backend) {
	var impls []impl
	for _, im := range b.impls {
		if !im.driverOnly {
			impls = append(impls, im)
		}
	}
	for _, w := range s.cfg.waiters {
		all := s.openHandover(ctx, b, impls, w+1)
		keys := map[*opened]string{}
		for _, o := range all {
			keys[o] = uniqueKey("hand-", w, "-", o.impl.name)
		}
		interleave(all, s.cfg.handoverRounds, func(o *opened, warm bool) error {
			n := s.cfg.handoversPerRound
			if warm {
				n = 2
			}
			var (
				lat []time.Duration
				err error
			)
			// Requests are counted from the first grant to the last
			// measured one: the drain after it (every participant still
			// waiting takes the key once more, 64 grants at 64 waiters for
			// 8 measured) would otherwise count as the handovers' own.
			var reqs int64
			var first int64
			var firstErr error
			mark := func(last bool) {
				if b.count == nil {
					return
				}
				c, cerr := b.count()
				if !last {
					first, firstErr = c, cerr
				} else if cerr == nil && firstErr == nil {
					reqs = c - first
				}
			}
			err = withTimeout(handoverTimeout, func() (err error) {
				lat, err = handoverRound(ctx, o.workers, keys[o], n, mark)
				return err
			})
			if !warm {
				o.lat = append(o.lat, lat...)
				o.ops += len(lat)
				o.reqs += reqs
			}
			return err
		})
		for _, o := range all {
			s.add(latencyRow("handover", b.name, o,
				map[string]any{"waiters": w, "settle_ms": settle.Milliseconds(), "settle_jitter_ms": settleJitter.Milliseconds(),
					"processes": b.spawn.Set != ""}))
		}
		closeAll(all)
	}
}

// handoverRound has ls contend for key until n handovers have been
// measured. Each holder waits until every other participant is inside
// its lock call (plus settle), notes the time, releases, and waits until
// someone else got the key before it contends again, so every sample is
// a real handover to a waiting participant, never the releaser barging
// back in. Once n samples are in, every participant takes the key once
// more (a lock call cannot be abandoned in every library) and stops.
//
// mark, if not nil, is called by the holder of the first grant and of the
// last measured one (last true), before they release.
func handoverRound(ctx context.Context, ls []locker, key string, n int, mark func(last bool)) ([]time.Duration, error) {
	var (
		mu       sync.Mutex
		cond     = sync.NewCond(&mu)
		granted  []time.Time // every grant's time, in order
		releases []time.Time // releases[i]: when the holder of grant i began to release
		waiting  atomic.Int64
		failed   atomic.Bool
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		// finishedN: the n handovers, the first grant (which follows no
		// release) and nobody else.
		finishedN = n + 1
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		failed.Store(true)
		mu.Lock()
		cond.Broadcast()
		mu.Unlock()
	}
	for _, l := range ls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				waiting.Add(1)
				at, unlock, err := timedLock(ctx, l, key)
				waiting.Add(-1)
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				granted = append(granted, at)
				mine := len(granted)
				finished := mine >= finishedN || failed.Load()
				cond.Broadcast()
				mu.Unlock()
				if mark != nil && (mine == 1 || mine == finishedN) {
					mark(mine == finishedN)
				}
				if !finished {
					for waiting.Load() < int64(len(ls)-1) && !failed.Load() {
						time.Sleep(50 * time.Microsecond)
					}
					time.Sleep(settle + rand.N(settleJitter))
				}
				// The key is held until unlock: no other grant, so no
				// other release, can come between taking the slot and
				// filling it.
				mu.Lock()
				slot := len(releases)
				releases = append(releases, time.Time{})
				mu.Unlock()
				rel, err := unlock(context.Background())
				if err != nil {
					fail(err)
					return
				}
				mu.Lock()
				releases[slot] = rel
				mu.Unlock()
				if finished {
					return
				}
				mu.Lock()
				for len(granted) == mine && !failed.Load() {
					cond.Wait()
				}
				finished = len(granted) >= finishedN || failed.Load()
				mu.Unlock()
				if finished {
					return
				}
			}
		}()
	}
	wg.Wait()
	var lat []time.Duration
	for i := 0; i+1 < len(granted) && i < len(releases) && len(lat) < n; i++ {
		lat = append(lat, granted[i+1].Sub(releases[i]))
	}
	return lat, firstErr
}

// openHandover opens, for each implementation, procs participants, each
// in a process of its own when the backend can spawn them, else each a
// client of its own in this process.
func (s *suite) openHandover(ctx context.Context, b *backend, impls []impl, procs int) []*opened {
	if b.spawn.Set == "" {
		return openAll(ctx, impls, procs, procs)
	}
	var spawned []impl
	for _, im := range impls {
		sp := b.spawn
		sp.Impl = im.name
		spawned = append(spawned, impl{name: im.name, open: func(context.Context) (process, error) { return openChild(sp) }})
	}
	return openAll(ctx, spawned, procs, procs)
}

// throughput runs W3: for each K and C, C workers of one process loop
// acquire-release on keys picked at random among K, in alternating
// windows per implementation. The work inside the lock is nothing: the
// figure is the lock's own throughput.
func (s *suite) throughput(ctx context.Context, b *backend) {
	if s.cfg.throughputOn != nil && !slices.Contains(s.cfg.throughputOn, b.name) {
		return
	}
	var impls []impl
	for _, im := range b.impls {
		if !im.driverOnly {
			impls = append(impls, im)
		}
	}
	for _, k := range s.cfg.keys {
		for _, c := range s.cfg.clients {
			all := openAll(ctx, impls, 1, c)
			keys := map[*opened][]string{}
			for _, o := range all {
				prefix := uniqueKey("w3-", o.impl.name)
				for i := range k {
					keys[o] = append(keys[o], fmt.Sprintf("%s/%d", prefix, i))
				}
			}
			interleave(all, s.cfg.throughputRounds, func(o *opened, warm bool) error {
				window := s.cfg.window
				if warm {
					window = s.cfg.warmWindow
				}
				var (
					ops int
					lat []time.Duration
					err error
				)
				reqs := delta(b.count, func() {
					err = withTimeout(roundTimeout, func() (err error) {
						ops, lat, err = throughputWindow(ctx, o.workers, keys[o], window)
						return err
					})
				})
				if !warm {
					o.ops += ops
					o.lat = append(o.lat, lat...)
					o.reqs += reqs
					o.elapsed += window
				}
				return err
			})
			for _, o := range all {
				r := latencyRow("throughput", b.name, o,
					map[string]any{"keys": k, "clients": c, "window_ms": s.cfg.window.Milliseconds(), "work_us": 0})
				if o.elapsed > 0 {
					r.OpsPerSec = float64(o.ops) / o.elapsed.Seconds()
				}
				s.add(r)
			}
			closeAll(all)
		}
	}
}

// throughputWindow runs the workers for window and returns the
// acquisitions completed in it and their latencies. Workers finish the
// iteration they are in when the window closes.
func throughputWindow(ctx context.Context, workers []locker, keys []string, window time.Duration) (int, []time.Duration, error) {
	var (
		stop     atomic.Bool
		mu       sync.Mutex
		lat      []time.Duration
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	end := time.Now().Add(window)
	for _, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for !stop.Load() {
				key := keys[rand.IntN(len(keys))]
				t0 := time.Now()
				unlock, err := w.lock(ctx, key)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					break
				}
				if now := time.Now(); now.Before(end) {
					mine = append(mine, now.Sub(t0))
				}
				if err := unlock(ctx); err != nil {
					errOnce.Do(func() { firstErr = err })
					stop.Store(true)
					break
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	time.Sleep(time.Until(end))
	stop.Store(true)
	wg.Wait()
	return len(lat), lat, firstErr
}

// closeAll closes every process of all, all at once (a child process
// stuck in a lock call takes seconds to give up).
func closeAll(all []*opened) {
	var wg sync.WaitGroup
	for _, o := range all {
		for _, p := range o.procs {
			wg.Go(p.close)
		}
	}
	wg.Wait()
}

// latencyRow is o's figures as a row (with its error, if any).
func latencyRow(workload, backend string, o *opened, params map[string]any) Row {
	r := Row{Workload: workload, Backend: backend, Implementation: o.impl.name, Params: params, Samples: len(o.lat)}
	if o.err != nil {
		r.Error = o.err.Error()
	}
	if len(o.lat) > 0 {
		r.P50us = percentile(o.lat, 0.50)
		r.P99us = percentile(o.lat, 0.99)
	}
	if o.ops > 0 {
		r.RequestsPerOp = float64(o.reqs) / float64(o.ops)
	}
	return r
}
