// Package rediskit holds what the redis and redlock backends share: the key
// layout, the stored value, the Lua scripts of both (files of lua/,
// embedded), the classification of go-redis errors into the driver
// sentinels, the pub/sub hub that wakes waiters, and URL parsing.
package rediskit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/backend/errclass"
	"github.com/fenced-dev/fenced/internal/core/ttlrule"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix starts every Redis key fenced writes.
const DefaultPrefix = "fenced:"

// Keys names the Redis keys of one lease key. All of them carry the user
// key as a hash tag ({key}). So they live in one Cluster hash slot, and one
// script may touch them together. A user key containing braces still works.
// Redis Cluster hashes the text between the first '{' of a name and the
// next '}'. That first '{' is the one after the prefix, which has no
// braces, so every name of a key shares that text. The one exception is a
// key that starts with '}', whose tag would be empty (Redis then hashes
// each whole name); see Layout.Cluster.
type Keys struct {
	Lock    string // the grant: value "<fence>:<owner>", expiry PX
	Fence   string // the fence counter, never expires
	Audit   string // capped stream of breaks
	Channel string // pub/sub channel published on release and break
	// Claim, where the backend uses it (redlock), names the last grant
	// attempt of the owner whose grant is on the node, and never expires;
	// see lua/redlock_acquire.lua.
	Claim string
	// Waiters, where the backend uses it (redis), is the key's waiter
	// queue: the processes (hub ids) with waiters for it, each until a
	// time. A refused try of a process with waiters enters it, and a
	// release wakes the first on its own channel (Channel + ":" + id).
	// See lua/waiter_queue.lua.
	Waiters string
	// Observed, where the backend uses it (redis), is present while some
	// process observes the key (driver.ObserveNotifier), each refreshing
	// its expiry: a release that wakes no waiter publishes on Channel only
	// then, so a lone release pays no PUBLISH.
	Observed string
}

// Layout maps lease keys to Redis keys under a prefix.
type Layout struct {
	Prefix string
	// Cluster says that the keys live on a Redis Cluster. There a lease
	// key that starts with '}' is written after a space inside the
	// braces (PREFIX{ }a}:lock for "}a"), so that its names share the
	// hash tag " " and one slot. No lease key starts with a space, so the
	// name is no other key's. Elsewhere such a key keeps the plain
	// layout it always had (PREFIX{}a}:lock): a standalone server hashes
	// nothing, and moving its keys would restart its fence counter.
	Cluster bool
}

// clusterEscape is what a Cluster layout writes before a lease key that
// starts with '}' (see Layout.Cluster).
const clusterEscape = " "

// open returns what follows the prefix and '{' in the names of lease key
// k (or of keys starting with k, for patterns).
func (l Layout) open(k string) string {
	if l.Cluster && strings.HasPrefix(k, "}") {
		return "{" + clusterEscape
	}
	return "{"
}

// CheckPrefix applies the Redis backends' rule for key prefixes, the one
// place redis and redlock check them. Any bytes are allowed but { and } and
// control characters. Every key of a lease is PREFIX{KEY}:..., and Redis
// Cluster hashes the first {...} of a name. So a brace in the prefix would
// scatter a lease's keys over slots its scripts cannot reach at once.
// Control characters are refused because redis-cli and logs cannot show
// them. Errors match fenced.ErrInvalidURL and name the prefix and the rule.
func CheckPrefix(prefix string) error {
	if i := strings.IndexFunc(prefix, func(r rune) bool { return r == '{' || r == '}' || r < 0x20 || r == 0x7f }); i >= 0 {
		return fmt.Errorf("%w: key prefix %q has %q at byte %d: a prefix may not contain { or } (hash tag) or control characters",
			fenced.ErrInvalidURL, prefix, prefix[i:i+1], i)
	}
	return nil
}

const (
	lockSuffix  = "}:lock"
	auditSuffix = "}:breaks"
)

const (
	fenceSuffix    = "}:fence"
	channelSuffix  = "}:free"
	waitersSuffix  = "}:waitq"
	claimSuffix    = "}:claim"
	observedSuffix = "}:observed"
)

