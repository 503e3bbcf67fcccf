//! A set of locks taken in one script, or none: each member as [`ACQUIRE_FIRST`](super) takes a
//! single lock (the same keys, its own owner, lease and fencing token).

/// Takes every lock of a set, or none. KEYS: each member's lock and fence, in the names' order.
/// ARGV: ttl_ms, then each member's owner.
///
/// Returns each member's token when every lock was free with nobody queued and is now the
/// caller's (each lease the TTL just set), `0` when someone holds a member, and nil when a
/// member is free but may have waiters queued or an announcement due (a marked fence), or is a
/// semaphore or held by readers: nothing is taken, and the members are then taken one by one,
/// where the single lock's scripts decide. Every check runs before the first write, so a script
/// that returns without tokens wrote nothing.
pub(crate) const ACQUIRE_SET: &str = concat!(
    r"
local members = #KEYS / 2
for i = 1, members do
  local holder = redis.call('GET', KEYS[2 * i - 1])
  if holder then
    if string.byte(holder, 1) == ",
    permits_mark_byte!(),
    r" then return false end
    return 0
  end
  local fence = redis.call('GET', KEYS[2 * i])
  if fence and not string.match(fence, '^%d+$') then return false end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tokens = {}
for i = 1, members do
  local lock, fence = KEYS[2 * i - 1], KEYS[2 * i]
  redis.call('SET', lock, ARGV[i + 1], 'PX', ARGV[1])
  local token = math.max(tonumber(redis.call('GET', fence) or '0') + 1, now)
  redis.call('SET', fence, string.format('%.0f', token), 'PX', ",
    fence_keep_ms!(),
    r")
  tokens[i] = token
end
return tokens
"
);
