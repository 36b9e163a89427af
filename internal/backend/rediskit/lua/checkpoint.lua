-- Stores a checkpoint under its grant: KEYS[1] lock, KEYS[2] checkpoint
-- (a hash: f the fence, v the value); ARGV[1] the grant's lock value
-- "<fence>:<owner>", ARGV[2] its fence, ARGV[3] the value. 1 if the lock
-- holds the grant (an expired lock reads as none) and the checkpoint was
-- written, else 0; a checkpoint of a higher fence is never replaced. A
-- key of another type fails the call before anything is written.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local f = redis.call('HGET', KEYS[2], 'f')
if f and tonumber(f) > tonumber(ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[2], 'f', ARGV[2], 'v', ARGV[3])
return 1
