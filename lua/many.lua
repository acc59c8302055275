-- many.lua: many requests under one policy in one call. Not loaded alone: it follows a
-- decision (or peek) script wrapped as the function sl_one(KEYS, ARGV), so each request is
-- decided by that very script, in order, as if it had come in its own EVALSHA.
-- KEYS[i]       request i's key
-- ARGV[1]       '1': each answer in full; '0': the verdict alone (1 or 0)
-- ARGV[2..4]    the policy's ARGV[1..3] (shared by every request of the call)
-- ARGV[3 + 2i]  request i's now (its script's ARGV[4])
-- ARGV[4 + 2i]  request i's cost (its script's ARGV[5])
-- returns       one entry per request: its script's reply (or verdict), or the error its own
--               call would have got (one failing key does not fail the others)
local full = ARGV[1] == '1'
local a1, a2, a3 = ARGV[2], ARGV[3], ARGV[4]
local out = {}
for i = 1, #KEYS do
  local ok, r = pcall(sl_one, {KEYS[i]}, {a1, a2, a3, ARGV[3 + 2 * i], ARGV[4 + 2 * i]})
  if not ok then
    if type(r) == 'table' and r.err then
      out[i] = r
    else
      out[i] = {err = tostring(r)}
    end
  elseif full then
    out[i] = r
  else
    out[i] = r[1]
  end
end
return out
