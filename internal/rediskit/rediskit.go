// Package rediskit holds what the redis and redlock backends share: the key
// layout, the stored value, the Lua scripts that are the same on every
// node, the classification of go-redis errors into the driver sentinels,
// the pub/sub hub that wakes waiters, and URL parsing.
package rediskit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/driver"
	"github.com/redis/go-redis/v9"
)

// DefaultPrefix starts every Redis key fenced writes.
const DefaultPrefix = "fenced:"

// Keys names the Redis keys of one lease key. All of them carry the user
// key as a hash tag ({key}), so they live in one Cluster hash slot and one
// script may touch them together. A user key containing braces still works:
// every name shares the same text up to the first '}' after the first '{'.
type Keys struct {
	Lock    string // the grant: value "<fence>:<owner>", expiry PX
	Fence   string // the fence counter, never expires
	Audit   string // capped stream of breaks
	Channel string // pub/sub channel published on release and break
}

// Layout maps lease keys to Redis keys under a prefix.
type Layout struct{ Prefix string }

const (
	lockSuffix  = "}:lock"
	auditSuffix = "}:breaks"
)

// Keys returns the Redis keys for lease key k.
func (l Layout) Keys(k string) Keys {
	base := l.Prefix + "{" + k
	return Keys{Lock: base + lockSuffix, Fence: base + "}:fence", Audit: base + auditSuffix, Channel: base + "}:free"}
}

// LockPattern is a SCAN MATCH pattern for the lock keys of lease keys
// starting with prefix.
func (l Layout) LockPattern(prefix string) string {
	return GlobEscape(l.Prefix+"{"+prefix) + "*" + GlobEscape(lockSuffix)
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
	return name[len(p) : len(name)-len(suffix)], true
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
	return strconv.FormatUint(fence, 10) + ":" + owner
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
	return fmt.Errorf("%w (key %q; inspect it with redis-cli and remove it yourself if it is stale, or use another key prefix)", ErrForeignValue, redisKey)
}

// ForeignReply returns err, a script's error, as an error matching
// ErrForeignValue naming keys when the server's reply says that one of
// them holds something fenced did not write (a key of the wrong type, a
// fence counter that is not a number), and nil for any other error.
func ForeignReply(err error, keys ...string) error {
	msg := err.Error()
	if !strings.Contains(msg, "WRONGTYPE") && !strings.Contains(msg, "not an integer") {
		return nil
	}
	return fmt.Errorf("%w (keys %s; server said: %s)", ErrForeignValue, strings.Join(keys, ", "), msg)
}

// Status codes returned by the scripts.
const (
	StatusForeign = -1 // the lock key holds a foreign value
	StatusHeld    = 0  // held by another owner
	StatusGranted = 1  // new grant
	StatusAgain   = 2  // already held by this owner: extended
	StatusStale   = -3 // redlock: a newer fence was granted on this node
	// StatusBadReply is what ParseAcquire reports for a reply that is not
	// {status, fence, pttl}; it counts as none of the above.
	StatusBadReply = -100
)

// acquireHead is the start of every acquire script: KEYS[1] is the lock,
// ARGV[1] the owner, ARGV[2] the TTL in ms. A key held by a value fenced
// did not write is refused ({-1, '0', pttl}); a grant of the same owner is
// extended and keeps its fence ({2, fence, 0}); another owner's grant is
// reported with its time left ({0, fence, pttl}). When the key is free the
// script goes on with the backend's own grant step.
const acquireHead = `
local v = redis.call('GET', KEYS[1])
if v then
  local f, o = string.match(v, '^(%d+):(.*)$')
  if not f then return {-1, '0', redis.call('PTTL', KEYS[1])} end
  if o == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {2, f, 0}
  end
  return {0, f, redis.call('PTTL', KEYS[1])}
end`

// AcquireScript returns an acquire script: the shared head (see the
// statuses above), then grant, the Lua that grants the free key and
// returns {StatusGranted, fence, 0} (or another status).
func AcquireScript(grant string) *redis.Script { return redis.NewScript(acquireHead + grant) }

// Acquired is the reply of an acquire script.
type Acquired struct {
	Status int64
	Fence  uint64
	PTTL   int64 // ms left on another owner's grant
}

// Ours reports whether the reply grants the key to the caller (new, or
// extended).
func (a Acquired) Ours() bool { return a.Status == StatusGranted || a.Status == StatusAgain }

