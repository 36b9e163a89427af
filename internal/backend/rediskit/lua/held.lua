-- held(v) answers an acquire that found the lock KEYS[1] holding v, for
-- the owner ARGV[1] with the TTL ARGV[2] ms: {-1, '0', pttl} for a value
-- fenced did not write (left alone), {2, fence, 0} for the owner's own
-- grant (its expiry reset, its fence kept), {0, fence, pttl} for another
-- owner's grant. Every acquire script starts with it.
local function held(v)
  local f, o = string.match(v, '^(%d+):(.*)$')
  if not f then return {-1, '0', redis.call('PTTL', KEYS[1])} end
  if o == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {2, f, 0}
  end
  return {0, f, redis.call('PTTL', KEYS[1])}
end
