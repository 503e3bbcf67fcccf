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

/// Takes a permit, in the order waiters queued. KEYS: lock, permits, fence, queue, waiters.
/// ARGV: owner, ttl_ms, limit, presence_ms (`0`: do not queue).
///
/// Waiters queue in the lock's queue (`queue`, and `waiters`: owner → `PRESENCE_DEADLINE_MS:TTL_MS`),
/// which a semaphore's name has to itself while its lock key says `#permits:N`: the mark is kept
/// at least as long as the queue. A caller is granted a permit when fewer than N are held
/// counting the **live** waiters queued ahead of it (presence deadline not passed), so nobody,
/// a `try_acquire_permit` included, takes a permit an earlier waiter is owed; waiters whose
/// presence lapsed are skipped, and dropped once they reach the head. A granted waiter leaves
/// the queue. With nobody queued (no queue key), this is the uncontended path, one script.
///
/// Returns `{1, token, ttl_ms}` when the caller holds a permit (taken now, or already its own:
/// an acquire that reached the server twice gets a new token, above the one whose reply was
/// lost); `{0, ms until the earliest permit's lease ends, fence}` when the caller must wait
/// (`-1`: no permit is held, the room is owed to waiters ahead), queued or its presence
/// refreshed when asked (`fence`: the last token handed out, so that a waiter granted by a
/// release, [`RELEASE_PERMIT`], can tell a grant made after this answer from one made before); `{-1, in_use}` when the name is in use with another number of permits (a lock, held
/// or with waiters queued, counts as one: a queue mark on the fence, checked against the queue
/// itself). A grant keeps the lock key's mark and the set at least as long as its lease, and no
/// longer than the latest live lease or the queue, so a semaphore used once leaves nothing behind.
pub(crate) const ACQUIRE_PERMIT: &str = concat!(
    r"
local lock, permits, fence, queue, waiters = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, ttl, limit, presence = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
-- A name nobody uses takes its mark in the call that reads it (`NX` with `GET`: nil when it
-- set it), with the lease asked for, as a grant sets it: the uncontended path's one call for both.
local mark = redis.call('SET', lock, '#permits:' .. ARGV[3], 'NX', 'PX', ARGV[2], 'GET')
local prior = redis.call('GET', fence) or '0'
if mark then
  local in_use = tonumber(string.match(mark, '^#permits:(%d+)$') or '1')
  if in_use ~= limit then return {-1, in_use} end
elseif string.sub(prior, -1) == '+' and redis.call('EXISTS', queue) == 1 then
  redis.call('DEL', lock)
  return {-1, 1}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Numbers go to the server as integer text (`%d`): Lua's own conversion of a number to text
-- is the general floating-point one, a costly part of a short script.
local held = 0
-- An unmarked name has no permits, unless its mark was lost (a failover, an eviction): then
-- its set is there, and counted as any.
if mark or redis.call('EXISTS', permits) == 1 then
  redis.call('ZREMRANGEBYSCORE', permits, '-inf', string.format('%d', now_ms))
  held = redis.call('ZCARD', permits)
end
-- Whether the caller holds a permit already (an acquire that reached the server twice) matters
-- only where it could be refused or queued; elsewhere the `ZADD` below tells.
local mine = false
if mark or held >= limit then mine = redis.call('ZSCORE', permits, owner) end
local granted = mine or held < limit
-- Only a marked name has a queue of permit waiters: the uncontended path reads none of it.
if not mine and granted and mark then
",
    lua_blocked_by_waiters_ahead!("held + ahead >= limit"),
    r"
end
if not granted then
  if presence > 0 then
    if redis.call('HSET', waiters, owner, (now_ms + presence) .. ':' .. ARGV[2]) == 1 then
      redis.call('RPUSH', queue, owner)
    end
    local keep = presence + 1000
    redis.call('PEXPIRE', queue, keep)
    redis.call('PEXPIRE', waiters, keep)
    if not mark then
      redis.call('SET', lock, '#permits:' .. ARGV[3], 'PX', keep)
    elseif redis.call('PTTL', lock) < keep then
      redis.call('PEXPIRE', lock, keep)
    end
  end
  local last = tonumber(string.match(prior, '^%d+'))
  if held == 0 then return {0, -1, last} end
  local first = redis.call('ZRANGE', permits, 0, 0, 'WITHSCORES')
  return {0, math.max(tonumber(first[2]) - now_ms, 1), last}
end
if redis.call('ZADD', permits, string.format('%d', now_ms + ttl), owner) == 1 then
  held = held + 1
end
if mark and redis.call('HDEL', waiters, owner) == 1 then redis.call('LREM', queue, 1, owner) end
-- The only live permit (a set made just now, without a TTL yet) sets both keys' TTL to its
-- lease (an unmarked name's mark has it already); any other raises each to its lease if it
-- would end sooner. Each key is checked on its own: the mark also outlives the queue, which it
-- gives to the semaphore, so its TTL says nothing of the set's.
if mark and (held == 1 or redis.call('PTTL', lock) < ttl) then
  redis.call('SET', lock, mark, 'PX', ARGV[2])
end
if held == 1 or redis.call('PTTL', permits) < ttl then redis.call('PEXPIRE', permits, ARGV[2]) end
if mark then
  local queue_left = redis.call('PTTL', queue)
  if queue_left > redis.call('PTTL', lock) then redis.call('PEXPIRE', lock, queue_left) end
end
local queued = false
",
    lua_take_token_after_prior!(),
    r"
return {1, token, ttl}
"
);

/// Gives a permit back, or ends a wait for one. KEYS: lock, permits, queue, waiters, fence (and,
/// where a release may reach the server twice, the owner's `released-by` mark:
/// [`RELEASE_PERMIT_MARKED`]). ARGV: owner, channel, `1` when a wait ends (else `0`: a
/// holder's release, whose owner left the queue when it was granted).
///
/// Takes the owner out of the queue (a cancelled wait, which may have been granted meanwhile)
/// and out of the set. Returns 1 when its permit was live and is now out, else 0: a permit
/// released twice, or after its lease ended (on the server's clock), or never held, adds
/// nothing. The last permit out, with nobody queued, deletes the lock key's mark. `$mark` runs
/// once a live permit is out, `$not_mine` answers when none was.
///
/// **Hand-off by grant**, as the lock's release does: room made (a permit out, a place given
/// up) goes to the live waiters at the head of the queue, in order, while fewer than N permits
/// are held, each granted here with its own lease and token and told by `granted OWNER TOKEN`,
/// so a hand-off costs no further round trip and wakes nobody else. Had it announced `free` to
/// every waiter, all of them would try again and the head, the only one let in, would often
/// come last. `free` is still announced where the room was not all handed on (the queue ran
/// out; a reader set, which shares this script, or a waiter that is not a permit's) while
/// somebody was queued, so a waiter whose presence lapsed, or a reader, tries again.
macro_rules! release_permit_script {
    ($mark:expr, $not_mine:expr) => {
        concat!(
            r"
local lock, permits, queue, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local left_queue = ARGV[3] == '1' and redis.call('HDEL', waiters, ARGV[1]) == 1
if left_queue then redis.call('LREM', queue, 1, ARGV[1]) end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The leases that ended go first, so that the owner's permit is found only if it was live.
redis.call('ZREMRANGEBYSCORE', permits, '-inf', string.format('%d', now_ms))
local released = redis.call('ZREM', permits, ARGV[1]) == 1
local in_line = redis.call('EXISTS', queue) == 1
-- Room nobody is queued for is not announced: a waiter not yet queued tries again anyway.
local room_left = (released or left_queue) and in_line
if room_left then
  local limit = tonumber(string.match(redis.call('GET', lock) or '', '^#permits:(%d+)$') or '')
  if limit then
    local held = redis.call('ZCARD', permits)
    local head = redis.call('LINDEX', queue, 0)
    while head and held < limit do
      local entry = redis.call('HGET', waiters, head)
      local deadline, ttl = '0', nil
      if entry then
        deadline, ttl = string.match(entry, '^(%d+):(%d+)$')
        -- Not a permit's waiter: its own acquire decides, woken by `free`.
        if not deadline then break end
      end
      if tonumber(deadline) > now_ms then
        local ttl_ms = tonumber(ttl)
        redis.call('ZADD', permits, string.format('%d', now_ms + ttl_ms), head)
        held = held + 1
        if redis.call('PTTL', permits) < ttl_ms then redis.call('PEXPIRE', permits, ttl) end
        if redis.call('PTTL', lock) < ttl_ms then redis.call('PEXPIRE', lock, ttl) end
        -- A semaphore's fence carries no queue mark: the lock key's mark keeps locks off.
        local prior, queued = redis.call('GET', fence) or '0', false
",
            lua_take_token_after_prior!(),
            r"
        redis.call('PUBLISH', ARGV[2], 'granted ' .. head .. ' ' .. string.format('%d', token))
      end
      redis.call('LPOP', queue)
      redis.call('HDEL', waiters, head)
      head = redis.call('LINDEX', queue, 0)
    end
    room_left = held < limit
    -- LINDEX past the end is false: the queue ran out, and its key went with its last entry.
    in_line = head ~= false
  end
end
if not in_line and redis.call('ZCARD', permits) == 0 then
  local mark = redis.call('GET', lock)
  if mark and string.byte(mark, 1) == ",
            permits_mark_byte!(),
            r" then redis.call('DEL', lock) end
end
if room_left then redis.call('PUBLISH', ARGV[2], 'free') end
if released then
  ",
            $mark,
            r"return 1
end
",
            $not_mine,
            r"
"
        )
    };
}

pub(crate) const RELEASE_PERMIT: &str = release_permit_script!("", "return 0");

/// [`RELEASE_PERMIT`] where a release may be re-sent: KEYS\[6\] is the owner's own mark,
/// `PREFIX:{NAME}:released-by:OWNER` (a name's permits are released by many owners at once, so
/// each keeps its own), kept as long as the lock's.
pub(crate) const RELEASE_PERMIT_MARKED: &str = release_permit_script!(
    concat!(
        "redis.call('SET', KEYS[6], '1', 'PX', ",
        release_mark_ms!(),
        ")\n"
    ),
    "if redis.call('EXISTS', KEYS[6]) == 1 then return 1 end return 0"
);

/// Renews a permit. KEYS: lock, permits. ARGV: owner, ttl_ms.
///
/// Resets the caller's permit (or reader's share, `scripts/readers.rs`) to `ttl_ms` from now if
/// its lease has not ended (an ended one may be counted out already, and its place taken) and
/// the name's mark is still there (a mark deleted or lost in a failover lets a lock take the
/// name), keeping both keys at least that long. Returns 1 or 0.
pub(crate) const EXTEND_PERMIT: &str = concat!(
    r"
local lock, permits = KEYS[1], KEYS[2]
local mark = redis.call('GET', lock)
if not mark or string.byte(mark, 1) ~= ",
    permits_mark_byte!(),
    r" then return 0 end
",
    lua_zero_unless_lease_live!("permits"),
    r"
local ttl = tonumber(ARGV[2])
redis.call('ZADD', permits, 'XX', now_ms + ttl, ARGV[1])
if redis.call('PTTL', permits) < ttl then redis.call('PEXPIRE', permits, ttl) end
if redis.call('PTTL', lock) < ttl then redis.call('PEXPIRE', lock, ttl) end
return 1
"
);

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::scripts::tests::{run, shared_server_keys};

    /// The keys the acquire script takes, of `keys` and their `permits` set.
    fn acquire_keys<'a>(keys: &'a crate::LockKeys, permits: &'a str) -> [&'a str; 5] {
        [
            keys.lock.as_str(),
            permits,
            keys.fence.as_str(),
            keys.queue.as_str(),
            keys.waiters.as_str(),
        ]
    }

    /// The keys the release script takes, of `keys` and their `permits` set (without the
    /// owner's `released-by` mark).
    fn release_keys<'a>(keys: &'a crate::LockKeys, permits: &'a str) -> [&'a str; 5] {
        [
            keys.lock.as_str(),
            permits,
            keys.queue.as_str(),
            keys.waiters.as_str(),
            keys.fence.as_str(),
        ]
    }

    /// One attempt of `owner` at one of 2 permits for `ttl` ms, queueing for `presence` ms
    /// (`"0"`: not queueing): the script's reply.
    async fn attempt(
        conn: &mut redis::aio::MultiplexedConnection,
        acquire_keys: &[&str; 5],
        owner: &str,
        ttl: &str,
        presence: &str,
    ) -> Vec<i64> {
        run(
            conn,
            ACQUIRE_PERMIT,
            acquire_keys,
            &[owner, ttl, "2", presence],
        )
        .await
    }

    /// A permit release that reaches the server twice (its first reply lost, the command sent
    /// again by the Cluster client or after a Sentinel failover): with marks, the second arrival
    /// answers released; without, it answered "not held". Either way a release of another
    /// owner, of a permit whose lease ended, or of one never held answers "not held" and gives
    /// no capacity back: the permit still held stays counted.
    #[tokio::test]
    async fn a_permit_released_twice_is_released_twice_where_releases_are_marked() {
        let (mut conn, keys) = shared_server_keys("resent-permit-release").await;
        let permits = keys.permits();
        let acquire_keys = acquire_keys(&keys, &permits);
        let channel = keys.channel.as_str();
        let mut answers = Vec::new();
        for (script, marked) in [(RELEASE_PERMIT_MARKED, true), (RELEASE_PERMIT, false)] {
            let release =
                async |conn: &mut redis::aio::MultiplexedConnection, owner: &str| -> i64 {
                    let mark = keys.permit_released_by(owner);
                    let mut names = release_keys(&keys, &permits).to_vec();
                    if marked {
                        names.push(&mark);
                    }
                    run(conn, script, &names, &[owner, channel, "0"]).await
                };
            let acquire = async |conn: &mut redis::aio::MultiplexedConnection, owner: &str| {
                let reply = attempt(conn, &acquire_keys, owner, "60000", "0").await;
                assert_eq!(reply[0], 1, "{owner} takes a permit: {reply:?}");
            };
            acquire(&mut conn, "keeper").await;
            acquire(&mut conn, "me").await;
            let mut sent_twice = Vec::new();
            for _ in 0..2 {
                sent_twice.push(release(&mut conn, "me").await);
            }
            answers.push(sent_twice);
            assert_eq!(
                release(&mut conn, "other").await,
                0,
                "another owner's release"
            );
            assert_eq!(release(&mut conn, "never").await, 0, "a permit never held");
            // A permit whose lease ended on the server's clock, not yet trimmed.
            acquire(&mut conn, "late").await;
            let _: () = redis::cmd("ZADD")
                .arg(&permits)
                .arg("XX")
                .arg(1)
                .arg("late")
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(release(&mut conn, "late").await, 0, "a lapsed permit");
            let counted: i64 = run(&mut conn, COUNT_PERMITS, &[&keys.lock, &permits], &[]).await;
            assert_eq!(counted, 1, "the keeper's permit, and nothing given back");
            let count_keys = [keys.lock.as_str(), permits.as_str()];
            let full = attempt(&mut conn, &acquire_keys, "third", "60000", "0").await;
            assert_eq!(full[0], 1, "one permit of two free: {full:?}");
            let refused = attempt(&mut conn, &acquire_keys, "fourth", "60000", "0").await;
            assert_eq!(refused[0], 0, "no third permit of two: {refused:?}");
            for owner in ["keeper", "third"] {
                assert_eq!(release(&mut conn, owner).await, 1, "{owner}'s release");
            }
            let counted: i64 = run(&mut conn, COUNT_PERMITS, &count_keys, &[]).await;
            assert_eq!(counted, 0);
        }
        assert_eq!(answers[0], [1, 1], "a marked release, sent twice");
        assert_eq!(answers[1], [1, 0], "an unmarked release, sent twice");
    }

    /// A release grants the room it makes to the first live waiter in the queue, in its own
    /// script, and tells that waiter alone (`granted OWNER TOKEN`, never `free` to all while
    /// the room is handed on); a waiter at the head whose presence lapsed is dropped, not
    /// granted. A release that makes room with nobody queued announces nothing.
    #[tokio::test]
    async fn a_release_grants_the_first_live_waiter_and_tells_it_alone() {
        use futures::StreamExt;

        let (mut conn, keys) = shared_server_keys("granting-release").await;
        let permits = keys.permits();
        let (acquire_keys, release_keys) =
            (acquire_keys(&keys, &permits), release_keys(&keys, &permits));
        let channel = keys.channel.as_str();
        let mut tokens = Vec::new();
        for holder in ["one", "two"] {
            let reply = attempt(&mut conn, &acquire_keys, holder, "60000", "0").await;
            assert_eq!(reply[0], 1, "{holder}: {reply:?}");
            tokens.push(reply[1]);
        }
        for waiter in ["ghost", "first", "second"] {
            let reply = attempt(&mut conn, &acquire_keys, waiter, "60000", "600000").await;
            assert_eq!(reply[0], 0, "{waiter} waits: {reply:?}");
            assert_eq!(reply[2], tokens[1], "the last token handed out: {reply:?}");
        }
        // The ghost's presence lapsed long ago.
        let _: () = redis::cmd("HSET")
            .arg(&keys.waiters)
            .arg("ghost")
            .arg("1:60000")
            .query_async(&mut conn)
            .await
            .unwrap();
        let client = redis::Client::open(dlock_test_servers::shared_redis().url()).unwrap();
        let mut pubsub = client.get_async_pubsub().await.unwrap();
        pubsub.subscribe(channel).await.unwrap();
        let mut messages = pubsub.into_on_message();
        let mut next_message = async || -> String {
            let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
                .await
                .expect("a message on the name's channel")
                .expect("the subscription is open");
            message.get_payload().unwrap()
        };
        let mut release = async |owner: &str| -> i64 {
            run(
                &mut conn,
                RELEASE_PERMIT,
                &release_keys,
                &[owner, channel, "0"],
            )
            .await
        };

        assert_eq!(release("one").await, 1);
        let granted = next_message().await;
        let token: i64 = granted
            .strip_prefix("granted first ")
            .unwrap_or_else(|| panic!("the first live waiter is told alone: {granted:?}"))
            .parse()
            .unwrap();
        assert!(token > tokens[1], "{token} after {tokens:?}");
        assert_eq!(release("two").await, 1);
        let granted = next_message().await;
        assert!(
            granted.starts_with("granted second "),
            "the next waiter, and no `free` between: {granted:?}"
        );
        // Nobody is queued for the room the next releases make: nothing is announced.
        assert_eq!(release("first").await, 1, "the granted permit is held");
        assert_eq!(release("second").await, 1);
        let _: () = redis::cmd("PUBLISH")
            .arg(channel)
            .arg("end")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(next_message().await, "end");
        for key in [&keys.lock, &permits, &keys.queue, &keys.waiters] {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(exists, 0, "{key} left after every permit went back");
        }
    }

    /// A `try_acquire_permit` (an attempt that does not queue) with a permit free but owed to a
    /// live waiter queued ahead gets none, and the waiter's own attempt gets it: here the room
    /// comes from a lease that ended, which no release hands on. A grant raises the set's TTL
    /// to its lease even while the queue keeps the name's mark longer than any lease (else the
    /// set would expire under live permits, and their places with it).
    #[tokio::test]
    async fn a_free_permit_owed_to_a_live_waiter_is_not_taken_past_it() {
        let (mut conn, keys) = shared_server_keys("owed-permit").await;
        let permits = keys.permits();
        let (acquire_keys, release_keys) =
            (acquire_keys(&keys, &permits), release_keys(&keys, &permits));
        let channel = keys.channel.as_str();
        let attempt = async |conn: &mut redis::aio::MultiplexedConnection,
                             owner: &str,
                             ttl: &str,
                             presence: &str|
               -> i64 {
            attempt(conn, &acquire_keys, owner, ttl, presence).await[0]
        };
        assert_eq!(attempt(&mut conn, "one", "20000", "0").await, 1);
        assert_eq!(attempt(&mut conn, "two", "20000", "0").await, 1);
        // A waiter queued while both are held, its presence long enough for the test.
        assert_eq!(attempt(&mut conn, "patient", "60000", "600000").await, 0);
        // The first holder vanished: its lease ended on the server's clock.
        let _: () = redis::cmd("ZADD")
            .arg(&permits)
            .arg("XX")
            .arg(1)
            .arg("one")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            attempt(&mut conn, "hasty", "60000", "0").await,
            0,
            "a try ahead of the live waiter"
        );
        assert_eq!(attempt(&mut conn, "patient", "60000", "600000").await, 1);
        let set_left: i64 = redis::cmd("PTTL")
            .arg(&permits)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            set_left > 20_000,
            "the set ends in {set_left} ms, before the 60 s permit just granted"
        );
        for owner in ["two", "patient"] {
            let released: i64 = run(
                &mut conn,
                RELEASE_PERMIT,
                &release_keys,
                &[owner, channel, "0"],
            )
            .await;
            assert_eq!(released, 1, "{owner}'s release");
        }
        for key in [&keys.lock, &permits, &keys.queue, &keys.waiters] {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(exists, 0, "{key} left after every permit went back");
        }
    }
}
