-- The redis backend's release: KEYS[1] lock, KEYS[2] waiter queue,
-- KEYS[3] (optional) the key's observer mark; ARGV[1] value, ARGV[2]
-- channel, ARGV[3] pass_on (see wake). Deletes the lock if it holds the
-- value and wakes the process first in the waiter queue, if any (see
-- waiter_queue.lua, which also publishes on channel for observers).
-- Returns 2 if it woke one, 1 if it released and woke nobody (publishing
-- on channel if an observer marks the key), 0 if the value is not the
-- lock's. release_free.lua, which runs first, answered a value that is
-- not the lock's and a key nobody waits for.
local first, now = first_waiter(KEYS[2])
redis.call('DEL', KEYS[1])
if first then
  wake(KEYS[2], first, now, ARGV[2], ARGV[3])
  return 2
end
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then redis.call('PUBLISH', ARGV[2], '') end
return 1
