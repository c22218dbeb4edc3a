"""The Redis store's Lua scripts: each compare-and-set write is one script, atomic on the
server (broker/store/redis.py runs them)."""

# KEYS: 1 job, 2 jobs:all, 3 jobs:pending, 4 jobs:active, then (node, alloc) per claim,
#       then alloc per release, then the job's sealed spec, then the node views (run:{node})
#       to update, then the pending and active version hashes (job id -> version, so a
#       snapshot re-reads only changed jobs), then reasons (dropped when a job leaves
#       PENDING), then the leader key.
# ARGV: 1 expected version, 2 new version, 3 doc, 4 state, 5 attempt, 6 score, 7 job id,
#       8 pending 0/1, 9 active 0/1, 10 owner, 11 release owner, 12 #claims, 13 #releases,
#       then the claimed GPU ids, then the released GPU ids, then the number of node views
#       and for each 1 (the job runs there: its doc, attempt and seal are copied in) or 0
#       (removed), then the SHA-1 the stored document must have ("": not checked;
#       Change.expected_doc), then the fencing token the leader key must hold ("": the write
#       is not a leader's, nothing to check).
# A node's view is what its agent reads of jobs (it reads no job record: broker/security/
# acl.py): "<job>" -> doc, "a:<job>" -> attempt, "s:<job>" -> the sealed spec. A claim on a
# node whose agent's incarnation the scheduler has not taken yet ("acked") is refused.
COMMIT = """
local fence = ARGV[#ARGV]
if fence ~= '' and redis.call('GET', KEYS[#KEYS]) ~= fence then return 'fenced' end
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if cur ~= tonumber(ARGV[1]) then return 'version' end
local want = ARGV[#ARGV - 1]
if want ~= '' and redis.sha1hex(redis.call('HGET', KEYS[1], 'doc') or '') ~= want then
  return 'changed'
end
local nc, nr = tonumber(ARGV[12]), tonumber(ARGV[13])
for i = 1, nc do
  local n = redis.call('HMGET', KEYS[3 + 2 * i], 'state', 'incarnation', 'acked')
  if (not n[1]) or n[1] == 'DOWN' or n[2] ~= n[3] then return 'dead' end
  local owner = redis.call('HGET', KEYS[4 + 2 * i], ARGV[13 + i])
  if owner and owner ~= ARGV[10] then return 'busy' end
end
for i = 1, nr do
  local key, gpu = KEYS[4 + 2 * nc + i], ARGV[13 + nc + i]
  if redis.call('HGET', key, gpu) == ARGV[11] then redis.call('HDEL', key, gpu) end
end
for i = 1, nc do redis.call('HSET', KEYS[4 + 2 * i], ARGV[13 + i], ARGV[10]) end
local kv, av = 4 + 2 * nc + nr + 1, 14 + nc + nr
local nv = tonumber(ARGV[av])
if nv > 0 then
  local sealed = redis.call('GET', KEYS[kv])
  local id = ARGV[7]
  for i = 1, nv do
    if ARGV[av + i] == '1' then
      redis.call('HSET', KEYS[kv + i], id, ARGV[3], 'a:' .. id, ARGV[5])
      if sealed then redis.call('HSET', KEYS[kv + i], 's:' .. id, sealed)
      else redis.call('HDEL', KEYS[kv + i], 's:' .. id) end
    else
      redis.call('HDEL', KEYS[kv + i], id, 'a:' .. id, 's:' .. id)
    end
  end
end
redis.call('HSET', KEYS[1], 'doc', ARGV[3], 'version', ARGV[2], 'state', ARGV[4],
           'attempt', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[6], ARGV[7])
local vpend, vact, reasons = KEYS[#KEYS - 3], KEYS[#KEYS - 2], KEYS[#KEYS - 1]
if ARGV[8] == '1' then
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[7])
  redis.call('HSET', vpend, ARGV[7], ARGV[2])
else
  redis.call('ZREM', KEYS[3], ARGV[7])
  redis.call('HDEL', vpend, ARGV[7])
  redis.call('HDEL', reasons, ARGV[7])
end
if ARGV[9] == '1' then
  redis.call('ZADD', KEYS[4], ARGV[6], ARGV[7])
  redis.call('HSET', vact, ARGV[7], ARGV[2])
else
  redis.call('ZREM', KEYS[4], ARGV[7])
  redis.call('HDEL', vact, ARGV[7])
end
return 'ok'
"""

