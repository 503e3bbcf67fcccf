//! The protected resource's side of fencing: [`FencingGate`].

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::{LockError, Result};
use crate::token::FencingToken;

/// The protected resource's side of fencing: remembers the highest token seen per name and
/// refuses older ones.
///
/// This is the check the GC-pause scenario needs: holder A pauses past its TTL, B acquires
/// (a higher token) and writes; when A wakes and writes with its old token, the gate refuses it.
/// Real storage does the same with a conditional write (`UPDATE … WHERE fence < $token`); this
/// in-memory gate is a model of it for tests and single-process resources.
///
/// A token equal to the highest is admitted, so one holder may write several times.
///
/// # Examples
/// ```
/// use dlock_api::{FencingGate, FencingToken, LockError};
/// let gate = FencingGate::new();
/// gate.admit("coupon:1", FencingToken::new(34))?;
/// gate.admit("coupon:1", FencingToken::new(35))?;
/// let stale = gate.admit("coupon:1", FencingToken::new(34));
/// assert!(matches!(stale, Err(LockError::Fenced { .. })));
/// # Ok::<(), LockError>(())
/// ```
#[derive(Debug, Default)]
pub struct FencingGate {
    highest: Mutex<HashMap<String, FencingToken>>,
}

impl FencingGate {
    /// An empty gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits `token` for `name` if it is at least the highest seen, remembering it; otherwise
    /// returns [`LockError::Fenced`].
    pub fn admit(&self, name: &str, token: FencingToken) -> Result<()> {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        match highest.get(name) {
            Some(&seen) if token < seen => Err(LockError::Fenced {
                name: name.to_owned(),
                presented: token,
                highest: seen,
            }),
            _ => {
                highest.insert(name.to_owned(), token);
                Ok(())
            }
        }
    }

    /// The highest token admitted for `name`, if any.
    pub fn highest(&self, name: &str) -> Option<FencingToken> {
        self.highest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied()
    }
}
