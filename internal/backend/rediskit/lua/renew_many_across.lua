-- Renews many grants of many hash slots of one Cluster node (Redis 7's
-- allow-cross-slot-keys, set by the flags line before this file):
-- KEYS[1] is one of the locks, only to route the call; ARGV[3i-2] is lock
-- i, ARGV[3i-1] its value, ARGV[3i] its ttl ms. One result per lock (see
-- renew); a lock of a slot the node does not serve gets the server's
-- error.
local out = {}
for i = 1, #ARGV / 3 do out[i] = renew(ARGV[3*i-2], ARGV[3*i-1], ARGV[3*i]) end
return out
