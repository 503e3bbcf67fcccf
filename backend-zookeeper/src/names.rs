//! Node names: a lock name as one path segment, the protected names of the queue's nodes (with
//! the limit each was queued with), and where a node stands in its queue.

use std::borrow::Cow;

use dlock_api::raw::Claim;
use dlock_api::{KeyMapper, LockName};

/// Whether ZooKeeper takes `c` in a path segment: not `/`, no control characters (C0, DEL,
/// C1), nothing in `U+D800..=U+F8FF` or `U+FFF0..`, which also rules out every character
/// beyond the basic plane (the server checks UTF-16 units, and those are surrogate pairs).
fn allowed(c: char) -> bool {
    let c = u32::from(c);
    c != u32::from('/')
        && c > 0x1f
        && !(0x7f..=0x9f).contains(&c)
        && !(0xd800..=0xf8ff).contains(&c)
        && c < 0xfff0
}

/// Names as path segments: one segment each, case kept; a name that does not fit as it is
/// becomes a readable part and a digest (see [`KeyMapper`]).
const MAPPER_MAX_BYTES: usize = LockName::MAX_BYTES;

fn mapper() -> KeyMapper {
    KeyMapper::new(MAPPER_MAX_BYTES)
        .with_allowed(allowed)
        .with_reserved(&[".", ".."])
}

/// The one path segment a lock name maps to.
pub(crate) fn name_segment(name: &LockName) -> Cow<'_, str> {
    mapper().map(name)
}

/// Why `segment` cannot be a path segment, if it cannot.
pub(crate) fn check_segment(segment: &str) -> Result<(), &'static str> {
    if segment == "." || segment == ".." {
        return Err("is a relative path segment");
    }
    if !segment.chars().all(allowed) {
        return Err("has a character ZooKeeper refuses in a path");
    }
    Ok(())
}

/// The marker of one create attempt's node: `_c_<128 random bits as a UUID>-lock-` (the layout
/// Curator's lock recipe uses), so that after a lost reply the node can be found again. A
/// semaphore's node carries its number of permits before the suffix,
/// `_c_<uuid>-permits<N>-lock-`, and a reader's `-read`, `_c_<uuid>-read-lock-`, so that every
/// node tells what it was queued for (a lock's name stays as it always was, and a client that
/// does not know the part still sees a queue node ahead of its own).
pub(crate) fn protected_marker(claim: Claim) -> String {
    let Claim { limit, shared } = claim;
    let hex = dlock_api::raw::random_owner();
    let mut marker = String::with_capacity(if limit == 1 { 50 } else { 63 });
    marker.push_str("_c_");
    for (i, part) in [
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..],
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            marker.push('-');
        }
        marker.push_str(part);
    }
    if limit != 1 {
        marker.push_str(PERMITS);
        marker.push_str(&limit.to_string());
    } else if shared {
        marker.push_str(READ);
    }
    marker.push_str("-lock-");
    marker
}

/// What a semaphore's node carries between its uuid and `-lock-`: `-permits<N>`.
const PERMITS: &str = "-permits";

/// What a reader's node carries between its uuid and `-lock-`.
const READ: &str = "-read";

/// Whether a queue node is a reader's.
pub(crate) fn is_reader(child: &str) -> bool {
    child
        .rsplit_once("-lock-")
        .is_some_and(|(head, _)| head.ends_with(READ))
}

/// The number of permits a queue node was queued with: a semaphore's `-permits<N>` part, and 1
/// for a lock's node, which has none.
pub(crate) fn limit(child: &str) -> u32 {
    let Some((head, _)) = child.rsplit_once("-lock-") else {
        return 1;
    };
    let Some((_, last)) = head.rsplit_once('-') else {
        return 1;
    };
    last.strip_prefix(&PERMITS[1..])
        .and_then(|digits| digits.parse::<u32>().ok())
        .filter(|n| *n > 1)
        .unwrap_or(1)
}

/// Where a node stands in its name's queue.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Place<'a> {
    /// Not in the queue: its session ended, or someone deleted it.
    Gone,
    /// Fewer than its limit are ahead of it, all queued with the same limit: it holds.
    Holds,
    /// A node ahead of it was queued with another limit (the one given).
    Mismatch(u32),
    /// As many as its limit or more are ahead: it waits for one of these, the `limit` nodes
    /// just before it, to go (a node further ahead going leaves it as many ahead as its limit,
    /// and these nodes still just before it).
    Waits(&'a [(i64, &'a str)]),
}

