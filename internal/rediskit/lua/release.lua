-- Redlock's release on one node: KEYS[1] lock; ARGV[1] value, ARGV[2]
-- channel. Deletes the lock if it holds the value and wakes waiters.
-- Returns 1 or 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
