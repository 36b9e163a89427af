-- The redis backend's acquire, its common case first (see acquire.lua for
-- the keys and arguments): a caller whose process has no waiters for the
-- key (ARGV[3] absent or 0), most likely finding it free. It runs before
-- the local functions of the other files are defined, so the common case
-- does not pay for making them (a closure each, every call): INCR and SET
-- NX, two commands. The increment is taken back if the lock was there, so
-- the counter counts grants only (and a counter that is not a number fails
-- before anything changed); the script then goes on to acquire.lua.
if tonumber(ARGV[3] or '0') == 0 then
  local n = redis.call('INCR', KEYS[2])
  local f = string.format('%d', n)
  if redis.call('SET', KEYS[1], f .. ':' .. ARGV[1], 'NX', 'PX', ARGV[2]) then
    return f
  end
  if n == 1 then redis.call('DEL', KEYS[2]) else redis.call('DECR', KEYS[2]) end
end
