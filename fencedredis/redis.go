// Package fencedredis is the fenced backend for a single Redis primary (or a
// Redis Cluster), over go-redis v9.
//
//	import _ "github.com/fenced-dev/fenced/fencedredis"
//
//	client, err := fenced.Open(ctx, "redis://:password@127.0.0.1:6379/0", nil)
//
// URLs are go-redis URLs: redis://, or rediss:// for TLS. They take
// go-redis's query options (such as dial_timeout) and these of fenced:
//
//	prefix=fenced:      namespace of every Redis key fenced writes
//	wait_replicas=N     after each grant, WAIT for N replicas (see Options)
//	wait_timeout=1s     how long that WAIT may take
//	audit_len=100       breaks kept per key in the audit stream
//	pipeline=off        one pooled connection per script (see Driver)
//
// Opened by URL, go-redis's own retries of commands and dials are off:
// fenced's Client decides about retries. Pass max_retries or dialer_retries
// to override.
//
// # Guarantees
//
// A grant, renewal or release is one Lua script, one round trip. The fence strictly
// increases while the node's data survives: appendonly yes with appendfsync
// always, and no eviction of the counter (maxmemory-policy noeviction or
// volatile-*). But Redis replicates asynchronously. After a failover or a
// restart without persistence, the same fence can go to a second holder. So
// the fence is FenceRepeatable. A lease needs LeaseOptions.MinFence
// FenceRepeatable (or FenceNone); the default, FenceStrict, is refused.
//
// Expiry follows the server's wall clock (PX). A forward step larger than
// the safety margin ends grants early. The fence then refuses the first
// holder at the resource.
//
// Waiters are woken by pub/sub: a release wakes one process, the one that
// has waited longest in the key's waiter queue, and one waiter in it. A
// process that died is passed over: the wake-up reaches no client, and
// the release wakes the next (not on Cluster, where PUBLISH counts one
// node's clients). A process alive but stopped (SIGSTOP) takes the
// wake-up; the releasing driver then wakes the next process if the key is
// still free some 20 ms later (Close waits for that). FIFO is not
// promised across processes. Keys in the namespace that fenced did not
// write are never deleted or overwritten: operations on them fail with
// ErrForeignValue, which names the key (a waiter queue of another type
// too: waiting on that key fails, it never turns into polling).
//
// Every Redis key of a lease carries the lease key as a Cluster hash tag,
// PREFIX{KEY}:lock and so on, whatever braces KEY holds. On a Cluster
// client a key that starts with '}' is written PREFIX{ }KEY…, as an empty
// tag would scatter its names over slots.
//
// How the driver keeps a lease, and why: docs/backends.md.
package fencedredis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/rediskit"
	"github.com/fenced-dev/fenced/internal/core/token"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
	"github.com/redis/go-redis/v9"
)

func init() {
	expiry := driver.Expiry{Name: "Redis", Note: "PX in milliseconds; an expired key is gone on its next access"}
	fenced.Register("redis", open, expiry)
	fenced.Register("rediss", open, expiry)
}

// ErrForeignValue means a Redis key in fenced's namespace holds something
// fenced did not write. Fenced refuses to touch it.
var ErrForeignValue = rediskit.ErrForeignValue

// Options configure a Driver. The zero value gives the defaults.
type Options struct {
	// Prefix starts every Redis key and channel fenced uses. Default
	// "fenced:".
	Prefix string
	// WaitReplicas, if positive, makes every grant wait (Redis WAIT) until
	// that many replicas acknowledged it, within WaitTimeout. A grant that
	// fewer replicas acknowledged is released again and reported as an
	// error matching ErrUnavailable, so no caller uses a fence that only
	// the primary knows.
	//
	// What it fixes: a failover to an acknowledging replica keeps the grant
	// and the counter, so the promoted node neither grants the key twice nor
	// repeats the fence. What it does not fix: WAIT is not consensus. A
	// failover may still promote a replica that did not acknowledge:
	// WaitReplicas may be lower than the number of replicas, or an
	// acknowledging one may be down. Replicas acknowledge receipt, not
	// fsync, so a replica restarting without persistence loses the grant.
	// Renewals and releases are not waited for. The grant's clock restarts
	// on the promoted node. The fence stays FenceRepeatable. Not available
	// on Redis Cluster clients.
	WaitReplicas int
	// WaitTimeout bounds the WAIT of each grant. Default 1s.
	WaitTimeout time.Duration
	// AuditLen is how many breaks the audit stream of a key keeps. Default
	// 100.
	AuditLen int
	// NoPipeline, if true, sends each script on a connection of its own
	// from the client's pool, as drivers before the pipeline did, instead
	// of through the client's full-duplex autopipeliner (see Driver). Set
	// it if the client has a hook that must stop commands from reaching
	// the server by not calling next: on the pipeline the command is
	// written before the hook runs. URL option pipeline=off.
	NoPipeline bool
}

