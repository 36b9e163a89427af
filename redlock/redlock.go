// Package redlock is the fenced backend for Redlock: the same lease held on
// a majority of N independent Redis primaries.
//
//	import _ "github.com/fenced-dev/fenced/redlock"
//
//	client, err := fenced.Open(ctx, "redlock://:password@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379/0", nil)
//
// The URL lists host:port pairs separated by commas (hostnames or IPv4);
// user, password, database and go-redis query options apply to every
// node. fenced options:
//
//	prefix=fenced:    namespace of every Redis key fenced writes
//	budget=250ms      longest time one acquisition, renewal or release may take
//	fence=URL         an external fence source: another fenced store, e.g.
//	                  fence=postgres://… or fence=sqlite:///var/lib/fence.db
//	                  (URL-escaped; its backend package must be linked in)
//	audit_len=100     breaks kept per key and node
//
// # The algorithm
//
// TryAcquire sends a grant script to every node in parallel and succeeds
// once a majority (N/2+1) granted it within the budget (at most a third of
// the TTL); it then checks that the TTL minus the time taken minus a drift
// allowance is still positive. The allowance is the lease's SafetyMargin
// (fenced.LeaseSpec, 1% of the TTL + 2ms unless the lease or the client's
// defaults set another), which the driver receives through
// driver.TermsAcquirer, so its check and the holder's local validity are
// the same arithmetic. It returns as soon as
// the outcome is decided, so nodes that are down or stopped cost nothing
// beyond the budget. A failed attempt releases whatever it was granted on
// every node. The driver tries once; the portable Client retries with
// backoff and full jitter, or when woken by a release (each node publishes
// on release, and waiters subscribe on every node). Renewal and release go
// to every node in parallel; renewal needs a majority. The Client measures
// validity from before the first request was sent, minus the same drift
// allowance.
//
// A node whose key holds a value fenced did not write refuses the grant
// and is never written to; if that costs the majority, the attempt fails
// with an error matching ErrForeignValue.
//
// # Guarantees
//
// Each node decides expiry by its wall clock (PX): a forward step of that
// clock on the nodes a rival needs (one node, when the holder's majority
// is exact) ends the grant early there and lets a second majority form
// (Guarantees.ClockStepSafe is false).
//
// Redlock has no monotonic token: with no FenceSource the driver declares
// FenceNone, every fence is zero, and a lease is refused unless its
// LeaseOptions.MinFence is FenceNone: work whose duplicates only waste
// effort, or a caller who fences the resource itself. Its mutual exclusion
// also rests on timing
// assumptions (bounded clock drift between nodes, pauses and network delays
// shorter than the TTL) and on nodes keeping their data across restarts
// (appendfsync always, or restarts delayed by a TTL).
//
// With a FenceSource the fence of each grant comes from that source, taken
// before the grant; every node remembers the highest fence it granted and
// refuses an older one, so fences rise in grant order as long as a majority
// of nodes keep their data, and the declared strength is the source's.
// Even when Redlock's timing assumptions fail and two clients hold the key,
// their fences differ and the resource refuses the older one.
package redlock

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/rediskit"
	"github.com/redis/go-redis/v9"
)

func init() {
	fenced.Register("redlock", open)
}

// ErrForeignValue means a Redis key in fenced's namespace holds something
// fenced did not write; fenced refuses to touch it.
var ErrForeignValue = rediskit.ErrForeignValue

// FenceSource issues fences for Redlock grants, which have none of their
// own.
type FenceSource interface {
	// Next returns a fence for key greater than every fence it returned
	// before for key.
	Next(ctx context.Context, key string) (uint64, error)
	// Strength says how far Next's promise holds (for example across a
	// failover of the source).
	Strength() driver.FenceStrength
}

// Options configure a Driver. The zero value gives the defaults.
type Options struct {
	// Prefix starts every Redis key and channel fenced uses. Default
	// "fenced:".
	Prefix string
	// Fence supplies fences; nil means none (FenceNone).
	Fence FenceSource
	// Budget is the longest one round of requests to the nodes may take
	// (further capped at a third of the TTL for acquisition). Default
	// 250ms.
	Budget time.Duration
	// AuditLen is how many breaks each node keeps per key. Default 100.
	AuditLen int
}

// Driver is a Redlock driver over N go-redis clients, one per independent
// primary. It implements driver.Driver, driver.Notifier,
// driver.BatchRenewer and driver.BreakLogger.
type Driver struct {
	nodes  []node
	quorum int
	owns   bool
	layout rediskit.Layout
	opts   Options
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup // cleanups of failed attempts
}

type node struct {
	c    redis.UniversalClient
	hub  *rediskit.Hub
	name string
}

