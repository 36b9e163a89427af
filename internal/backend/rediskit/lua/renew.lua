-- Renews one grant: KEYS[1] lock; ARGV[1] value, ARGV[2] ttl ms. 1 if the
-- value matched and the expiry was reset, else 0; a key of another type
-- fails the call.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