// Driver is a fenced driver over one go-redis client. It implements
// driver.Driver, driver.Notifier, driver.BatchRenewer and
// driver.BreakLogger, and is safe for concurrent use.
//
// # Pipeline
//
// On a *redis.Client (standalone or Sentinel) a script call that finds
// another of the driver's calls in flight goes through the client's
// full-duplex autopipeliner (go-redis's
// Client.AsyncAutoPipelineWithOptions, FullDuplex, no flush delay): one
// held connection, a writer goroutine that writes whatever is queued as
// soon as it can, and a reader that hands each reply to its caller in
// order. Calls that arrive while the writer is busy go out in its next
// write and the server reads them in one read, so 64 goroutines share
// round trips instead of taking 64 pooled connections and as many system
// calls each way (TestPipelineSharesRoundTrips: about 50 scripts per
// server read). A call that finds none in flight (a lone acquire, the
// woken waiter of a handover) goes on a pooled connection as before and
// pays no hand-off to the pipeline's goroutines. The half-duplex
// autopipeliner (one batch in flight, the next waiting for its replies)
// was measured and rejected: contended calls queued behind a batch, and
// K=1 C=8 throughput fell 3-7× (docs/benchmarks.md, Redis pipeline).
//
// Each script is still one EVALSHA, atomic on the server, and each
// caller waits for its own reply, so fences and outcomes are those of
// the unpipelined path. A caller stops waiting at its context's deadline
// (the autopipeliner does not, once a call is queued) and reports
// ErrUnknownOutcome: the script may still run. A connection that fails
// with scripts written and their replies unread fails each of them
// with a transport error, ErrUnknownOutcome, as before. go-redis replays
// such scripts on a new connection only within the client's MaxRetries
// (off in a client fenced.Open makes): a replayed grant finds the
// owner's own grant and returns its fence; a replayed release or renewal
// whose first run took effect reports ErrNotHeld, as a retry did before
// the pipeline; neither touches another owner's grant.
//
// The autopipeliner is the client's own cached instance (your code
// calling AsyncAutoPipeline on the client shares it): the driver asks
// for it in New and uses it only if it is full duplex with no flush
// delay; another configuration, set up by your code first, or a client
// without a pipeline pool (PipelinePoolSize < 0) leaves the driver
// unpipelined. Close closes it only when the driver owns the client
// (opened by URL); if your code closes it, the driver goes on without
// it. Batch renewal (RenewBatch) keeps its own explicit pipeline; a
// Cluster client, a grant that waits for replicas (WaitReplicas) and
// Options.NoPipeline keep one pooled connection per call.
type Driver struct {
	c    redis.UniversalClient
	owns bool
	// pipe is the client's full-duplex autopipeliner, or nil (see
	// Pipeline above); inflight counts d's scripts in flight (see run).
	pipe     *redis.AutoPipeliner
	inflight atomic.Int32
	layout   rediskit.Layout
	opts     Options
	hub      *rediskit.Hub
	// waiters is this process's side of the keys' waiter queues (see
	// Subscribe).
	waiters *rediskit.WaitQueue
	// passOn is the scripts' pass_on argument (lua/waiter_queue.lua's
	// wake): "1", a wake-up that reached no client passes on to the next
	// process in the queue, except on Cluster ("0").
	passOn string
	// nudges are the releases' nudges in flight (see nudge); nudgeEnd,
	// under nudgeMu, is set by Close, which then waits for them.
	nudgeMu  sync.Mutex
	nudgeEnd bool
	nudges   sync.WaitGroup
	// caps is what Capabilities returns, set by New.
	caps driver.Capabilities
	// native, under nativeMu, is the commands renewal uses, once probed
	// (nativePath); nil until then.
	nativeMu sync.Mutex
	native   *rediskit.Native
	// marks are this process's observer marks (SubscribeObserver).
	marks observedMarks

	// closed is set once by Close; read without a lock on every call.
	closed atomic.Bool
}

