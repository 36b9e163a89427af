-- The redis backend's acquire. KEYS[1] lock, KEYS[2] fence counter,
-- KEYS[3] waiters mark (only with ARGV[3] > 0); ARGV[1] owner, ARGV[2]
-- ttl ms, ARGV[3] how many subscriptions to the key the caller's process
-- has open (absent: none), ARGV[4] the waiters mark's slack in ms.
-- A new grant's reply is its fence alone, as a string; any other reply
-- is held's.
local here = tonumber(ARGV[3] or '0')
if here == 0 then
  -- Most likely free: INCR and SET NX, two commands. The increment is
  -- taken back if the lock was there, so the counter counts grants only
  -- (and a counter that is not a number fails before anything changed).
  local n = redis.call('INCR', KEYS[2])
  local f = string.format('%d', n)
  if redis.call('SET', KEYS[1], f .. ':' .. ARGV[1], 'NX', 'PX', ARGV[2]) then
    return f
  end
  if n == 1 then redis.call('DEL', KEYS[2]) else redis.call('DECR', KEYS[2]) end
end
local v = redis.call('GET', KEYS[1])
if v then
  local r = held(v)
  if r[1] == 0 and here > 0 then
    -- A refusal seen by a process with subscribers: make sure the
    -- waiters mark outlives the grant's PTTL by at least half the slack
    -- (setting it for PTTL plus the slack if not), so that the release
    -- that follows publishes. Only the first refusal of a grant, and the
    -- first after a renewal, writes: the others only read its PTTL.
    local keep, slack = tonumber(ARGV[2]), tonumber(ARGV[4])
    if r[3] > 0 then keep = r[3] end
    if redis.call('PTTL', KEYS[3]) < keep + slack / 2 then
      redis.call('SET', KEYS[3], '1', 'PX', keep + slack)
    end
  end
  return r
end
local f = string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('SET', KEYS[1], f .. ':' .. ARGV[1], 'PX', ARGV[2])
-- A grant while the process has other subscribers sets the mark again:
-- the release that woke this waiter consumed the one they had set.
if here > 1 then redis.call('SET', KEYS[3], '1', 'PX', tonumber(ARGV[2]) + tonumber(ARGV[4])) end
return f
