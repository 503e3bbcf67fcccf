//! The Lua scripts: one atomic round trip per operation, sent by SHA (`EVALSHA`, falling back to
//! `EVAL` when the server has forgotten them, e.g. after a restart or `SCRIPT FLUSH`).
//!
//! Keys of one name (all in one hash slot): `lock` (value: the holder's owner token, TTL: the
//! lease), `fence` (the last fencing token), `queue` (a list of waiting owners, first in line
//! first), `waiters` (a hash: owner → `PRESENCE_DEADLINE_MS:TTL_MS`, then `:r` for a reader, or
//! `=VALUE=` for an election's candidate, whose grant writes its leader record, `scripts/election.rs`).
//!
//! **Hand-off by grant.** A release does not just free the lock and let waiters race: it gives the
//! lock to the first *live* waiter in the queue (one whose presence deadline has not passed), raises
//! the fence for it and publishes `granted OWNER TOKEN`. The waiter learns it holds the lock from
//! that message, with no further round trip, so a hand-off costs about one round trip, and waiters
//! are served in arrival order. A waiter refreshes its presence while it waits; one that vanished
//! is skipped once its presence lapses.
//!
//! **The queue marks.** The uncontended pair (the first attempt and its release) reads neither
//! queue key: a waiter that joins the queue leaves a mark where those two scripts look anyway.
//! - On the **fence**: its value gets a trailing `+` ("waiters may be queued"). The first attempt
//!   reads the fence to take its token; a marked one makes it undo its `SET` and leave the decision
//!   to the full acquire, which knows the queue. Invariant: a non-empty queue has a marked fence
//!   (every script that queues marks it in the same step; only a script that finds the queue empty
//!   takes the mark off). A mark left on an empty queue (its waiters gave up, or it expired) costs
//!   the next first attempt one more round trip, and that acquire takes it off.
//! - On the **lock**: its value gets a trailing `+` when a waiter queues while it is held. A lock
//!   taken by the first attempt had nobody queued then (its fence was not marked), so only this
//!   mark can tell its release that somebody queued since: the release deletes an unmarked lock
//!   it owns, and hands a marked one to the full release. Every script that compares the holder
//!   with an owner takes both values as that owner's.
//!
//!
//! **The watch mark.** A holder that keeps its lock longer than a moment marks the fence with
//! `!CLIENT` after its digits ([`WATCH_HELD`]): "the holder listens on `PREFIX:held-by:CLIENT`",
//! the one channel its client subscribes for all its held locks. A lock can pass to someone else
//! without its holder's release only when its key went (it expired, an operator deleted it, a
//! failover lost it); whoever takes it then finds the mark and publishes `taken OWNER TOKEN
//! LOCK_KEY` there, and the old holder's guard is lost at once instead of at its next renewal.
//! The first attempt reads a marked fence as not a number and leaves the decision to the full
//! acquire, which announces; every grant writes the fence anew, without the mark.
//!
//! Owner values and client ids are hex digits and fences decimal digits, so neither `+` nor `!`
//! is ever part of either.

use redis::Script;

/// How long a fence lives past the write that last set it (a grant, a queue mark), in ms; a
/// literal, to be pasted into the scripts.
///
/// A fence is read only to take the next token, and every token is floored at the server's clock
/// in microseconds, which passes a token within microseconds of its grant: a fence deleted at any
/// moment gives a next token above every earlier one (`the_fence_deleted_mid_stream_still_gives_rising_tokens`).
/// So a name used once can leave nothing behind: a lock per order id must not grow the server
/// without end. It is kept ten minutes past each grant, not less, so that a server clock stepped
/// back by less than that still gives rising tokens; and at least as long as the queue and its
/// waiters (their `keep`), so that its queue mark ("waiters may be queued") lives as long as the
/// queue it stands for.
macro_rules! fence_keep_ms {
    () => {
        "600000"
    };
}

/// Takes the next fencing token of the name whose fence key is `fence`, given `t`, the reply of
/// `TIME`, and `queued`, whether waiters may still be queued in `queue` (the fence then keeps its
/// mark, and lives as long as the queue); leaves it in `token`, and the fence's value before in
/// `prior`. The new value drops the watch mark: the new holder does not watch yet. Inline, not a function: each call of a script pays for every closure it
/// makes.
///
/// The token is above the last one, and at least the server clock in microseconds, so tokens keep
/// rising even if the fence key is lost (restart without persistence, failover to a replica that
/// missed the last grants). Lua numbers are doubles, exact below 2^53 µs (the year 2255). They
/// go to the server as `%d` text: Lua's own number-to-text conversion is its general
/// floating-point one, which costs a short script more than most of its commands.
macro_rules! lua_take_token {
    () => {
        concat!(
            r"
local prior = redis.call('GET', fence) or '0'
",
            lua_take_token_after_prior!()
        )
    };
}

/// [`lua_take_token!`] for a script that has read the fence's value into `prior` already.
macro_rules! lua_take_token_after_prior {
    () => {
        concat!(
            r"
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token = math.max(tonumber(string.match(prior, '^%d+')) + 1, now)
local keep = ",
            fence_keep_ms!(),
            r"
if queued then keep = math.max(keep, redis.call('PTTL', queue)) end
redis.call('SET', fence, string.format('%d', token) .. (queued and '+' or ''), 'PX', string.format('%d', keep))
"
        )
    };
}

