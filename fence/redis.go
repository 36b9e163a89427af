package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/fenced-dev/fenced"
)

// DefaultRedisKeyField names the hash field in which the Redis guard
// records the lease key a hash is bound to.
const DefaultRedisKeyField = "fence_key"

// Redis guards resources stored as Redis hashes. The hash itself records
// the newest fence, its owner and the lease key they belong to (fields
// "fence", "fence_owner" and "fence_key" by default) and a Lua script
// compares and writes in one atomic step, so no other command can run in
// between.
//
// The first admitted write binds a hash to its token's lease key; a token
// for any other key is then refused with ErrWrongKey whatever its fence,
// because fences are only comparable within one key. A hash written before
// guards recorded the key (no key field) is bound by its next admitted
// write. RedisOptions.LeaseKey also checks the key before the first write.
//
// Never delete or expire a guarded hash: that would forget its fence and
// accept the next stale write. Mark it deleted with a field instead.
//
// Fences are compared as canonical decimal strings inside the script, not
// as Lua numbers, which lose precision above 2^53.
type Redis struct {
	c                                redis.Scripter
	fenceField, ownerField, keyField string
	checks                           tokenChecks
	hooks                            fenced.Hooks
}

// RedisOptions configure a Redis guard. nil gives the defaults.
type RedisOptions struct {
	// FenceField, OwnerField and KeyField name the hash fields recording
	// the newest fence, its owner and the lease key; defaults "fence",
	// "fence_owner" and "fence_key". They must differ.
	FenceField, OwnerField, KeyField string
	// LeaseKey, when set, returns the lease key that guards the hash named
	// by its argument (for example "invoice:" + id for "invoices/" + id);
	// a token for another key is refused with ErrWrongKey before anything
	// is sent, even to a hash not yet bound.
	LeaseKey func(hash string) string
	// Check, when set, must accept every token before it is compared (for
	// example a *Verifier for signed tokens); a refusal is returned as the
	// error and nothing is sent.
	Check Checker
	// Hooks receive a StaleWrite event for every refused stale write.
	Hooks fenced.Hooks
}

// NewRedis returns a guard using c (a *redis.Client, *redis.ClusterClient or
// any redis.Scripter). opts may be nil.
func NewRedis(c redis.Scripter, opts *RedisOptions) (*Redis, error) {
	if c == nil {
		return nil, errors.New("fence: NewRedis: client is nil")
	}
	g := &Redis{c: c, fenceField: DefaultFenceColumn, ownerField: DefaultOwnerColumn, keyField: DefaultRedisKeyField}
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
		g.checks = tokenChecks{leaseKey: opts.LeaseKey, check: opts.Check}
		g.hooks = opts.Hooks
	}
	if g.fenceField == g.ownerField || g.fenceField == g.keyField || g.ownerField == g.keyField {
		return nil, fmt.Errorf("fence: NewRedis: %w: fence, owner and key fields must differ (%q, %q, %q)", ErrSchema, g.fenceField, g.ownerField, g.keyField)
	}
	return g, nil
}

// RedisWrite is a guarded change to a hash.
type RedisWrite struct {
	// Set lists field, value pairs to store (HSET). It must not name the
	// guard's fence, owner or key fields.
	Set []string
	// If lists field, value pairs that must all hold for the write to apply;
	// a missing field equals "". When one does not hold the result is
	// PreconditionFailed.
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
func (g *Redis) Claim(ctx context.Context, key string, t Token) (Result, error) {
	return g.Write(ctx, key, t, RedisWrite{})
}

// Write applies w to the hash at key in one script if the hash is bound to
// t's lease key (or to none yet), its recorded fence admits t (newer, or
// equal with the same owner) and w.If holds, recording t's fence, owner and
// key. A missing hash has fence 0. Errors: ErrInvalidToken for a bad token
// or malformed pairs, ErrWrongKey for a token of another lease key, the
// Checker's error when it refuses t, ErrSchema when the fence field holds
// something that is not a fence, and Redis errors (a key of another type,
// connection failures) wrapped. On every error nothing is changed.
func (g *Redis) Write(ctx context.Context, key string, t Token, w RedisWrite) (Result, error) {
	if key == "" {
		return Result{}, fmt.Errorf("fence: redis write: key is empty")
	}
	if err := g.checks.run(ctx, key, t); err != nil {
		return Result{}, fmt.Errorf("fence: redis write %q: %w", key, err)
	}
	if len(w.Set)%2 != 0 || len(w.If)%2 != 0 {
		return Result{}, fmt.Errorf("fence: redis write %q: %w: Set and If must be field, value pairs", key, ErrInvalidToken)
	}
	for i := 0; i < len(w.Set); i += 2 {
		if f := w.Set[i]; f == g.fenceField || f == g.ownerField || f == g.keyField {
			return Result{}, fmt.Errorf("fence: redis write %q: Set names the guard's field %q", key, f)
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
		return Result{}, fmt.Errorf("fence: redis write %q: %w", key, err)
	}
	if len(vals) != 4 {
		return Result{}, fmt.Errorf("fence: redis write %q: unexpected script reply %v", key, vals)
	}
	code, _ := vals[0].(int64)
	curS, _ := vals[1].(string)
	owner, _ := vals[2].(string)
	bound, _ := vals[3].(string)
	switch code {
	case -1:
		return Result{}, fmt.Errorf("fence: redis write %q: %w: field %s holds %q, not a fence", key, ErrSchema, g.fenceField, curS)
	case -2:
		return Result{}, fmt.Errorf("fence: redis write %q: %w", key, checkKey(bound, t.Key))
	}
	cur, err := strconv.ParseUint(curS, 10, 64)
	if err != nil {
		return Result{}, fmt.Errorf("fence: redis write %q: %w: field %s holds %q", key, ErrSchema, g.fenceField, curS)
	}
	var r Result
	switch code {
	case 1:
		r = Result{Outcome: Applied, Current: t.Fence}
	case 2:
		r = classify(t, cur, owner)
	case 3:
		r = Result{Outcome: PreconditionFailed, Current: cur}
	default:
		return Result{}, fmt.Errorf("fence: redis write %q: unexpected script outcome %d", key, code)
	}
	report(g.hooks, t, r, key)
	return r, nil
}
