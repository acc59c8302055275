-- state_bucket.lua: a token bucket key's hash {t = last refill time, k = tokens}, read by the
-- scripts that call it (the token bucket has no compact form yet, docs/state-format.md).

-- the stored (last, tokens, foreign); nil last: no state. Another algorithm's key in the compact
-- form (a rule whose algorithm changed) holds no state here ('foreign': the writer deletes it
-- first); anything else of the wrong type is the error it was
local function sl_bucket_load(key)
  local vals = redis.pcall('hmget', key, 't', 'k')
  if vals.err == nil then
    return tonumber(vals[1]), tonumber(vals[2]), false
  end
  if redis.call('type', key)['ok'] ~= 'string' then
    error(vals)
  end
  return nil, nil, true
end
