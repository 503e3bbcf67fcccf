//! [`FencingToken`]: the number that grows with every acquire of a name.

use std::fmt;

/// A number that grows with every successful acquire of a lock name.
///
/// Every acquire of a name returns a token strictly greater than every token returned before for
/// that name by the same deployment (where the backend's [`Fencing`](crate::Fencing) is
/// `Strict`). Pass it to the resource you protect with every write; a resource that remembers
/// the highest token it has seen can refuse a write from a holder whose lock expired while it was
/// paused (see [`FencingGate`](crate::FencingGate)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value (backends use this).
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The raw value, for storing next to the data it protects.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}
