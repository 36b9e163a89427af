-- renew(k, v, ttl) resets the expiry of lock k to ttl ms if it holds v:
-- 1 if it did, 0 if k holds something else or nothing, or the server's
-- error message for k alone (a key of another type), which leaves k
-- untouched. The batch renew scripts start with it.
local function renew(k, v, ttl)
  local cur = redis.pcall('GET', k)
  if type(cur) == 'table' and cur.err then return cur.err end
  if cur == v then return redis.call('PEXPIRE', k, ttl) end
  return 0
end
