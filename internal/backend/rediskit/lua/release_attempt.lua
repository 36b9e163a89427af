-- Redlock's rollback of one failed attempt on one node: KEYS[1] lock,
-- KEYS[2] attempt claim (see redlock_acquire), KEYS[3] the node's waiter
-- queue; ARGV[1] owner, ARGV[2] the attempt's number, ARGV[3] channel.
-- A no-op (0) if the lock holds another owner's grant or a foreign value,
-- or if a later attempt of this owner set the claim: that attempt may
-- have counted the grant here, whatever its fence. Otherwise the owner's
-- grant, if any, is this attempt's or an earlier failed one's: it is
-- deleted, waking waiters as release.lua does, whatever its fence (the
-- attempt may have re-acquired an older grant), and the claim moves past
-- the attempt, so that its own grant request, if it lands later still, is
-- refused. (A claim of another owner is only replaced while the lock is
-- free: none of its grants is here to guard.)
-- Returns 1 if a grant was deleted, else 0.
local v = redis.call('GET', KEYS[1])
if v then
  local f, o = string.match(v, '^(%d+):(.*)$')
  if o ~= ARGV[1] then return 0 end
end
local claim = redis.call('GET', KEYS[2])
if claim then
  local n, o = string.match(claim, '^(%d+):(.*)$')
  if not n then return redis.error_reply('ERR attempt claim is not an integer and an owner') end
  if o == ARGV[1] and tonumber(n) > tonumber(ARGV[2]) then return 0 end
end
-- Read the queue before writing, so that a queue key of another type fails
-- the script with nothing changed.
local first, now
if v then first, now = first_waiter(KEYS[3]) end
redis.call('SET', KEYS[2], string.format('%d', tonumber(ARGV[2]) + 1) .. ':' .. ARGV[1])
if v then
  redis.call('DEL', KEYS[1])
  if first then wake(KEYS[3], first, now, ARGV[3], nil) else redis.call('PUBLISH', ARGV[3], '') end
  return 1
end
return 0
