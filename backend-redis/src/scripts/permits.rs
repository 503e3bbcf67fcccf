//! The semaphore's scripts. A semaphore of N permits keeps, beside the name's fence and channel:
//! - `permits`, a sorted set: one member per permit, its owner value, scored by the instant its
//!   lease ends in ms on the **server's** clock (`TIME`), so a holder that vanishes loses its
//!   permit when the server's clock passes it, whatever the clients' clocks say; members past
//!   their score are removed before any count;
//! - `lock`, the name's lock key, holding `#permits:N` for as long as the last permit lives. It
//!   stores the limit with the name, and it keeps the lock scripts off the name: their `SET NX`
//!   finds the key taken, and a value starting with `#` says by what.
//!
//! Owner values are hex digits, so a holder value never starts with `#`.

/// Takes a permit. KEYS: lock, permits, fence, queue. ARGV: owner, ttl_ms, limit.
///
/// Returns `{1, token, ttl_ms}` when the caller holds a permit (taken now, or already its own:
/// an acquire that reached the server twice gets a new token, above the one whose reply was
/// lost); `{0, ms until the earliest permit's lease ends}` when all are taken; `{-1, in_use}`
/// when the name is in use with another number of permits (a lock, held or with waiters
/// queued, counts as one: a queue mark on the fence, checked against the queue itself). A grant
/// keeps the lock key's mark and the set at least as long as its lease, and no longer than the
/// latest live lease, so a semaphore used once leaves nothing behind.
pub(crate) const ACQUIRE_PERMIT: &str = concat!(
    r"
local lock, permits, fence, queue = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local mark = redis.call('GET', lock)
if mark then
  local in_use = tonumber(string.match(mark, '^#permits:(%d+)$') or '1')
  if in_use ~= limit then return {-1, in_use} end
end
local prior = redis.call('GET', fence) or '0'
if string.sub(prior, -1) == '+' and redis.call('EXISTS', queue) == 1 then return {-1, 1} end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', permits, '-inf', now_ms)
local held = 0
if redis.call('ZADD', permits, 'NX', now_ms + ttl, owner) == 0 then
  redis.call('ZADD', permits, 'XX', now_ms + ttl, owner)
else
  held = redis.call('ZCARD', permits)
  if held > limit then
    redis.call('ZREM', permits, owner)
    local first = redis.call('ZRANGE', permits, 0, 0, 'WITHSCORES')
    return {0, math.max(tonumber(first[2]) - now_ms, 1)}
  end
end
-- The only live permit (a set made just now, without a TTL yet) sets both keys' TTL to its
-- lease; any other raises them to its lease if they would end sooner.
if not mark or held == 1 or redis.call('PTTL', lock) < ttl then
  redis.call('SET', lock, '#permits:' .. ARGV[3], 'PX', ttl)
  redis.call('PEXPIRE', permits, ttl)
end
local queued = false
",
    lua_take_token_after_prior!(),
    r"
return {1, token, ttl}
"
);

/// Gives a permit back. KEYS: lock, permits. ARGV: owner, channel.
///
/// Returns 1 when the caller's permit was in the set and is now out of it (announced `free` on
/// the channel, so waiters try again), else 0: a permit released twice, or whose place was
/// taken after its lease ended, adds nothing (one whose lease ended but was not yet trimmed
/// counted for nobody, and its guard knows it is lost before it asks). The last permit out
/// deletes the lock key's mark.
pub(crate) const RELEASE_PERMIT: &str = concat!(
    r"
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
if redis.call('ZCARD', KEYS[2]) == 0 then
  local mark = redis.call('GET', KEYS[1])
  if mark and string.byte(mark, 1) == ",
    permits_mark_byte!(),
    r" then redis.call('DEL', KEYS[1]) end
end
redis.call('PUBLISH', ARGV[2], 'free')
return 1
"
);

/// Renews a permit. KEYS: lock, permits. ARGV: owner, ttl_ms.
///
/// Resets the caller's permit to `ttl_ms` from now if its lease has not ended (an ended one may
/// be counted out already, and its place taken), keeping both keys at least that long. Returns
/// 1 or 0.
pub(crate) const EXTEND_PERMIT: &str = r"
local lock, permits = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', permits, ARGV[1])
if not score or tonumber(score) <= now_ms then return 0 end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', permits, 'XX', now_ms + ttl, ARGV[1])
if redis.call('PTTL', permits) < ttl then redis.call('PEXPIRE', permits, ttl) end
if redis.call('PTTL', lock) < ttl then redis.call('PEXPIRE', lock, ttl) end
return 1
";

/// How many permits of the name are held now. KEYS: lock, permits.
///
/// Read-only (replicas and `EVALSHA_RO` may run it): permits past their lease are not counted,
/// not removed. A name held as a lock counts one.
pub(crate) const COUNT_PERMITS: &str = concat!(
    r"
local mark = redis.call('GET', KEYS[1])
if mark and string.byte(mark, 1) ~= ",
    permits_mark_byte!(),
    r" then return 1 end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[2], '(' .. now_ms, '+inf')
"
);