var (
	_ driver.Driver          = (*Driver)(nil)
	_ driver.Notifier        = (*Driver)(nil)
	_ driver.ObserveNotifier = (*Driver)(nil)
	_ driver.BatchRenewer    = (*Driver)(nil)
	_ driver.BreakLogger     = (*Driver)(nil)
)

// New returns a driver over an existing go-redis client. It takes a
// *redis.Client, a Sentinel failover client or a *redis.ClusterClient (a
// *redis.Ring is refused, since its shards move keys and so reset fence
// counters). opts may be nil. The driver does not own c: Close leaves it
// open. go-redis retries failed commands by default (MaxRetries 3). Every
// fenced script is safe to retry except that a release retried after it
// took effect reports ErrNotHeld. go-redis also ignores context deadlines
// unless Options.ContextTimeoutEnabled is set: set it, or a call on a
// link that drops packets waits out ReadTimeout (5s by default) whatever
// its context says. The client fenced.Open makes from a URL sets it.
func New(c redis.UniversalClient, opts *Options) (*Driver, error) {
	if c == nil {
		return nil, errors.New("redis: New: nil client")
	}
	d := &Driver{c: c, hub: rediskit.NewHub(c)}
	d.waiters = rediskit.NewWaitQueue(d.hub.ID(), d.leaveWaiters)
	if opts != nil {
		d.opts = *opts
	}
	if d.opts.Prefix == "" {
		d.opts.Prefix = rediskit.DefaultPrefix
	}
	if err := rediskit.CheckPrefix(d.opts.Prefix); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	if d.opts.WaitReplicas < 0 {
		return nil, fmt.Errorf("redis: WaitReplicas %d is negative", d.opts.WaitReplicas)
	}
	if d.opts.WaitTimeout <= 0 {
		d.opts.WaitTimeout = time.Second
	}
	if d.opts.AuditLen <= 0 {
		d.opts.AuditLen = 100
	}
	_, cluster := c.(*redis.ClusterClient)
	if cluster && d.opts.WaitReplicas > 0 {
		return nil, errors.New(
			"redis: WaitReplicas is not supported on a Cluster client (WAIT must follow the grant on the same connection)")
	}
	if _, ok := c.(*redis.Ring); ok {
		return nil, errors.New("redis: a Ring client is not supported: its shards move keys, which would reset fence counters")
	}
	d.layout = rediskit.Layout{Prefix: d.opts.Prefix, Cluster: cluster}
	d.passOn = "1"
	if cluster {
		d.passOn = "0" // PUBLISH counts one node's clients (see lua/waiter_queue.lua)
	}
	d.caps = d.makeCapabilities()
	if rc, ok := c.(*redis.Client); ok && !d.opts.NoPipeline && d.opts.WaitReplicas == 0 {
		d.pipe = pipeline(rc)
	}
	return d, nil
}

// pipelineOptions is the autopipeliner the driver asks its client for
// (see Driver): full duplex, no flush delay, one ordered stream.
var pipelineOptions = redis.AutoPipelineOptions{FullDuplex: true, MaxFlushDelay: 0, MaxConcurrentBatches: 1}

// pipeline returns c's full-duplex autopipeliner, or nil if c has none
// of that configuration: no pipeline pool (PipelinePoolSize < 0, where
// go-redis would fall back to half duplex), or one set up by other code
// with other options.
func pipeline(c *redis.Client) *redis.AutoPipeliner {
	if c.Options().PipelinePoolSize < 0 {
		return nil
	}
	cfg := pipelineOptions
	ap, err := c.AsyncAutoPipelineWithOptions(&cfg)
	if err != nil {
		return nil
	}
	got := ap.Config()
	if !got.FullDuplex || got.MaxFlushDelay != 0 || got.Unordered || got.MaxConcurrentBatches > 1 || ap.IsBlocking() {
		return nil
	}
	return ap
}