# Leadership. The leader key holds the leader's fencing token "<epoch>:<owner>" with a
# lifetime (PX); the epoch grows with every new leadership, so tokens are never reused.
# KEYS: 1 leader, 2 leader:epoch. ARGV: 1 owner, 2 lease ms. The token, or false if another
# owner leads (its own lease is renewed if the owner already leads).
ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local sep = string.find(cur, ':', 1, true)
  if sep and string.sub(cur, sep + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return cur
  end
  return false
end
local token = redis.call('INCR', KEYS[2]) .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
"""

# KEYS: 1 leader. ARGV: 1 token, 2 lease ms. 1 if renewed, 0 if the leadership has ended.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS: 1 leader. ARGV: 1 token.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: 1 node, 2 nodes, 3 nodes:seq. ARGV: 1 node id, 2 doc, 3 state, 4 incarnation,
#       5 lease_expires. A node keeps the place in the order where it first registered.
PUT_NODE = """
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
end
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'state', ARGV[3], 'incarnation', ARGV[4],
           'lease_expires', ARGV[5])
return 1
"""

# KEYS: 1 node, 2 alloc. ARGV: 1 expected incarnation, 2 now (the lease must have lapsed).
MARK_DOWN = """
local cur = redis.call('HMGET', KEYS[1], 'incarnation', 'lease_expires')
if (not cur[1]) or cur[1] ~= ARGV[1] then return 0 end
if tonumber(cur[2]) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'DOWN')
redis.call('DEL', KEYS[2])
return 1
"""

# An agent's log lines, into its node's stream of the attempt (logs:{job}:{attempt}@{node}),
# only while its node's view (run:{node}) holds that attempt of the job.
# KEYS: 1 the node's view, 2 stream. ARGV: 1 attempt, 2 time, 3 maxlen, 4 ttl, 5 job id, then
# (stream, text) pairs.
APPEND_LOGS = """
local attempt = redis.call('HGET', KEYS[1], 'a:' .. ARGV[5])
if (not attempt) or tonumber(attempt) ~= tonumber(ARGV[1]) then
  return {0, attempt or '0', attempt and 'ACTIVE' or 'NOT_HERE'}
end
for i = 6, #ARGV, 2 do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*',
             't', ARGV[2], 's', ARGV[i], 'x', ARGV[i + 1])
end
if #ARGV > 5 then redis.call('EXPIRE', KEYS[2], ARGV[4]) end
return {1}
"""



# KEYS: usage hash, runtimes stream. ARGV: team, GPU-seconds, now, half-life, stream cap,
# runtime sample JSON or "". Decay the team's total to now and add, in one step, so concurrent
# reports never lose an increment; append the finished job's runtime in the same round trip.
ADD_USAGE = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local value, at = 0, tonumber(ARGV[3])
if raw then
  local rec = cjson.decode(raw)
  value, at = rec[1], rec[2]
end
local now = tonumber(ARGV[3])
local age = now - at
if age < 0 then age = 0 end
value = value * math.pow(0.5, age / tonumber(ARGV[4])) + tonumber(ARGV[2])
if now < at then now = at end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({value, now}))
if ARGV[6] ~= '' then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 's', ARGV[6])
end
return 1
"""

# An instance record, compare-and-set on its version.
# KEYS: 1 inst:{request id}, 2 instances (every request id), 3 instances:live, 4 leader.
# ARGV: 1 expected version (0: no record yet), 2 doc, 3 score (requested at), 4 request id,
#       5 live 0/1, 6 the fencing token ("" for none).
INSTANCE_CAS = """
if ARGV[6] ~= '' and redis.call('GET', KEYS[4]) ~= ARGV[6] then return 'fenced' end
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if cur ~= tonumber(ARGV[1]) then return 'version' end
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'version', cur + 1)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
else
  redis.call('ZREM', KEYS[3], ARGV[4])
end
return 'ok'
"""

# Forget a node that is DOWN (a cloud machine given back). KEYS: 1 node, 2 nodes, 3 alloc,
# 4 its view, 5 its report stream.
# ARGV: 1 node id, 2 expected incarnation. 1 if forgotten, 0 if it is not DOWN (or another
# incarnation registered meanwhile).
FORGET_NODE = """
local cur = redis.call('HMGET', KEYS[1], 'state', 'incarnation')
if cur[1] ~= 'DOWN' or cur[2] ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

# The scheduler takes a node's agent incarnation: claims on it are allowed from now on, and it
# joins the node index. KEYS: 1 node, 2 nodes, 3 nodes:seq. ARGV: 1 node id, 2 incarnation.
# 1 if taken, 0 if the node's record is of another incarnation (or gone).
ACK_NODE = """
if redis.call('HGET', KEYS[1], 'incarnation') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'acked', ARGV[2])
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
end
return 1
"""
