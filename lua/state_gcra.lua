-- state_gcra.lua: a GCRA key's state in either state format (docs/state-format.md); follows
-- prelude.lua in the scripts that call it. Format 1 is the hash {a = arrival time, 17 digits};
-- format 2 the arrival time in quarter microseconds, negated, one integer: a double between
-- 2^50 and 2^51 us (the years 2005 to 2041) is a whole number of them, so it is the very double;
-- the sign tells it from a window's number (a rule whose algorithm changed reads another's key
-- as no key, as with the hashes). Each format tries the form it writes first, and writes its
-- own (SL_FORMAT, set before the prelude).

-- the stored (form 'c' compact or 'h' hash, arrival time); nil: no key
local function sl_gcra_load(key)
  if SL_FORMAT == 2 then
    local v = redis.pcall('get', key)
    if type(v) == 'string' then
      if string.byte(v, 1) == 45 then -- '-': GCRA's; another algorithm's is no state here
        return 'c', -tonumber(v) / 4
      end
      return 'c', nil
    elseif not v then
      return nil, nil
    end
    return 'h', tonumber(redis.call('hget', key, 'a'))
  end
  local v = redis.pcall('hget', key, 'a')
  if type(v) == 'string' then
    return 'h', tonumber(v)
  elseif not v then
    return nil, nil
  end
  v = redis.call('get', key)
  if string.byte(v, 1) == 45 then
    return 'c', -tonumber(v) / 4
  end
  return 'c', nil
end

-- write 'tat' (the stored one was 'old') in this script's format; a hash holding more than its
-- state (a reservation book) stays a hash. A compact key is moved by INCRBY, in place, its TTL
-- kept; a new one is SET with KEEPTTL, so sl_touch decides the TTL as for the hash
local function sl_gcra_save(key, kind, old, tat)
  local q = tat * 4
  if SL_FORMAT == 2 and q == math.floor(q) and q >= 0 and q < 9007199254740992 then
    if kind == 'c' and old ~= nil then
      redis.call('incrby', key, string.format('%.0f', old * 4 - q))
      return
    elseif kind ~= 'h' or redis.call('hlen', key) <= 1 then
      redis.call('set', key, string.format('-%.0f', q), 'keepttl')
      return
    end
  end
  if kind == 'c' then
    redis.call('del', key)
  end
  redis.call('hset', key, 'a', sl_num(tat))
end
