// Package redisfence is the resource-side guard of package fence for data
// kept in Redis hashes: one Lua script compares the hash's recorded fence
// and writes, atomically.
//
//	guard, _ := redisfence.New(rdb, nil)
//	res, err := guard.Write(ctx, "account:1", fence.From(lease), redisfence.Write{Set: []string{"balance", "100"}})
//
// It lives in its own package so that package fence does not link
// go-redis.
package redisfence

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/fence"
)

// DefaultKeyField names the hash field in which the Redis guard
// records the lease key a hash is bound to.
const DefaultKeyField = "fence_key"

// Guard guards resources stored as Redis hashes. The hash itself records the
// newest fence, its owner and the lease key they belong to (fields "fence",
// "fence_owner" and "fence_key" by default). A Lua script compares and
// writes in one atomic step, so no other command can run in between.
//
// The first admitted write binds a hash to its token's lease key. A token
// for any other key is then refused with fence.ErrWrongKey whatever its fence,
// because fences are only comparable within one key. A hash written before
// guards recorded the key (no key field) is bound by its next admitted
// write. Options.LeaseKey also checks the key before the first write.
//
// Never delete or expire a guarded hash: that would forget its fence and
// accept the next stale write. Mark it deleted with a field instead.
//
// Fences are compared as canonical decimal strings inside the script, not
// as Lua numbers, which lose precision above 2^53.
type Guard struct {
	c                                redis.Scripter
	fenceField, ownerField, keyField string
	checks                           fence.Prechecks
	hook                             func(fenced.Event)
}

// Options configure a Redis guard. nil gives the defaults.
type Options struct {
	// FenceField, OwnerField and KeyField name the hash fields recording
	// the newest fence, its owner and the lease key; defaults "fence",
	// "fence_owner" and "fence_key". They must differ.
	FenceField, OwnerField, KeyField string
	// LeaseKey, when set, returns the lease key that guards the hash named
	// by its argument (for example "invoice:" + id for "invoices/" + id). A
	// token for another key is refused with fence.ErrWrongKey before
	// anything is sent, even to a hash not yet bound.
	LeaseKey func(hash string) string
	// Check, when set, must accept every token before it is compared (for
	// example a *fence.Verifier for signed tokens); a refusal is returned as the
	// error and nothing is sent.
	Check fence.Checker
	// Hook receives an EventStaleWrite for every refused stale write
	// (when nil, the hook of the client that issued the token).
	Hook func(fenced.Event)
}

// New returns a guard using c (a *redis.Client, *redis.ClusterClient or
// any redis.Scripter). opts may be nil.
func New(c redis.Scripter, opts *Options) (*Guard, error) {
	if c == nil {
		return nil, errors.New("fence: New: client is nil")
	}
	g := &Guard{c: c, fenceField: fence.DefaultFenceColumn, ownerField: fence.DefaultOwnerColumn, keyField: DefaultKeyField}
	if opts != nil {
		if opts.FenceField != "" {
			g.fenceField = opts.FenceField
		}
		if opts.OwnerField != "" {
			g.ownerField = opts.OwnerField
		}
		if opts.KeyField != "" {
			g.keyField = opts.KeyField
		}
		g.checks = fence.Prechecks{LeaseKey: opts.LeaseKey, Check: opts.Check}
		g.hook = opts.Hook
	}
	if g.fenceField == g.ownerField || g.fenceField == g.keyField || g.ownerField == g.keyField {
		return nil, fmt.Errorf("fence: New: %w: fence, owner and key fields must differ (%q, %q, %q)",
			fence.ErrSchema, g.fenceField, g.ownerField, g.keyField)
	}
	return g, nil
}

// Write is a guarded change to a hash.
type Write struct {
	// Set lists field, value pairs to store (HSET). It must not name the
	// guard's fence, owner or key fields.
	Set []string
	// If lists field, value pairs that must all hold for the write to apply;
	// a missing field equals "". When one does not hold the result is
	// fence.PreconditionFailed.
	If []string
}