/// The first byte of the lock key's value while the name is a semaphore (`#permits:N`), as
/// Lua's `string.byte` returns it: `#`.
macro_rules! permits_mark_byte {
    () => {
        "35"
    };
}

/// The lock key's value while readers hold the name (`scripts/readers.rs`), as a Lua string.
macro_rules! readers_mark {
    () => {
        "'#readers'"
    };
}

/// Joins `owner` to the name's queue, or refreshes its presence there, as `$entry` (a Lua
/// expression: the waiter's record after its presence deadline, `TTL_MS` for a writer,
/// `TTL_MS:r` for a reader) for `$presence` ms from `now_ms`; on joining, marks the fence
/// (whose value the script read into `last`) and a writer's held lock (`holder`), so that the
/// uncontended scripts, which read no queue, hand over to the full ones. The queue, its records
/// and the fence are kept a second past the presence or the holder's lease, whichever is later.
macro_rules! lua_join_queue {
    ($presence:literal, $entry:literal) => {
        concat!(
            r"
  local keep = math.max(redis.call('PTTL', lock), ",
            $presence,
            r") + 1000
  if redis.call('HSET', waiters, owner, (now_ms + ",
            $presence,
            r") .. ':' .. ",
            $entry,
            r") == 1 then
    redis.call('RPUSH', queue, owner)
    if string.sub(last, -1) ~= '+' then redis.call('SET', fence, last .. '+', 'PX', keep) end
    if holder and string.byte(holder, 1) ~= ",
            permits_mark_byte!(),
            r" and string.sub(holder, -1) ~= '+' then
      redis.call('APPEND', lock, '+')
    end
  end
  redis.call('PEXPIRE', queue, keep)
  redis.call('PEXPIRE', waiters, keep)
  if redis.call('PTTL', fence) < keep then redis.call('PEXPIRE', fence, keep) end
"
        )
    };
}

/// Tells whoever watched the name before `owner` took it with `token` over a key that went
/// (`taken OWNER TOKEN LOCK_KEY` on `$prefix .. CLIENT`; `$prefix`: a Lua expression, the watch
/// channels' prefix): the holder whose client the fence's value before this grant (`prior`)
/// names, and the clients of the readers in a reader set left without its mark (`readers`,
/// which goes, with its `watchers`).
macro_rules! lua_tell_watchers {
    ($prefix:literal) => {
        concat!(
            r"
local taken = 'taken ' .. owner .. ' ' .. string.format('%.0f', token) .. ' ' .. lock
local watcher = string.match(prior, '^%d+!(%x+)')
if watcher then redis.call('PUBLISH', ",
            $prefix,
            r" .. watcher, taken) end
if redis.call('DEL', readers) == 1 then
  for _, client in ipairs(redis.call('SMEMBERS', watchers)) do
    redis.call('PUBLISH', ",
            $prefix,
            r" .. client, taken)
  end
  redis.call('DEL', watchers)
end
"
        )
    };
}

/// Drops the waiters at the head of `queue` whose presence (in `waiters`) lapsed by `now_ms`,
/// leaving the first live one (or nil) in `head`; `$stop` may end the walk earlier (a Lua
/// condition on `head`, after `and`, e.g. at the caller's own entry).
macro_rules! lua_drop_lapsed_heads {
    ($stop:literal) => {
        concat!(
            r"
local head = redis.call('LINDEX', queue, 0)
while head ",
            $stop,
            r" do
  local entry = redis.call('HGET', waiters, head)
  if entry and tonumber(string.match(entry, '^(%d+):')) > now_ms then break end
  redis.call('LPOP', queue)
  redis.call('HDEL', waiters, head)
  head = redis.call('LINDEX', queue, 0)
end
"
        )
    };
}

/// Answers 0 unless `ARGV[1]`'s member of the lease set `$set` (a Lua variable) is live: its
/// score, the end of its lease, is after the server's clock, left in `now_ms`.
macro_rules! lua_zero_unless_lease_live {
    ($set:literal) => {
        concat!(
            r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', ",
            $set,
            r", ARGV[1])
if not score or tonumber(score) <= now_ms then return 0 end
"
        )
    };
}

/// Sets `granted` to false if a live waiter queued ahead of `owner` (presence deadline after
/// `now_ms`) blocks it: `$blocks`, a Lua condition on that waiter's record `entry` and on
/// `ahead`, how many live waiters are ahead up to and including it. Drops the lapsed waiters at
/// the head first. A caller not queued walks the whole queue.
macro_rules! lua_blocked_by_waiters_ahead {
    ($blocks:literal) => {
        concat!(
            lua_drop_lapsed_heads!("and head ~= owner"),
            r"
  if head and head ~= owner then
    local ahead = 0
    for _, waiter in ipairs(redis.call('LRANGE', queue, 0, -1)) do
      if waiter == owner then break end
      local entry = redis.call('HGET', waiters, waiter)
      if entry and tonumber(string.match(entry, '^(%d+):')) > now_ms then
        ahead = ahead + 1
        if ",
            $blocks,
            r" then
          granted = false
          break
        end
      end
    end
  end
"
        )
    };
}

/// How long a leader record outlives the lease it was written or renewed under, in ms: the
/// record is set with the lock key's PTTL plus this, in the same script, so it never ends
/// before the lease it belongs to.
macro_rules! leader_margin_ms {
    () => {
        "1000"
    };
}

/// `grant_next`, for the scripts that free a lock: defined only once the script knows somebody
/// is queued, so that a release with nobody waiting makes no closure.
macro_rules! lua_grant_helper {
    () => {
        concat!(
            r"
local function raise_fence(fence, queue, t, queued)
",
            lua_take_token!(),
            r"
  return token
end

-- Gives the free lock to the first live waiter, starting with `head` (already popped), and tells
-- it; or, if that waiter is a reader, wakes the readers queued before the next writer; or, if
-- the queue held only waiters whose presence lapsed, announces the lock free (one of them may
-- still be alive and re-queue) and takes the queue mark off the fence. A candidate's grant also
-- writes its leader record (`OWNER TERM VALUE`, as a proclaim would), so it leads with no
-- further round trip; observers read again on the `granted` message.
local function grant_next(head, lock, fence, queue, waiters, channel)
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  while head do
    local entry = redis.call('HGET', waiters, head)
    if entry then
      local deadline, ttl, rest = string.match(entry, '^(%d+):(%d+)(.*)$')
      if tonumber(deadline) > now_ms then
        if rest == ':r' then
          -- Readers come in by their own acquire, every one queued before the next writer
          -- together: the head goes back, the fence keeps its mark, and all are woken.
          redis.call('LPUSH', queue, head)
          redis.call('PUBLISH', channel, 'free')
          return
        end
        redis.call('HDEL', waiters, head)
        redis.call('SET', lock, head, 'PX', ttl)
        local token = string.format('%.0f', raise_fence(fence, queue, t, redis.call('EXISTS', queue) == 1))
        if string.byte(rest, 1) == 61 then
          -- The record key is the lock key's `:leader` (`LockKeys::leader`): not passed in, as
          -- a release cannot know whether its next waiter campaigns; it shares the lock key's
          -- hash tag, so it is in the slot the script runs on.
          redis.call('SET', lock .. ':leader', head .. ' ' .. token .. ' ' .. string.sub(rest, 2, -2),
            'PX', tonumber(ttl) + ",
            leader_margin_ms!(),
            r")
        end
        redis.call('PUBLISH', channel, 'granted ' .. head .. ' ' .. token)
        return
      end
      redis.call('HDEL', waiters, head)
    end
    head = redis.call('LPOP', queue)
  end
  local last = redis.call('GET', fence)
  if last then redis.call('SET', fence, string.match(last, '^%d+'), 'KEEPTTL') end
  redis.call('PUBLISH', channel, 'free')
end
"
        )
    };
}

/// Whether the holder value `holder` (nil when free) is the owner `owner`'s, marked or not.
macro_rules! lua_holds {
    ($holder:literal, $owner:literal) => {
        concat!(
            "(", $holder, " == ", $owner, " or ", $holder, " == ", $owner, " .. '+')"
        )
    };
}

/// The first attempt of an acquire, with the fewest keys, arguments and calls: a fresh owner
/// cannot hold the lock already, and does not queue yet. KEYS: lock, fence. ARGV: owner, ttl_ms.
///
/// Returns the token when the lock was free with nobody queued and is now the caller's (its lease
/// is the TTL just set), `0` when someone holds it, `-N` when it is a semaphore of N permits
/// ([`permits`]), and nil when it is free but waiters may be queued (a marked fence) or readers
/// hold it ([`readers`]): [`ACQUIRE`] then decides (a live waiter goes first; lapsed ones are
/// dropped; readers whose lease ended are trimmed). `GETSET` stores the clock and returns the last token in one call; only when the
/// last token is not below the clock (two grants in one microsecond, a clock stepped back) does
/// a second call store the last token plus one.
const ACQUIRE_FIRST: &str = concat!(
    r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local holder = redis.call('GET', KEYS[1])
  if holder and string.byte(holder, 1) == ",
    permits_mark_byte!(),
    r" then
    local permits = string.match(holder, '^#permits:(%d+)$')
    if permits then return -tonumber(permits) end
    return false
  end
  return 0
end
local t = redis.call('TIME')
local last = redis.call('SET', KEYS[2], t[1] .. string.sub('00000' .. t[2], -6), 'PX', ",
    fence_keep_ms!(),
    r", 'GET')
local token = tonumber(last or '0')
if not token then
  redis.call('SET', KEYS[2], last, 'PX', math.max(",
    fence_keep_ms!(),
    r", redis.call('PTTL', KEYS[1]) + 1000))
  redis.call('DEL', KEYS[1])
  return false
end
token = token + 1
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if token > now then
  redis.call('SET', KEYS[2], string.format('%.0f', token), 'KEEPTTL')
  return token
end
return now
"
);

/// Acquire. KEYS: lock, fence, queue, waiters, readers (the name's lease set), reader watchers.
/// ARGV: owner, ttl_ms, enqueue (`0`/`1`), presence_ms, channel, the watch channels' prefix
/// (`PREFIX:held-by:`), and for an election's candidate its value.
///
/// A candidate's grant writes its leader record (as [`election::PROCLAIM`] would), and its queue
/// entry carries the value, so that a release granting it the lock writes the record too.
///
/// Returns `{1, token, pttl}` when the caller holds the lock (taken now, held already, or granted
/// to it by a release whose message may still be on its way), `{-1, N, 0}` when the name is a
/// semaphore of N permits ([`permits`]), else `{0, ms to wait, fence}` (the holder's PTTL, or
/// while readers hold, until the earliest reader's lease ends; `-2`: free but a live waiter is
/// first; `fence`: the last token handed out, so a waiter can tell a grant made after this
/// answer, whose token is higher, from one made before). With enqueue, a busy answer also queues
/// the caller (or refreshes its presence), marking the fence and a held lock when it joins.
/// Readers whose lease ended are trimmed first, and the last one's mark goes. Taking a lock whose
/// fence carries a watch mark publishes `taken OWNER TOKEN LOCK_KEY` on the watching client's
/// channel; taking it over a reader set left without its mark (the mark deleted or lost in a
/// failover) deletes the set and tells each watching reader's client the same.
const ACQUIRE: &str = concat!(
    r"
local lock, fence, queue, waiters, readers, watchers = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner = ARGV[1]
local holder = redis.call('GET', lock)
local shared = holder == ",
    readers_mark!(),
    r"
if holder and not shared and string.byte(holder, 1) == ",
    permits_mark_byte!(),
    r" then return {-1, tonumber(string.match(holder, '%d+$')), 0} end
if ",
    lua_holds!("holder", "owner"),
    r" then
  return {1, tonumber(string.match(redis.call('GET', fence) or '0', '^%d+')), redis.call('PTTL', lock)}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wait_ms
if shared then
  redis.call('ZREMRANGEBYSCORE', readers, '-inf', now_ms)
  local first = redis.call('ZRANGE', readers, 0, 0, 'WITHSCORES')
  if first[2] then
    wait_ms = math.max(tonumber(first[2]) - now_ms, 1)
  else
    redis.call('DEL', lock)
    holder = nil
  end
end
if not holder then
",
    lua_drop_lapsed_heads!(""),
    r"
  if (not head) or head == owner then
    if head then
      redis.call('LPOP', queue)
      redis.call('HDEL', waiters, owner)
    end
    redis.call('SET', lock, owner, 'PX', ARGV[2])
    local queued = redis.call('EXISTS', queue) == 1
",
    lua_take_token!(),
    lua_tell_watchers!("ARGV[6]"),
    r"
    if ARGV[7] then
      redis.call('SET', lock .. ':leader', owner .. ' ' .. string.format('%.0f', token) .. ' ' .. ARGV[7],
        'PX', tonumber(ARGV[2]) + ",
    leader_margin_ms!(),
    r")
      redis.call('PUBLISH', ARGV[5], 'leader ' .. string.format('%.0f', token))
    end
    return {1, token, tonumber(ARGV[2])}
  end
  -- Free with a live waiter first (its holder expired rather than released): wake it.
  redis.call('PUBLISH', ARGV[5], 'free')
end
local last = redis.call('GET', fence) or '0'
if ARGV[3] == '1' then
  local queued_as = ARGV[2]
  if ARGV[7] then queued_as = ARGV[2] .. '=' .. ARGV[7] .. '=' end
",
    lua_join_queue!("tonumber(ARGV[4])", "queued_as"),
    r"
end
return {0, wait_ms or redis.call('PTTL', lock), tonumber(string.match(last, '^%d+'))}
"
);

/// How long a release's mark says who released a lock, in ms: longer than any re-sent release
/// takes to arrive (the Cluster client's retries, a Sentinel failover).
///
/// Where a release may reach the server twice (a Cluster client re-sends a command whose reply
/// it lost, a Sentinel connection re-sends a release after a failover), a release that deleted
/// the lock leaves a short-lived mark, `released-by = OWNER`, and a release that finds the lock
/// not the caller's but the mark its own answers "released": the first one did, and the second
/// finding nothing must not tell the caller its critical section went unprotected (`NotHeld`).
/// A single node's connection sends each command once, and its scripts leave no mark.
macro_rules! release_mark_ms {
    () => {
        "60000"
    };
}

pub(crate) mod permits;
pub(crate) mod readers;
pub(crate) mod set;

/// Release. KEYS: lock, fence, queue, waiters (and the mark, [`RELEASE_MARKED`]). ARGV: owner,
/// channel. Deletes the lock only if the caller owns it and hands it to the next live waiter.
/// Returns 1 or 0. `$mark` runs once the lock is deleted, `$not_mine` answers when it is not the
/// caller's.
macro_rules! release_script {
    ($mark:expr, $not_mine:expr) => {
        concat!(
            r"
local holder = redis.call('GET', KEYS[1])
if not ",
            lua_holds!("holder", "ARGV[1]"),
            r" then ",
            $not_mine,
            r" end
redis.call('DEL', KEYS[1])
",
            $mark,
            r"local head = redis.call('LPOP', KEYS[3])
if not head then return 1 end
",
            lua_grant_helper!(),
            r"
grant_next(head, KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2])
return 1
"
        )
    };
}

const RELEASE: &str = release_script!("", "return 0");

/// [`RELEASE`] where a release may be re-sent: KEYS\[5\] is the name's `released-by` mark.
const RELEASE_MARKED: &str = release_script!(
    concat!(
        "redis.call('SET', KEYS[5], ARGV[1], 'PX', ",
        release_mark_ms!(),
        ")\n"
    ),
    "if redis.call('GET', KEYS[5]) == ARGV[1] then return 1 end return 0"
);

/// Release of a lock taken by the first attempt, with nobody queued. KEYS: lock (and the mark,
/// [`RELEASE_UNCONTENDED_MARKED`]). ARGV: owner.
/// Deletes the lock only if the caller owns it and nobody queued since (the lock is not marked);
/// returns 1 (released), 0 (not the caller's), or 2 (the caller's, marked: left held for
/// [`RELEASE`] to hand over). Most locks are released before anyone queues for them, and this
/// script is the compare-and-delete of a plain lock: each key or argument passed into Lua, and
/// each call from it, costs the server about as much as a plain command.
macro_rules! release_uncontended_script {
    ($mark:expr, $not_mine:expr) => {
        concat!(
            r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  ",
            $mark,
            r"return 1
end
if holder == ARGV[1] .. '+' then return 2 end
",
            $not_mine,
            r"
"
        )
    };
}

const RELEASE_UNCONTENDED: &str = release_uncontended_script!("", "return 0");

/// [`RELEASE_UNCONTENDED`] where a release may be re-sent: KEYS\[2\] is the `released-by` mark.
const RELEASE_UNCONTENDED_MARKED: &str = release_uncontended_script!(
    concat!(
        "redis.call('SET', KEYS[2], ARGV[1], 'PX', ",
        release_mark_ms!(),
        ")\n"
    ),
    "if redis.call('GET', KEYS[2]) == ARGV[1] then return 1 end return 0"
);

/// Cancel a wait (timeout, dropped future, failed acquire). KEYS and ARGV as release. If a
/// release granted the lock to the caller meanwhile, releases it onward (returns 2); otherwise
/// leaves the queue (returns 1), waking the waiters if the lock is free or readers hold it.
const CANCEL: &str = concat!(
    lua_grant_helper!(),
    r"
local holder = redis.call('GET', KEYS[1])
if ",
    lua_holds!("holder", "ARGV[1]"),
    r" then
  redis.call('DEL', KEYS[1])
  local head = redis.call('LPOP', KEYS[3])
  if head then grant_next(head, KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2]) end
  return 2
end
redis.call('LREM', KEYS[3], 0, ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
-- Readers queued behind the caller may come in beside the readers that hold.
if (not holder or string.byte(holder, 1) == ",
    permits_mark_byte!(),
    r") and redis.call('LLEN', KEYS[3]) > 0 then
  redis.call('PUBLISH', ARGV[2], 'free')
end
return 1
"
);

/// Extend. KEYS: lock. ARGV: owner, ttl_ms. Resets the lease only if the caller owns the lock
/// (its value marked or not: Redlock's nodes never mark it). Returns 1 or 0.
pub(crate) const EXTEND: &str = concat!(
    r"
local holder = redis.call('GET', KEYS[1])
if ",
    lua_holds!("holder", "ARGV[1]"),
    r" then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"
);

/// Extend of many locks at once (one tick's renewals, `renew.rs`): [`EXTEND`] for each key in
/// turn. KEYS: the locks (on one server). ARGV: ttl_ms, then the owner of each key in order.
/// Returns 1 or 0 per key.
pub(crate) const EXTEND_MANY: &str = concat!(
    r"
local extended = {}
for i, key in ipairs(KEYS) do
  local holder, owner = redis.call('GET', key), ARGV[i + 1]
  if ",
    lua_holds!("holder", "owner"),
    r" then
    extended[i] = redis.call('PEXPIRE', key, ARGV[1])
  else
    extended[i] = 0
  end
end
return extended
"
);

/// Starts a holder's watch. KEYS: lock, fence. ARGV: owner, client id.
///
/// If the caller holds the lock, marks the fence with `!CLIENT` (see the module docs; a mark
/// an earlier holder left is replaced) and keeps it at least [`fence_keep_ms!`] more (a lock
/// held longer than its fence would otherwise live keeps its mark: the watch runs this again
/// well before then), and returns 1; else returns 0: the holder's lock is gone. A fence that is
/// missing (deleted) is started at `0`: tokens are floored at the server's clock, so the next
/// one still rises.
pub(crate) const WATCH_HELD: &str = concat!(
    r"
local holder = redis.call('GET', KEYS[1])
if not ",
    lua_holds!("holder", "ARGV[1]"),
    r" then return 0 end
local digits, queued = string.match(redis.call('GET', KEYS[2]) or '0', '^(%d+)!?%x*(.*)$')
redis.call('SET', KEYS[2], digits .. '!' .. ARGV[2] .. queued, 'PX', math.max(redis.call('PTTL', KEYS[2]), ",
    fence_keep_ms!(),
    r"))
return 1
"
);

/// Node acquire, for multi-node algorithms (no queue). KEYS: lock, fence, watch. ARGV: owner,
/// ttl_ms, floor, the watch channels' prefix (`PREFIX:held-by:`).
///
/// `SET NX PX` and, when set, the token alone: the name's fence counter plus one. A counter that
/// does not exist (first use, lost with a restart without persistence, or expired ten minutes
/// after it started) starts from `floor`, the caller's wall clock in microseconds, so tokens keep
/// rising through a restart and an expiry (the counter counted far fewer grants than
/// microseconds passed since its start); otherwise it is a plain counter, so that nodes which saw the same grants hand out the same token and a
/// quorum usually agrees on it (one caller's round gives every node the same floor). When someone
/// holds the lock, `{0, PTTL, holder}`. A first attempt sent to every node at once does the same
/// in plain pipelined commands (`Counting::EveryAttempt`), cheaper on the server, advancing the
/// counter even when busy.
///
/// Taking a lock whose key went while its holder watched it ([`NODE_WATCH_HELD`]) tells that
/// holder: `lost OWNER` on its client's channel, and the watch mark goes.
pub(crate) const NODE_ACQUIRE: &str = concat!(
    r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ",
    fence_keep_ms!(),
    r")
  local mark = redis.call('GET', KEYS[3])
  if mark then
    redis.call('DEL', KEYS[3])
    local client, watcher = string.match(mark, '^(%x+) (%x+)$')
    if client then redis.call('PUBLISH', ARGV[4] .. client, 'lost ' .. watcher) end
  end
  return redis.call('INCR', KEYS[2])
end
return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1]) or ''}
"
);

/// [`fence_keep_ms!`] as the node acquire's pipeline sends it.
pub(crate) const FENCE_KEEP_MS_ARG: &str = fence_keep_ms!();

/// Node release. KEYS: lock, watch. ARGV: owner. Deletes the lock (and the holder's watch mark)
/// only if the caller owns it; 1 or 0.
pub(crate) const NODE_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  return 1
end
return 0
";

/// Node release with an announcement. KEYS: lock, watch. ARGV: owner, channel. Deletes the lock
/// (and the holder's watch mark) only if the caller owns it and then publishes `released` on the
/// channel; 1 or 0.
pub(crate) const NODE_RELEASE_ANNOUNCED: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
";

/// A node holder's watch. KEYS: lock, watch. ARGV: owner, mark (`CLIENT OWNER`).
///
/// If the caller holds the lock, sets the watch mark for [`fence_keep_ms!`] (the watch runs this
/// again well before then) and returns 1: whoever takes the lock after its key went tells the
/// holder on `PREFIX:held-by:CLIENT` ([`NODE_ACQUIRE`]); else returns 0.
pub(crate) const NODE_WATCH_HELD: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ",
    fence_keep_ms!(),
    r")
return 1
"
);

/// Raises a fence counter to at least a value (Redlock writes its quorum's highest token back).
/// KEYS: fence. ARGV: token. Returns the counter after.
pub(crate) const NODE_RAISE_FENCE: &str = concat!(
    r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if current < wanted then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ",
    fence_keep_ms!(),
    r")
  return wanted
end
return current
"
);

/// Raises a fence counter to at least a value, only while the caller holds the lock on this node.
/// KEYS: lock, fence. ARGV: owner, token. Returns 1 if the caller holds the lock (the counter is
/// then at least the token), else 0 and leaves the counter alone.
pub(crate) const NODE_RAISE_FENCE_HELD: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ",
    fence_keep_ms!(),
    r")
end
return 1
"
);

/// A waiter's place in the name's waiting line on one node, for multi-node algorithms (Redlock
/// keeps the line on its agreed node, and the first in line skips that node's gate). KEYS:
/// queue, waiters. ARGV: waiter, presence_ms. Joins the line at its end, or refreshes the
/// waiter's presence; drops the waiters ahead whose presence lapsed; returns 1 when the waiter
/// is first, else 0. Entries have the single-node queue's format (`DEADLINE:TTL`, TTL 0 here),
/// so [`INSPECT`] counts them alike.
pub(crate) const NODE_LINE_CHECK: &str = r"
local queue, waiters, me = KEYS[1], KEYS[2], ARGV[1]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('HSET', waiters, me, (now_ms + tonumber(ARGV[2])) .. ':0') == 1 then
  redis.call('RPUSH', queue, me)
end
local head = redis.call('LINDEX', queue, 0)
while head and head ~= me do
  local entry = redis.call('HGET', waiters, head)
  if entry and tonumber(string.match(entry, '^(%d+):') or '0') > now_ms then break end
  redis.call('LPOP', queue)
  redis.call('HDEL', waiters, head)
  head = redis.call('LINDEX', queue, 0)
end
local keep = math.max(redis.call('PTTL', queue), tonumber(ARGV[2])) + 1000
redis.call('PEXPIRE', queue, keep)
redis.call('PEXPIRE', waiters, keep)
if head == me then return 1 end
return 0
";

/// Inspect (read only). KEYS: lock, fence, queue, waiters, readers.
///
/// Returns `{holder, pttl, fence, waiters, readers, waiting readers}`: the holder's owner value
/// (`''` when free; without its queue mark, as is the fence; the readers' mark while readers
/// hold), its PTTL (`-2` free, `-1` a key without TTL), the name's fence counter (the holder's
/// token: a grant sets the lock and raises the fence in one script; `''` when the name never
/// had one), how many queued waiters are live (presence deadline not passed), how many readers'
/// leases are live while the readers' mark holds, and how many of the live waiters are readers.
/// On a node without the queue (Redlock's) the waiters are 0.
pub(crate) const INSPECT: &str = concat!(
    r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live, live_readers = 0, 0
for _, owner in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local entry = redis.call('HGET', KEYS[4], owner)
  if entry and tonumber(string.match(entry, '^(%d+):') or '0') > now_ms then
    live = live + 1
    if string.sub(entry, -2) == ':r' then live_readers = live_readers + 1 end
  end
end
local holder = redis.call('GET', KEYS[1]) or ''
if string.sub(holder, -1) == '+' then holder = string.sub(holder, 1, -2) end
local readers = 0
if holder == ",
    readers_mark!(),
    r" then
  readers = redis.call('ZCOUNT', KEYS[5], '(' .. now_ms, '+inf')
end
return {holder, redis.call('PTTL', KEYS[1]),
  string.match(redis.call('GET', KEYS[2]) or '', '^%d*'), live, readers, live_readers}
"
);

pub(crate) mod election;

/// The scripts, hashed once per client.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub(crate) acquire_first: Script,
    pub(crate) acquire: Script,
    /// Every lock of a set, or none (`scripts/set.rs`).
    pub(crate) acquire_set: Script,
    /// The releases leave a `released-by` mark and take one as released ([`release_mark_ms!`]):
    /// they take the mark's key after their own (a permit's: its owner's own mark).
    pub(crate) marks_releases: bool,
    pub(crate) release: Script,
    pub(crate) release_uncontended: Script,
    pub(crate) cancel: Script,
    pub(crate) extend: Script,
    pub(crate) extend_many: Script,
    pub(crate) watch_held: Script,
    pub(crate) inspect: Script,
    pub(crate) acquire_permit: Script,
    pub(crate) release_permit: Script,
    pub(crate) extend_permit: Script,
    pub(crate) count_permits: Script,
    pub(crate) acquire_read: Script,
    pub(crate) watch_reader: Script,
    pub(crate) proclaim: Script,
    pub(crate) leader: Script,
    pub(crate) extend_leader: Script,
    pub(crate) vacate: Script,
    /// A leader's release: [`release`](Self::release) that also ends its record
    /// (`scripts/election.rs`), marked where releases are.
    pub(crate) release_leader: Script,
}

impl Scripts {
    /// The scripts; with `marks_releases` where a release may reach the server twice.
    pub(crate) fn new(marks_releases: bool) -> Self {
        let (release, release_uncontended, release_leader) = match marks_releases {
            true => (
                RELEASE_MARKED,
                RELEASE_UNCONTENDED_MARKED,
                election::RELEASE_LEADER_MARKED,
            ),
            false => (RELEASE, RELEASE_UNCONTENDED, election::RELEASE_LEADER),
        };
        Self {
            acquire_first: Script::new(ACQUIRE_FIRST),
            acquire: Script::new(ACQUIRE),
            acquire_set: Script::new(set::ACQUIRE_SET),
            marks_releases,
            release: Script::new(release),
            release_uncontended: Script::new(release_uncontended),
            cancel: Script::new(CANCEL),
            extend: Script::new(EXTEND),
            extend_many: Script::new(EXTEND_MANY),
            watch_held: Script::new(WATCH_HELD),
            inspect: Script::new(INSPECT),
            acquire_permit: Script::new(permits::ACQUIRE_PERMIT),
            release_permit: Script::new(match marks_releases {
                true => permits::RELEASE_PERMIT_MARKED,
                false => permits::RELEASE_PERMIT,
            }),
            extend_permit: Script::new(permits::EXTEND_PERMIT),
            count_permits: Script::new(permits::COUNT_PERMITS),
            acquire_read: Script::new(readers::ACQUIRE_READ),
            watch_reader: Script::new(readers::WATCH_READER),
            proclaim: Script::new(election::PROCLAIM),
            leader: Script::new(election::LEADER),
            extend_leader: Script::new(election::EXTEND_LEADER),
            vacate: Script::new(election::VACATE),
            release_leader: Script::new(release_leader),
        }
    }
}

/// What a message on a lock's channel says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Announcement<'a> {
    /// The lock was handed to `owner` with fencing token `token`.
    Granted { owner: &'a str, token: u64 },
    /// The lock is free: waiters should try.
    Free,
    /// The name's leader may have changed (a proclaim, a leader's release or lost lease):
    /// observers read again; waiters need not.
    Leader,
    /// `owner` took the lock whose key is `lock`, with fencing token `token`, over a key that
    /// went without its holder's release: a holder of it with a lower token has lost it.
    Taken {
        owner: &'a str,
        token: u64,
        lock: &'a str,
    },
}

impl<'a> Announcement<'a> {
    pub(crate) fn parse(payload: &'a str) -> Option<Self> {
        if let Some(taken) = payload.strip_prefix("taken ") {
            // The lock key goes last: a name may hold spaces.
            let mut words = taken.splitn(3, ' ');
            let (owner, token, lock) = (words.next()?, words.next()?, words.next()?);
            return Some(Self::Taken {
                owner,
                token: token.parse().ok()?,
                lock,
            });
        }
        let mut words = payload.split(' ');
        match (words.next()?, words.next(), words.next()) {
            ("granted", Some(owner), Some(token)) => Some(Self::Granted {
                owner,
                token: token.parse().ok()?,
            }),
            ("free", None, None) => Some(Self::Free),
            ("leader", _, None) => Some(Self::Leader),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `script` on `keys` with `args`, against a real Redis.
    pub(super) async fn run<T: redis::FromRedisValue>(
        conn: &mut redis::aio::MultiplexedConnection,
        script: &str,
        keys: &[&str],
        args: &[&str],
    ) -> T {
        let script = Script::new(script);
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        invocation.invoke_async(conn).await.unwrap()
    }

    /// A connection to the test binary's shared Redis, and the keys of a name of this process's
    /// own, `NAME/PID` (test binaries may share the server).
    pub(super) async fn shared_server_keys(
        name: &str,
    ) -> (redis::aio::MultiplexedConnection, crate::LockKeys) {
        let server = dlock_test_servers::shared_redis();
        let conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let name = format!("{name}/{}", std::process::id());
        let keys = crate::LockKeys::new("dlock-test", &dlock_api::LockName::new(name).unwrap());
        (conn, keys)
    }

    /// Runs `script` on `keys` for `owner` (and the channel, for the full release).
    async fn release(
        conn: &mut redis::aio::MultiplexedConnection,
        script: &str,
        keys: &[&str],
        owner: &str,
        channel: Option<&str>,
    ) -> i64 {
        match channel {
            Some(channel) => run(conn, script, keys, &[owner, channel]).await,
            None => run(conn, script, keys, &[owner]).await,
        }
    }

    /// A release that reaches the server twice (its first reply lost, the command sent again by
    /// the Cluster client or after a Sentinel failover): with marks, the second arrival answers
    /// released, on the first attempt's path and on the full one; without, it answered "not
    /// held", which says the caller's critical section was unprotected. Another owner's release
    /// is still refused. Against a real Redis.
    #[tokio::test]
    async fn a_release_sent_twice_is_released_twice_where_releases_are_marked() {
        let (mut conn, keys) = shared_server_keys("resent-release").await;
        let lock_and_mark = [keys.lock.as_str(), keys.released_by.as_str()];
        let all = [
            keys.lock.as_str(),
            keys.fence.as_str(),
            keys.queue.as_str(),
            keys.waiters.as_str(),
            keys.released_by.as_str(),
        ];
        let channel = Some(keys.channel.as_str());
        let mut answers = Vec::new();
        for (uncontended, full) in [
            (RELEASE_UNCONTENDED_MARKED, RELEASE_MARKED),
            (RELEASE_UNCONTENDED, RELEASE),
        ] {
            let mut sent_twice = Vec::new();
            for first_attempts_path in [true, false] {
                let _: () = redis::cmd("SET")
                    .arg(&keys.lock)
                    .arg("me")
                    .arg("PX")
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                for _ in 0..2 {
                    sent_twice.push(match first_attempts_path {
                        true => release(&mut conn, uncontended, &lock_and_mark, "me", None).await,
                        false => release(&mut conn, full, &all, "me", channel).await,
                    });
                }
                let other = release(&mut conn, full, &all, "other", channel).await;
                assert_eq!(other, 0, "another owner's release");
            }
            answers.push(sent_twice);
        }
        assert_eq!(answers[0], [1, 1, 1, 1], "marked releases, sent twice each");
        assert_eq!(
            answers[1],
            [1, 0, 1, 0],
            "unmarked releases, sent twice each"
        );
    }

    #[test]
    fn parses_announcements() {
        assert_eq!(
            Announcement::parse("granted abc 17"),
            Some(Announcement::Granted {
                owner: "abc",
                token: 17
            })
        );
        assert_eq!(Announcement::parse("free"), Some(Announcement::Free));
        assert_eq!(Announcement::parse("leader"), Some(Announcement::Leader));
        assert_eq!(Announcement::parse("leader 17"), Some(Announcement::Leader));
        assert_eq!(
            Announcement::parse("taken abc 18 dlock:{a b}"),
            Some(Announcement::Taken {
                owner: "abc",
                token: 18,
                lock: "dlock:{a b}"
            })
        );
        assert_eq!(Announcement::parse("taken abc 18"), None);
        assert_eq!(Announcement::parse("granted abc"), None);
        assert_eq!(Announcement::parse("released"), None);
    }
}