// run runs script s on d. A call that finds no other of d's calls in
// flight goes on a pooled connection of its own, as without the
// pipeline: it pays no hand-off to the autopipeliner's goroutines. A
// call that finds others in flight goes through the autopipeliner (see
// Driver and runPiped).
func (d *Driver) run(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	n := d.inflight.Add(1)
	defer d.inflight.Add(-1)
	if ap := d.pipe; ap != nil && n > 1 && !ap.IsClosed() {
		if cmd, ok := d.runPiped(ctx, ap, s, keys, args); ok {
			return cmd
		}
	}
	return s.Run(ctx, d.c, keys, args...)
}

// runPiped sends EVALSHA of s through ap and waits for its reply until
// ctx is done: the autopipeliner does not end a call at its context
// once the call is queued, so the wait does. A wait that ctx ended
// reports ctx's error (the script may still run: the caller's unknown
// outcome), never the late reply. ok is false when the script was not
// run and should go on the client: the server does not have it loaded
// (NOSCRIPT: the client's Run loads it), or the code sharing the client
// closed ap meanwhile (refused before it was sent).
func (d *Driver) runPiped(ctx context.Context, ap *redis.AutoPipeliner, s *redis.Script, keys []string, args []any) (*redis.Cmd, bool) {
	argv := make([]any, 0, 3+len(keys)+len(args))
	argv = append(argv, "evalsha", s.Hash(), len(keys))
	for _, k := range keys {
		argv = append(argv, k)
	}
	argv = append(argv, args...)
	cmd := redis.NewCmd(ctx, argv...)
	rediskit.PipedScripts.Add(1)
	err := ap.Submit(ctx, cmd).WaitContext(ctx)
	switch {
	case err == nil:
		return cmd, true
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		abandoned := redis.NewCmd(ctx)
		abandoned.SetErr(err)
		return abandoned, true
	case redis.HasErrorPrefix(err, "NOSCRIPT"):
		return nil, false
	case errors.Is(err, redis.ErrClosed) && ap.IsClosed() && !d.closed.Load():
		return nil, false
	}
	return cmd, true
}

// Client returns the go-redis client under d, for resource-side guards.
func (d *Driver) Client() redis.UniversalClient { return d.c }

// open is the URL opener for redis:// and rediss://.
func open(ctx context.Context, u *url.URL) (driver.Driver, error) {
	if u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("%w: redis URL needs a host, as in redis://127.0.0.1:6379/0", fenced.ErrInvalidURL)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n <= 0 || n > 65535 {
			return nil, fmt.Errorf("%w: port %q is not a TCP port", fenced.ErrInvalidURL, p)
		}
	}
	q := rediskit.TakeQuery(u, "prefix", "wait_replicas", "wait_timeout", "audit_len", "pipeline")
	opts := &Options{
		Prefix:       q.Prefix(""),
		WaitReplicas: q.Int("wait_replicas", 0),
		WaitTimeout:  q.Duration("wait_timeout", 0),
		AuditLen:     q.Int("audit_len", 0),
	}
	switch p := q.String("pipeline", "on"); p {
	case "on":
	case "off":
		opts.NoPipeline = true
	default:
		return nil, fmt.Errorf("%w: pipeline=%q: want on or off", fenced.ErrInvalidURL, p)
	}
	if err := q.Err(); err != nil {
		return nil, err
	}
	ro, err := rediskit.ClientOptions(u)
	if err != nil {
		return nil, err
	}
	c := redis.NewClient(ro)
	if err := rediskit.Ping(ctx, c, ro.Addr, ro.DialTimeout+2*time.Second); err != nil {
		c.Close()
		return nil, err
	}
	d, err := New(c, opts)
	if err != nil {
		c.Close()
		return nil, err
	}
	d.owns = true
	return d, nil
}

