//! The Lua scripts: one atomic round trip per operation, sent by SHA (`EVALSHA`, falling back to
//! `EVAL` when the server has forgotten them, e.g. after a restart or `SCRIPT FLUSH`).

use redis::Script;

/// Acquire: `SET lock owner NX PX ttl`; on success raise the fence and return `{1, token}`,
/// otherwise `{0, holder's PTTL}`.
///
/// The token is `max(last + 1, server time in µs)`: strictly increasing while the fence key lives,
/// and still increasing after the key is lost (a restart without persistence, a failover to a
/// replica that missed it) as long as the server clock does not step back. Lua numbers are
/// doubles, exact below 2^53 µs (the year 2255).
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now)
  redis.call('SET', KEYS[2], string.format('%.0f', token))
  return {1, token}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// Release: delete the lock only if we own it, and wake the waiters. Returns 1 or 0.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
";

/// Extend: reset the lease only if we own the lock. Returns 1 or 0.
const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// The three scripts, hashed once per client.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire: Script,
    pub(crate) release: Script,
    pub(crate) extend: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            acquire: Script::new(ACQUIRE),
            release: Script::new(RELEASE),
            extend: Script::new(EXTEND),
        }
    }
}
