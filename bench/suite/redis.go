package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fencedredis"
	"github.com/fenced-dev/fenced/fencedredlock"
	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// newRedisClient is the go-redis client every Redis implementation gets,
// with the same pool and no retries.
func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 128})
}

// redisCommands counts the commands the servers processed (INFO's
// total_commands_processed; a script call is one command), less the INFO
// calls it made itself.
func redisCommands(addrs []string) counter {
	var clients []*redis.Client
	for _, a := range addrs {
		clients = append(clients, newRedisClient(a))
	}
	var calls int64
	return func() (int64, error) {
		var total int64
		for _, c := range clients {
			info, err := c.Info(context.Background(), "stats").Result()
			if err != nil {
				return 0, err
			}
			n, err := infoField(info, "total_commands_processed")
			if err != nil {
				return 0, err
			}
			total += n
		}
		// Each server counted the INFO calls before this one.
		total -= calls * int64(len(clients))
		calls++
		return total, nil
	}
}

// redisScriptCalls counts the script calls (EVAL, EVALSHA, FCALL and
// their read-only forms) the servers processed: the requests of a
// renewal, since fenced, redsync and redislock all renew with a script.
func redisScriptCalls(addrs []string) counter {
	var clients []*redis.Client
	for _, a := range addrs {
		clients = append(clients, newRedisClient(a))
	}
	return func() (int64, error) {
		var total int64
		for _, c := range clients {
			info, err := c.Info(context.Background(), "commandstats").Result()
			if err != nil {
				return 0, err
			}
			for _, line := range strings.Split(info, "\n") {
				name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
				if !ok {
					continue
				}
				switch strings.TrimPrefix(name, "cmdstat_") {
				case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
					v, _, _ := strings.Cut(rest, ",")
					n, err := strconv.ParseInt(v, 10, 64)
					if err != nil {
						return 0, err
					}
					total += n
				}
			}
		}
		return total, nil
	}
}

func infoField(info, name string) (int64, error) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO has no %s", name)
}

// clientProcess is an implementation whose workers share one locker (a
// library object safe for concurrent use) over one go-redis client.
type clientProcess struct {
	l       locker
	closers []func() error
}

func (p clientProcess) worker() (locker, error) { return p.l, nil }
func (p clientProcess) close() {
	for _, c := range p.closers {
		c()
	}
}

type lockFunc func(ctx context.Context, key string) (func(context.Context) error, error)

func (f lockFunc) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	return f(ctx, key)
}

func redsyncLock(rs *redsync.Redsync) lockFunc {
	return func(ctx context.Context, key string) (func(context.Context) error, error) {
		m := rs.NewMutex(key, redsync.WithExpiry(benchTTL), redsync.WithTries(math.MaxInt32))
		if err := m.LockContext(ctx); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return okErr(m.UnlockContext(ctx)) }, nil
	}
}

// okErr turns redsync's (false, nil) into an error.
func okErr(ok bool, err error) error {
	if err == nil && !ok {
		return errors.New("not held")
	}
	return err
}

// redislockRetry is redislock's retry strategy in every workload: linear
// 10ms, the faster of the two strategies bench/redis measured (the
// exponential one starves old waiters).
func redislockRetry() redislock.RetryStrategy { return redislock.LinearBackoff(10 * time.Millisecond) }

