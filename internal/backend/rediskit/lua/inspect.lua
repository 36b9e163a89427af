-- KEYS[1] lock, KEYS[2] fence counter. Returns {value|false, pttl,
-- counter|false}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
