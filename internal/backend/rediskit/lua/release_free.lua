-- The redis backend's release, its common cases first (see
-- release_waiters.lua for the keys and arguments), before the local
-- functions of waiter_queue.lua are defined, so they do not pay for making
-- them: a value that is not the lock's (0), and a key nobody waits for
-- (its waiter queue does not exist: the lock is deleted, 1), published
-- on the channel only while an observer marks the key.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1])
  if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then redis.call('PUBLISH', ARGV[2], '') end
  return 1
end
