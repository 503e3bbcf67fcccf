//! Lock names, and the mapping of names into a backend's narrower key space.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::{LockError, Result};

/// A validated lock name: 1 to [`LockName::MAX_BYTES`] bytes of UTF-8 with no NUL.
///
/// Names are case sensitive and compared byte for byte: `"Coupon:1"` and `"coupon:1"` are two
/// locks on every backend, including the ones whose server folds case (they map names through a
/// [`KeyMapper`]). Cloning is cheap.
///
/// Use fine-grained names (`coupon:{id}`) rather than one global name: unrelated work then does not
/// queue behind one lock.
///
/// # Examples
/// ```
/// use dlock_api::{LockError, LockName};
/// let name = LockName::new("coupon:42")?;
/// assert_eq!(name.as_str(), "coupon:42");
/// assert!(matches!(LockName::new(""), Err(LockError::InvalidArgument { .. })));
/// # Ok::<(), LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockName(Arc<str>);

impl LockName {
    /// The longest name accepted, in bytes.
    pub const MAX_BYTES: usize = 1024;

    /// Validates `name`.
    ///
    /// # Errors
    /// [`LockError::InvalidArgument`] if the name is empty, longer than [`Self::MAX_BYTES`] bytes,
    /// or contains a NUL character.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(LockError::invalid("lock name", "must not be empty"));
        }
        if name.len() > Self::MAX_BYTES {
            return Err(LockError::invalid(
                "lock name",
                format!(
                    "is {} bytes; the limit is {} bytes",
                    name.len(),
                    Self::MAX_BYTES
                ),
            ));
        }
        if name.contains('\0') {
            return Err(LockError::invalid("lock name", "must not contain NUL"));
        }
        Ok(Self(name.into()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for LockName {
    type Err = LockError;
    fn from_str(s: &str) -> Result<Self> {
        Self::new(s)
    }
}

impl TryFrom<&str> for LockName {
    type Error = LockError;
    fn try_from(s: &str) -> Result<Self> {
        Self::new(s)
    }
}

impl TryFrom<String> for LockName {
    type Error = LockError;
    fn try_from(s: String) -> Result<Self> {
        Self::new(s)
    }
}

impl TryFrom<&LockName> for LockName {
    type Error = LockError;
    fn try_from(name: &LockName) -> Result<Self> {
        Ok(name.clone())
    }
}

/// Maps lock names into a backend's key space without two names ever sharing a key.
///
/// Backends with tighter rules than [`LockName`] (MySQL: 64 characters, case-insensitive;
/// ZooKeeper: no `/` in a node name) map each name with a `KeyMapper`:
///
/// - A name that already fits (short enough, only allowed characters, no
///   [`DIGEST_MARKER`](Self::DIGEST_MARKER), and on case-folding backends no upper-case letter) is
///   used **as is**, so keys stay readable in the server's own tools.
/// - Any other name becomes `<readable prefix>~<digest>`: the allowed characters of the name
///   (lower-cased where the server folds case), cut to fit, then `~`, then the first 160 bits of
///   the name's SHA-256 in lower-case base32 (32 characters).
///
/// Pass-through keys never contain `~` and digest keys always do, so the two kinds never meet; two
/// digest keys are equal only if two names share 160 bits of SHA-256, which no one has ever found
/// (the odds for a billion names are below 10^-30).
///
/// For backends that take a fixed-width integer key, [`KeyMapper::hash_i64`] is the documented
/// fallback; there a collision can happen (odds in its docs) and only makes two names wait for
/// each other.
///
/// # Examples
/// ```
/// use dlock_api::{KeyMapper, LockName};
/// let mysql = KeyMapper::new(64).case_insensitive();
/// let a = LockName::new("coupon:42")?;
/// let b = LockName::new("Coupon:42")?;
/// assert_eq!(mysql.map(&a), "coupon:42");
/// assert_ne!(mysql.map(&a), mysql.map(&b));
/// assert!(mysql.map(&b).len() <= 64);
/// # Ok::<(), dlock_api::LockError>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct KeyMapper {
    max_bytes: usize,
    allowed: fn(char) -> bool,
    case_insensitive: bool,
    reserved: &'static [&'static str],
}

/// Characters of the digest (base32 lower case) plus the marker; every backend must accept them.
fn digest_char(c: char) -> bool {
    c.is_ascii_lowercase() || ('2'..='7').contains(&c) || c == KeyMapper::DIGEST_MARKER
}

impl KeyMapper {
    /// Separates the readable prefix from the digest in mapped keys; never in pass-through keys.
    pub const DIGEST_MARKER: char = '~';
    /// Length of the digest part in characters (160 bits in base32).
    pub const DIGEST_CHARS: usize = 32;

    /// A mapper for keys of at most `max_bytes` bytes, any character allowed, case kept.
    ///
    /// # Panics
    /// If `max_bytes` cannot hold the marker and the digest (33 bytes): a backend bug, not input.
    pub fn new(max_bytes: usize) -> Self {
        assert!(
            max_bytes > Self::DIGEST_CHARS,
            "key space too small for a digest"
        );
        Self {
            max_bytes,
            allowed: |_| true,
            case_insensitive: false,
            reserved: &[],
        }
    }

    /// Only characters for which `allowed` is true may appear in keys. It must accept lower-case
    /// ASCII letters, the digits 2 to 7 and `~`.
    pub fn with_allowed(mut self, allowed: fn(char) -> bool) -> Self {
        debug_assert!("abcxyz234567~".chars().all(allowed));
        self.allowed = allowed;
        self
    }