// Keys returns the Redis keys for lease key k. Every name is a slice of one
// string built in one allocation. Keys runs twice per acquire and release
// pair, on the path whose cost is measured against the incumbents.
func (l Layout) Keys(k string) Keys {
	open := l.open(k)
	base := len(l.Prefix) + len(open) + len(k)
	var b strings.Builder
	b.Grow(7*base + len(lockSuffix) + len(fenceSuffix) + len(auditSuffix) + len(channelSuffix) + len(waitersSuffix) + len(claimSuffix) +
		len(observedSuffix))
	name := func(suffix string) (start, end int) {
		start = b.Len()
		b.WriteString(l.Prefix)
		b.WriteString(open)
		b.WriteString(k)
		b.WriteString(suffix)
		return start, b.Len()
	}
	lock0, lock1 := name(lockSuffix)
	fence0, fence1 := name(fenceSuffix)
	audit0, audit1 := name(auditSuffix)
	chan0, chan1 := name(channelSuffix)
	wait0, wait1 := name(waitersSuffix)
	claim0, claim1 := name(claimSuffix)
	obs0, obs1 := name(observedSuffix)
	s := b.String()
	return Keys{Lock: s[lock0:lock1], Fence: s[fence0:fence1], Audit: s[audit0:audit1], Channel: s[chan0:chan1], Waiters: s[wait0:wait1],
		Claim: s[claim0:claim1], Observed: s[obs0:obs1]}
}

// Lock returns the lock key of lease key k alone (Keys(k).Lock, without
// building the other names), for batches of many keys.
func (l Layout) Lock(k string) string { return l.Prefix + l.open(k) + k + lockSuffix }

// LockPattern is a SCAN MATCH pattern for the lock keys of lease keys
// starting with prefix.
func (l Layout) LockPattern(prefix string) string {
	return GlobEscape(l.Prefix+l.open(prefix)+prefix) + "*" + GlobEscape(lockSuffix)
}

// AuditPattern is a SCAN MATCH pattern for every audit stream.
func (l Layout) AuditPattern() string {
	return GlobEscape(l.Prefix+"{") + "*" + GlobEscape(auditSuffix)
}

// KeyOfLock returns the lease key of a lock key, or false if name is not one.
func (l Layout) KeyOfLock(name string) (string, bool) {
	return l.cut(name, lockSuffix)
}

// KeyOfAudit returns the lease key of an audit stream name.
func (l Layout) KeyOfAudit(name string) (string, bool) {
	return l.cut(name, auditSuffix)
}

func (l Layout) cut(name, suffix string) (string, bool) {
	p := l.Prefix + "{"
	if !strings.HasPrefix(name, p) || !strings.HasSuffix(name, suffix) || len(name) < len(p)+len(suffix)+1 {
		return "", false
	}
	k := name[len(p) : len(name)-len(suffix)]
	if strings.HasPrefix(k, clusterEscape+"}") {
		k = k[len(clusterEscape):] // a Cluster layout's (see Layout.Cluster)
	}
	return k, true
}

// GlobEscape escapes the characters special to Redis glob patterns.
func GlobEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\', '^', '-':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Value is the stored value of a grant: the fence, a colon, the owner.
// Scripts compare it whole, so renew and release check owner and fence.
func Value(fence uint64, owner string) string {
	var b strings.Builder // one allocation
	b.Grow(20 + 1 + len(owner))
	var digits [20]byte
	b.Write(strconv.AppendUint(digits[:0], fence, 10))
	b.WriteByte(':')
	b.WriteString(owner)
	return b.String()
}

// ParseValue splits a stored value; ok is false for a value fenced did not
// write.
func ParseValue(v string) (fence uint64, owner string, ok bool) {
	i := strings.IndexByte(v, ':')
	if i <= 0 {
		return 0, "", false
	}
	f, err := strconv.ParseUint(v[:i], 10, 64)
	if err != nil {
		return 0, "", false
	}
	return f, v[i+1:], true
}

// ErrForeignValue means a Redis key in fenced's namespace holds something
// fenced did not write. fenced never deletes or overwrites it.
var ErrForeignValue = errors.New("redis key holds a value fenced did not write; refusing to touch it")

// ForeignError reports a foreign value at a Redis key.
func ForeignError(redisKey string) error {
	return fmt.Errorf("%w (key %q; inspect it with redis-cli and remove it yourself if it is stale, or use another key prefix)",
		ErrForeignValue, redisKey)
}

