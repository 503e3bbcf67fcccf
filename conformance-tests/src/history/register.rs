//! The fenced register: the protected resource of a fault test, and its unfenced shadow.
//!
//! A lock is only worth what it protects. The fault suite gives every lock name a register
//! holding a set of integers, and workers update it the way real programs misuse a lock
//! under faults: read the set, think, write back the set plus one element of their own
//! ([`RegisterClient::rmw`](super::register_service::RegisterClient::rmw)). Every write
//! carries the writer's fencing token and hold id.
//!
//! - The **fenced** register accepts a write only if its token is above every token it has
//!   accepted for that name, or equal to it from the same hold. Under faults the lock may fail;
//!   this register must still refuse every stale write, and its refusals count the "stale
//!   attempts" the checker reports.
//! - The **shadow** register accepts every write. Run beside the fenced one, its final sets show
//!   the updates that fencing saved: acknowledged elements that a stale writer overwrote.
//!
//! Both log every write decision with the host-clock time it was made ([`WriteRecord`]), and
//! [`Register::snapshot`] hands the log and final sets to the history checker. Workers reach a
//! register over TCP: see [`register_service`](super::register_service).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::clock::now_ns;
use super::event::HoldId;

/// Which rule a register applies to writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterKind {
    /// Accept a write iff its token is above the highest accepted one for the name, or equal to
    /// it from the same hold.
    Fenced,
    /// Accept every write (the negative control: what happens without fencing).
    Shadow,
}

/// One write decision, stamped when the register made it (at once, on arrival).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    /// The lock name (one register value per name).
    pub name: String,
    /// The writer's fencing token.
    pub token: u64,
    /// The hold the writer claims to write under.
    pub holder: HoldId,
    /// The element this write adds.
    pub element: u64,
    /// Whether the register took the write.
    pub accepted: bool,
    /// The highest accepted token for the name before this write, if any.
    pub max_token_before: Option<u64>,
    /// [`now_ns`] of the decision.
    pub t: u64,
}

/// What a register holds at the end of a run: its log and its final sets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterSnapshot {
    /// Every write decision, in the order made.
    pub log: Vec<WriteRecord>,
    /// The final set per name.
    pub sets: BTreeMap<String, BTreeSet<u64>>,
}

/// A register's value as read: the set and the highest accepted token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterValue {
    /// The set of elements.
    pub set: BTreeSet<u64>,
    /// The highest token accepted for the name, if any.
    pub max_token: Option<u64>,
}

/// The in-memory register, without the network: what a [`RegisterServer`](super::register_service::RegisterServer) serves.
#[derive(Debug)]
pub struct Register {
    kind: RegisterKind,
    slots: HashMap<String, Slot>,
    log: Vec<WriteRecord>,
}

/// One name's value.
#[derive(Debug, Default)]
struct Slot {
    /// The highest accepted token and the hold that wrote it.
    top: Option<(u64, HoldId)>,
    set: BTreeSet<u64>,
}

impl Register {
    /// An empty register applying `kind`'s rule.
    pub fn new(kind: RegisterKind) -> Self {
        Self {
            kind,
            slots: HashMap::new(),
            log: Vec::new(),
        }
    }

    /// The value of `name` (empty if never written).
    pub fn read(&self, name: &str) -> RegisterValue {
        self.slots
            .get(name)
            .map(|slot| RegisterValue {
                set: slot.set.clone(),
                max_token: slot.top.map(|(token, _)| token),
            })
            .unwrap_or_default()
    }

    /// Decides and logs a write setting `name` to `base` plus `element`; returns whether it
    /// was accepted.
    pub fn write(
        &mut self,
        name: &str,
        token: u64,
        holder: HoldId,
        base: BTreeSet<u64>,
        element: u64,
    ) -> bool {
        let t = now_ns();
        let Slot { top, set } = self.slots.entry(name.to_owned()).or_default();
        let fenced_ok = match *top {
            None => true,
            Some((max, by)) => token > max || (token == max && holder == by),
        };
        let accepted = fenced_ok || self.kind == RegisterKind::Shadow;
        let max_token_before = top.map(|(max, _)| max);
        if accepted {
            *set = base;
            set.insert(element);
            if top.is_none_or(|(max, _)| token > max) {
                *top = Some((token, holder));
            }
        }
        self.log.push(WriteRecord {
            name: name.to_owned(),
            token,
            holder,
            element,
            accepted,
            max_token_before,
            t,
        });
        accepted
    }

    /// A copy of the log and the sets.
    pub fn snapshot(&self) -> RegisterSnapshot {
        RegisterSnapshot {
            log: self.log.clone(),
            sets: self
                .slots
                .iter()
                .map(|(name, slot)| (name.clone(), slot.set.clone()))
                .collect(),
        }
    }
}
