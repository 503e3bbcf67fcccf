//! The reader-writer lock's scripts. A writer is the name's lock, unchanged; readers keep,
//! beside the name's fence, queue and channel:
//! - the name's lease set (`PREFIX:{NAME}:permits`, a semaphore's permits on another name): one
//!   member per reader, its owner value, scored by the instant its lease ends in ms on the
//!   **server's** clock (`TIME`), so a reader that vanishes loses its share when the server's
//!   clock passes it, whatever the other readers renew; members past their score are trimmed
//!   before any decision. Renewal, release and a cancelled wait are a permit's
//!   (`scripts/permits.rs`): the set, the queue and the mark are the same keys;
//! - `lock`, the name's lock key, holding `#readers` for as long as the last reader lives. A
//!   writer's `SET NX` finds it taken, and the writer's full acquire then trims the set and
//!   comes in once it is empty; a semaphore's acquire reads no `#permits:N` in it and refuses;
//! - `reader-watch`, a set of the ids of the clients whose readers watch their share: a writer
//!   that takes the name over a set left without its mark (deleted, lost in a failover) tells
//!   each on its own channel (`taken`), as a lock's holder is told.
//!
//! Readers wait in the lock's queue, their record marked `:r`, so a writer's release lets every
//! reader queued before the next writer in together, and a reader comes in only while no writer
//! holds and no live writer waits ahead of it (writer preference).

/// Takes a reader's share. KEYS: lock, readers, fence, queue, waiters, reader watchers. ARGV:
/// owner, ttl_ms, presence_ms (`0`: do not queue), the watch channels' prefix
/// (`PREFIX:held-by:`).
///
/// The caller is granted a share when no writer holds the lock and no live writer is queued
/// ahead of it (lapsed waiters at the head are dropped); readers queued ahead of a waiting writer
/// share. A grant over a free name deletes a reader set left without its mark (its readers lost
/// their share with the mark) and tells a watching writer whose key went, as a lock's acquire
/// does. A grant writes the fence with its queue mark, whatever the queue: a writer's first
/// attempt, which reads no reader set, then leaves the decision to the full acquire, which does.
///
/// Returns `{1, token, ttl_ms}` when the caller holds a share (taken now, or already its own: an
/// acquire that reached the server twice gets a new token); `{0, ms until the holding writer's
/// lease ends (-1: none holds)}` when it must wait, queued or its presence refreshed when asked;
/// `{-1, N}` when the name is a semaphore of N permits.
pub(crate) const ACQUIRE_READ: &str = concat!(
    r"
local lock, readers, fence, queue, waiters, watchers = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, ttl, presence = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local holder = redis.call('GET', lock)
local shared = holder == ",
    readers_mark!(),
    r"
if holder and not shared and string.byte(holder, 1) == ",
    permits_mark_byte!(),
    r" then return {-1, tonumber(string.match(holder, '%d+$'))} end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mine = false
if shared then
  redis.call('ZREMRANGEBYSCORE', readers, '-inf', now_ms)
  mine = redis.call('ZSCORE', readers, owner)
end
local granted = mine or shared or not holder
local last = redis.call('GET', fence) or '0'
if granted and not mine and string.sub(last, -1) == '+' then
",
    lua_blocked_by_waiters_ahead!("string.sub(entry, -2) ~= ':r'"),
    r"
end
if not granted then
  if presence > 0 then
",
    lua_join_queue!("presence", "ARGV[2] .. ':r'"),
    r"
  end
  if holder and not shared then return {0, redis.call('PTTL', lock)} end
  return {0, -1}
end
local prior = last
local queued = true
",
    lua_take_token_after_prior!(),
    r"
if not holder then
",
    lua_tell_watchers!("ARGV[4]"),
    r"
end
redis.call('ZADD', readers, now_ms + ttl, owner)
if string.sub(last, -1) == '+' and redis.call('HDEL', waiters, owner) == 1 then
  redis.call('LREM', queue, 1, owner)
end
if not shared or redis.call('PTTL', lock) < ttl then
  redis.call('SET', lock, ",
    readers_mark!(),
    r", 'PX', ttl)
end
if redis.call('PTTL', readers) < ttl then redis.call('PEXPIRE', readers, ttl) end
return {1, token, ttl}
"
);

/// A reader's watch. KEYS: lock, readers, reader watchers. ARGV: owner, client id.
///
/// If the caller's share is live under the name's `#readers` mark, adds its client to the
/// watchers, kept at least ten minutes (the watch runs this again well before then) and as long
/// as the mark, and returns 1; else 0: the share is gone.
pub(crate) const WATCH_READER: &str = concat!(
    r"
local lock, readers, watchers = KEYS[1], KEYS[2], KEYS[3]
if redis.call('GET', lock) ~= ",
    readers_mark!(),
    r" then return 0 end
",
    lua_zero_unless_lease_live!("readers"),
    r"
redis.call('SADD', watchers, ARGV[2])
local keep = math.max(redis.call('PTTL', lock), ",
    fence_keep_ms!(),
    r")
if redis.call('PTTL', watchers) < keep then redis.call('PEXPIRE', watchers, keep) end
return 1
"
);