// ForeignReply returns err, a script's error, as an error matching
// ErrForeignValue naming keys. It does so when the server's reply says that
// one of them holds something fenced did not write: a key of the wrong
// type, or a fence counter that is not a number. It returns nil for any
// other error. A waiter queue of another type is named alone: the scripts'
// error names it (lua/waiter_queue.lua).
func ForeignReply(err error, keys ...string) error {
	msg := err.Error()
	if !strings.Contains(msg, "WRONGTYPE") && !strings.Contains(msg, "not an integer") {
		return nil
	}
	if i := strings.Index(msg, foreignQueue); i >= 0 {
		what := msg[i:]
		if j := strings.Index(what, " script: "); j >= 0 {
			what = what[:j] // the server's note of the script and line
		}
		return fmt.Errorf("%w (%s; waits and releases on this key fail until it is gone: "+
			"remove it with redis-cli if stale, or use another prefix)", ErrForeignValue, strings.TrimSuffix(what, "."))
	}
	return fmt.Errorf("%w (keys %s; server said: %s)", ErrForeignValue, strings.Join(keys, ", "), msg)
}

// foreignQueue starts the scripts' error for a waiter queue of another
// type (lua/waiter_queue.lua's foreign_queue).
const foreignQueue = "waiter queue "

// Status codes returned by the scripts.
const (
	StatusForeign = -1 // the lock key holds a foreign value
	StatusHeld    = 0  // held by another owner
	StatusGranted = 1  // new grant
	StatusAgain   = 2  // already held by this owner: extended
	StatusStale   = -3 // redlock: a newer fence was granted on this node
	// StatusSuperseded is redlock's refusal of an attempt older than the
	// latest attempt of the same owner on the node (lua/redlock_acquire.lua).
	StatusSuperseded = -4
	// StatusBadReply is what ParseAcquire reports for a reply that is not
	// {status, fence, pttl}; it counts as none of the above.
	StatusBadReply = -100
)

// Acquired is the reply of an acquire script.
type Acquired struct {
	Status int64
	Fence  uint64
	PTTL   int64 // ms left on another owner's grant
}

// Ours reports whether the reply grants the key to the caller (new, or
// extended).
func (a Acquired) Ours() bool { return a.Status == StatusGranted || a.Status == StatusAgain }

// ParseAcquire reads an acquire script's reply. A fence alone (a string) is
// a new grant; anything else is {status, fence, pttl}. A reply of another
// shape has Status StatusBadReply.
func ParseAcquire(res any) Acquired {
	if s, ok := res.(string); ok {
		f, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return Acquired{Status: StatusBadReply}
		}
		return Acquired{Status: StatusGranted, Fence: f}
	}
	r, ok := res.([]any)
	if !ok || len(r) != 3 {
		return Acquired{Status: StatusBadReply}
	}
	var a Acquired
	a.Status, _ = r[0].(int64)
	s, _ := r[1].(string)
	a.Fence, _ = strconv.ParseUint(s, 10, 64)
	a.PTTL, _ = r[2].(int64)
	return a
}

// RenewReply is one request's outcome in RenewAll.
type RenewReply struct {
	// Renewed is true when the grant was still there and its expiry reset.
	Renewed bool
	// Err is the server's error for this request alone (a redis.Error
	// such as WRONGTYPE, LOADING or OOM), unclassified.
	Err error
}

// RenewChunk is how many grants one call of the RenewMany script renews. A
// period's renewal of M leases costs M/RenewChunk script calls. A script
// blocks the server while it runs. Measured on a loaded 2-core machine
// (bench/redis BenchmarkRenewalPeriod), a call of 256 grants took 0.9 to 2
// ms. That is the longest other clients wait behind it. Each of the M
// single-grant scripts it replaces took 7 to 9 µs.
const RenewChunk = 256

