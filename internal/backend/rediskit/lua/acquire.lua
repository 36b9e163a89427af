-- The redis backend's acquire. KEYS[1] lock, KEYS[2] fence counter,
-- KEYS[3] waiter queue (only with ARGV[3] > 0); ARGV[1] owner, ARGV[2]
-- ttl ms, ARGV[3] how many subscriptions to the key the caller's process
-- has open (absent: none), ARGV[4] the queue entry's slack in ms, ARGV[5]
-- the caller process's member in the queue. The waiter queue is a sorted set of the
-- processes with waiters for the key, each scored with the time (server
-- clock, ms) until which it stands; the release wakes the one that has
-- stood longest (see release_waiters.lua).
-- A new grant's reply is its fence alone, as a string; any other reply
-- is held's.
-- A caller with no waiters that found the key free was granted in
-- acquire_free.lua, which runs first.
local here = tonumber(ARGV[3] or '0')
local v = redis.call('GET', KEYS[1])
if v then
  local r = held(v)
  if r[1] == 0 and here > 0 then
    -- A refusal seen by a process with waiters (see stand_refused).
    local keep = tonumber(ARGV[2])
    if r[3] > 0 then keep = r[3] end
    stand_refused(KEYS[3], ARGV[5], keep, tonumber(ARGV[4]), KEYS[1])
  end
  return r
end
-- Free, and the caller has waiters: read the queue before writing, so
-- that a queue key of another type fails the script with nothing
-- changed.
queue_score(KEYS[3], ARGV[5])
local f = string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('SET', KEYS[1], f .. ':' .. ARGV[1], 'PX', ARGV[2])
granted_waiter(KEYS[3], ARGV[5], tonumber(ARGV[2]), tonumber(ARGV[4]))
return f