// The scripts are rediskit's (internal/backend/rediskit/lua): rediskit.Acquire
// grants, rediskit.ReleaseWaiters releases. A process with no
// subscription to the key (most likely free) sends the grant with two
// keys and two arguments: INCR and SET NX, and a reply of the fence alone.
// One with waiters sends the waiter queue, its count of waiters and its
// hub id too: a refusal then makes sure, in the same atomic step, that
// the process stands in the queue for the holder's PTTL plus at least
// half of rediskit.WaitersSlack, and a grant moves it to the end of the
// queue: the grantee need not be one of its waiters (a new acquisition
// tries once before it subscribes), so the process leaves the queue only
// when its last waiter leaves (rediskit.WaitQueue). The release takes the process that has stood longest off the queue and
// publishes on that process's channel alone, so each release wakes one
// process, not every process with a waiter: with 64 waiting processes
// the others stay asleep. Only the first refusal of a grant, and the
// first after a renewal, writes the queue: the others only read it, so a
// crowd of refused waiters costs the server no writes (no AOF fsync under
// appendfsync always). A process that subscribes after the caller read
// the count announces itself: the Client subscribes before its next try,
// and that try, refused, is made with a subscription.

// release runs rediskit.ReleaseWaiters for value on k.
func (d *Driver) release(ctx context.Context, k rediskit.Keys, value string) *redis.Cmd {
	return d.run(ctx, rediskit.ReleaseWaiters, []string{k.Lock, k.Waiters, k.Observed}, value, k.Channel, d.passOn)
}

// TryAcquire implements driver.Driver in one round trip (two with
// WaitReplicas: the WAIT is pipelined after the script on the same
// connection, and returns once the replicas acknowledged).
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := d.usable(); err != nil {
		return 0, err
	}
	k := d.layout.Keys(key)
	subs, member := d.waiters.Current(k)
	if subs == 0 && d.opts.WaitReplicas == 0 {
		res, err := d.run(ctx, rediskit.Acquire, []string{k.Lock, k.Fence}, owner, rediskit.Millis(ttl)).Result()
		if err != nil {
			return 0, d.scriptErr("acquire", key, err, true, k.Lock, k.Fence)
		}
		return d.acquireResult(key, k, rediskit.ParseAcquire(res))
	}
	keys := []string{k.Lock, k.Fence, k.Waiters}
	args := []any{owner, rediskit.Millis(ttl), subs, rediskit.WaitersSlack.Milliseconds(), member}
	if d.opts.WaitReplicas > 0 {
		return d.acquireAndWait(ctx, key, k, keys, args)
	}
	res, err := d.run(ctx, rediskit.Acquire, keys, args...).Result()
	if err != nil {
		return 0, d.scriptErr("acquire", key, err, true, k.Lock, k.Fence)
	}
	return d.acquireResult(key, k, rediskit.ParseAcquire(res))
}

func (d *Driver) acquireResult(key string, k rediskit.Keys, a rediskit.Acquired) (uint64, error) {
	switch a.Status {
	case rediskit.StatusGranted, rediskit.StatusAgain:
		return a.Fence, nil
	case rediskit.StatusHeld:
		return 0, &fenced.HeldError{Remaining: rediskit.PTTL(a.PTTL)}
	case rediskit.StatusForeign:
		return 0, fmt.Errorf("redis: acquire %q: %w", key, rediskit.ForeignError(k.Lock))
	}
	return 0, fmt.Errorf("redis: acquire %q: unexpected script reply (status %d)", key, a.Status)
}

