-- Redlock's acquire on one node. KEYS[1] lock, KEYS[2] highest fence
-- granted on this node; ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] fence
-- ('0' without a fence source). A free key is granted ({1, fence, 0})
-- unless this node granted a newer fence ({-3, last, 0}); a held one is
-- answered by held.
local v = redis.call('GET', KEYS[1])
if v then return held(v) end
local last = redis.call('GET', KEYS[2])
if last then
  local n = tonumber(last)
  if not n then return redis.error_reply('ERR fence counter is not an integer') end
  if ARGV[3] ~= '0' and n >= tonumber(ARGV[3]) then return {-3, last, 0} end
end
if ARGV[3] ~= '0' or not last then redis.call('SET', KEYS[2], ARGV[3]) end
redis.call('SET', KEYS[1], ARGV[3] .. ':' .. ARGV[1], 'PX', ARGV[2])
return {1, ARGV[3], 0}