var (
	_ driver.Driver        = (*Driver)(nil)
	_ driver.TermsAcquirer = (*Driver)(nil)
	_ driver.Notifier      = (*Driver)(nil)
	_ driver.BatchRenewer  = (*Driver)(nil)
	_ driver.BreakLogger   = (*Driver)(nil)
)

// New returns a Redlock driver over clients, one per independent Redis
// primary (not replicas of each other, not a Cluster). Use an odd number,
// at least 3. opts may be nil. The driver does not own the clients. For
// the budget to bound slow nodes, clients should honour context deadlines
// (go-redis Options.ContextTimeoutEnabled); the driver stops waiting at the
// budget either way.
func New(clients []redis.UniversalClient, opts *Options) (*Driver, error) {
	if len(clients) == 0 {
		return nil, errors.New("redlock: New: no nodes")
	}
	d := &Driver{quorum: len(clients)/2 + 1, closed: make(chan struct{})}
	if opts != nil {
		d.opts = *opts
	}
	if d.opts.Prefix == "" {
		d.opts.Prefix = rediskit.DefaultPrefix
	}
	if d.opts.Budget <= 0 {
		d.opts.Budget = 250 * time.Millisecond
	}
	if d.opts.AuditLen <= 0 {
		d.opts.AuditLen = 100
	}
	d.layout = rediskit.Layout{Prefix: d.opts.Prefix}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("redlock: New: node %d is nil", i)
		}
		if _, ok := c.(*redis.ClusterClient); ok {
			return nil, fmt.Errorf("redlock: New: node %d is a Cluster client; Redlock needs independent primaries", i)
		}
		name := fmt.Sprintf("node %d", i)
		if cl, ok := c.(*redis.Client); ok {
			name = cl.Options().Addr
		}
		d.nodes = append(d.nodes, node{c: c, hub: rediskit.NewHub(c), name: name})
	}
	return d, nil
}

// Nodes returns the number of nodes and the majority needed.
func (d *Driver) Nodes() (n, quorum int) { return len(d.nodes), d.quorum }

func open(ctx context.Context, u *url.URL) (driver.Driver, error) {
	hosts := strings.Split(u.Host, ",")
	if u.Host == "" || len(hosts) == 0 {
		return nil, fmt.Errorf("%w: redlock URL needs hosts, as in redlock://h1:6379,h2:6379,h3:6379/0", driver.ErrInvalidURL)
	}
	for _, h := range hosts {
		host, port, err := splitHostPort(h)
		if err != nil {
			return nil, fmt.Errorf("%w: redlock host %q: %v", driver.ErrInvalidURL, h, err)
		}
		_, _ = host, port
	}
	q := rediskit.TakeQuery(u, "prefix", "budget", "fence", "audit_len")
	opts := &Options{Prefix: q.String("prefix", ""), Budget: q.Duration("budget", 0), AuditLen: q.Int("audit_len", 0)}
	if err := q.Err(); err != nil {
		return nil, err
	}
	retries := u.Query().Has("max_retries")
	dialRetries := u.Query().Has("dialer_retries")
	var clients []redis.UniversalClient
	closeAll := func() {
		for _, c := range clients {
			c.Close()
		}
	}
	for _, h := range hosts {
		nu := *u
		nu.Scheme, nu.Host = "redis", h
		ro, err := redis.ParseURL(nu.String())
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("%w: %s", driver.ErrInvalidURL, strings.TrimPrefix(err.Error(), "redis: "))
		}
		if !retries {
			ro.MaxRetries = -1
		}
		if !dialRetries {
			ro.DialerRetries = 1
		}
		ro.ContextTimeoutEnabled = true
		clients = append(clients, redis.NewClient(ro))
	}
	// Every node must answer (and accept the password) at open time, so a
	// typo is reported at once; later, a minority may be down.
	var errs []error
	for _, c := range clients {
		o := c.(*redis.Client).Options()
		if err := rediskit.Ping(ctx, c, o.Addr, o.DialTimeout+2*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > len(clients)-(len(clients)/2+1) {
		closeAll()
		return nil, fmt.Errorf("redlock: fewer than a majority of %d nodes usable: %w", len(clients), errors.Join(errs...))
	}
	if f := q.String("fence", ""); f != "" {
		fc, err := fenced.Open(ctx, f, nil)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("redlock: fence source: %w", err)
		}
		opts.Fence = ClientFence(fc)
	}
	d, err := New(clients, opts)
	if err != nil {
		closeAll()
		return nil, err
	}
	d.owns = true
	return d, nil
}

