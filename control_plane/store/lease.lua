-- PlanStore.lease: the plan driver's lease, taken or renewed. One replica of the fleet drives
-- the rollout plans at a time; a lease that is not renewed expires and another replica takes
-- it. Each taking gets a new fencing number, so a driver that lost its lease (paused, cut
-- off) can write nothing: change.lua and plan.lua check the holder.
--
-- KEYS[1] the lease, KEYS[2] the fencing counter (same {ns} slot)
-- ARGV[1] this replica's instance id, ARGV[2] the lease's time to live (ms), ARGV[3] the
-- holder value this replica has ('' = none), ARGV[4] '1' to release instead
-- Returns the lease's holder ("<instance>#<fence>") after the call, '' when released or free.
local cur = redis.call('GET', KEYS[1])
if ARGV[4] == '1' then
  if cur and cur == ARGV[3] then redis.call('DEL', KEYS[1]) end
  return ''
end
if cur and cur == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return cur
end
if cur then return cur end
local holder = ARGV[1] .. '#' .. string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('SET', KEYS[1], holder, 'PX', ARGV[2])
return holder
