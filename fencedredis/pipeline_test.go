package fencedredis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
	"github.com/redis/go-redis/v9"
)

// writeCounter counts the writes (system calls) go-redis makes on the
// connections it dials.
type writeCounter struct{ writes atomic.Int64 }

type countedConn struct {
	net.Conn
	w *writeCounter
}

func (c countedConn) Write(b []byte) (int, error) {
	c.w.writes.Add(1)
	return c.Conn.Write(b)
}

// client returns a go-redis client of srv whose connections count their
// writes into w.
func (w *writeCounter) client(t testing.TB, addr string, retries int) *redis.Client {
	d := &net.Dialer{}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: retries, PoolSize: 128,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countedConn{conn, w}, nil
		}})
	t.Cleanup(func() { c.Close() })
	return c
}

// serverIO returns the server's count of reads from and writes to its
// clients' sockets (INFO stats total_reads_processed and
// total_writes_processed): a batch of commands that arrives together is
// one read, and their replies one write.
func serverIO(t *testing.T, c *redis.Client) (reads, writes int64) {
	t.Helper()
	s, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(s, "\n") {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch name {
		case "total_reads_processed":
			reads = n
		case "total_writes_processed":
			writes = n
		}
	}
	return reads, writes
}

// TestPipelineSharesRoundTrips: 64 goroutines acquiring and releasing
// keys of their own through one driver share round trips: the server
// reads their scripts in fewer reads than scripts, and answers in fewer
// writes (the autopipeliner writes the scripts that queue while it
// writes into its next write, on one connection), where the same run
// over a driver with NoPipeline costs the server a read and a write per
// script. Scripts are counted by the server (INFO commandstats), reads
// and writes by the server (INFO stats) and, for the record, writes on
// the client's connections.
func TestPipelineSharesRoundTrips(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	rc := admin(t, srv)
	const workers, rounds = 64, 40
	type counts struct{ scripts, reads, replies, writes int64 }
	run := func(opts *fencedredis.Options) counts {
		// A minute for each of the four runs, not for all of them: under
		// the hog (a3) the last run's release hit a shared minute's end.
		ctx := testCtx(t)
		defer func(start time.Time) { t.Logf("a run took %v", time.Since(start).Round(time.Millisecond)) }(time.Now())
		var w writeCounter
		d, err := fencedredis.New(w.client(t, srv.Addr(), -1), opts)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		o := owner()
		warm, err := d.TryAcquire(ctx, "warm", o, time.Minute) // loads the scripts
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, driver.Grant{Key: "warm", Owner: o, Fence: warm}); err != nil {
			t.Fatal(err)
		}
		s0, w0 := scriptCalls(t, rc), w.writes.Load()
		r0, p0 := serverIO(t, rc)
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for i := range workers {
			wg.Go(func() {
				key := fmt.Sprintf("share:%d", i)
				for range rounds {
					f, err := d.TryAcquire(ctx, key, o, time.Minute)
					if err == nil {
						err = d.Release(ctx, driver.Grant{Key: key, Owner: o, Fence: f})
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		r1, p1 := serverIO(t, rc)
		// Less the INFO commandstats call between the two INFO stats.
		return counts{scripts: scriptCalls(t, rc) - s0, reads: r1 - r0 - 1, replies: p1 - p0 - 1, writes: w.writes.Load() - w0}
	}
	// Interleaved, twice each, so that a phase of the machine's load does
	// not favour one side.
	var piped, plain counts
	add := func(a *counts, b counts) {
		a.scripts, a.reads, a.replies, a.writes = a.scripts+b.scripts, a.reads+b.reads, a.replies+b.replies, a.writes+b.writes
	}
	for range 2 {
		add(&piped, run(nil))
		add(&plain, run(&fencedredis.Options{NoPipeline: true}))
	}
	t.Logf("pipelined: %d scripts, server reads %d, server writes %d, client writes %d", piped.scripts, piped.reads, piped.replies, piped.writes)
	t.Logf("NoPipeline: %d scripts, server reads %d, server writes %d, client writes %d", plain.scripts, plain.reads, plain.replies, plain.writes)
	if want := int64(2 * workers * rounds * 2); piped.scripts != want || plain.scripts != want {
		t.Fatalf("the server ran %d and %d scripts, want %d each", piped.scripts, plain.scripts, want)
	}
	// The control: a read and a reply write per script, so these counts
	// count round trips.
	if plain.reads < plain.scripts || plain.replies < plain.scripts {
		t.Fatalf("NoPipeline: %d reads and %d writes for %d scripts, want one or more each", plain.reads, plain.replies, plain.scripts)
	}
	// Shared: at least two scripts per round trip on average.
	if 2*piped.reads > piped.scripts || 2*piped.replies > piped.scripts {
		t.Fatalf("pipelined: %d server reads and %d writes for %d scripts from %d goroutines: round trips are not shared",
			piped.reads, piped.replies, piped.scripts, workers)
	}
}

// TestPipelineLoneCallNotDelayed: one goroutine's acquire and release,
// each with nothing else in flight, take no longer through the
// autopipeliner than on a pooled connection of their own (NoPipeline),
// measured interleaved in the same run. A pipeline that waited to
// gather a batch (go-redis's MaxFlushDelay) would fail this.
func TestPipelineLoneCallNotDelayed(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	piped := newDriver(t, srv, nil)
	plain := newDriver(t, srv, &fencedredis.Options{NoPipeline: true})
	pair := func(d *fencedredis.Driver, key string) time.Duration {
		o := owner()
		began := time.Now()
		f, err := d.TryAcquire(ctx, key, o, time.Minute)
		if err == nil {
			err = d.Release(ctx, driver.Grant{Key: key, Owner: o, Fence: f})
		}
		if err != nil {
			t.Fatal(err)
		}
		return time.Since(began)
	}
	pair(piped, "lone:piped") // loads the scripts, dials
	pair(plain, "lone:plain")
	var p, q []time.Duration
	for range 400 {
		p = append(p, pair(piped, "lone:piped"))
		q = append(q, pair(plain, "lone:plain"))
	}
	slices.Sort(p)
	slices.Sort(q)
	med := func(d []time.Duration) time.Duration { return d[len(d)/2] }
	t.Logf("acquire+release alone: pipelined p50 %v p90 %v; NoPipeline p50 %v p90 %v",
		med(p), p[len(p)*9/10], med(q), q[len(q)*9/10])
	// The pipeline hands each call to its writer and reader goroutines:
	// two more goroutine switches per call than the pooled connection. On
	// a busy machine a switch can cost as much as the loopback round trip
	// itself, so the bound is twice the control's median, measured in the
	// same run; a wait to gather a batch would add at least one more round
	// trip per call on top of it.
	if med(p) > 2*med(q) {
		t.Fatalf("a lone acquire+release took %v through the pipeline, %v without: delayed", med(p), med(q))
	}
}

// scripts counts the scripts in a chunk a client wrote.
func scripts(chunk []byte) int { return bytes.Count(bytes.ToLower(chunk), []byte("evalsha")) }

// TestPipelineLostReplies: a connection cut after the server received a
// write of several goroutines' scripts, before any reply (the proxy
// forwards the write, then cuts). Every script of that write ran on the
// server with its reply lost.
//
// Without retries (a client fenced.Open makes), each of those calls
// reports ErrUnknownOutcome, never a refusal; the other calls, on the
// next connection, get their own replies (none of the lost write's).
// With go-redis's retries (MaxRetries 3, a client of the user's), the
// lost scripts are replayed on a new connection: a replayed grant
// returns the fence the server holds for its owner, a replayed release
// finds its grant gone (ErrNotHeld, as a retry did before the pipeline),
// and no other owner's grant is touched.
func TestPipelineLostReplies(t *testing.T) {
	for _, retries := range []int{-1, 3} {
		t.Run(fmt.Sprintf("MaxRetries=%d", retries), func(t *testing.T) {
			ctx := testCtx(t)
			srv := testenv.StartRedis(t, testenv.RedisConfig{})
			px := testenv.StartProxy(t, srv.Addr())
			var w writeCounter
			d, err := fencedredis.New(w.client(t, px.Addr, retries), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			rc := admin(t, srv)
			const n = 32
			layout := rediskit.Layout{Prefix: rediskit.DefaultPrefix}
			o := owner()
			warm, err := d.TryAcquire(ctx, "lost:warm", o, time.Minute) // loads the script
			if err != nil {
				t.Fatal(err)
			}
			// A grant of another owner the releases must never touch.
			other := owner()
			if _, err := d.TryAcquire(ctx, "lost:other", other, time.Minute); err != nil {
				t.Fatal(err)
			}

			// Phase 1: n concurrent grants; the first write that carries
			// two or more of them is cut after the server got it.
			var many atomic.Bool
			px.CutAfter(func(chunk []byte) bool {
				if scripts(chunk) >= 2 {
					many.Store(true)
					return true
				}
				return false
			})
			fences := make([]uint64, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					fences[i], errs[i] = d.TryAcquire(ctx, fmt.Sprintf("lost:%d", i), o, time.Minute)
				})
			}
			close(start)
			wg.Wait()
			if px.Cuts() == 0 || !many.Load() {
				// The goroutines' scripts never met in one write: the
				// cut would prove nothing about a shared write.
				t.Fatalf("no write carried two grants (cuts %d): the pipeline did not share a write", px.Cuts())
			}
			unknown := 0
			for i, err := range errs {
				key := fmt.Sprintf("lost:%d", i)
				val, gerr := rc.Get(ctx, layout.Keys(key).Lock).Result()
				switch {
				case err == nil:
					if want := rediskit.Value(fences[i], o); gerr != nil || val != want {
						t.Errorf("grant %d: fence %d, but the server holds %q (%v), want %q", i, fences[i], val, gerr, want)
					}
				case errors.Is(err, fenced.ErrUnknownOutcome):
					unknown++
					if retries > 0 {
						t.Errorf("grant %d: %v, though go-redis replays it", i, err)
					}
				default:
					t.Errorf("grant %d: %v, want a fence or ErrUnknownOutcome (never a refusal)", i, err)
				}
			}
			t.Logf("grants: %d of %d reported unknown outcomes after the cut", unknown, n)
			if retries < 0 && unknown < 2 {
				t.Errorf("%d unknown outcomes: the cut write carried at least two grants, each of which must report one", unknown)
			}

			// Phase 2: release every grant the server holds for o,
			// concurrently, with the same cut.
			many.Store(false)
			px.CutAfter(func(chunk []byte) bool {
				if scripts(chunk) >= 2 {
					many.Store(true)
					return true
				}
				return false
			})
			var grants []driver.Grant
			for i := range n {
				key := fmt.Sprintf("lost:%d", i)
				val, err := rc.Get(ctx, layout.Keys(key).Lock).Result()
				if err != nil {
					continue
				}
				f, _, _ := rediskit.ParseValue(val)
				grants = append(grants, driver.Grant{Key: key, Owner: o, Fence: f})
			}
			rerrs := make([]error, len(grants))
			start = make(chan struct{})
			for i, g := range grants {
				wg.Go(func() {
					<-start
					rerrs[i] = d.Release(ctx, g)
				})
			}
			close(start)
			wg.Wait()
			if !many.Load() {
				t.Fatalf("no write carried two releases")
			}
			for i, err := range rerrs {
				switch {
				case err == nil:
				case errors.Is(err, fenced.ErrUnknownOutcome):
				case errors.Is(err, fenced.ErrNotHeld) && retries > 0:
					// A replay of a release that took effect.
				default:
					t.Errorf("release %d: %v, want nil or ErrUnknownOutcome (never a refusal)", i, err)
				}
				if n, _ := rc.Exists(ctx, layout.Keys(grants[i].Key).Lock).Result(); n != 0 && !errors.Is(err, fenced.ErrUnknownOutcome) {
					t.Errorf("release %d (%v) returned %v, and its grant is still there", i, grants[i], err)
				}
			}
			if val, err := rc.Get(ctx, layout.Keys("lost:other").Lock).Result(); err != nil || !bytes.HasSuffix([]byte(val), []byte(":"+other)) {
				t.Errorf("another owner's grant: %q, %v: touched", val, err)
			}
			// The driver works on: a call after the cuts gets its own reply.
			if err := d.Release(ctx, driver.Grant{Key: "lost:warm", Owner: o, Fence: warm}); err != nil {
				t.Fatalf("release after the cuts: %v", err)
			}
		})
	}
}

// TestPipelinePausedServer: a server stopped (SIGSTOP) with scripts of
// many goroutines written and unanswered. Each call ends at its
// deadline with ErrUnknownOutcome; once the server runs again it
// executes them, and calls after that get their own replies, not the
// late replies of the calls that gave up.
func TestPipelinePausedServer(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	// The client fenced.Open makes of the URL: no retries, deadlines
	// honoured.
	d := openAsURL(t, srv.URL())
	rc := admin(t, srv)
	layout := rediskit.Layout{Prefix: rediskit.DefaultPrefix}
	o := owner()
	if _, err := d.TryAcquire(ctx, "paused:warm", o, time.Minute); err != nil {
		t.Fatal(err)
	}
	const n = 16
	if err := srv.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Signal(syscall.SIGCONT)
		}
	})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, errs[i] = d.TryAcquire(cctx, fmt.Sprintf("paused:%d", i), o, time.Minute)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, fenced.ErrUnknownOutcome) {
			t.Errorf("grant %d against a stopped server: %v, want ErrUnknownOutcome", i, err)
		}
	}
	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed = true
	// Every call from now on gets its own reply: grants of fresh keys
	// whose fences the server confirms, and refusals of the keys the
	// stopped calls may have taken once the server ran them.
	for round := range 3 {
		var wg sync.WaitGroup
		fences := make([]uint64, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				fences[i], errs[i] = d.TryAcquire(ctx, fmt.Sprintf("paused:fresh:%d:%d", round, i), owner(), time.Minute)
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d grant %d after the server resumed: %v", round, i, err)
			}
			v, gerr := rc.Get(ctx, layout.Keys(fmt.Sprintf("paused:fresh:%d:%d", round, i)).Lock).Result()
			f, _, _ := rediskit.ParseValue(v)
			if gerr != nil || f != fences[i] {
				t.Fatalf("round %d grant %d: fence %d, server holds %q (%v): a reply went to the wrong call", round, i, fences[i], v, gerr)
			}
		}
	}
}