// ParseAcquire reads an acquire script's reply; a reply of another shape
// has Status StatusBadReply.
func ParseAcquire(res []any) Acquired {
	if len(res) != 3 {
		return Acquired{Status: StatusBadReply}
	}
	var a Acquired
	a.Status, _ = res[0].(int64)
	s, _ := res[1].(string)
	a.Fence, _ = strconv.ParseUint(s, 10, 64)
	a.PTTL, _ = res[2].(int64)
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

// RenewAll renews every grant of grants (each for its TTL) on c in one pipeline of Renew
// scripts: one round trip (on Cluster, one per node involved). If the
// server does not know the script (NOSCRIPT) it loads it and sends the
// pipeline again (renewing twice is harmless). It fails as a whole, with
// the error classified (see Classify), when the script cannot be loaded or
// the connection fails: then each renewal may or may not have been
// applied.
func RenewAll(ctx context.Context, c redis.UniversalClient, l Layout, grants []driver.Grant) ([]RenewReply, error) {
	run := func() []*redis.Cmd {
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, len(grants))
		for i, g := range grants {
			k := l.Keys(g.Key)
			cmds[i] = Renew.EvalSha(ctx, pipe, []string{k.Lock}, Value(g.Fence, g.Owner), Millis(g.TTL))
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		return cmds
	}
	cmds := run()
	if len(cmds) > 0 && redis.HasErrorPrefix(cmds[0].Err(), "NOSCRIPT") {
		if err := Renew.Load(ctx, c).Err(); err != nil {
			return nil, Classify(err, false)
		}
		cmds = run()
	}
	out := make([]RenewReply, len(cmds))
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		var rerr redis.Error
		if err != nil && !errors.As(err, &rerr) {
			// The connection failed: the whole batch's outcome is unknown.
			return nil, Classify(err, true)
		}
		out[i] = RenewReply{Renewed: err == nil && n == 1, Err: err}
	}
	return out, nil
}

// The scripts shared by both backends. KEYS and ARGV are documented above
// each; every script reads before it writes, so an error (a key of the
// wrong type, a counter that is not a number) leaves nothing changed.
var (
	// Renew: KEYS[1] lock; ARGV[1] value, ARGV[2] ttl ms. Returns 1 if the
	// value matched and the expiry was reset, else 0.
	Renew = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

	// Release: KEYS[1] lock; ARGV[1] value, ARGV[2] channel. Deletes the
	// lock if the value matches and wakes waiters. Returns 1 or 0.
	Release = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0`)

	// ReleaseOwner: KEYS[1] lock; ARGV[1] owner, ARGV[2] channel. Deletes
	// the lock if the owner matches whatever the fence (redlock's cleanup
	// after a failed attempt, whose fence a node may not have seen).
	ReleaseOwner = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then
  local f, o = string.match(v, '^(%d+):(.*)$')
  if o == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], '')
    return 1
  end
end
return 0`)

	// Inspect: KEYS[1] lock, KEYS[2] fence. Returns {value|false, pttl,
	// counter|false}.
	Inspect = redis.NewScript(`
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}`)

	// Break: KEYS[1] lock, KEYS[2] audit; ARGV[1] channel, ARGV[2] reason,
	// ARGV[3] by, ARGV[4] audit length. Deletes whatever grant exists,
	// appends to the capped audit stream and wakes waiters. Returns {0}
	// when free, {-1} for a foreign value, else {1, fence, short owner,
	// pttl, stream id}.
	Break = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return {0} end
local f, o = string.match(v, '^(%d+):(.*)$')
if not f then return {-1} end
local full = o
if #o > 8 then o = string.sub(o, 1, 8) .. '…' end
local pttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[4], '*', 'fence', f, 'owner', o, 'reason', ARGV[2], 'by', ARGV[3])
redis.call('PUBLISH', ARGV[1], '')
return {1, f, o, pttl, id, full}`)
)

// Classify maps a go-redis error to the driver's sentinels by
// driver.Classify with classifyRedis, the hook of both Redis backends.
// mayApply says whether the command could have been applied by the server
// when the connection failed after sending it (false for reads).
func Classify(err error, mayApply bool) error { return driver.Classify(err, mayApply, classifyRedis) }

// classifyRedis is the Redis backends' driver.Classifier. Server replies
// that refuse the command before running it (loading, busy, read-only
// replica, cluster down, authentication) match ErrUnavailable; other
// server errors are returned as they are, with their message, for the
// caller to wrap. A failed dial or an exhausted pool sent nothing; any
// other failure of the connection may have come after the command was
// sent.
func classifyRedis(err error) error {
	if errors.Is(err, redis.ErrClosed) {
		return driver.ErrClosed
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "MOVED", "ASK"} {
			if strings.HasPrefix(msg, p) {
				return driver.ErrUnavailable
			}
		}
		if strings.HasPrefix(msg, "NOAUTH") || strings.HasPrefix(msg, "WRONGPASS") {
			return fmt.Errorf("%w: authentication failed", driver.ErrUnavailable)
		}
		return nil
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return driver.ErrUnavailable
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return driver.ErrUnavailable
	}
	return driver.ErrUnknownOutcome
}

// IsTransport reports whether err (as returned by Classify) means the
// server could not be reached or did not answer.
func IsTransport(err error) bool {
	return errors.Is(err, driver.ErrUnavailable) || errors.Is(err, driver.ErrUnknownOutcome) || errors.Is(err, driver.ErrClosed)
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
// PEXPIRE) by the one TTL rounding rule (driver.TTLUnits): rounded up, so
// a grant never ends before the holder's local validity.
func Millis(ttl time.Duration) int64 { return driver.TTLUnits(ttl, time.Millisecond) }

// PTTL converts a PTTL reply to a duration (zero for none or unknown).
func PTTL(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}
