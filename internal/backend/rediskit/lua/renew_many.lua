-- Renews many grants whose keys share one hash slot: KEYS[i] lock i;
-- ARGV[2i-1] its value, ARGV[2i] its ttl ms. One result per key (see
-- renew).
local out = {}
for i, k in ipairs(KEYS) do out[i] = renew(k, ARGV[2*i-1], ARGV[2*i]) end
return out