func splitHostPort(h string) (string, string, error) {
	if h == "" {
		return "", "", errors.New("empty host")
	}
	i := strings.LastIndexByte(h, ':')
	if i < 0 {
		return h, "", nil
	}
	host, port := h[:i], h[i+1:]
	if host == "" {
		return "", "", errors.New("empty host")
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", "", fmt.Errorf("port %q is not a TCP port", port)
	}
	return host, port, nil
}

// acquireScript: KEYS[1] lock, KEYS[2] highest fence granted on this
// node; ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] fence ('0' without a
// source). Returns {status, fence, pttl}.
var acquireScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then
  local f, o = string.match(v, '^(%d+):(.*)$')
  if not f then return {-1, '0', redis.call('PTTL', KEYS[1])} end
  if o == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {2, f, 0}
  end
  return {0, f, redis.call('PTTL', KEYS[1])}
end
local last = redis.call('GET', KEYS[2])
if last then
  local n = tonumber(last)
  if not n then return redis.error_reply('ERR fence counter is not an integer') end
  if ARGV[3] ~= '0' and n >= tonumber(ARGV[3]) then return {-3, last, 0} end
end
if ARGV[3] ~= '0' or not last then redis.call('SET', KEYS[2], ARGV[3]) end
redis.call('SET', KEYS[1], ARGV[3] .. ':' .. ARGV[1], 'PX', ARGV[2])
return {1, ARGV[3], 0}`)

// reply is one node's answer.
type reply[T any] struct {
	node int
	val  T
	err  error
}

// fanout runs op on every node in parallel and collects replies until
// decided reports true for the replies so far, every node answered, or the
// budget runs out. Replies that arrive later are sent to late, which is
// closed after the last one (nil if the caller does not care).
func fanout[T any](ctx context.Context, d *Driver, budget time.Duration, op func(context.Context, redis.UniversalClient) (T, error), decided func([]reply[T]) bool, late func(reply[T])) []reply[T] {
	ctx, cancel := context.WithTimeout(ctx, budget)
	ch := make(chan reply[T], len(d.nodes))
	for i, n := range d.nodes {
		go func() {
			v, err := op(ctx, n.c)
			ch <- reply[T]{node: i, val: v, err: err}
		}()
	}
	var got []reply[T]
	timer := time.NewTimer(budget)
	defer timer.Stop()
collect:
	for len(got) < len(d.nodes) {
		select {
		case r := <-ch:
			got = append(got, r)
			if decided != nil && decided(got) {
				break collect
			}
		case <-timer.C:
			break collect
		}
	}
	missing := len(d.nodes) - len(got)
	if missing == 0 {
		cancel()
		return got
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer cancel()
		for range missing {
			r := <-ch
			if late != nil {
				late(r)
			}
		}
	}()
	return got
}

type acquired struct {
	status int64
	fence  uint64
	pttl   int64
}

// TryAcquire implements driver.Driver: TryAcquireTerms with the default
// drift allowance, driver.DefaultSafetyMargin(ttl).
func (d *Driver) TryAcquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return d.TryAcquireTerms(ctx, key, owner, driver.Terms{TTL: ttl, SafetyMargin: driver.DefaultSafetyMargin(ttl)})
}

// TryAcquireTerms implements driver.TermsAcquirer: one parallel round to
// every node (after one request to the fence source, if any); the grant
// counts if a majority made it and t.TTL minus the time the round took
// minus t.SafetyMargin (the drift allowance) is still positive.
func (d *Driver) TryAcquireTerms(ctx context.Context, key, owner string, t driver.Terms) (uint64, error) {
	ttl, drift := t.TTL, t.SafetyMargin
	if err := d.usable(); err != nil {
		return 0, err
	}
	start := time.Now()
	var fence uint64
	if d.opts.Fence != nil {
		f, err := d.opts.Fence.Next(ctx, key)
		if err != nil {
			return 0, fmt.Errorf("redlock: acquire %q: fence source: %w", key, err)
		}
		if f == 0 {
			return 0, fmt.Errorf("redlock: acquire %q: fence source returned fence 0", key)
		}
		fence = f
	}
	k := d.layout.Keys(key)
	budget := min(d.opts.Budget, ttl/3)
	args := []any{owner, rediskit.Millis(ttl), strconv.FormatUint(fence, 10)}
	isOurs := func(r reply[acquired]) bool {
		return r.err == nil && (r.val.status == rediskit.StatusGranted || r.val.status == rediskit.StatusAgain)
	}
	// Success is decided at a majority; failure waits for every node (or
	// the budget), so that the cleanup below finds every grant this
	// attempt made instead of racing with one still in flight.
	decided := func(rs []reply[acquired]) bool {
		ok := 0
		for _, r := range rs {
			if isOurs(r) {
				ok++
			}
		}
		return ok >= d.quorum
	}
	// A grant that lands after the attempt was decided as failed is
	// released where it landed.
	var failed atomic.Bool
	outcome := make(chan struct{})
	defer close(outcome)
	late := func(r reply[acquired]) {
		<-outcome
		if failed.Load() && (isOurs(r) || r.err != nil) {
			d.releaseOwnerOn(r.node, k, owner)
		}
	}
	rs := fanout(ctx, d, budget, func(ctx context.Context, c redis.UniversalClient) (acquired, error) {
		res, err := acquireScript.Run(ctx, c, []string{k.Lock, k.Fence}, args...).Slice()
		if err != nil {
			return acquired{}, err
		}
		var a acquired
		if len(res) == 3 {
			a.status, _ = res[0].(int64)
			s, _ := res[1].(string)
			a.fence, _ = strconv.ParseUint(s, 10, 64)
			a.pttl, _ = res[2].(int64)
		}
		return a, nil
	}, decided, late)
	elapsed := time.Since(start)

	// Tally: ours by fence (an idempotent re-acquire keeps its old fence).
	byFence := map[uint64]int{}
	var heldTTLs []int64
	var nodeErrs []error
	foreign, stale, unknown := false, false, false
	for _, r := range rs {
		switch {
		case r.err != nil:
			nodeErrs = append(nodeErrs, fmt.Errorf("%s: %w", d.nodes[r.node].name, d.nodeErr(r.err, true, k)))
			if errors.Is(d.nodeErr(r.err, true, k), driver.ErrUnknownOutcome) {
				unknown = true
			}
		case isOurs(r):
			byFence[r.val.fence]++
		case r.val.status == rediskit.StatusHeld:
			heldTTLs = append(heldTTLs, r.val.pttl)
		case r.val.status == rediskit.StatusForeign:
			foreign = true
		case r.val.status == rediskit.StatusStale:
			stale = true
		}
	}
	var granted uint64
	ours := 0
	for f, n := range byFence {
		if n > ours {
			ours, granted = n, f
		}
	}
	validity := ttl - elapsed - drift
	if ours >= d.quorum && validity > 0 {
		return granted, nil
	}

	// Failed: take back what this attempt got, on every node that granted
	// it or may have (late answers are handled by late).
	failed.Store(true)
	var cleanup sync.WaitGroup
	for _, r := range rs {
		if isOurs(r) || r.err != nil {
			cleanup.Add(1)
			go func() {
				defer cleanup.Done()
				d.releaseOwnerOn(r.node, k, owner)
			}()
		}
	}
	cleanup.Wait()

	switch {
	case foreign:
		return 0, fmt.Errorf("redlock: acquire %q: %w", key, rediskit.ForeignError(k.Lock))
	case ours >= d.quorum:
		return 0, fmt.Errorf("redlock: acquire %q: %w: a majority granted it but only after %v of the %v TTL (drift allowance %v); released it",
			key, driver.ErrUnavailable, elapsed.Round(time.Millisecond), ttl, drift)
	case len(heldTTLs) > 0 || stale:
		// Held elsewhere: the key frees when enough holders' grants end;
		// the shortest remaining time is the earliest worth another try.
		sort.Slice(heldTTLs, func(i, j int) bool { return heldTTLs[i] < heldTTLs[j] })
		var rem time.Duration
		if len(heldTTLs) > 0 {
			rem = rediskit.PTTL(heldTTLs[0])
		}
		return 0, &driver.HeldError{Key: key, Remaining: rem}
	}
	sentinel := driver.ErrUnavailable
	if unknown {
		sentinel = driver.ErrUnknownOutcome
	}
	missing := len(d.nodes) - len(rs)
	return 0, fmt.Errorf("redlock: acquire %q: %w: %d of %d nodes granted it (need %d), %d did not answer within %v: %w",
		key, sentinel, ours, len(d.nodes), d.quorum, missing, budget, errors.Join(nodeErrs...))
}

// releaseOwnerOn deletes owner's grant of k on one node, whatever its
// fence, within the budget.
func (d *Driver) releaseOwnerOn(i int, k rediskit.Keys, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.Budget)
	defer cancel()
	_ = rediskit.ReleaseOwner.Run(ctx, d.nodes[i].c, []string{k.Lock}, owner, k.Channel).Err()
}

// nodeErr classifies one node's error; a key of the wrong type or a
// counter that is not a number becomes ErrForeignValue.
func (d *Driver) nodeErr(err error, mayApply bool, k rediskit.Keys) error {
	msg := err.Error()
	if strings.Contains(msg, "WRONGTYPE") || strings.Contains(msg, "not an integer") {
		return fmt.Errorf("%w (keys %s, %s; server said: %s)", ErrForeignValue, k.Lock, k.Fence, msg)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		if mayApply {
			return fmt.Errorf("%w: no answer within the budget", driver.ErrUnknownOutcome)
		}
		return fmt.Errorf("%w: no answer within the budget", driver.ErrUnavailable)
	}
	return rediskit.Classify(err, mayApply)
}

func (d *Driver) usable() error {
	select {
	case <-d.closed:
		return driver.ErrClosed
	default:
		return nil
	}
}

// majority runs a compare-then-act script on every node and counts the
// replies with tally. The round ends as soon as done(ok, refused) reports
// true; the requests still in flight complete in the background.
func (d *Driver) majority(ctx context.Context, budget time.Duration, done func(ok, refused int) bool, script *redis.Script, keys []string, args ...any) (ok, refused int, errs []error) {
	rs := fanout(ctx, d, budget, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		return script.Run(ctx, c, keys, args...).Int64()
	}, func(rs []reply[int64]) bool {
		return done(d.tally(rs))
	}, nil)
	ok, refused, errs = d.tallyErrs(rs)
	if missing := len(d.nodes) - len(rs); missing > 0 {
		errs = append(errs, fmt.Errorf("%w: %d nodes did not answer within %v", driver.ErrUnknownOutcome, missing, budget))
	}
	return ok, refused, errs
}

// tally counts the nodes' replies to one compare-then-act script (renew,
// release): ok where it took effect (1), refused where the node answered
// that it does not hold the grant (0). Every other reply counts as
// neither: a transport failure, and equally a server error such as
// LOADING, BUSY or OOM, which says nothing about whether the node holds
// the grant. Renew, RenewBatch and Release all count with it, so a server
// error can never end a lease as refused.
func (d *Driver) tally(rs []reply[int64]) (ok, refused int) {
	for _, r := range rs {
		switch {
		case r.err != nil:
		case r.val == 1:
			ok++
		default:
			refused++
		}
	}
	return ok, refused
}

// tallyErrs is tally that also returns the errors, classified and named by
// node.
func (d *Driver) tallyErrs(rs []reply[int64]) (ok, refused int, errs []error) {
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, rediskit.Classify(r.err, true)))
		}
	}
	ok, refused = d.tally(rs)
	return ok, refused, errs
}

// Renew implements driver.Driver: a majority must still hold g.
func (d *Driver) Renew(ctx context.Context, g driver.Grant, ttl time.Duration) error {
	if err := d.usable(); err != nil {
		return err
	}
	k := d.layout.Keys(g.Key)
	decided := func(ok, refused int) bool { return ok >= d.quorum || refused > len(d.nodes)-d.quorum }
	ok, refused, errs := d.majority(ctx, min(d.opts.Budget, ttl/3), decided, rediskit.Renew, []string{k.Lock}, rediskit.Value(g.Fence, g.Owner), rediskit.Millis(ttl))
	return d.verdict("renew", g, ok, refused, errs)
}

func (d *Driver) verdict(op string, g driver.Grant, ok, refused int, errs []error) error {
	switch {
	case ok >= d.quorum:
		return nil
	case refused > len(d.nodes)-d.quorum:
		return fmt.Errorf("redlock: %s %v: %w on %d of %d nodes", op, g, driver.ErrNotHeld, refused, len(d.nodes))
	}
	return fmt.Errorf("redlock: %s %v: %w: confirmed on %d of %d nodes (need %d): %w", op, g, driver.ErrUnknownOutcome, ok, len(d.nodes), d.quorum, errors.Join(errs...))
}

// RenewBatch implements driver.BatchRenewer: one pipeline per node, all
// nodes in parallel, so one round trip for the whole batch. Each grant's
// replies are counted as Renew counts them (tally), so a server error on
// a node (LOADING, BUSY, OOM) is never taken for a refusal.
func (d *Driver) RenewBatch(ctx context.Context, reqs []driver.RenewRequest) ([]error, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	// A node answers with one reply per request; a request's own server
	// error is in its reply, a failure of the whole pipeline (transport)
	// in the node's.
	rs := fanout(ctx, d, d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) ([]reply[int64], error) {
		run := func() ([]*redis.Cmd, error) {
			pipe := c.Pipeline()
			cmds := make([]*redis.Cmd, len(reqs))
			for i, r := range reqs {
				k := d.layout.Keys(r.Grant.Key)
				cmds[i] = rediskit.Renew.EvalSha(ctx, pipe, []string{k.Lock}, rediskit.Value(r.Grant.Fence, r.Grant.Owner), rediskit.Millis(r.TTL))
			}
			_, err := pipe.Exec(ctx)
			return cmds, err
		}
		cmds, err := run()
		if err != nil && len(cmds) > 0 && redis.HasErrorPrefix(cmds[0].Err(), "NOSCRIPT") {
			if err := rediskit.Renew.Load(ctx, c).Err(); err != nil {
				return nil, err
			}
			cmds, err = run()
		}
		out := make([]reply[int64], len(cmds))
		for i, cmd := range cmds {
			n, cerr := cmd.Int64()
			var rerr redis.Error
			if cerr != nil && !errors.As(cerr, &rerr) {
				return nil, cerr
			}
			out[i] = reply[int64]{val: n, err: cerr}
		}
		return out, nil
	}, nil, nil)
	var nodeErrs []error
	answered := 0
	for _, r := range rs {
		if r.err != nil {
			nodeErrs = append(nodeErrs, fmt.Errorf("%s: %w", d.nodes[r.node].name, rediskit.Classify(r.err, true)))
		} else {
			answered++
		}
	}
	if missing := len(d.nodes) - len(rs); missing > 0 {
		nodeErrs = append(nodeErrs, fmt.Errorf("%w: %d nodes did not answer within %v", driver.ErrUnknownOutcome, missing, d.opts.Budget))
	}
	if answered < d.quorum {
		return nil, fmt.Errorf("redlock: renew batch of %d: %w: %d of %d nodes answered (need %d): %w", len(reqs), driver.ErrUnknownOutcome, answered, len(d.nodes), d.quorum, errors.Join(nodeErrs...))
	}
	out := make([]error, len(reqs))
	for i, req := range reqs {
		var replies []reply[int64]
		for _, r := range rs {
			if r.err == nil {
				replies = append(replies, reply[int64]{node: r.node, val: r.val[i].val, err: r.val[i].err})
			}
		}
		ok, refused, errs := d.tallyErrs(replies)
		out[i] = d.verdict("renew", req.Grant, ok, refused, append(errs, nodeErrs...))
	}
	return out, nil
}

// Release implements driver.Driver: it deletes g on every node that has it
// and wakes waiters there. It succeeds if any node still had g.
func (d *Driver) Release(ctx context.Context, g driver.Grant) error {
	if err := d.usable(); err != nil {
		return err
	}
	k := d.layout.Keys(g.Key)
	// Enough nodes must have answered that a new majority can form; the
	// rest finish in the background.
	decided := func(ok, refused int) bool { return ok >= d.quorum || ok+refused == len(d.nodes) }
	ok, refused, errs := d.majority(ctx, d.opts.Budget, decided, rediskit.Release, []string{k.Lock}, rediskit.Value(g.Fence, g.Owner), k.Channel)
	switch {
	case ok >= d.quorum:
		return nil
	case refused == len(d.nodes):
		return fmt.Errorf("redlock: release %v: %w", g, driver.ErrNotHeld)
	case ok > 0 && ok+refused == len(d.nodes):
		// Only a minority still had it (the rest of an earlier release may
		// still be in flight, or the grant expired on the others): it was
		// not the current grant, though its remnants are gone now.
		return fmt.Errorf("redlock: release %v: %w (still present on %d of %d nodes, removed)", g, driver.ErrNotHeld, ok, len(d.nodes))
	case refused > len(d.nodes)-d.quorum:
		return fmt.Errorf("redlock: release %v: %w on %d of %d nodes (the rest did not answer)", g, driver.ErrNotHeld, refused, len(d.nodes))
	}
	return fmt.Errorf("redlock: release %v: %w: %w", g, driver.ErrUnknownOutcome, errors.Join(errs...))
}

// view is one node's state of a key.
type view struct {
	value   string
	held    bool
	pttl    int64
	counter uint64
	hasCtr  bool
}

// Inspect implements driver.Driver: the key is held if a majority of nodes
// hold the same grant; Remaining is the time left on the majority.
func (d *Driver) Inspect(ctx context.Context, key string) (driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return driver.LeaseInfo{}, err
	}
	k := d.layout.Keys(key)
	rs := fanout(ctx, d, d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) (view, error) {
		res, err := rediskit.Inspect.Run(ctx, c, []string{k.Lock, k.Fence}).Slice()
		if err != nil || len(res) != 3 {
			return view{}, err
		}
		var v view
		v.value, v.held = res[0].(string)
		v.pttl, _ = res[1].(int64)
		if s, ok := res[2].(string); ok {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return v, fmt.Errorf("%w", rediskit.ForeignError(k.Fence))
			}
			v.counter, v.hasCtr = n, true
		}
		return v, nil
	}, nil, nil)
	info := driver.LeaseInfo{Key: key}
	answered, seen := 0, false
	byValue := map[string][]int64{}
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			if errors.Is(r.err, ErrForeignValue) || strings.Contains(r.err.Error(), "WRONGTYPE") {
				return info, fmt.Errorf("redlock: inspect %q: %s: %w", key, d.nodes[r.node].name, d.nodeErr(r.err, false, k))
			}
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, rediskit.Classify(r.err, false)))
			continue
		}
		answered++
		v := r.val
		seen = seen || v.held || v.hasCtr
		info.Fence = max(info.Fence, v.counter)
		if v.held {
			if _, _, ok := rediskit.ParseValue(v.value); !ok {
				return info, fmt.Errorf("redlock: inspect %q: %s: %w", key, d.nodes[r.node].name, rediskit.ForeignError(k.Lock))
			}
			byValue[v.value] = append(byValue[v.value], v.pttl)
		}
	}
	if answered < d.quorum {
		return info, fmt.Errorf("redlock: inspect %q: %w: %d of %d nodes answered: %w", key, driver.ErrUnavailable, answered, len(d.nodes), errors.Join(errs...))
	}
	for v, ttls := range byValue {
		if len(ttls) >= d.quorum {
			f, o, _ := rediskit.ParseValue(v)
			sort.Slice(ttls, func(i, j int) bool { return ttls[i] > ttls[j] })
			info.Held, info.Fence, info.Remaining = true, f, rediskit.PTTL(ttls[d.quorum-1])
			info.SetOwner(o)
			return info, nil
		}
	}
	if !seen {
		return info, fmt.Errorf("redlock: inspect %q: %w", key, driver.ErrNotFound)
	}
	return info, nil
}

// List implements driver.Driver: the keys a majority of nodes list with
// the same grant.
func (d *Driver) List(ctx context.Context, prefix string) ([]driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	rs := fanout(ctx, d, 4*d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) ([]driver.LeaseInfo, error) {
		names, err := rediskit.ScanAll(ctx, c, d.layout.LockPattern(prefix))
		if err != nil {
			return nil, err
		}
		return rediskit.ReadGrants(ctx, c, d.layout, names)
	}, nil, nil)
	type grantID struct {
		key, owner string
		fence      uint64
	}
	count := map[grantID][]driver.LeaseInfo{}
	answered := 0
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, r.err))
			continue
		}
		answered++
		for _, i := range r.val {
			id := grantID{i.Key, i.Owner, i.Fence}
			count[id] = append(count[id], i)
		}
	}
	if answered < d.quorum {
		return nil, fmt.Errorf("redlock: list %q: %w: %d of %d nodes answered: %w", prefix, driver.ErrUnavailable, answered, len(d.nodes), errors.Join(errs...))
	}
	var out []driver.LeaseInfo
	for _, is := range count {
		if len(is) >= d.quorum {
			sort.Slice(is, func(a, b int) bool { return is[a].Remaining > is[b].Remaining })
			out = append(out, is[d.quorum-1])
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Break implements driver.Driver: it deletes the key's grant on every
// node, recording the break in each node's audit stream, and wakes
// waiters. Foreign values are left alone.
func (d *Driver) Break(ctx context.Context, key string, req driver.BreakRequest) (driver.LeaseInfo, error) {
	if err := d.usable(); err != nil {
		return driver.LeaseInfo{}, err
	}
	k := d.layout.Keys(key)
	rs := fanout(ctx, d, d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) ([]any, error) {
		return rediskit.Break.Run(ctx, c, []string{k.Lock, k.Audit}, k.Channel, req.Reason, req.By, d.opts.AuditLen).Slice()
	}, nil, nil)
	var broken *driver.LeaseInfo
	var errs []error
	free := 0
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, d.nodeErr(r.err, true, k)))
			continue
		}
		info, err := rediskit.BreakReply(key, k, r.val)
		switch {
		case err == nil:
			if broken == nil || info.Remaining > broken.Remaining {
				broken = &info
			}
		case errors.Is(err, driver.ErrNotHeld):
			free++
		default:
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, err))
		}
	}
	if broken != nil {
		return *broken, nil
	}
	if len(errs) > 0 && free < d.quorum {
		return driver.LeaseInfo{Key: key}, fmt.Errorf("redlock: break %q: %w", key, errors.Join(errs...))
	}
	return driver.LeaseInfo{Key: key}, fmt.Errorf("redlock: break %q: %w: no node holds a grant", key, driver.ErrNotHeld)
}

// Breaks implements driver.BreakLogger: the records of every node that
// answers, one per break (a break recorded on several nodes is reported
// once, with its earliest time).
func (d *Driver) Breaks(ctx context.Context, key string) ([]driver.BreakRecord, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	rs := fanout(ctx, d, 4*d.opts.Budget, func(ctx context.Context, c redis.UniversalClient) ([]driver.BreakRecord, error) {
		return rediskit.ReadBreaks(ctx, c, d.layout, key)
	}, nil, nil)
	type id struct {
		key, owner, reason, by string
		fence                  uint64
	}
	first := map[id]driver.BreakRecord{}
	answered := 0
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.nodes[r.node].name, r.err))
			continue
		}
		answered++
		for _, b := range r.val {
			i := id{b.Key, b.Owner, b.Reason, b.By, b.Fence}
			if old, ok := first[i]; !ok || b.Time.Before(old.Time) {
				first[i] = b
			}
		}
	}
	if answered == 0 && len(errs) > 0 {
		return nil, fmt.Errorf("redlock: breaks %q: %w: %w", key, driver.ErrUnavailable, errors.Join(errs...))
	}
	out := make([]driver.BreakRecord, 0, len(first))
	for _, b := range first {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, nil
}

// Subscribe implements driver.Notifier: it subscribes on the nodes (each
// publishes on release and break), returns once a majority confirmed, and
// merges the wake-ups.
func (d *Driver) Subscribe(ctx context.Context, key string) (driver.Subscription, error) {
	if err := d.usable(); err != nil {
		return nil, err
	}
	ch := d.layout.Keys(key).Channel
	sctx, cancel := context.WithTimeout(ctx, d.opts.Budget*4)
	defer cancel()
	rs := fanout(sctx, d, d.opts.Budget*4, func(ctx context.Context, c redis.UniversalClient) (driver.Subscription, error) {
		for _, n := range d.nodes {
			if n.c == c {
				return n.hub.Subscribe(ctx, ch)
			}
		}
		return nil, errors.New("unknown node")
	}, func(rs []reply[driver.Subscription]) bool {
		// A majority suffices: every grant is on a majority of nodes, so
		// its release publishes on at least one of them; a stopped node
		// must not delay the wait.
		ok := 0
		for _, r := range rs {
			if r.err == nil {
				ok++
			}
		}
		return ok >= d.quorum
	}, func(r reply[driver.Subscription]) {
		if r.err == nil {
			r.val.Close()
		}
	})
	m := &merged{c: make(chan struct{}, 1), done: make(chan struct{})}
	var errs []error
	for _, r := range rs {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		m.subs = append(m.subs, r.val)
	}
	if len(m.subs) == 0 {
		return nil, fmt.Errorf("redlock: subscribe %q: %w", key, errors.Join(errs...))
	}
	for _, s := range m.subs {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			for {
				select {
				case <-s.C():
					select {
					case m.c <- struct{}{}:
					default:
					}
				case <-m.done:
					return
				}
			}
		}()
	}
	return m, nil
}

type merged struct {
	c    chan struct{}
	subs []driver.Subscription
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func (m *merged) C() <-chan struct{} { return m.c }

func (m *merged) Close() error {
	m.once.Do(func() {
		close(m.done)
		m.wg.Wait()
		for _, s := range m.subs {
			s.Close()
		}
	})
	return nil
}

// Guarantees implements driver.Driver.
func (d *Driver) Guarantees() driver.Guarantees {
	note := fmt.Sprintf("redlock over %d nodes, majority %d: mutual exclusion assumes bounded clock drift between nodes and pauses shorter than the TTL", len(d.nodes), d.quorum)
	strength := driver.FenceNone
	if d.opts.Fence != nil {
		strength = d.opts.Fence.Strength()
		note += fmt.Sprintf("; fences come from an external source whose fence is %s, and each node refuses a fence older than one it granted", strength)
	} else {
		note += "; Redlock has no monotonic token of its own, so supply a FenceSource with redlock.Options.Fence or fence= in the URL"
	}
	note += "; expiry is PX on each node's wall clock: a forward step on the nodes of a holder's majority that a rival needs (one node, when that majority is exact) ends the grant early there, and a second majority can form (not safe from clock steps)"
	return driver.Guarantees{Fence: strength, ServerClock: true, ClockStepSafe: false, Notify: true, FIFO: false, Note: note}
}

// Close implements driver.Driver: it closes the subscriber connections,
// and the clients when the driver was opened by URL.
func (d *Driver) Close() error {
	var errs []error
	d.once.Do(func() {
		close(d.closed)
		for _, n := range d.nodes {
			errs = append(errs, n.hub.Close())
		}
		d.wg.Wait()
		if d.owns {
			for _, n := range d.nodes {
				errs = append(errs, n.c.Close())
			}
			if c, ok := d.opts.Fence.(*clientFence); ok {
				errs = append(errs, c.c.Close())
			}
		}
	})
	return errors.Join(errs...)
}
