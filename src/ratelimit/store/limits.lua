-- Levee rate limits: checks (and consumes) every limit of one request, or
-- adjusts one limit, in ONE atomic round trip. Mirrors store/memory.rs
-- exactly; see the `store` module docs for the semantics.
--
-- KEYS[i]  = the key of limit i (one key per limit: Redis Cluster friendly).
-- ARGV[1]  = mode: "check", "peek" (a check that consumes nothing),
--            "adjust" or "release" (undo a check that admitted, given the
--            same prefix and limits: the cross-slot case on a cluster,
--            where another slot refused).
-- ARGV[2]  = member prefix (unique per call): sliding-log members are
--            "<prefix>:<j>" for j in 0..units-1.
-- ARGV[3]  = now in µs; "0" (production) reads Redis TIME. Tests pass a
--            virtual clock; then every TTL gets an hour of slack so no key
--            expires in real time before its virtual expiry (expiry never
--            changes a decision: an expired key is logically empty).
-- ARGV[4]  = adjust delta (signed units; "0" for check).
-- ARGV[5 + 6*(i-1) ...] = limit i: algorithm (1 sliding_log,
--            2 sliding_window, 3 gcra, 4 fixed_window), limit, window_us,
--            burst, cost, shadow (0/1).
--
-- Returns for check: { allowed, then per limit: allowed, limit, remaining,
-- reset_after_us, retry_after_us }; for adjust: { 1 }.
--
-- Lua numbers are doubles: every value stays an integer below 2^53 (Redis
-- TIME in µs is ~2^51), and division goes through fdiv.

local mode = ARGV[1]
local prefix = ARGV[2]
local now = tonumber(ARGV[3]) or 0
local delta = tonumber(ARGV[4]) or 0
local slack = 0
if now > 0 then
  slack = 3600000
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(a / b) for integers a >= 0, b > 0, corrected for rounding.
local function fdiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function int(x)
  return string.format('%d', x)
end

local function expire(key, us)
  redis.call('PEXPIRE', key, int(math.max(1, fdiv(us + 999, 1000)) + slack))
end

local function params(i)
  local b = 4 + (i - 1) * 6
  local p = {
    algo = tonumber(ARGV[b + 1]),
    limit = tonumber(ARGV[b + 2]),
    w = math.max(1, tonumber(ARGV[b + 3])),
    burst = tonumber(ARGV[b + 4]),
    cost = tonumber(ARGV[b + 5]),
    shadow = ARGV[b + 6] == '1',
    interval = 0,
  }
  p.cap = p.limit
  if p.algo == 3 then
    p.interval = fdiv(p.w + math.max(1, p.limit) - 1, math.max(1, p.limit))
    if p.burst > 0 then p.cap = p.burst end
  end
  return p
end

-- Loads the state of one limit as of `now` (never writes).
local function load(key, p)
  local s = {}
  if p.algo == 1 then
    s.lo = '(' .. int(now - p.w)
    s.n = redis.call('ZCOUNT', key, s.lo, '+inf')
    if s.n > 0 then
      s.oldest = tonumber(redis.call('ZRANGEBYSCORE', key, s.lo, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2])
    end
  elseif p.algo == 3 then
    s.tat = tonumber(redis.call('GET', key)) or 0
  else
    s.start = fdiv(now, p.w) * p.w
    local h = redis.call('HMGET', key, 'ws', 'prev', 'cur')
    local ws = tonumber(h[1])
    s.prev, s.cur = 0, 0
    if ws == s.start then
      s.prev = tonumber(h[2]) or 0
      s.cur = tonumber(h[3]) or 0
    elseif ws == s.start - p.w and p.algo == 2 then
      s.prev = tonumber(h[3]) or 0
    end
    if p.algo == 4 then s.prev = 0 end
  end
  return s
end

-- Phase one: admits?, retry_after (µs).
local function evaluate(key, p, s)
  if p.cost > p.cap then return false, p.w end
  if p.algo == 1 then
    if s.n + p.cost <= p.limit then return true, 0 end
    local k = s.n + p.cost - p.limit
    local ts = tonumber(redis.call('ZRANGEBYSCORE', key, s.lo, '+inf', 'WITHSCORES', 'LIMIT', k - 1, 1)[2])
    return false, ts + p.w - now
  elseif p.algo == 2 then
    local e = now - s.start
    if s.cur + p.cost <= p.limit then
      local room = (p.limit - s.cur - p.cost) * p.w
      if s.prev * (p.w - e) <= room then return true, 0 end
      return false, p.w - e - fdiv(room, s.prev)
    end
    return false, p.w - e + p.w - fdiv((p.limit - p.cost) * p.w, s.cur)
  elseif p.algo == 3 then
    local tol = p.cap * p.interval
    local new_tat = math.max(s.tat, now) + p.cost * p.interval
    if new_tat - now <= tol then return true, 0 end
    return false, new_tat - tol - now
  else
    if s.cur + p.cost <= p.limit then return true, 0 end
    return false, s.start + p.w - now
  end
