"""The Lua scripts of the Redis session store: each step that touches several keys, made atomic.

A session is a hash (`session:<id>`) and a swap list (`session:<id>:swaps`), both expiring
`session_ttl` after the last use. Beside them, three indexes: `sessions` (a set of every id, for
rebuild passes; swept), `sessions:expiry` (a sorted set: id -> when it expires unless used, in
Redis's own milliseconds) and, for each principal under a per-principal cap, `principal:<hash>` (the
same, for its sessions). The sorted sets are the caps' counters: a create trims what has expired,
counts what is left and adds the new session in one script, so two replicas creating at once cannot
both take the last place, and a replica's restart loses no count. Every load renews a session's
scores with its keys; a delete removes them. Times come from Redis (`TIME`), so the replicas'
clocks never disagree about what has expired.
"""

from __future__ import annotations

# `now`, in milliseconds of Redis's clock, and `room`: whether a new session fits under a cap on
# all sessions (`total`, counted in `live`) and one on its principal's (`per`, in `owned`); nil if it
# does, else {the cap's scope, milliseconds until the least recently used one expires}
_ROOM = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function full(key, cap, scope)
  if cap <= 0 then return nil end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if redis.call('ZCARD', key) < cap then return nil end
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return {scope, tonumber(oldest[2]) - now}
end
local function room(live, total, owned, per)
  return full(live, tonumber(total), 'sessions') or full(owned, tonumber(per), 'principal')
end
"""

# KEYS: sessions:expiry, principal:<hash>; ARGV: the two caps
CHECK = (
    _ROOM
    + """
return room(KEYS[1], ARGV[1], KEYS[2], ARGV[2]) or 0
"""
)

# KEYS: session, swaps, sessions, implied, sessions:expiry, principal:<hash>
# ARGV: id, ttl ms, implied claim ('' if none), first swap, session key prefix, caps (2), fields...
CREATE = (
    _ROOM
    + """
if ARGV[3] ~= '' then
  local holder = redis.call('HGET', KEYS[4], ARGV[3])
  if holder and redis.call('EXISTS', ARGV[5] .. holder) == 1 then return holder end
end
local refusal = room(KEYS[5], ARGV[6], KEYS[6], ARGV[7])
if refusal then return refusal end
local ttl = tonumber(ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[4], ARGV[3], ARGV[1]) end
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
if tonumber(ARGV[7]) > 0 then
  redis.call('HSET', KEYS[1], 'owned', KEYS[6])
  redis.call('ZADD', KEYS[6], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[6], ttl)
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('LPUSH', KEYS[2], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[5], now + ttl, ARGV[1])
return ARGV[1]
"""
)

# a use: the session's keys and scores live on; KEYS: session, swaps, sessions:expiry, backend
# sessions; ARGV: id, ttl ms, the backend sessions' ttl ms (longer: the sweep reads them once the
# session has expired, to end them)
LOAD = """
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then return {} end
local clock = redis.call('TIME')
local ttl = tonumber(ARGV[2])
local expires = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) + ttl
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[3]))
redis.call('ZADD', KEYS[3], expires, ARGV[1])
local owned = redis.call('HGET', KEYS[1], 'owned')
if owned then
  redis.call('ZADD', owned, expires, ARGV[1])
  redis.call('PEXPIRE', owned, ttl)
end
return {fields, redis.call('LRANGE', KEYS[2], 0, -1), redis.call('HGETALL', KEYS[4])}
"""

# a compare-and-set of one backend session; KEYS: session, backend sessions; ARGV: backend id, the
# session id expected now ('' for none), the new value ('' to forget it), the backend sessions' ttl
# ms. Returns the value stored afterwards ('' for none), or false when the session is gone.
SET_BACKEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local current = redis.call('HGET', KEYS[2], ARGV[1])
local current_id = ''
if current then current_id = cjson.decode(current)[1] end
if current_id == ARGV[2] then
  if ARGV[3] == '' then
    redis.call('HDEL', KEYS[2], ARGV[1])
  else
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
    redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]))
  end
end
return redis.call('HGET', KEYS[2], ARGV[1]) or ''
"""

# KEYS[1]: the session's hash. ARGV: a backend id, a URI, "1" to subscribe or "0" to unsubscribe,
# the most subscriptions a session keeps. The session's subscriptions, a JSON list of [backend, URI]
# pairs, afterwards; false when the session is gone. One script: two replicas' subscriptions at once
# both stay.
SUBSCRIBE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local raw = redis.call('HGET', KEYS[1], 'subscriptions')
local kept = {}
if raw and raw ~= '' then kept = cjson.decode(raw) end
local found = 0
for i, pair in ipairs(kept) do
  if pair[1] == ARGV[1] and pair[2] == ARGV[2] then found = i end
end
if ARGV[3] == '1' and found == 0 and #kept < tonumber(ARGV[4]) then
  table.insert(kept, {ARGV[1], ARGV[2]})
elseif ARGV[3] == '0' and found > 0 then
  table.remove(kept, found)
end
if #kept == 0 then
  redis.call('HDEL', KEYS[1], 'subscriptions')
  return '[]'
end
local encoded = cjson.encode(kept)
redis.call('HSET', KEYS[1], 'subscriptions', encoded)
return encoded
"""

UPDATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""

SWAP = """
local current = redis.call('HGET', KEYS[1], 'fingerprint')
if not current then return -1 end
if current ~= ARGV[1] or current == ARGV[2] then return 0 end
local previous = tonumber(redis.call('HGET', KEYS[1], 'number'))
local number = redis.call('HINCRBY', KEYS[1], 'number', 1)
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[2], 'catalog', ARGV[3])
redis.call('LPUSH', KEYS[2], cjson.encode({previous = {previous, current}, current = {number, ARGV[2]},
  reason = ARGV[4], at = tonumber(ARGV[5])}))
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[6]) - 1)
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return number
"""

# KEYS: session, swaps, sessions, implied, sessions:expiry, backend sessions; ARGV: id, implied
# claim ('' if none)
DELETE = """
local owned = redis.call('HGET', KEYS[1], 'owned')
if owned then redis.call('ZREM', owned, ARGV[1]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[6])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
if ARGV[2] ~= '' and redis.call('HGET', KEYS[4], ARGV[2]) == ARGV[1] then
  redis.call('HDEL', KEYS[4], ARGV[2])
end
return 1
"""

FORGET_IMPLIED = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""

# drops the expired from `sessions:expiry` (KEYS[1]); returns how many
TRIM = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
"""