func (d *Driver) acquireAndWait(ctx context.Context, key string, k rediskit.Keys, keys []string, args []any) (uint64, error) {
	run := func() (*redis.Cmd, *redis.IntCmd, error) {
		pipe := d.c.Pipeline()
		acq := rediskit.Acquire.EvalSha(ctx, pipe, keys, args...)
		wait := redis.NewIntCmd(ctx, "wait", d.opts.WaitReplicas, d.opts.WaitTimeout.Milliseconds())
		_ = pipe.Process(ctx, wait)
		_, err := pipe.Exec(ctx)
		return acq, wait, err
	}
	acq, wait, err := run()
	if err != nil && redis.HasErrorPrefix(acq.Err(), "NOSCRIPT") {
		if lerr := rediskit.Acquire.Load(ctx, d.c).Err(); lerr != nil {
			return 0, d.scriptErr("acquire", key, lerr, false)
		}
		acq, wait, err = run()
	}
	if acq.Err() != nil {
		return 0, d.scriptErr("acquire", key, acq.Err(), true, k.Lock, k.Fence)
	}
	a := rediskit.ParseAcquire(acq.Val())
	if !a.Ours() {
		return d.acquireResult(key, k, a)
	}
	fence := a.Fence
	acked, werr := wait.Result()
	if werr == nil && err == nil && acked >= int64(d.opts.WaitReplicas) {
		return fence, nil
	}
	// Not acknowledged: take the grant back (best effort; it expires
	// anyway) so nobody works under a fence only this primary knows.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.WaitTimeout)
	defer cancel()
	_ = d.release(rctx, k, rediskit.Value(fence, args[0].(string))).Err()
	if werr != nil {
		return 0, fmt.Errorf("redis: acquire %q: WAIT for %d replicas failed, grant of fence %d released: %w",
			key, d.opts.WaitReplicas, fence, rediskit.Classify(werr, false))
	}
	return 0, fmt.Errorf("redis: acquire %q: %w: only %d of %d replicas acknowledged the grant of fence %d within %v; released it",
		key, fenced.ErrUnavailable, acked, d.opts.WaitReplicas, fence, d.opts.WaitTimeout)
}

// scriptErr wraps a script error: transport failures become the driver
// sentinels, a key of the wrong type or a counter that is not a number
// becomes ErrForeignValue naming the keys involved.
func (d *Driver) scriptErr(op, key string, err error, mayApply bool, redisKeys ...string) error {
	if ferr := rediskit.ForeignReply(err, redisKeys...); ferr != nil {
		return fmt.Errorf("redis: %s %q: %w", op, key, ferr)
	}
	return fmt.Errorf("redis: %s %q: %w", op, key, rediskit.Classify(err, mayApply))
}

// usable returns ErrClosed once d is closed and, for a renewal, an error
// matching ErrInvalidTTL when a grant to renew carries no TTL
// (ttlrule.CheckAll).
func (d *Driver) usable(renewing ...driver.Grant) error {
	if d.closed.Load() {
		return fenced.ErrClosed
	}
	return ttlrule.CheckAll(renewing)
}

// Renew implements driver.Driver.
func (d *Driver) Renew(ctx context.Context, g driver.Grant) error {
	if err := d.usable(g); err != nil {
		return err
	}
	k := d.layout.Keys(g.Key)
	if d.nativePath(ctx).SetIfEq {
		if ok, err := d.renewNative(ctx, g, k.Lock); ok {
			return err
		}
	}
	n, err := d.run(ctx, rediskit.Renew, []string{k.Lock}, rediskit.Value(g.Fence, g.Owner), rediskit.Millis(g.TTL)).Int64()
	if err != nil {
		return d.scriptErr("renew", g.Key, err, true, k.Lock)
	}
	if n != 1 {
		return fmt.Errorf("redis: renew %v: %w", g, fenced.ErrNotHeld)
	}
	return nil
}

// RenewBatch implements driver.BatchRenewer: one pipeline of batch renew
// scripts of rediskit.RenewChunk grants each, one round trip (on Cluster,
// one per node involved; see rediskit.RenewAll). Each grant's result is
// nil (renewed), ErrNotHeld (its lock is gone or someone else's), or the
// server's error for its script call (outcome unknown, never a refusal).
func (d *Driver) RenewBatch(ctx context.Context, grants []driver.Grant) ([]error, error) {
	if err := d.usable(grants...); err != nil {
		return nil, err
	}
	replies, err := rediskit.RenewAll(ctx, d.c, d.layout, grants)
	if err != nil {
		return nil, fmt.Errorf("redis: renew batch of %d: %w", len(grants), err)
	}
	errs := make([]error, len(grants))
	for i, r := range replies {
		switch {
		case r.Err != nil:
			errs[i] = d.scriptErr("renew", grants[i].Key, r.Err, true)
		case !r.Renewed:
			errs[i] = fmt.Errorf("redis: renew %v: %w", grants[i], fenced.ErrNotHeld)
		}
	}
	return errs, nil
}

