-- state.lua: how a key's state is read and written, in either state format; follows prelude.lua
-- in the scripts that use it (limiter.scripts adds it where a script calls these functions).

-- State formats (docs/state-format.md). SL_FORMAT is set in front of this prelude when a script
-- is built: 2 writes a key's state as one decimal number at the key (the compact form), 1
-- writes the hash of the releases before it. Both read either form, so keys written by any
-- release keep their state, and a key changes form the next time it is written.
-- The compact form holds the window start in whole milliseconds as its last 13 digits (a window
-- that is no whole number of milliseconds, or starts past the year 2286, stays a hash):
--   fixed window    <count><start, 13 digits>
--   sliding window  <previous><current, C digits><start, 13 digits><C, 1 digit>
-- and a GCRA key's is its theoretical arrival time in quarter microseconds (sl_gcra_load).
-- Nothing in it depends on the policy, so a key keeps its meaning when its route's limit or
-- period changes. Up to 19 digits with no leading zero, Redis holds it as one integer.

-- The key's state in either form: 'c' and the text (compact), 'h' and the HMGET of 'fields'
-- (a hash), or nil (no key). Each format tries the form it writes first.
local function sl_load(key, fields)
  if SL_FORMAT == 2 then
    local v = redis.pcall('get', key)
    if type(v) ~= 'table' then
      if v then
        return 'c', v
      end
      return nil, nil
    end
    return 'h', redis.call('hmget', key, unpack(fields))
  end
  local h = redis.pcall('hmget', key, unpack(fields))
  if h.err == nil then
    if h[1] then
      return 'h', h
    end
    return nil, nil
  end
  return 'c', redis.call('get', key)
end

-- Write a state: the compact text 'c' where the format allows and the state has one (c not nil)
-- and the key is no hash holding more than its state (a reservation book), else the hash.
-- 'kind' is what sl_load found. SET keeps the key's TTL (KEEPTTL), so sl_touch still decides it.
local function sl_save(key, kind, c, fields, values)
  if SL_FORMAT == 2 and c ~= nil and (kind ~= 'h' or redis.call('hlen', key) <= #fields) then
    redis.call('set', key, c, 'keepttl')
    return
  end
  if kind == 'c' then
    redis.call('del', key)
  end
  local args = {}
  for i = 1, #fields do
    args[2 * i - 1] = fields[i]
    args[2 * i] = sl_num(values[i])
  end
  redis.call('hset', key, unpack(args))
end

-- a window start's 13 digits of milliseconds, or nil when it has none
local function sl_start_ms(ws)
  if ws % 1000 ~= 0 or ws < 0 or ws >= 1e16 then
    return nil
  end
  return string.format('%013.0f', ws / 1000)
end

local SL_FIXED = {'w', 'n'}
local SL_SLIDING = {'w', 'c', 'p'}

-- a fixed window's stored (form, window start, count) (nil start: no key)
local function sl_fixed_load(key)
  local kind, v = sl_load(key, SL_FIXED)
  if kind == 'c' then
    return kind, tonumber(string.sub(v, -13)) * 1000, tonumber(string.sub(v, 1, -14)) or 0
  elseif kind == 'h' then
    return kind, tonumber(v[1]), tonumber(v[2])
  end
  return nil, nil, 0
end

local function sl_fixed_save(key, kind, ws, count)
  local c = sl_start_ms(ws)
  if c ~= nil and count > 0 then
    c = string.format('%.0f', count) .. c
  end
  sl_save(key, kind, c, SL_FIXED, {ws, count})
end

-- a sliding window's stored (form, window start, current, previous)
local function sl_sliding_load(key)
  local kind, v = sl_load(key, SL_SLIDING)
  if kind == 'c' then
    local n = tonumber(string.sub(v, -1))
    return kind, tonumber(string.sub(v, -14, -2)) * 1000, tonumber(string.sub(v, -14 - n, -15)),
      tonumber(string.sub(v, 1, -15 - n)) or 0
  elseif kind == 'h' then
    return kind, tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
  end
  return nil, nil, 0, 0
end

local function sl_sliding_save(key, kind, ws, cur, prev)
  local c = sl_start_ms(ws)
  local digits = string.format('%.0f', cur)
  if c ~= nil and #digits <= 9 then
    c = digits .. c .. #digits
    if prev > 0 then
      c = string.format('%.0f', prev) .. c
    end
  else
    c = nil
  end
  sl_save(key, kind, c, SL_SLIDING, {ws, cur, prev})
end

local SL_GCRA = {'a'}

-- a GCRA key's stored (form, theoretical arrival time) (nil: no key). The compact form is the
-- time in quarter microseconds: a double between 2^50 and 2^51 us (the years 2005 to 2041) is
-- a whole number of them, so the number is the exact double the hash would hold
local function sl_gcra_load(key)
  local kind, v = sl_load(key, SL_GCRA)
  if kind == 'c' then
    return kind, tonumber(v) / 4
  elseif kind == 'h' then
    return kind, tonumber(v[1])
  end
  return nil, nil
end

local function sl_gcra_save(key, kind, tat)
  local q = tat * 4
  local c = nil
  if q == math.floor(q) and q >= 0 and q < 9007199254740992 then -- 2^53
    c = string.format('%.0f', q)
  end
  sl_save(key, kind, c, SL_GCRA, {tat})
end

-- A compact key turned into the hash of the same state, its TTL kept: a reservation's book is
-- written beside the state, in a hash. 'load' is the algorithm's sl_*_load, 'fields' its hash's.
local function sl_hashed(key, load, fields)
  local got = {load(key)}
  if got[1] ~= 'c' then
    return
  end
  local ttl = redis.call('pttl', key)
  redis.call('del', key)
  local args = {}
  for i = 1, #fields do
    args[2 * i - 1] = fields[i]
    args[2 * i] = sl_num(got[i + 1])
  end
  redis.call('hset', key, unpack(args))
  if ttl > 0 then
    redis.call('pexpire', key, ttl)
  end
end