// RenewAll renews every grant of grants (each for its TTL) on c in one
// pipeline of batch scripts, RenewChunk grants per script. That is one
// round trip (on Cluster, one per node involved). On a Cluster client the
// grants are grouped by the primary that serves their slot. They are
// renewed by RenewManyAcross, which may touch keys of many slots of its
// node. Some grants it may not renew there: a slot moved, or a server older
// than Redis 7 lacks script flags. Those are renewed again by RenewMany,
// whose keys share one slot, in a second round trip. If the server does not
// know a script (NOSCRIPT), RenewAll loads it and sends the pipeline again.
// Renewing twice is harmless. It fails as a whole when a script cannot be
// loaded or the connection fails, with the error classified (see Classify).
// Then each renewal may or may not have been applied. A server error may
// refuse one script call (LOADING, BUSY, OOM) or one key (a key of another
// type). It is then the Err of each grant concerned: its outcome is
// unknown, never a refusal.
func RenewAll(ctx context.Context, c redis.UniversalClient, l Layout, grants []driver.Grant) ([]RenewReply, error) {
	out := make([]RenewReply, len(grants))
	locks := make([]string, len(grants))
	todo := make([]int, len(grants))
	for i, g := range grants {
		locks[i], todo[i] = l.Lock(g.Key), i
	}
	cc, cluster := c.(*redis.ClusterClient)
	if cluster {
		var err error
		if todo, err = runRenewals(ctx, c, RenewManyAcross, nodeChunks(ctx, cc, locks, grants), out); err != nil {
			return nil, err
		}
	}
	if len(todo) > 0 {
		if _, err := runRenewals(ctx, c, RenewMany, slotChunks(cluster, locks, grants, todo), out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// renewChunk is one call of a batch renew script: its keys and arguments,
// and the positions in the batch of the grants it renews.
type renewChunk struct {
	keys  []string
	args  []any
	index []int
}

// slotChunks splits the grants at positions todo into RenewMany calls of
// at most RenewChunk grants; with cluster, each call's keys share one hash
// slot.
func slotChunks(cluster bool, locks []string, grants []driver.Grant, todo []int) []renewChunk {
	var chunks []renewChunk
	open := map[uint16]int{} // slot → index of its chunk with room left
	for _, i := range todo {
		var slot uint16
		if cluster {
			slot = HashSlot(locks[i])
		}
		at, ok := open[slot]
		if !ok || len(chunks[at].index) == RenewChunk {
			chunks = append(chunks, renewChunk{})
			at = len(chunks) - 1
			open[slot] = at
		}
		ch := &chunks[at]
		ch.keys = append(ch.keys, locks[i])
		ch.args = append(ch.args, Value(grants[i].Fence, grants[i].Owner), Millis(grants[i].TTL))
		ch.index = append(ch.index, i)
	}
	return chunks
}

// nodeChunks splits grants into RenewManyAcross calls of at most
// RenewChunk grants whose slots the same primary serves (as the client's
// slot map says): the first lock is the call's one declared key, which
// routes it; every lock, value and TTL is an argument.
func nodeChunks(ctx context.Context, cc *redis.ClusterClient, locks []string, grants []driver.Grant) []renewChunk {
	var chunks []renewChunk
	open := map[string]int{} // node address → index of its chunk with room left
	for i := range grants {
		node := ""
		if n, err := cc.MasterForKey(ctx, locks[i]); err == nil {
			node = n.Options().Addr
		} // else: the chunk of unknown nodes; go-redis routes it by its first key
		at, ok := open[node]
		if !ok || len(chunks[at].index) == RenewChunk {
			chunks = append(chunks, renewChunk{keys: []string{locks[i]}})
			at = len(chunks) - 1
			open[node] = at
		}
		ch := &chunks[at]
		ch.args = append(ch.args, locks[i], Value(grants[i].Fence, grants[i].Owner), Millis(grants[i].TTL))
		ch.index = append(ch.index, i)
	}
	return chunks
}

// runRenewals sends chunks through s in one pipeline and writes each
// grant's outcome into out. It returns the positions of the grants whose
// outcome is an error (of the whole call or of the grant alone), or an
// error when the connection failed.
func runRenewals(ctx context.Context, c redis.UniversalClient, s *redis.Script, chunks []renewChunk, out []RenewReply) ([]int, error) {
	run := func() []*redis.Cmd {
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, len(chunks))
		for i, ch := range chunks {
			cmds[i] = s.EvalSha(ctx, pipe, ch.keys, ch.args...)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		return cmds
	}
	cmds := run()
	for _, cmd := range cmds {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			if err := s.Load(ctx, c).Err(); err != nil {
				return nil, Classify(err, false)
			}
			cmds = run()
			break
		}
	}
	var failed []int
	for i, cmd := range cmds {
		ch := chunks[i]
		res, err := cmd.Slice()
		var rerr redis.Error
		if err != nil && !errors.As(err, &rerr) {
			// The connection failed: the whole batch's outcome is unknown.
			return nil, Classify(err, true)
		}
		if err == nil && len(res) != len(ch.index) {
			err = fmt.Errorf("renew script returned %d results for %d grants", len(res), len(ch.index))
		}
		for j, at := range ch.index {
			r := RenewReply{Err: err}
			if err == nil {
				switch v := res[j].(type) {
				case int64:
					r = RenewReply{Renewed: v == 1}
				case string:
					// The server's error on this key alone (WRONGTYPE,
					// or a key of a slot this node does not serve).
					r = RenewReply{Err: serverError(v)}
				default:
					r = RenewReply{Err: fmt.Errorf("renew script: unexpected result %v", v)}
				}
			}
			out[at] = r
			if r.Err != nil {
				failed = append(failed, at)
			}
		}
	}
	return failed, nil
}

// serverError is an error the server reported inside a script's result
// (as a string, since a script cannot return an error for one element).
// It is a redis.Error, as the same error in a reply of its own would be.
type serverError string

func (e serverError) Error() string { return string(e) }

// RedisError marks serverError as a server reply (redis.Error).
func (e serverError) RedisError() {}

// HashSlot is the Redis Cluster hash slot of key, modulo 16384. It is the
// CRC16 (XMODEM) of its hash tag, or of the whole key. The hash tag is the
// text between the first '{' and the next '}', when not empty.
func HashSlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// Classify maps a go-redis error to the driver's sentinels by
// errclass.Wrap with classifyRedis, the hook of both Redis backends.
// mayApply says whether the command could have been applied by the server
// when the connection failed after sending it (false for reads).
func Classify(err error, mayApply bool) error { return errclass.Wrap(err, mayApply, classifyRedis) }

// classifyRedis is the Redis backends' errclass.Func. Server replies
// that refuse the command before running it (loading, busy, read-only
// replica, cluster down, authentication) match ErrUnavailable; other
// server errors are returned as they are, with their message, for the
// caller to wrap. A failed dial or an exhausted pool sent nothing; any
// other failure of the connection may have come after the command was
// sent.
func classifyRedis(err error) error {
	if errors.Is(err, redis.ErrClosed) {
		return fenced.ErrClosed
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "MOVED", "ASK"} {
			if strings.HasPrefix(msg, p) {
				return fenced.ErrUnavailable
			}
		}
		if strings.HasPrefix(msg, "NOAUTH") || strings.HasPrefix(msg, "WRONGPASS") {
			return fmt.Errorf("%w: authentication failed", fenced.ErrUnavailable)
		}
		return nil
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fenced.ErrUnavailable
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return fenced.ErrUnavailable
	}
	return fenced.ErrUnknownOutcome
}

// IsTransport reports whether err (as returned by Classify) means the
// server could not be reached or did not answer.
func IsTransport(err error) bool {
	return errors.Is(err, fenced.ErrUnavailable) || errors.Is(err, fenced.ErrUnknownOutcome) || errors.Is(err, fenced.ErrClosed)
}

// Ping checks that a client reaches its server and authenticates, with a
// clear error naming addr (never the password).
func Ping(ctx context.Context, c redis.UniversalClient, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		msg := err.Error()
		if strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "invalid password") {
			return fmt.Errorf("redis at %s: authentication failed (wrong or missing password): %s", addr, msg)
		}
		return fmt.Errorf("redis at %s unreachable: %w", addr, Classify(err, false))
	}
	return nil
}

// Millis converts a TTL to the whole milliseconds Redis counts in (PX,
// PEXPIRE). It uses the one TTL rounding rule (ttlrule.Units): rounded
// up. So a grant never ends before the holder's local validity.
func Millis(ttl time.Duration) int64 { return ttlrule.Units(ttl, time.Millisecond) }

// PTTL converts a PTTL reply to a duration (zero for none or unknown).
func PTTL(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}
