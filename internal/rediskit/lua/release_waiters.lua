-- The redis backend's release: KEYS[1] lock, KEYS[2] waiters mark;
-- ARGV[1] value, ARGV[2] channel. Deletes the lock if it holds the value,
-- and publishes on the channel only if the waiters mark was there too
-- (deleting it). Returns 1 or 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[2]) == 2 then redis.call('PUBLISH', ARGV[2], '') end
  return 1
end
return 0
