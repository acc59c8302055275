-- state_fixed.lua: a fixed window key's state in either state format (docs/state-format.md);
-- follows prelude.lua in the scripts that call it. Format 1 is the hash {w = window start,
-- n = count}; format 2 one decimal number, <count><window start in ms, 13 digits> (a window
-- that is no whole number of milliseconds, or starts past 2286, stays a hash). Each format
-- tries the form it writes first, and writes its own (SL_FORMAT, set before the prelude).

-- the stored (form 'c' compact or 'h' hash, window start, count); nil start: no key
local function sl_fixed_load(key)
  local v
  if SL_FORMAT == 2 then
    v = redis.pcall('get', key)
    if type(v) == 'string' then
      return 'c', tonumber(string.sub(v, -13)) * 1000, tonumber(string.sub(v, 1, -14)) or 0
    elseif not v then
      return nil, nil, 0
    end
    v = redis.call('hmget', key, 'w', 'n')
  else
    v = redis.pcall('hmget', key, 'w', 'n')
    if v.err then
      v = redis.call('get', key)
      return 'c', tonumber(string.sub(v, -13)) * 1000, tonumber(string.sub(v, 1, -14)) or 0
    elseif not v[1] then
      return nil, nil, 0
    end
  end
  return 'h', tonumber(v[1]), tonumber(v[2])
end

local function sl_fixed_save(key, kind, ws, count)
  if SL_FORMAT == 2 and ws % 1000 == 0 and ws >= 0 and ws < 1e16
      and (kind ~= 'h' or redis.call('hlen', key) <= 2) then
    local c = string.format('%013.0f', ws / 1000)
    if count > 0 then
      c = string.format('%.0f', count) .. c
    end
    redis.call('set', key, c, 'keepttl')
    return
  end
  if kind == 'c' then
    redis.call('del', key)
  end
  redis.call('hset', key, 'w', sl_num(ws), 'n', sl_num(count))
end
