"""The budget book's Lua scripts (broker/store/budgets_redis.py runs them): each is atomic on
the Redis server, which is what keeps two schedulers from reserving the same last dollar and
the ledger from booking an interval twice."""

# Check-and-reserve, all or none.
# KEYS: 1 budgets, 2 reserved, 3 res, 4 applied (tokens), then the spent hash of each team in
#       ARGV order.
# ARGV: 1 now, 2 month id, 3 week id, 4 the request's token, 5 number of teams, then (team,
#       dollars) per team, then (instance key, team, dollars) per part.
# Returns {'ok'} (or {'ok', 'again'} when the token was reserved before), or
# {'over', team, spent, reserved, need, cap}.
RESERVE = """
local wid = {month = ARGV[2], week = ARGV[3], total = 'total'}
local n = tonumber(ARGV[5])
local first = 6 + 2 * n
if redis.call('SISMEMBER', KEYS[4], ARGV[4]) == 1 then return {'ok', 'again'} end
for i = 1, n do
  local team, need = ARGV[4 + 2 * i], tonumber(ARGV[5 + 2 * i])
  local raw = redis.call('HGET', KEYS[1], team)
  if raw then
    local b = cjson.decode(raw)
    if b.hard then
      local spent = tonumber(redis.call('HGET', KEYS[4 + i], wid[b.window]) or '0')
      local res = tonumber(redis.call('HGET', KEYS[2], team) or '0')
      if spent + res + need > b.amount + 1e-6 then
        return {'over', team, string.format('%.17g', spent), string.format('%.17g', res),
                string.format('%.17g', need), string.format('%.17g', b.amount)}
      end
    end
  end
end
for i = first, #ARGV, 3 do
  local field, usd = ARGV[i] .. '|' .. ARGV[i + 1], tonumber(ARGV[i + 2])
  local raw = redis.call('HGET', KEYS[3], field)
  local amount, left = usd, usd
  if raw then
    local r = cjson.decode(raw)
    amount, left = r[1] + usd, r[2] + usd
  end
  redis.call('HSET', KEYS[3], field, cjson.encode({amount, left, tonumber(ARGV[1])}))
  redis.call('HINCRBYFLOAT', KEYS[2], ARGV[i + 1], usd)
end
redis.call('SADD', KEYS[4], ARGV[4])
return {'ok'}
"""

# Book one interval of one instance, once.
# KEYS: 1 mark, 2 done, 3 reserved, 4 res, 5 usd sums, 6 GPU-second sums, 7 idle sums, then
#       the spent hash of each part's team.
# ARGV: 1 instance key, 2 interval, 3 month id, 4 week id, then (team, dollars, GPU-seconds,
#       idle GPU-seconds, "team|site|day") per part. 1 if booked, 0 if booked before.
CHARGE = """
local key, k = ARGV[1], tonumber(ARGV[2])
if redis.call('SISMEMBER', KEYS[2], key) == 1 then return 0 end
local mark = redis.call('HGET', KEYS[1], key)
if mark and tonumber(mark) >= k then return 0 end
redis.call('HSET', KEYS[1], key, k)
local p = 0
for i = 5, #ARGV, 5 do
  p = p + 1
  local team, usd = ARGV[i], tonumber(ARGV[i + 1])
  redis.call('HINCRBYFLOAT', KEYS[5], ARGV[i + 4], usd)
  redis.call('HINCRBYFLOAT', KEYS[6], ARGV[i + 4], ARGV[i + 2])
  redis.call('HINCRBYFLOAT', KEYS[7], ARGV[i + 4], ARGV[i + 3])
  redis.call('HINCRBYFLOAT', KEYS[7 + p], 'total', usd)
  redis.call('HINCRBYFLOAT', KEYS[7 + p], ARGV[3], usd)
  redis.call('HINCRBYFLOAT', KEYS[7 + p], ARGV[4], usd)
  local field = key .. '|' .. team
  local raw = redis.call('HGET', KEYS[4], field)
  if raw then
    local r = cjson.decode(raw)
    local use = math.min(r[2], usd)
    if use > 0 then
      redis.call('HSET', KEYS[4], field, cjson.encode({r[1], r[2] - use, r[3]}))
      redis.call('HINCRBYFLOAT', KEYS[3], team, -use)
    end
  end
end
return 1
"""

# Release what is left of an instance's reservations and mark it settled.
# KEYS: 1 reserved, 2 res, 3 done. ARGV: 1 instance key, then its "key|team" fields.
SETTLE = """
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[2], ARGV[i])
  if raw then
    local r = cjson.decode(raw)
    local team = string.sub(ARGV[i], string.len(ARGV[1]) + 2)
    if r[2] ~= 0 then redis.call('HINCRBYFLOAT', KEYS[1], team, -r[2]) end
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
redis.call('SADD', KEYS[3], ARGV[1])
return 1
"""