func redislockLock(c *redislock.Client) lockFunc {
	return func(ctx context.Context, key string) (func(context.Context) error, error) {
		l, err := c.Obtain(ctx, key, benchTTL, &redislock.Options{RetryStrategy: redislockRetry()})
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
}

// redisBackend is one redis-server without the append-only file, as most
// Redis lock users run it: the headline, where client and script costs
// show.
func redisBackend(tb *testenv.MainTB) *backend { return redisServer(tb, false) }

// redisAOFBackend is one redis-server with the append-only file fsynced
// on every write (what fenced recommends for a fence that survives a
// restart): each write waits for an fsync, which hides client and script
// costs.
func redisAOFBackend(tb *testenv.MainTB) *backend { return redisServer(tb, true) }

// redisServer is the Redis backend on one redis-server, with the
// append-only file fsynced on every write (aof) or without it.
func redisServer(tb *testenv.MainTB, aof bool) *backend {
	srv := testenv.StartRedis(tb, testenv.RedisConfig{NoPersistence: !aof})
	addr := srv.Addr()
	impls := redisImpls([]string{addr})
	holders := []holderImpl{
		{name: "fenced", how: "Client auto-renew (driver batch renewal where it has one)",
			open: func(ctx context.Context, ttl time.Duration) (holder, error) {
				c := newRedisClient(addr)
				d, err := fencedredis.New(c, nil)
				if err != nil {
					return nil, err
				}
				return &fencedHolder{c: fenced.NewClient(d, nil), closeAlso: c.Close}, nil
			}},
		{name: "redsync", how: "one Extend per lock per period", open: func(ctx context.Context, ttl time.Duration) (holder, error) {
			c := newRedisClient(addr)
			return &redsyncHolder{rs: redsync.New(goredis.NewPool(c)), c: c, refresher: newRefresher(ttl / 3)}, nil
		}},
		{name: "redislock", how: "one Refresh per lock per period", open: func(ctx context.Context, ttl time.Duration) (holder, error) {
			c := newRedisClient(addr)
			return &redislockHolder{rl: redislock.New(c), c: c, refresher: newRefresher(ttl / 3)}, nil
		}},
	}
	name, setup := "redis", "redis-server without the append-only file (appendonly no)"
	if aof {
		name, setup = "redis-aof", "redis-server with appendfsync always"
	}
	return &backend{
		name: name, impls: impls, holders: holders, spawn: spawnSpec{Set: "redis", Args: []string{addr}},
		count: redisCommands([]string{addr}), renewalCount: redisScriptCalls([]string{addr}),
		renewalTTL: func(m int) time.Duration {
			if m > 20000 {
				return 30 * time.Second
			}
			return 6 * time.Second
		},
		note: setup +
			"; requests are commands the server executed (INFO total_commands_processed, commands inside scripts included), " +
			"except in renewal, where they are script calls (INFO commandstats); redislock retries every 10ms; " +
			"redsync's default retry delay (50-250ms); rueidislock with its defaults (2 of 3 keys, auto-extend, " +
			"waits by client-side caching) and with KeyMajority 1 (one key, rueidislock-1key); only fenced has a fence " +
			"(redislock v0.9.4, the newest release, has none, nor has rueidislock)",
	}
}

// redisImpls are the implementations on the one redis-server at addrs[0].
func redisImpls(addrs []string) []impl {
	addr := addrs[0]
	withClient := func(f func(c *redis.Client) (process, error)) func(context.Context) (process, error) {
		return func(context.Context) (process, error) {
			c := newRedisClient(addr)
			p, err := f(c)
			if err != nil {
				c.Close()
			}
			return p, err
		}
	}
	impls := []impl{
		{name: "fenced", open: withClient(func(c *redis.Client) (process, error) {
			d, err := fencedredis.New(c, nil)
			if err != nil {
				return nil, err
			}
			p := newFencedProcess(d)
			return clientProcess{l: p, closers: []func() error{p.c.Close, c.Close}}, nil
		})},
		{name: "fenced-driver", driverOnly: true, open: withClient(func(c *redis.Client) (process, error) {
			d, err := fencedredis.New(c, nil)
			if err != nil {
				return nil, err
			}
			return clientProcess{l: driverProcess{d}, closers: []func() error{d.Close, c.Close}}, nil
		})},
		{name: "redsync", open: withClient(func(c *redis.Client) (process, error) {
			return clientProcess{l: redsyncLock(redsync.New(goredis.NewPool(c))), closers: []func() error{c.Close}}, nil
		})},
		{name: "redislock", open: withClient(func(c *redis.Client) (process, error) {
			return clientProcess{l: redislockLock(redislock.New(c)), closers: []func() error{c.Close}}, nil
		})},
		{name: "rueidislock", open: func(context.Context) (process, error) { return openRueidislock(addr, 0) }},
		{name: "rueidislock-1key", open: func(context.Context) (process, error) { return openRueidislock(addr, 1) }},
	}
	if os.Getenv(redisABEnv) != "" {
		impls = append(impls, redisABImpls(withClient)...)
	}
	return impls
}

// redisABEnv, set to anything, adds redisABImpls to the Redis backend
// (in the suite and in its child processes, which inherit it):
//
//	FENCED_BENCH_REDIS_AB=1 ./scripts/bench.sh --quick --only redis --workloads uncontended,handover,throughput
const redisABEnv = "FENCED_BENCH_REDIS_AB"

// redisABImpls are fenced's Redis driver on the paths its pipeline was
// chosen against, measured interleaved with it: fenced-nopipe
// (Options.NoPipeline: one pooled connection per script, the driver
// before the pipeline) and fenced-halfduplex (the driver over go-redis's
// half-duplex autopipeliner: one batch in flight, no flush delay).
func redisABImpls(withClient func(f func(c *redis.Client) (process, error)) func(context.Context) (process, error)) []impl {
	return []impl{
		{name: "fenced-nopipe", open: withClient(func(c *redis.Client) (process, error) {
			d, err := fencedredis.New(c, &fencedredis.Options{NoPipeline: true})
			if err != nil {
				return nil, err
			}
			p := newFencedProcess(d)
			return clientProcess{l: p, closers: []func() error{p.c.Close, c.Close}}, nil
		})},
		{name: "fenced-halfduplex", open: withClient(func(c *redis.Client) (process, error) {
			ap, err := c.AutoPipelineWithOptions(&redis.AutoPipelineOptions{MaxConcurrentBatches: 1})
			if err != nil {
				return nil, err
			}
			d, err := fencedredis.New(ap, nil) // not a *redis.Client: no pipeline of its own
			if err != nil {
				return nil, err
			}
			p := newFencedProcess(d)
			return clientProcess{l: p, closers: []func() error{p.c.Close, ap.Close, c.Close}}, nil
		})},
	}
}

// redsyncHolder holds redsync mutexes and extends each one every period.
type redsyncHolder struct {
	rs *redsync.Redsync
	c  *redis.Client
	*refresher
}

func (h *redsyncHolder) acquire(ctx context.Context, key string, ttl time.Duration) error {
	m := h.rs.NewMutex(key, redsync.WithExpiry(ttl), redsync.WithTries(1))
	if err := m.LockContext(ctx); err != nil {
		return err
	}
	h.add(
		func(ctx context.Context) error { return okErr(m.ExtendContext(ctx)) },
		func(ctx context.Context) error { return okErr(m.UnlockContext(ctx)) })
	return nil
}
func (h *redsyncHolder) close() { h.c.Close() }

// redislockHolder holds redislock locks and refreshes each one every
// period.
type redislockHolder struct {
	rl *redislock.Client
	c  *redis.Client
	*refresher
}

func (h *redislockHolder) acquire(ctx context.Context, key string, ttl time.Duration) error {
	l, err := h.rl.Obtain(ctx, key, ttl, nil)
	if err != nil {
		return err
	}
	h.add(
		func(ctx context.Context) error { return l.Refresh(ctx, ttl, nil) },
		l.Release)
	return nil
}
func (h *redislockHolder) close() { h.c.Close() }

// redlockBackend is five redis-servers: fenced's Redlock against redsync
// over five pools. Neither has a fence; the requests are summed over the
// five servers.
func redlockBackend(tb *testenv.MainTB) *backend {
	var addrs []string
	for range 5 {
		addrs = append(addrs, testenv.StartRedis(tb, testenv.RedisConfig{}).Addr())
	}
	impls := redlockImpls(addrs)
	return &backend{name: "redlock", impls: impls, count: redisCommands(addrs), spawn: spawnSpec{Set: "redlock", Args: addrs},
		note: "5 redis-servers, appendfsync always; no fence on either side"}
}

// redlockImpls are the implementations on the five redis-servers addrs.
func redlockImpls(addrs []string) []impl {
	clients := func() ([]*redis.Client, []func() error) {
		var cs []*redis.Client
		var closers []func() error
		for _, a := range addrs {
			c := newRedisClient(a)
			cs = append(cs, c)
			closers = append(closers, c.Close)
		}
		return cs, closers
	}
	impls := []impl{
		{name: "fenced", open: func(context.Context) (process, error) {
			cs, closers := clients()
			var ucs []redis.UniversalClient
			for _, c := range cs {
				ucs = append(ucs, c)
			}
			d, err := fencedredlock.New(ucs, nil)
			if err != nil {
				return nil, err
			}
			p := newFencedProcess(d)
			return clientProcess{l: p, closers: append([]func() error{p.c.Close}, closers...)}, nil
		}},
		{name: "redsync", open: func(context.Context) (process, error) {
			cs, closers := clients()
			var pools []redsyncredis.Pool
			for _, c := range cs {
				pools = append(pools, goredis.NewPool(c))
			}
			return clientProcess{l: redsyncLock(redsync.New(pools...)), closers: closers}, nil
		}},
	}
	return impls
}
