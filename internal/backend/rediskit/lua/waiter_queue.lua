-- The redis backend's waiter queue: a sorted set of the processes with
-- waiters for a key, each scored with the server time (ms) until which it
-- stands. A member is "<hub id>:<episode>": the process's hub id, and the
-- number of its current waiting episode for the key. A release wakes one
-- process, on the channel of its hub id, not all of them.

-- now_ms is the server's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- stand puts process id in queue q until now + span ms, and keeps q
-- itself at least that long.
local function stand(q, id, now, span)
  redis.call('ZADD', q, now + span, id)
  if redis.call('PTTL', q) < span then redis.call('PEXPIRE', q, span) end
end

-- foreign_queue fails the script, naming queue q, which holds a key of
-- type t, not a waiter queue: another program's. The error starts with
-- WRONGTYPE, as the server's own does (rediskit.ForeignReply).
local function foreign_queue(q, t)
  error(redis.error_reply('WRONGTYPE waiter queue ' .. q .. ' holds a ' .. t .. ', not the sorted set fenced keeps there'))
end

-- queue_score returns process id's score in queue q (nil if none); a q of
-- another type fails the script (foreign_queue) before anything is
-- written.
local function queue_score(q, id)
  local s = redis.pcall('ZSCORE', q, id)
  if type(s) == 'table' and s.err then foreign_queue(q, redis.call('TYPE', q)['ok']) end
  return s
end

-- stand_refused makes sure that process id, refused because lock is
-- held for keep more ms, stands in queue q until then plus at least half
-- of slack (entering it until then plus slack if not), so that the
-- release that follows wakes it if it is first. Only the first refusal of
-- a grant, and the first after a renewal, writes: the others only read.
-- "Then" is the lock's expiry as the server keeps it (PEXPIRETIME, Redis
-- 7), the same for every process refused under one grant: they tie, and
-- the queue orders them by member, which a Redlock process has the same
-- on every node. now + keep varies by a millisecond from one refusal to
-- the next (TIME and PTTL read the clock apart), so nodes ordered the
-- same processes differently and one release woke a different process on
-- each. Before Redis 7, or for a lock without an expiry, now + keep.
local function stand_refused(q, id, keep, slack, lock)
  local now = now_ms()
  local ends = now + keep
  local exp = redis.pcall('PEXPIRETIME', lock)
  if type(exp) == 'number' and exp > 0 then ends = exp end
  local until_ = queue_score(q, id)
  if not until_ or tonumber(until_) < ends + slack / 2 then
    stand(q, id, now, ends - now + slack)
  end
end

-- granted_waiter updates queue q for process id, whose try was granted
-- while it had waiters for the key: the process stays in the queue, moved
-- to its end (standing for the grant's ttl plus slack ms). The grantee
-- need not be one of those waiters (a new acquisition of the process tries
-- once before it subscribes), and they may still wait; once the process's
-- last waiter leaves, the leave script takes it off (leave_waiters.lua).
local function granted_waiter(q, id, ttl, slack)
  stand(q, id, now_ms(), ttl + slack)
end

-- first_waiter returns the process that has stood longest in queue q
-- and still stands at now (ms), or nil. It only reads, so a key of
-- another type fails the script (foreign_queue) before it wrote anything.
local function first_waiter(q)
  local t = redis.call('TYPE', q)['ok']
  if t == 'none' then return nil, 0 end
  if t ~= 'zset' then foreign_queue(q, t) end
  local now = now_ms()
  return redis.call('ZRANGEBYSCORE', q, now, '+inf', 'LIMIT', 0, 1)[1], now
end

-- wake takes the entries that no longer stand at now off queue q, then
-- member id, and publishes on its process's channel (channel .. ':' ..
-- hub id). If that publish reached no client, the process is gone (its
-- subscriber connection closed with it, as a killed process's does), and
-- the next member is woken the same way, up to 8 in all; unless pass_on,
-- an argument of the calling script, is '0' (Redis Cluster, where
-- PUBLISH counts only the clients of the node it runs on; absent counts
-- as set). Then it publishes on channel itself, for observers.
local function wake(q, id, now, channel, pass_on)
  redis.call('ZREMRANGEBYSCORE', q, '-inf', '(' .. now)
  for _ = 1, 8 do
    redis.call('ZREM', q, id)
    local n = redis.call('PUBLISH', channel .. ':' .. string.match(id, '^[^:]*'), '')
    if n > 0 or pass_on == '0' then break end
    id = redis.call('ZRANGEBYSCORE', q, now, '+inf', 'LIMIT', 0, 1)[1]
    if not id then break end
  end
  redis.call('PUBLISH', channel, '')
end