// Release implements driver.Driver. It wakes the key's waiters.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	if err := d.usable(); err != nil {
		return err
	}
	k := d.layout.Keys(g.Key)
	start := time.Now()
	n, err := d.release(ctx, k, rediskit.Value(g.Fence, g.Owner)).Int64()
	if err != nil {
		return d.scriptErr("release", g.Key, err, true, k.Lock)
	}
	if n == 0 {
		return fmt.Errorf("redis: release %v: %w", g, fenced.ErrNotHeld)
	}
	if n == 2 {
		d.nudge(k, time.Since(start))
	}
	return nil
}

// Bounds of a nudge's wait (see nudge).
const (
	nudgeMin = 20 * time.Millisecond
	nudgeRTT = 4 // round trips of the release
)

// nudge passes a release's wake-up on if the process it woke does not
// take it: after a wait, if the key is still free, it wakes the process
// first in the queue now (lua/leave_waiters.lua with no member). A live
// process woken by the release has tried by then: it holds the key, or
// its refused try found the key held. One that is alive but stopped
// (SIGSTOP, a debugger) has not; its connection took the wake-up all the
// same (a dead one's did not: the release passed that on itself). The
// wait is nudgeMin plus nudgeRTT times the release's round trip, so it
// grows with the load on this client, the network and the server; a woken
// process slower than that costs a second try, not a missed wake-up. Close
// waits for the nudges in flight.
func (d *Driver) nudge(k rediskit.Keys, rtt time.Duration) {
	d.nudgeMu.Lock()
	defer d.nudgeMu.Unlock()
	if d.nudgeEnd {
		return
	}
	d.nudges.Add(1)
	go func() {
		defer d.nudges.Done()
		time.Sleep(nudgeMin + nudgeRTT*rtt)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = d.run(ctx, rediskit.LeaveWaiters, []string{k.Lock, k.Waiters}, "", k.Channel, d.passOn).Err()
	}()
}

// Inspect implements driver.Driver in one round trip.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return driver.LeaseInfo{}, err
	}
	k := d.layout.Keys(key)
	res, err := d.run(ctx, rediskit.Inspect, []string{k.Lock, k.Fence}).Slice()
	if err != nil {
		return driver.LeaseInfo{}, d.scriptErr("inspect", key, err, false, k.Lock)
	}
	return inspectReply(key, k, res)
}

func inspectReply(key string, k rediskit.Keys, res []any) (driver.LeaseInfo, error) {
	info := driver.LeaseInfo{Key: key}
	if len(res) != 3 {
		return info, fmt.Errorf("redis: inspect %q: unexpected script reply", key)
	}
	if v, ok := res[0].(string); ok {
		f, o, ok := rediskit.ParseValue(v)
		if !ok {
			return info, fmt.Errorf("redis: inspect %q: %w", key, rediskit.ForeignError(k.Lock))
		}
		pttl, _ := res[1].(int64)
		info.Held, info.Fence, info.Remaining = true, f, rediskit.PTTL(pttl)
		token.Set(&info, o)
		return info, nil
	}
	s, ok := res[2].(string)
	if !ok {
		return info, fmt.Errorf("redis: inspect %q: %w", key, fenced.ErrNotFound)
	}
	f, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return info, fmt.Errorf("redis: inspect %q: %w", key, rediskit.ForeignError(k.Fence))
	}
	info.Fence = f
	return info, nil
}

// List implements driver.Driver: a SCAN of the namespace (on every primary
// of a Cluster), then one pipelined read of the grants found.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	names, err := rediskit.ScanAll(ctx, d.c, d.layout.LockPattern(prefix))
	if err != nil {
		return nil, fmt.Errorf("redis: list %q: %w", prefix, err)
	}
	infos, err := rediskit.ReadGrants(ctx, d.c, d.layout, names)
	if err != nil {
		return nil, fmt.Errorf("redis: list %q: %w", prefix, err)
	}
	return infos, nil
}