// TestPipelineHonoursDeadlines: calls that go through the autopipeliner
// (many goroutines at once) return at their context's deadline when the
// link to Redis drops every packet, as lone calls do
// (TestURLClientHonoursDeadlines). go-redis's autopipeliner does not end
// a queued call at its context: waiting on the command's result (the
// blocking face's wait) took the client's ReadTimeout, 5 s, whatever
// the deadline said.
func TestPipelineHonoursDeadlines(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	px := testenv.StartProxy(t, srv.Addr())
	d := openAsURL(t, "redis://"+px.Addr+"/0")
	const n = 16
	// Warm up the pipeline's connection, and measure what this run's
	// machine takes for a round of n concurrent calls and for a timer (the
	// worst of a few): the slack allowed past each deadline is derived
	// from it.
	var round, late time.Duration
	for r := range 5 {
		began := time.Now()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if _, err := d.Inspect(ctx, fmt.Sprintf("dl:%d:%d", r, i)); err != nil && !errors.Is(err, fenced.ErrNotFound) {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		round = max(round, time.Since(began))
		began = time.Now()
		time.Sleep(10 * time.Millisecond)
		late = max(late, time.Since(began)-10*time.Millisecond)
	}
	px.BlackHole(true)
	t.Cleanup(func() { px.BlackHole(false) })
	const deadline = 200 * time.Millisecond
	// A call ends at its deadline, plus scheduling: eight times this run's
	// worst round of concurrent calls and timer lateness, and at least
	// 500ms, well under the 5s ReadTimeout and the reconnection a call
	// waited out before.
	bound := deadline + max(500*time.Millisecond, 8*(round+late))
	for _, name := range []string{"TryAcquire", "Release"} {
		took := make([]time.Duration, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				began := time.Now()
				if name == "TryAcquire" {
					_, errs[i] = d.TryAcquire(cctx, fmt.Sprintf("dl:%d", i), owner(), time.Minute)
				} else {
					errs[i] = d.Release(cctx, driver.Grant{Key: fmt.Sprintf("dl:%d", i), Owner: owner(), Fence: 1})
				}
				took[i] = time.Since(began)
			})
		}
		wg.Wait()
		slowest := slices.Max(took)
		t.Logf("%d concurrent %s calls with a %v deadline through the black hole: slowest %v (bound %v: round %v, timer lateness %v)",
			n, name, deadline, slowest, bound, round, late)
		for i, err := range errs {
			if !errors.Is(err, fenced.ErrUnknownOutcome) {
				t.Errorf("%s %d through a black hole: %v, want ErrUnknownOutcome", name, i, err)
			}
			if took[i] > bound {
				t.Errorf("%s %d returned %v after its %v deadline (bound %v)", name, i, took[i], deadline, bound)
			}
		}
	}
}

