-- Redlock's acquire on one node. KEYS[1] lock, KEYS[2] highest fence
-- granted on this node, KEYS[3] the attempt claim, KEYS[4] the node's
-- waiter queue (only with ARGV[5] > 0); ARGV[1] owner, ARGV[2] ttl ms,
-- ARGV[3] fence ('0' without a fence source), ARGV[4] the attempt's
-- number, higher for every later attempt of one owner, ARGV[5] how many
-- waiters for the key the caller's process has (absent: none), ARGV[6]
-- the queue entry's slack in ms, ARGV[7] the process's member in the
-- queue (see waiter_queue.lua: a refusal makes the process stand in the
-- queue, a grant moves it to the end of the queue).
--
-- The claim, '<n>:<owner>', never expires: an attempt of that owner
-- numbered below n is refused here untouched ({-4, '0', 0}). Every grant
-- and every re-acquire of the owner's own grant sets n to the attempt's
-- number, and the rollback of a failed attempt (release_attempt) sets it
-- past that attempt, so that a request of an attempt that lands late can
-- neither take over a grant a later attempt of its owner counted here
-- (for that attempt's rollback to delete) nor be granted after its own
-- rollback. Otherwise a free key is granted ({1, fence, 0}) unless this
-- node granted a newer fence ({-3, last, 0}), and a held one is answered
-- by held.
local here = tonumber(ARGV[5] or '0')
local claim = redis.call('GET', KEYS[3])
if claim then
  local n, o = string.match(claim, '^(%d+):(.*)$')
  if not n then return redis.error_reply('ERR attempt claim is not an integer and an owner') end
  if o == ARGV[1] and tonumber(n) > tonumber(ARGV[4]) then return {-4, '0', 0} end
end
local v = redis.call('GET', KEYS[1])
if v then
  local r = held(v)
  if r[1] == 2 then redis.call('SET', KEYS[3], ARGV[4] .. ':' .. ARGV[1]) end
  if r[1] == 0 and here > 0 then
    local keep = tonumber(ARGV[2])
    if r[3] > 0 then keep = r[3] end
    stand_refused(KEYS[4], ARGV[7], keep, tonumber(ARGV[6]), KEYS[1])
  end
  return r
end
local last = redis.call('GET', KEYS[2])
if last then
  local n = tonumber(last)
  if not n then return redis.error_reply('ERR fence counter is not an integer') end
  if ARGV[3] ~= '0' and n >= tonumber(ARGV[3]) then return {-3, last, 0} end
end
-- A queue key of another type fails here, before any write.
if here > 0 then queue_score(KEYS[4], ARGV[7]) end
if ARGV[3] ~= '0' or not last then redis.call('SET', KEYS[2], ARGV[3]) end
redis.call('SET', KEYS[1], ARGV[3] .. ':' .. ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[3], ARGV[4] .. ':' .. ARGV[1])
if here > 0 then granted_waiter(KEYS[4], ARGV[7], tonumber(ARGV[2]), tonumber(ARGV[6])) end
return {1, ARGV[3], 0}