end

-- Writes a (rolled) window state with its TTL.
local function write_window(key, p, s)
  if p.algo == 2 then
    redis.call('HSET', key, 'ws', int(s.start), 'prev', int(s.prev), 'cur', int(s.cur))
    expire(key, s.start + 2 * p.w - now)
  else
    redis.call('HSET', key, 'ws', int(s.start), 'cur', int(s.cur))
    expire(key, s.start + p.w - now)
  end
end

-- Adds `units` at `now` and sets the TTL.
local function charge(key, p, s, units)
  if p.algo == 1 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - p.w))
    local j = 0
    while j < units do
      local args = {}
      local stop = math.min(units, j + 500)
      while j < stop do
        args[#args + 1] = int(now)
        args[#args + 1] = prefix .. ':' .. int(j)
        j = j + 1
      end
      redis.call('ZADD', key, unpack(args))
    end
    s.oldest = s.oldest or now
    s.n = s.n + units
    expire(key, p.w)
  elseif p.algo == 3 then
    s.tat = math.max(s.tat, now) + units * p.interval
    redis.call('SET', key, int(s.tat))
    expire(key, s.tat - now)
  else
    s.cur = s.cur + units
    write_window(key, p, s)
  end
end

-- remaining, reset_after (µs) of the state as it is now.
local function report(p, s)
  if p.algo == 1 then
    local reset = 0
    if s.n > 0 then reset = s.oldest + p.w - now end
    return math.max(0, p.limit - s.n), reset
  elseif p.algo == 2 then
    local e = now - s.start
    local avail = math.max(0, p.limit - s.cur) * p.w - s.prev * (p.w - e)
    local reset = 0
    if s.prev > 0 or s.cur > 0 then reset = s.start + p.w - now end
    return fdiv(math.max(0, avail), p.w), reset
  elseif p.algo == 3 then
    local level = math.max(s.tat, now) - now
    return fdiv(math.max(0, p.cap * p.interval - level), p.interval), level
  else
    local reset = 0
    if s.cur > 0 then reset = s.start + p.w - now end
    return math.max(0, p.limit - s.cur), reset
  end
end

local function refund(key, p, s, units)
  if p.algo == 1 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - p.w))
    redis.call('ZPOPMAX', key, int(units))
  elseif p.algo == 3 then
    local tat = math.max(now, s.tat - units * p.interval)
    if tat > now then
      redis.call('SET', key, int(tat))
      expire(key, tat - now)
    else
      redis.call('DEL', key)
    end
  else
    s.cur = math.max(0, s.cur - units)
    write_window(key, p, s)
  end
end

if mode == 'release' then
  for i = 1, #KEYS do
    local p = params(i)
    if p.algo == 1 then
      -- Exactly this call's members.
      local members = {}
      for j = 0, p.cost - 1 do members[#members + 1] = prefix .. ':' .. int(j) end
      redis.call('ZREM', KEYS[i], unpack(members))
    else
      refund(KEYS[i], p, load(KEYS[i], p), p.cost)
    end
  end
  return { 1 }
end

if mode == 'adjust' then
  local p = params(1)
  local s = load(KEYS[1], p)
  if delta > 0 then
    charge(KEYS[1], p, s, delta)
  elseif delta < 0 then
    refund(KEYS[1], p, s, -delta)
  end
  return { 1 }
end

local ps, ss, admits, retries = {}, {}, {}, {}
local allowed = true
for i = 1, #KEYS do
  ps[i] = params(i)
  ss[i] = load(KEYS[i], ps[i])
  admits[i], retries[i] = evaluate(KEYS[i], ps[i], ss[i])
  if not admits[i] and not ps[i].shadow then allowed = false end
end

local out = { allowed and 1 or 0 }
for i = 1, #KEYS do
  local p, s = ps[i], ss[i]
  if allowed and admits[i] and mode ~= 'peek' then charge(KEYS[i], p, s, p.cost) end
  local remaining, reset = report(p, s)
  local reported = p.limit
  if p.algo == 3 then reported = p.cap end
  out[#out + 1] = admits[i] and 1 or 0
  out[#out + 1] = reported
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retries[i]
end
return out