// TestPipelineOwnership: a driver opened by URL closes its client's
// autopipeliner in Close; a driver over the user's client leaves it open
// (the client's own cached instance, which the user's code shares), and
// goes on without it once the user's code closes it. pipeline=off, a
// Cluster client and WaitReplicas leave the driver unpipelined.
func TestPipelineOwnership(t *testing.T) {
	ctx := testCtx(t)
	srv := testenv.StartRedis(t, testenv.RedisConfig{})
	u, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	owned, err := fencedredis.OpenURL(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	p := fencedredis.Pipe(owned)
	if p == nil {
		t.Fatal("a driver opened by URL has no pipeline")
	}
	if err := owned.Close(); err != nil {
		t.Fatal(err)
	}
	if !p.IsClosed() {
		t.Error("Close of a driver opened by URL left its autopipeliner open")
	}

	off, err := url.Parse(srv.URL() + "?pipeline=off")
	if err != nil {
		t.Fatal(err)
	}
	unpiped, err := fencedredis.OpenURL(ctx, off)
	if err != nil {
		t.Fatal(err)
	}
	if fencedredis.Pipe(unpiped) != nil {
		t.Error("pipeline=off: the driver has a pipeline")
	}
	unpiped.Close()
	if d := newDriver(t, srv, &fencedredis.Options{WaitReplicas: 1, WaitTimeout: time.Millisecond}); fencedredis.Pipe(d) != nil {
		t.Error("WaitReplicas: the driver has a pipeline")
	}

	rc := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rc.Close() })
	d, err := fencedredis.New(rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	p = fencedredis.Pipe(d)
	if mine, err := rc.AsyncAutoPipeline(); err != nil || mine != p {
		t.Fatalf("the driver's autopipeliner %p is not the client's (%p, %v)", p, mine, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if p.IsClosed() {
		t.Error("Close of a driver over the user's client closed the client's autopipeliner")
	}
	if err := p.Set(ctx, "users-own", "1", 0).Err(); err != nil {
		t.Errorf("the user's autopipeliner after the driver's Close: %v", err)
	}
	// The user's code closes it: a driver over the client works on.
	d, err = fencedredis.New(rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if fencedredis.Pipe(d) != p {
		t.Fatal("a second driver over the client has another autopipeliner")
	}
	p.Close()
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Go(func() {
			key, o := fmt.Sprintf("after-close:%d", i), owner()
			f, err := d.TryAcquire(ctx, key, o, time.Minute)
			if err == nil {
				err = d.Release(ctx, driver.Grant{Key: key, Owner: o, Fence: f})
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d after the user closed the client's autopipeliner: %v", i, err)
		}
	}
}

// openAsURL returns a driver on a go-redis client made as fenced.Open
// makes it from rawURL, closed with the test.
func openAsURL(t *testing.T, rawURL string) *fencedredis.Driver {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := rediskit.ClientOptions(u)
	if err != nil {
		t.Fatal(err)
	}
	rcl := redis.NewClient(ro)
	t.Cleanup(func() { rcl.Close() })
	d, err := fencedredis.New(rcl, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}
