-- RolloutStore.restore: write back what the store lost of a replica's memory.
--
-- KEYS[1] rollout hash, KEYS[2] audit stream, KEYS[3] meta hash, KEYS[4] adjustments hash,
-- KEYS[5] rollout plans hash (all in the {ns} slot).
-- ARGV[1] instance id, ARGV[2] channel, ARGV[3] audit maxlen, ARGV[4] time (s) of the
-- restoration entries, ARGV[5] epoch to set when the store has none, ARGV[6] the epoch
-- the caller remembers ('' = none), ARGV[7] JSON {route: state JSON} remembered,
-- ARGV[8] JSON [[id, kind, route, json], ...] remembered audit entries, ARGV[9] JSON
-- {field: value} remembered adjustments, ARGV[10] JSON {route: plan record JSON} remembered.
-- Writes back, compare-and-set, what the store lacks: a route state whose stored version
-- is missing or lower; audit entries missing from the stream (re-added at their own ids,
-- in order); adjustments missing after the epoch changed. Each restored route gets an
-- audit entry (kind "restore") and a mode_change event; restored audit entries or
-- adjustments without a restored route get one entry for route "*".
-- Returns {epoch in the store, routes restored, audit entries restored, adjustments
-- restored, id1, json1, id2, json2, ...} (the restoration entries written).
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'stream' then
  return redis.error_reply('audit key ' .. KEYS[2] .. ' holds a ' .. t .. ', not a stream')
end
local maxlen = tonumber(ARGV[3])
local at = tonumber(ARGV[4])
local instance = ARGV[1]
local function idkey(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms or -1), tonumber(seq or -1)
end
local function idlt(a, b)
  local am, as = idkey(a)
  local bm, bs = idkey(b)
  if am ~= bm then return am < bm end
  return as < bs
end
local function sorted_keys(tbl)
  local ks = {}
  for k in pairs(tbl) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end
local function version_of(raw)
  local ok, dec = pcall(cjson.decode, raw)
  if ok and type(dec) == 'table' and tonumber(dec['version']) then return tonumber(dec['version']), dec end
  return 0, nil
end

local epoch = redis.call('HGET', KEYS[3], 'epoch')
local epoch_lost = (not epoch) or (ARGV[6] ~= '' and epoch ~= ARGV[6])
if not epoch then
  epoch = ARGV[5]
  redis.call('HSET', KEYS[3], 'epoch', epoch)
end

-- route states: compare-and-set, the newest version wins
local restored = {}
local states = cjson.decode(ARGV[7])
for _, route in ipairs(sorted_keys(states)) do
  local raw = states[route]
  local myver, mine = version_of(raw)
  local cur = redis.call('HGET', KEYS[1], route)
  local curver, curdec = -1, nil
  if cur then curver, curdec = version_of(cur) end
  if mine and myver > 0 and curver < myver then
    redis.call('HSET', KEYS[1], route, raw)
    restored[#restored + 1] = {route, curdec, mine, raw, cur and curver or 0, myver}
  end
end

-- audit entries missing from the stream (not merely trimmed from a full one)
local audit = cjson.decode(ARGV[8])
local xlen = redis.call('XLEN', KEYS[2])
local first = nil
if xlen > 0 then first = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1][1] end
local missing = {}
for _, e in ipairs(audit) do
  if #redis.call('XRANGE', KEYS[2], e[1], e[1]) == 0 and (xlen < maxlen or (first and idlt(first, e[1]))) then
    missing[#missing + 1] = e
  end
end
if #missing > 0 then
  local merged = {}
  for _, row in ipairs(redis.call('XRANGE', KEYS[2], '-', '+')) do
    local f, m = row[2], {}
    for i = 1, #f, 2 do m[f[i]] = f[i + 1] end
    merged[#merged + 1] = {row[1], m['kind'] or '', m['route'] or '', m['json'] or '{}'}
  end
  for _, e in ipairs(missing) do merged[#merged + 1] = e end
  table.sort(merged, function(a, b) return idlt(a[1], b[1]) end)
  redis.call('DEL', KEYS[2])
  for i = math.max(1, #merged - maxlen + 1), #merged do
    local e = merged[i]
    redis.call('XADD', KEYS[2], e[1], 'kind', e[2], 'route', e[3], 'json', e[4])
  end
end

-- runtime adjustments, only when the data went with the epoch
local adj_restored = 0
if epoch_lost then
  local adj = cjson.decode(ARGV[9])
  for _, f in ipairs(sorted_keys(adj)) do
    adj_restored = adj_restored + redis.call('HSETNX', KEYS[4], f, adj[f])
  end
end

-- rollout plans' records: compare-and-set, the newest version wins
local plans_restored = 0
local plans = cjson.decode(ARGV[10])
for _, route in ipairs(sorted_keys(plans)) do
  local raw = plans[route]
  local myver = version_of(raw)
  local cur = redis.call('HGET', KEYS[5], route)
  local curver = -1
  if cur then curver = version_of(cur) end
  if myver > 0 and curver < myver then
    redis.call('HSET', KEYS[5], route, raw)
    plans_restored = plans_restored + 1
  end
end

local out = {epoch, #restored, #missing, adj_restored, plans_restored}
local reason = 'restored by ' .. instance .. ' after the store lost its data'
local function append(route, entry, event_head)
  local json = cjson.encode(entry)
  local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', maxlen, '*', 'kind', 'restore', 'route', route, 'json', json)
  local audit_json = string.sub(json, 1, -2) .. ',"id":"' .. id .. '"}'
  redis.call('PUBLISH', ARGV[2], event_head .. ',"audit":' .. audit_json .. '}')
  out[#out + 1] = id
  out[#out + 1] = json
end
for _, r in ipairs(restored) do
  local route, old, new, raw, oldver, newver = r[1], r[2], r[3], r[4], r[5], r[6]
  local entry = {
    kind = 'restore', route = route, actor = 'instance/' .. instance, at = at,
    ['from'] = old and old['mode'] or '', to = new['mode'],
    from_percent = old and tonumber(old['canary_percent']) or 0, to_percent = tonumber(new['canary_percent']) or 0,
    reason = reason .. ' (stored version ' .. string.format('%d', oldver) .. ', restored version ' .. string.format('%d', newver) .. ')',
    forced = false, automatic = true, gate = cjson.null,
  }
  append(route, entry, '{"type":"mode_change","restored":true,"route":' .. cjson.encode(route) .. ',"state":' .. raw)
end
if #restored == 0 and (#missing > 0 or adj_restored > 0 or plans_restored > 0) then
  local entry = {
    kind = 'restore', route = '*', actor = 'instance/' .. instance, at = at, ['from'] = '', to = '',
    from_percent = 0, to_percent = 0,
    reason = reason .. ' (' .. #missing .. ' audit entries, ' .. adj_restored .. ' runtime adjustments, '
      .. plans_restored .. ' plan records)',
    forced = false, automatic = true, gate = cjson.null,
  }
  append('*', entry, '{"type":"restore","route":"*"')
end
return out