/// Where `child`, queued with `claim`, stands in `queue` (see [`queue`]). A node holds iff
/// fewer than its limit of nodes are ahead of it: places only move up, so at most the limit hold
/// at once. Any node ahead with another limit refuses it, so nodes of two limits never hold
/// together (the first of them to list sees the other ahead, or is ahead of it). A reader's
/// node holds iff no other kind of node (a writer) is ahead of it, and waits for the nearest
/// writer ahead (Curator's `InterProcessReadWriteLock`): a writer's node ahead keeps every
/// reader behind it out, so writers are not starved, and its going lets them all in at once.
pub(crate) fn place<'a>(queue: &'a [(i64, &'a str)], child: &str, claim: Claim) -> Place<'a> {
    let limit = claim.limit;
    let Some(at) = queue.iter().position(|(_, c)| *c == child) else {
        return Place::Gone;
    };
    let ahead = &queue[..at];
    if let Some(other) = ahead
        .iter()
        .map(|(_, c)| self::limit(c))
        .find(|other| *other != limit)
    {
        return Place::Mismatch(other);
    }
    if claim.shared {
        return match ahead.iter().rposition(|(_, c)| !is_reader(c)) {
            None => Place::Holds,
            Some(writer) => Place::Waits(&ahead[writer..=writer]),
        };
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    match at.checked_sub(limit) {
        None => Place::Holds,
        Some(from) => Place::Waits(&ahead[from..]),
    }
}

/// How many nodes hold now: those at the head of the queue queued with the first one's limit,
/// up to that limit. A node of another limit behind them is being refused, and every node
/// behind such a one too. Readers at the head all hold.
pub(crate) fn holders(queue: &[(i64, &str)]) -> usize {
    let Some((_, first)) = queue.first() else {
        return 0;
    };
    if is_reader(first) {
        return queue.iter().take_while(|(_, c)| is_reader(c)).count();
    }
    let limit = self::limit(first);
    let same = queue
        .iter()
        .take_while(|(_, c)| self::limit(c) == limit)
        .count();
    same.min(usize::try_from(limit).unwrap_or(usize::MAX))
}

/// How many readers hold the name (its first nodes, while they are readers') and how many
/// readers' nodes wait behind another.
pub(crate) fn readers(queue: &[(i64, &str)]) -> (usize, usize) {
    let holding = queue.iter().take_while(|(_, c)| is_reader(c)).count();
    let waiting = queue
        .iter()
        .skip(holding)
        .filter(|(_, c)| is_reader(c))
        .count();
    (holding, waiting)
}

/// The sequence number ZooKeeper appended to a queue node's name (its trailing digits), if the
/// child is a queue node (`…-lock-<digits>`).
pub(crate) fn sequence(child: &str) -> Option<i64> {
    let (head, digits) = child.rsplit_once('-')?;
    if !head.ends_with("-lock") || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    digits.parse().ok()
}

/// The queue under a name node: its children that are queue nodes, by sequence.
pub(crate) fn queue(children: &[String]) -> Vec<(i64, &str)> {
    let mut queue: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|child| sequence(child).map(|seq| (seq, child.as_str())))
        .collect();
    queue.sort_unstable();
    queue
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: Claim = Claim::LOCK;
    const READ_CLAIM: Claim = Claim {
        limit: 1,
        shared: true,
    };

    fn permits(limit: u32) -> Claim {
        Claim {
            limit,
            shared: false,
        }
    }

    #[test]
    fn readers_share_until_a_writer_is_ahead() {
        // r0 r1 w2 r3 r4 w5
        let claims = [READ_CLAIM, READ_CLAIM, LOCK, READ_CLAIM, READ_CLAIM, LOCK];
        let names: Vec<String> = claims
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{}{i:010}", protected_marker(*c)))
            .collect();
        assert!(names[0].contains("-read-lock-"), "{}", names[0]);
        assert!(is_reader(&names[0]) && !is_reader(&names[2]));
        assert_eq!(limit(&names[0]), 1);
        let q = queue(&names);
        assert_eq!(place(&q, &names[0], READ_CLAIM), Place::Holds);
        assert_eq!(place(&q, &names[1], READ_CLAIM), Place::Holds);
        // The writer waits for the reader just before it.
        let Place::Waits(watch) = place(&q, &names[2], LOCK) else {
            panic!("a writer behind readers does not wait");
        };
        assert_eq!(watch.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1]);
        // Readers behind the writer wait for it, each for the nearest writer ahead.
        for (reader, writer) in [(3, 2), (4, 2)] {
            let Place::Waits(watch) = place(&q, &names[reader], READ_CLAIM) else {
                panic!("reader {reader} behind a writer does not wait");
            };
            assert_eq!(watch.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [writer]);
        }
        assert_eq!(holders(&q), 2);
        // The first writer gone: the readers behind it hold together, the next writer waits.
        let rest: Vec<String> = [&names[3], &names[4], &names[5]].map(Clone::clone).to_vec();
        let q = queue(&rest);
        assert_eq!(place(&q, &names[3], READ_CLAIM), Place::Holds);
        assert_eq!(place(&q, &names[4], READ_CLAIM), Place::Holds);
        assert_eq!(holders(&q), 2);
        // A semaphore's node behind readers is refused as behind a lock.
        let sem = format!("{}{:010}", protected_marker(permits(3)), 9);
        let mixed = [names[0].clone(), sem.clone()];
        assert_eq!(place(&queue(&mixed), &sem, permits(3)), Place::Mismatch(1));
    }

    fn segment(name: &str) -> String {
        name_segment(&LockName::new(name).unwrap()).into_owned()
    }

    #[test]
    fn names_are_single_distinct_segments() {
        assert_eq!(segment("orders:42"), "orders:42");
        assert_eq!(segment("쿠폰"), "쿠폰");
        let names = [
            "a",
            "a/b",
            "a//b",
            "a~b",
            ".",
            "..",
            "...",
            "zookeeper",
            "x\u{1}",
            "😀",
            "A",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let s = segment(name);
            assert!(check_segment(&s).is_ok(), "{name:?} -> {s:?}");
            assert!(!s.contains('/'));
            assert!(seen.insert(s), "{name:?} collides");
        }
        assert_ne!(segment("."), ".");
        assert_ne!(segment(".."), "..");
        assert!(segment(&"x".repeat(1024)).len() <= 1024);
    }

    #[test]
    fn markers_and_sequences() {
        let marker = protected_marker(LOCK);
        assert!(marker.starts_with("_c_") && marker.ends_with("-lock-"));
        assert_eq!(marker.len(), 45);
        assert_ne!(marker, protected_marker(LOCK));
        assert_eq!(sequence(&format!("{marker}0000000042")), Some(42));
        assert_eq!(sequence("_c_x-lock-"), None);
        assert_eq!(sequence("other-0000000001"), None);
        let children = vec![
            format!("{marker}0000000007"),
            "stray".to_owned(),
            format!("{}0000000003", protected_marker(LOCK)),
        ];
        let q = queue(&children);
        assert_eq!(q.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [3, 7]);
    }

    #[test]
    fn limits_ride_in_node_names() {
        let lock = format!("{}0000000001", protected_marker(LOCK));
        assert_eq!(limit(&lock), 1);
        let sem = protected_marker(permits(3));
        assert!(sem.ends_with("-permits3-lock-"), "{sem}");
        let sem = format!("{sem}0000000002");
        assert_eq!(limit(&sem), 3);
        assert_eq!(sequence(&sem), Some(2));
        let most = protected_marker(permits(u32::MAX));
        assert_eq!(most.len(), 63, "{most}");
        assert_eq!(limit(&format!("{most}0000000002")), u32::MAX);
        assert_eq!(limit("stray"), 1);
    }

    #[test]
    fn places_in_the_queue() {
        let names: Vec<String> = [1, 3, 3, 3, 3, 3]
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{}{i:010}", protected_marker(permits(*n))))
            .collect();
        let q = queue(&names);
        // Behind a lock's node: refused, whatever the place.
        assert_eq!(place(&q, &names[1], permits(3)), Place::Mismatch(1));
        assert_eq!(place(&q, &names[0], LOCK), Place::Holds);
        let q = queue(&names[1..]);
        assert_eq!(place(&q, &names[1], permits(3)), Place::Holds);
        assert_eq!(place(&q, &names[3], permits(3)), Place::Holds);
        // The fourth waits for any of the three just before it; the fifth for the three
        // before it, the fourth among them.
        let Place::Waits(watch) = place(&q, &names[4], permits(3)) else {
            panic!("the fourth of three does not wait");
        };
        assert_eq!(watch.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [1, 2, 3]);
        let Place::Waits(watch) = place(&q, &names[5], permits(3)) else {
            panic!("the fifth of three does not wait");
        };
        assert_eq!(watch.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [2, 3, 4]);
        assert_eq!(place(&q, &names[0], LOCK), Place::Gone);
        assert_eq!(holders(&q), 3);
        assert_eq!(holders(&queue(&names)), 1);
        assert_eq!(holders(&queue(&names[1..3])), 2);
        assert_eq!(holders(&[]), 0);
    }
}