// redisScript: KEYS[1] the hash. ARGV: fence, owner, fence field, owner
// field, key field, lease key, number of If pairs, If pairs..., Set pairs...
// Returns {outcome, current fence, current owner, bound key}: outcome 1
// applied, 2 stale, 3 precondition failed, -1 corrupt fence field, -2
// bound to another lease key.
var redisScript = redis.NewScript(`
local function cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
local cur = redis.call('HMGET', KEYS[1], ARGV[3], ARGV[4], ARGV[5])
local f = cur[1] or '0'
local o = cur[2] or ''
local k = cur[3] or ''
if not string.match(f, '^[0-9]+$') or (#f > 1 and string.sub(f, 1, 1) == '0') then
  return {-1, f, o, k}
end
if cur[3] and k ~= ARGV[6] then
  return {-2, f, o, k}
end
local c = cmp(f, ARGV[1])
if c > 0 or (c == 0 and o ~= ARGV[2]) then
  return {2, f, o, k}
end
local nif = tonumber(ARGV[7])
local i = 8
for _ = 1, nif do
  local v = redis.call('HGET', KEYS[1], ARGV[i]) or ''
  if v ~= ARGV[i + 1] then return {3, f, o, k} end
  i = i + 2
end
local set = {ARGV[3], ARGV[1], ARGV[4], ARGV[2], ARGV[5], ARGV[6]}
while i <= #ARGV do
  set[#set + 1] = ARGV[i]
  set[#set + 1] = ARGV[i + 1]
  i = i + 2
end
redis.call('HSET', KEYS[1], unpack(set))
return {1, ARGV[1], ARGV[2], ARGV[6]}
`)

// Claim records t's fence on the hash at key (creating it if needed) before
// the holder does anything else; see SQL.Claim.
func (g *Guard) Claim(ctx context.Context, key string, t fence.Token) (fence.Result, error) {
	return g.Write(ctx, key, t, Write{})
}

// Write applies w to the hash at key in one script, recording t's fence,
// owner and key. It does so only if the hash is bound to t's lease key (or
// to none yet), its recorded fence admits t (newer, or equal with the same
// owner), and w.If holds. A missing hash has fence 0. Errors:
// fence.ErrInvalidToken for a bad token or malformed pairs;
// fence.ErrWrongKey for a token of another lease key. The fence.Checker's
// error when it refuses t; fence.ErrSchema when the fence field holds
// something that is not a fence. Redis errors (a key of another type,
// connection failures) are wrapped. On every error nothing is changed.
func (g *Guard) Write(ctx context.Context, key string, t fence.Token, w Write) (fence.Result, error) {
	if key == "" {
		return fence.Result{}, fmt.Errorf("fence: redis write: key is empty")
	}
	if err := g.checks.Run(ctx, key, t); err != nil {
		return fence.Result{}, fmt.Errorf("fence: redis write %q: %w", key, err)
	}
	if len(w.Set)%2 != 0 || len(w.If)%2 != 0 {
		return fence.Result{}, fmt.Errorf("fence: redis write %q: %w: Set and If must be field, value pairs", key, fence.ErrInvalidToken)
	}
	for i := 0; i < len(w.Set); i += 2 {
		if f := w.Set[i]; f == g.fenceField || f == g.ownerField || f == g.keyField {
			return fence.Result{}, fmt.Errorf("fence: redis write %q: Set names the guard's field %q", key, f)
		}
	}
	args := make([]any, 0, 7+len(w.If)+len(w.Set))
	args = append(args, strconv.FormatUint(t.Fence, 10), t.Owner, g.fenceField, g.ownerField, g.keyField, t.Key, len(w.If)/2)
	for _, s := range w.If {
		args = append(args, s)
	}
	for _, s := range w.Set {
		args = append(args, s)
	}
	vals, err := redisScript.Run(ctx, g.c, []string{key}, args...).Slice()
	if err != nil {
		return fence.Result{}, fmt.Errorf("fence: redis write %q: %w", key, err)
	}
	if len(vals) != 4 {
		return fence.Result{}, fmt.Errorf("fence: redis write %q: unexpected script reply %v", key, vals)
	}
	code, _ := vals[0].(int64)
	curS, _ := vals[1].(string)
	owner, _ := vals[2].(string)
	bound, _ := vals[3].(string)
	switch code {
	case -1:
		return fence.Result{}, fmt.Errorf("fence: redis write %q: %w: field %s holds %q, not a fence",
			key, fence.ErrSchema, g.fenceField, curS)
	case -2:
		return fence.Result{}, fmt.Errorf("fence: redis write %q: %w", key, fence.CheckKey(bound, t.Key))
	}
	cur, err := strconv.ParseUint(curS, 10, 64)
	if err != nil {
		return fence.Result{}, fmt.Errorf("fence: redis write %q: %w: field %s holds %q", key, fence.ErrSchema, g.fenceField, curS)
	}
	var r fence.Result
	switch code {
	case 1:
		r = fence.Result{Outcome: fence.Applied, Current: t.Fence}
	case 2:
		r = fence.Refusal(t, cur, owner)
	case 3:
		r = fence.Result{Outcome: fence.PreconditionFailed, Current: cur}
	default:
		return fence.Result{}, fmt.Errorf("fence: redis write %q: unexpected script outcome %d", key, code)
	}
	fence.ReportStale(g.hook, t, r, key)
	return r, nil
}
