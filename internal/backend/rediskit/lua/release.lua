-- Redlock's release on one node: KEYS[1] lock, KEYS[2] the node's waiter
-- queue; ARGV[1] value, ARGV[2] channel. Deletes the lock if it holds the
-- value, wakes the process first in the waiter queue on its own channel
-- (see waiter_queue.lua), and publishes on channel for observers (and for
-- waiters of releases before the queue, which listen there). Returns 1 or
-- 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local first, now = first_waiter(KEYS[2])
redis.call('DEL', KEYS[1])
if first then wake(KEYS[2], first, now, ARGV[2], nil) else redis.call('PUBLISH', ARGV[2], '') end
return 1
