//! The elections' scripts. A leader is the lock's holder that published a value: beside the
//! name's lock key, its **leader record** `PREFIX:{NAME}:leader` holds `OWNER TERM VALUE` (the
//! holder's owner value, hex digits; its term, the grant's fencing token, decimal digits; then
//! the value's bytes as they are). The record counts only while its owner holds the lock key:
//! a record left by an earlier holder (its key expired, or was deleted) is ignored by every
//! read, and lives at most [`leader_margin_ms!`] past the lease it was written under.
//!
//! Each script that changes what a read would answer publishes `leader` on the name's channel
//! (the one waiters listen on), so observers read again.

/// Whether the leader record `record` (nil when there is none) is the owner `owner`'s.
macro_rules! lua_record_of {
    ($record:literal, $owner:literal) => {
        concat!(
            "(",
            $record,
            " and string.sub(",
            $record,
            ", 1, #",
            $owner,
            " + 1) == ",
            $owner,
            " .. ' ')"
        )
    };
}

/// Proclaim. KEYS: lock, leader. ARGV: owner, term, value, channel.
///
/// If the caller holds the lock (its value marked or not), writes `OWNER TERM VALUE` as the
/// record, to live as long as the lock key plus [`leader_margin_ms!`], publishes `leader TERM`
/// and returns 1; else returns 0 and writes nothing: a deposed leader never replaces its
/// successor's record.
pub(crate) const PROCLAIM: &str = concat!(
    r"
local holder = redis.call('GET', KEYS[1])
if not ",
    lua_holds!("holder", "ARGV[1]"),
    r" then return 0 end
local pttl = math.max(redis.call('PTTL', KEYS[1]), 0)
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3], 'PX', pttl + ",
    leader_margin_ms!(),
    r")
redis.call('PUBLISH', ARGV[4], 'leader ' .. ARGV[2])
return 1
"
);

/// The leader (read only). KEYS: lock, leader.
///
/// Returns `{pttl, record}`: the lock key's PTTL (`-2` free, `-1` a key without TTL) and the
/// leader record if its owner holds the lock now, else `''`.
pub(crate) const LEADER: &str = r"
local holder = redis.call('GET', KEYS[1])
if not holder then return {-2, ''} end
local pttl = redis.call('PTTL', KEYS[1])
if string.sub(holder, -1) == '+' then holder = string.sub(holder, 1, -2) end
local record = redis.call('GET', KEYS[2])
if record and string.sub(record, 1, #holder + 1) == holder .. ' ' then return {pttl, record} end
return {pttl, ''}
";

/// Extend of a lease that proclaimed. KEYS: lock, leader. ARGV: owner, ttl_ms, channel.
///
/// As [`EXTEND`](super::EXTEND), and the caller's record is kept [`leader_margin_ms!`] longer
/// than the new lease. When the lock is no longer the caller's, a record of its own is deleted
/// and `leader` published: its observers learn that it no longer leads now rather than at the
/// end of the lease they last read. Returns 1 or 0.
pub(crate) const EXTEND_LEADER: &str = concat!(
    r"
local holder = redis.call('GET', KEYS[1])
local record = redis.call('GET', KEYS[2])
local mine = ",
    lua_record_of!("record", "ARGV[1]"),
    r"
if ",
    lua_holds!("holder", "ARGV[1]"),
    r" then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if mine then redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + ",
    leader_margin_ms!(),
    r") end
  return 1
end
if mine then
  redis.call('DEL', KEYS[2])
  redis.call('PUBLISH', ARGV[3], 'leader')
end
return 0
"
);

/// A leader's lease whose lock went. KEYS: lock, leader. ARGV: owner, channel.
///
/// If the lock is not the caller's and the record is, deletes the record and publishes
/// `leader`, so observers learn that the caller no longer leads now rather than at the end of
/// the lease they last read; returns 1 then, else 0 and changes nothing.
pub(crate) const VACATE: &str = concat!(
    r"
local holder = redis.call('GET', KEYS[1])
if ",
    lua_holds!("holder", "ARGV[1]"),
    r" then return 0 end
local record = redis.call('GET', KEYS[2])
if not ",
    lua_record_of!("record", "ARGV[1]"),
    r" then return 0 end
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[2], 'leader')
return 1
"
);

/// What a leader's release does besides the lock's: once the lock key is deleted, the record
/// (its own, or one an earlier holder left) goes and observers are told, before the lock is
/// handed to the next waiter. KEYS\[5\] is the record.
macro_rules! lua_resign {
    () => {
        "redis.call('DEL', KEYS[5])\nredis.call('PUBLISH', ARGV[2], 'leader')\n"
    };
}

/// A leader's release that finds the lock not its own: a record of its own still goes, and
/// observers are told.
macro_rules! lua_resign_not_mine {
    () => {
        concat!(
            "local record = redis.call('GET', KEYS[5])\nif ",
            lua_record_of!("record", "ARGV[1]"),
            " then redis.call('DEL', KEYS[5]) redis.call('PUBLISH', ARGV[2], 'leader') end\n"
        )
    };
}

/// Release of a lease that proclaimed. KEYS: lock, fence, queue, waiters, leader. ARGV: owner,
/// channel. [`RELEASE`](super::RELEASE), which deletes the record and publishes `leader` too.
pub(crate) const RELEASE_LEADER: &str =
    release_script!(lua_resign!(), concat!(lua_resign_not_mine!(), "return 0"));

/// [`RELEASE_LEADER`] where a release may be re-sent: KEYS\[6\] is the name's `released-by`
/// mark.
pub(crate) const RELEASE_LEADER_MARKED: &str = release_script!(
    concat!(
        "redis.call('SET', KEYS[6], ARGV[1], 'PX', ",
        release_mark_ms!(),
        ")\n",
        lua_resign!()
    ),
    concat!(
        lua_resign_not_mine!(),
        "if redis.call('GET', KEYS[6]) == ARGV[1] then return 1 end return 0"
    )
);

/// A leader record as [`LEADER`] returns it: `(term, value)`.
pub(crate) fn parse_record(record: &[u8]) -> Option<(u64, &[u8])> {
    let mut parts = record.splitn(3, |&b| b == b' ');
    let (_owner, term, value) = (parts.next()?, parts.next()?, parts.next()?);
    let term = std::str::from_utf8(term).ok()?.parse().ok()?;
    Some((term, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_records_with_any_value() {
        assert_eq!(parse_record(b"ab12 17 x y\nz"), Some((17, &b"x y\nz"[..])));
        assert_eq!(parse_record(b"ab12 17 "), Some((17, &b""[..])));
        assert_eq!(parse_record(b"ab12 x v"), None);
        assert_eq!(parse_record(b"ab12 17"), None);
    }
}
