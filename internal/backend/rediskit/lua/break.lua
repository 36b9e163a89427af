-- KEYS[1] lock, KEYS[2] audit stream, KEYS[3] the redis backend's
-- waiter queue (Redlock: none); ARGV[1] channel, ARGV[2] reason, ARGV[3]
-- by, ARGV[4] audit length, ARGV[5] pass_on (see wake). Deletes whatever
-- grant exists, appends to the capped audit stream and wakes waiters: all
-- of them on channel, and the process first in the waiter queue on its
-- own channel. Returns {0} when free, {-1} for a foreign value, else {1,
-- fence, short owner, pttl, stream id, owner}.
local v = redis.call('GET', KEYS[1])
if not v then return {0} end
local f, o = string.match(v, '^(%d+):(.*)$')
if not f then return {-1} end
local full = o
if #o > 8 then o = string.sub(o, 1, 8) .. '…' end
local pttl = redis.call('PTTL', KEYS[1])
local first, now
if KEYS[3] then first, now = first_waiter(KEYS[3]) end
redis.call('DEL', KEYS[1])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[4], '*', 'fence', f, 'owner', o, 'reason', ARGV[2], 'by', ARGV[3])
redis.call('PUBLISH', ARGV[1], '')
if first then wake(KEYS[3], first, now, ARGV[1], ARGV[5]) end
return {1, f, o, pttl, id, full}
