//! Node names: a lock name as one path segment, and the protected names of the queue's nodes.

use std::borrow::Cow;

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
/// Curator's lock recipe uses), so that after a lost reply the node can be found again.
pub(crate) fn protected_marker() -> String {
    let hex = dlock_api::raw::random_owner();
    let mut marker = String::with_capacity(45);
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
    marker.push_str("-lock-");
    marker
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
        let marker = protected_marker();
        assert!(marker.starts_with("_c_") && marker.ends_with("-lock-"));
        assert_ne!(marker, protected_marker());
        assert_eq!(sequence(&format!("{marker}0000000042")), Some(42));
        assert_eq!(sequence("_c_x-lock-"), None);
        assert_eq!(sequence("other-0000000001"), None);
        let children = vec![
            format!("{marker}0000000007"),
            "stray".to_owned(),
            format!("{}0000000003", protected_marker()),
        ];
        let q = queue(&children);
        assert_eq!(q.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [3, 7]);
    }
}