// Break implements driver.Driver: it deletes the current grant, appends a
// record to the key's audit stream and wakes waiters, in one script. A
// foreign value is left alone.
func (d *Driver) Break(ctx context.Context, key string, reason, by string) (driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return driver.LeaseInfo{}, err
	}
	k := d.layout.Keys(key)
	res, err := d.run(ctx, rediskit.Break, []string{k.Lock, k.Audit, k.Waiters}, k.Channel, reason, by, d.opts.AuditLen,
		d.passOn).Slice()
	if err != nil {
		return driver.LeaseInfo{}, d.scriptErr("break", key, err, true, k.Lock, k.Audit)
	}
	return rediskit.BreakReply(key, k, res)
}

// Breaks implements driver.BreakLogger from the capped audit streams.
func (d *Driver) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	recs, err := rediskit.ReadBreaks(ctx, d.c, d.layout, key)
	if err != nil {
		return nil, fmt.Errorf("redis: breaks %q: %w", key, err)
	}
	return recs, nil
}

// Subscribe implements driver.Notifier over pub/sub; see rediskit.Hub for
// the design (one subscriber connection per driver, fan-out per key). A
// waiter listens on its process's own channel for the key: a release wakes
// the process first in the key's waiter queue, not every process with a
// waiter (see rediskit.WaitQueue). The process stands in the queue from
// its first waiter's Subscribe to its last waiter's Close.
func (d *Driver) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	k := d.layout.Keys(key)
	ep := d.waiters.Join(k)
	s, err := d.hub.Subscribe(ctx, d.waiters.WaitChannel(k))
	if err != nil {
		d.waiters.Leave(k, ep)
		return nil, err
	}
	return d.waiters.Sub(s, k, ep), nil
}

// leaveWaiters ends this process's waiting episode for k at the server
// (see rediskit.WaitQueue.Leave).
func (d *Driver) leaveWaiters(ctx context.Context, k rediskit.Keys, member string) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = d.run(ctx, rediskit.LeaveWaiters, []string{k.Lock, k.Waiters}, member, k.Channel, d.passOn).Err()
}

// guaranteesNote is the Note of Capabilities; the portable Client quotes it
// when it refuses a lease whose MinFence is strict.
const guaranteesNote = "redis: fences come from a per-key INCR counter and rise strictly only while this node keeps its data, " +
	"which needs appendonly yes, appendfsync always and no eviction; replication is asynchronous, so a failover to a replica " +
	"that missed a grant, or a restart without persistence, loses the lock and can hand the same fence to a second holder"

// makeCapabilities is what Capabilities returns for d's options. The
// Client asks for it on every acquire (to check the lease's MinFence), so
// New computes it once.
func (d *Driver) makeCapabilities() driver.Capabilities {
	note := guaranteesNote
	if d.opts.WaitReplicas > 0 {
		note += fmt.Sprintf("; grants wait for %d replica acknowledgements (WAIT), which narrows but does not close this window",
			d.opts.WaitReplicas)
	}
	note += "; expiry is PX on the server's wall clock, so a forward step of that clock ends grants early (not safe from clock steps)"
	return driver.Capabilities{
		Subscribe: true, Observe: true, BatchRenew: true, BreakLog: true, Checkpoint: true,
		Fence:       fenced.FenceRepeatable,
		ServerClock: true,
		// PX expiry compares with the server's wall clock (mstime).
		ClockStepSafe: false,
		Note:          note,
	}
}

// Capabilities implements driver.Driver: waiters and observers woken by
// pub/sub, batch renewal in one script, and the break log.
func (d *Driver) Capabilities() driver.Capabilities { return d.caps }

// Close implements driver.Driver. It closes the subscriber connection, and
// the go-redis client when the driver was opened by URL.
func (d *Driver) Close() error {
	if !d.closed.CompareAndSwap(false, true) {
		return nil
	}
	d.nudgeMu.Lock()
	d.nudgeEnd = true
	d.nudgeMu.Unlock()
	d.nudges.Wait()
	err := d.hub.Close()
	d.marks.close()
	d.waiters.Close()
	if d.owns && d.pipe != nil {
		// Before the client: the autopipeliner drains what it holds.
		if perr := d.pipe.Close(); err == nil {
			err = perr
		}
	}
	if d.owns {
		if cerr := d.c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
