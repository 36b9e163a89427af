-- The redis backend's release: KEYS[1] lock, KEYS[2] waiter queue;
-- ARGV[1] value, ARGV[2] channel, ARGV[3] pass_on (see wake). Deletes the
-- lock if it holds the value and wakes the process first in the waiter
-- queue, if any (see waiter_queue.lua). Returns 1 or 0.
-- release_free.lua, which runs first, answered a value that is not the
-- lock's and a key nobody waits for.
local first, now = first_waiter(KEYS[2])
redis.call('DEL', KEYS[1])
if first then wake(KEYS[2], first, now, ARGV[2], ARGV[3]) end
return 1
