-- Redlock's cleanup after a failed attempt: KEYS[1] lock; ARGV[1] owner,
-- ARGV[2] channel. Deletes the lock if the owner matches whatever the
-- fence (a node may not have seen the attempt's fence). Returns 1 or 0.
local v = redis.call('GET', KEYS[1])
if v then
  local f, o = string.match(v, '^(%d+):(.*)$')
  if o == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', ARGV[2], '')
    return 1
  end
end
return 0
