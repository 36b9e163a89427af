-- The end of a process's waiting for a key (redis backend): KEYS[1] lock,
-- KEYS[2] waiter queue; ARGV[1] the process's member, ARGV[2] channel,
-- ARGV[3] pass_on (see wake).
-- Takes the member off the queue and, if the key is free, wakes the
-- process first in the queue: a wake-up the leaving process took but did
-- not use (its waiter gave up) would otherwise be lost to the others.
-- With an empty member it is a release's nudge (fencedredis): it only
-- wakes the first process if the key is free.
-- Returns 1 if it woke one, else 0.
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
queue_score(KEYS[2], ARGV[1]) -- another type fails here, before any write
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local first, now = first_waiter(KEYS[2])
if not first then return 0 end
wake(KEYS[2], first, now, ARGV[2], ARGV[3])
return 1