    /// Whole names the backend cannot use as keys as they are (ZooKeeper's path segments `.`
    /// and `..`, say): they are mapped to the digest form like any name that does not fit.
    pub fn with_reserved(mut self, reserved: &'static [&'static str]) -> Self {
        self.reserved = reserved;
        self
    }

    /// The server compares keys case-insensitively (MySQL `GET_LOCK` names).
    pub fn case_insensitive(mut self) -> Self {
        self.case_insensitive = true;
        self
    }

    fn fits(&self, name: &str) -> bool {
        name.len() <= self.max_bytes
            && !self.reserved.contains(&name)
            && !name.contains(Self::DIGEST_MARKER)
            && name.chars().all(|c| {
                let folds = self.case_insensitive && (!c.is_ascii() || c.is_ascii_uppercase());
                !folds && (self.allowed)(c)
            })
    }

    /// The backend key for `name`; equal keys mean equal names.
    pub fn map<'a>(&self, name: &'a LockName) -> Cow<'a, str> {
        let name = name.as_str();
        if self.fits(name) {
            return Cow::Borrowed(name);
        }
        let digest = Sha256::digest(name.as_bytes());
        let digest = data_encoding::BASE32_NOPAD
            .encode(&digest[..20])
            .to_ascii_lowercase();
        let room = self
            .max_bytes
            .saturating_sub(Self::DIGEST_CHARS)
            .saturating_sub(Self::DIGEST_MARKER.len_utf8());
        let mut key = String::with_capacity(self.max_bytes);
        for c in name.chars() {
            let c = if self.case_insensitive {
                c.to_ascii_lowercase()
            } else {
                c
            };
            let keep = (c.is_ascii() || !self.case_insensitive)
                && c != Self::DIGEST_MARKER
                && (self.allowed)(c);
            if !keep {
                continue;
            }
            if key.len().saturating_add(c.len_utf8()) > room {
                break;
            }
            key.push(c);
        }
        key.push(Self::DIGEST_MARKER);
        key.push_str(&digest);
        debug_assert!(
            key.chars()
                .skip_while(|&c| c != Self::DIGEST_MARKER)
                .all(digest_char)
        );
        Cow::Owned(key)
    }

    /// A stable 64-bit key for `name`: the first 8 bytes of its SHA-256, big-endian, as `i64`.
    ///
    /// For backends whose lock key is a fixed-width integer (Postgres advisory locks). Two names
    /// share a key with probability 2^-64 per pair; among `n` names in use at once, about
    /// n²/2^65 (one in 37 million for a million names). A shared key makes the two names wait
    /// for each other; it never lets two holders in, because the key itself is the lock.
    pub fn hash_i64(name: &LockName) -> i64 {
        let digest = Sha256::digest(name.as_str().as_bytes());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        i64::from_be_bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> LockName {
        LockName::new(s).unwrap()
    }

    #[test]
    fn validates_names() {
        assert!(LockName::new("").is_err());
        assert!(LockName::new("a\0b").is_err());
        assert!(LockName::new("x".repeat(1025)).is_err());
        assert!(LockName::new("x".repeat(1024)).is_ok());
        assert!(LockName::new("쿠폰/발급:1").is_ok());
    }

    #[test]
    fn short_plain_names_pass_through() {
        let m = KeyMapper::new(64);
        assert_eq!(m.map(&name("coupon:1")), "coupon:1");
    }

    #[test]
    fn long_names_differing_late_get_distinct_keys() {
        let m = KeyMapper::new(64).case_insensitive();
        let base = "a".repeat(100);
        let a = m.map(&name(&format!("{base}1"))).into_owned();
        let b = m.map(&name(&format!("{base}2"))).into_owned();
        assert_ne!(a, b);
        assert!(a.len() <= 64 && b.len() <= 64);
    }

    #[test]
    fn case_and_marker_names_never_collide_with_pass_through() {
        let m = KeyMapper::new(64).case_insensitive();
        let upper = m.map(&name("A")).into_owned();
        assert_ne!(upper, "a");
        assert!(upper.contains('~'));
        // A name that looks like a digest key is itself digested.
        let lookalike = m.map(&name(&upper)).into_owned();
        assert_ne!(lookalike, upper);
    }

    #[test]
    fn disallowed_characters_are_mapped() {
        let m = KeyMapper::new(200).with_allowed(|c| c != '/');
        let n = name("a/b");
        let k = m.map(&n);
        assert!(!k.contains('/'));
        assert_ne!(m.map(&name("a/b")), m.map(&name("a//b")));
    }

    #[test]
    fn multibyte_names_are_cut_on_char_boundaries() {
        let m = KeyMapper::new(40);
        let n = name(&"쿠".repeat(30));
        let k = m.map(&n);
        assert!(k.len() <= 40);
    }

    #[test]
    fn reserved_names_are_mapped() {
        let mapper = KeyMapper::new(64).with_reserved(&[".", ".."]);
        for reserved in [".", ".."] {
            let key = mapper.map(&name(reserved)).into_owned();
            assert_ne!(key, reserved);
            assert!(key.contains(KeyMapper::DIGEST_MARKER), "{key}");
        }
        assert_ne!(mapper.map(&name(".")), mapper.map(&name("..")));
        assert_eq!(mapper.map(&name("...")), "...");
    }

    #[test]
    fn hash_i64_is_stable() {
        assert_eq!(
            KeyMapper::hash_i64(&name("a")),
            KeyMapper::hash_i64(&name("a"))
        );
        assert_ne!(
            KeyMapper::hash_i64(&name("a")),
            KeyMapper::hash_i64(&name("b"))
        );
    }
}
