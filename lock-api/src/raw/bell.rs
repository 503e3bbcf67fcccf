//! [`ChangeBell`]: a server's word that something a reader watches may have changed, so the
//! reader looks again at once instead of on its next timer.

use std::any::Any;
use std::fmt;

use tokio::sync::watch;

/// Rings when what it was made for (a name's leader record, say) may have changed: the reader
/// then reads the state again. A ring carries no state of its own, so a ring too many costs a
/// read and nothing else; rings that come while the reader is busy collapse into one.
///
/// A backend makes one from the receiving side of a [`watch`] channel it bumps on each
/// notification, and a membership value whose drop ends its interest (an `UNLISTEN` when no
/// bell of the channel is left, say).
pub struct ChangeBell {
    rings: watch::Receiver<u64>,
    _membership: Box<dyn Any + Send + Sync>,
}

impl ChangeBell {
    /// A bell that rings on every change of `rings`' value, and keeps `membership` until it is
    /// dropped. Rings before this call are not heard.
    pub fn new(mut rings: watch::Receiver<u64>, membership: impl Any + Send + Sync) -> Self {
        rings.mark_unchanged();
        Self {
            rings,
            _membership: Box::new(membership),
        }
    }

    /// Waits for a ring since the bell was made or last heard ring. `false` if the bell can
    /// never ring again (whatever rang it is gone): read on a timer from then on.
    ///
    /// # Cancel safety
    /// Cancel safe: a ring that comes while no call waits is heard by the next one.
    pub async fn rung(&mut self) -> bool {
        self.rings.changed().await.is_ok()
    }
}

impl fmt::Debug for ChangeBell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeBell").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_ring_before_the_bell_is_not_heard_and_rings_while_busy_collapse_into_one() {
        let (ring, rings) = watch::channel(0_u64);
        ring.send_modify(|n| *n += 1);
        let mut bell = ChangeBell::new(rings, ());
        ring.send_modify(|n| *n += 1);
        ring.send_modify(|n| *n += 1);
        assert!(bell.rung().await);
        let again = tokio::time::timeout(std::time::Duration::from_millis(50), bell.rung()).await;
        assert!(again.is_err(), "two rings while busy are heard once");
        drop(ring);
        assert!(!bell.rung().await, "a bell whose ringer is gone says so");
    }
}
