//! [`GuardTimer`]: one task per client that renews its guards and starts their other
//! background work (a watch on the key) when it comes due, instead of a task per guard.
//!
//! Most locks are released long before their first renewal (a third of the TTL: 10 s by
//! default). A task spawned per guard costs a spawn, two wake-ups and, on a multi-thread runtime,
//! the unparking of another worker thread: on a short hold that is a large part of the acquire
//! and release pair. With a timer, a grant is one map insertion and a release one removal, under
//! a lock nobody holds for long; the timer task is woken only when a grant comes due earlier than
//! the timer next looks, which it never does when every lock has the same TTL.
//!
//! Renewals stay on the timer for as long as the guard is held: at each tick the task takes
//! every renewal due within a small slack and renews them together (`watchdog.rs`), so many held
//! locks cost one task, one timer and one exchange with the server per tick, not one per lock.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use super::runtime::PerRuntime;
use super::time::after;
use super::watchdog::{MAX_SLACK, Renewing, renew_due};

/// With nothing scheduled, how soon after a grant the timer looks again anyway: grants that keep
/// coming (each released before it comes due) then always find a look planned before they are
/// due and need no wake-up. A timer that saw no grant for this long sleeps until the next one.
const LINGER: Duration = Duration::from_secs(1);

/// Starts the background work of one client's guards when it comes due, and renews them.
///
/// A backend keeps one per client. Returned from
/// [`RawLease::guard_timer`](super::RawLease::guard_timer), it renews every guard that renews
/// its own lease ([`RenewedBy::Guard`](super::RenewedBy::Guard)), the renewals due at one tick
/// together; a backend may also [`schedule`](Self::schedule) its own per-guard work (a watch on
/// the held key, started a moment after the grant, so a lock released sooner never costs one).
///
/// Each runtime that schedules has a task of its own ([`PerRuntime`]), so a guard's background
/// work runs on the runtime that took the guard: another runtime that ends (a parallel
/// `#[tokio::test]` sharing the client) does not take it along. The tasks end when the timer is
/// dropped. They keep time with tokio's clock, so paused time in tests moves them as it moves
/// everything else.
pub struct GuardTimer {
    shared: PerRuntime<Arc<Shared>>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    wake: Notify,
    /// Set when the `GuardTimer` is dropped: the task ends.
    closed: AtomicBool,
}

type Start = Box<dyn FnOnce() + Send>;

/// What comes due: a start that runs once, or a guard's renewal, which comes back after each.
enum Due {
    Start(Start),
    Renew(Box<Renewing>),
}

#[derive(Default)]
struct State {
    due: BTreeMap<(Instant, u64), Due>,
    /// Where a renewal taken from `due` at least once is now, by id: its new due time, or
    /// `None` while it is being renewed. Its [`Scheduled`] still names the first key.
    moved: HashMap<u64, Option<Instant>>,
    next_id: u64,
    /// When the task will next look without being woken (`None`: only when woken).
    looks_at: Option<Instant>,
    /// A grant was scheduled since the task last looked.
    busy: bool,
    /// The task is alive (it clears this if its runtime drops it).
    running: bool,
}

/// A start or renewal scheduled on a [`GuardTimer`], cancelled when dropped (the guard let go
/// first): keep it with the guard's lease.
#[must_use = "dropping it cancels the start"]
pub struct Scheduled {
    shared: Weak<Shared>,
    key: (Instant, u64),
}

impl GuardTimer {
    /// A timer with no task yet: the first schedule starts it.
    pub fn new() -> Self {
        Self {
            shared: PerRuntime::new(),
        }
    }

    /// Runs `start` at `at` on the timer's task, unless the returned handle is dropped first.
    /// `start` should only spawn (it runs on the task that times every guard of the client).
    /// `None` outside a tokio runtime: nothing could run it.
    pub fn schedule(
        &self,
        at: Instant,
        start: impl FnOnce() + Send + 'static,
    ) -> Option<Scheduled> {
        self.schedule_boxed(at, Box::new(start))
    }

    fn schedule_boxed(&self, at: Instant, start: Start) -> Option<Scheduled> {
        self.schedule_due(at, Due::Start(start))
    }

    /// Renews (or ends at its maximum hold) a guard from `at` on, until the returned handle is
    /// dropped or the guard is closed or lost.
    pub(crate) fn schedule_renewal(&self, at: Instant, renewing: Renewing) -> Option<Scheduled> {
        self.schedule_due(at, Due::Renew(Box::new(renewing)))
    }

    fn schedule_due(&self, at: Instant, due: Due) -> Option<Scheduled> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let shared = self.shared.get_or_make(|_| {
            Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Notify::new(),
                closed: AtomicBool::new(false),
            })
        })?;
        let mut state = shared.lock();
        let key = (at, state.next_id);
        state.next_id = state.next_id.wrapping_add(1);
        state.due.insert(key, due);
        state.busy = true;
        shared.look_by(state, at, &runtime);
        Some(Scheduled {
            shared: Arc::downgrade(&shared),
            key,
        })
    }
}

impl Default for GuardTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for GuardTimer {
    fn drop(&mut self) {
        for shared in self.shared.running() {
            shared.closed.store(true, Ordering::SeqCst);
            shared.wake.notify_one();
        }
    }
}

impl fmt::Debug for GuardTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let running = self.shared.running();
        let scheduled: usize = running.iter().map(|shared| shared.lock().due.len()).sum();
        f.debug_struct("GuardTimer")
            .field("scheduled", &scheduled)
            .field("runtimes", &running.len())
            .finish()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes sure the task looks by `at`: starts it if it is not running, wakes it if it
    /// sleeps past `at`.
    fn look_by(
        self: &Arc<Self>,
        mut state: MutexGuard<'_, State>,
        at: Instant,
        runtime: &tokio::runtime::Handle,
    ) {
        if !state.running {
            state.running = true;
            state.looks_at = Some(at);
            drop(state);
            runtime.spawn(run(self.clone()));
        } else if state.looks_at.is_none_or(|looks_at| at < looks_at) {
            state.looks_at = Some(at);
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Puts a renewal back after its turn, due at `at`, unless its guard let go meanwhile
    /// (its [`Scheduled`] was dropped while it was being renewed).
    pub(crate) fn requeue(self: &Arc<Self>, id: u64, at: Instant, renewing: Box<Renewing>) {
        let mut state = self.lock();
        match state.moved.get_mut(&id) {
            Some(moved) => *moved = Some(at),
            None => {
                drop(state);
                return;
            }
        }
        state.due.insert((at, id), Due::Renew(renewing));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.look_by(state, at, &runtime);
        }
    }

    /// Forgets a renewal that ended (its guard was closed or lost).
    pub(crate) fn finished(&self, id: u64) {
        self.lock().moved.remove(&id);
    }
}

impl fmt::Debug for Scheduled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduled")
            .field("at", &self.key.0)
            .finish()
    }
}

impl Drop for Scheduled {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut state = shared.lock();
            let mut removed = state.due.remove(&self.key);
            if removed.is_none() {
                if let Some(Some(at)) = state.moved.remove(&self.key.1) {
                    removed = state.due.remove(&(at, self.key.1));
                }
            }
            // Dropped outside the lock: a start may hold the last reference to a client.
            drop(state);
            drop(removed);
        }
    }
}

/// Clears `running` however the task ends, so the next grant starts a new one.
struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.running = false;
        state.looks_at = None;
    }
}

/// Takes what is due at `now` from `state`: the starts due, and the renewals due within their
/// slack, each renewal marked as being renewed.
fn take_due(state: &mut State, now: Instant) -> (Vec<Start>, Vec<(u64, Box<Renewing>)>) {
    let ready: Vec<(Instant, u64)> = state
        .due
        .range(..(after(now, MAX_SLACK), u64::MAX))
        .filter(|&(&(at, _), due)| match due {
            Due::Start(_) => at <= now,
            Due::Renew(renewing) => renewing.ready(now),
        })
        .map(|(&key, _)| key)
        .collect();
    let (mut starts, mut renewals) = (Vec::new(), Vec::new());
    for key in ready {
        match state.due.remove(&key) {
            Some(Due::Start(start)) => starts.push(start),
            Some(Due::Renew(renewing)) => {
                state.moved.insert(key.1, None);
                renewals.push((key.1, renewing));
            }
            None => {}
        }
    }
    (starts, renewals)
}

async fn run(shared: Arc<Shared>) {
    let running = Running(shared);
    let shared = &running.0;
    loop {
        if shared.closed.load(Ordering::SeqCst) {
            return;
        }
        let notified = shared.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let now = Instant::now();
        let (starts, renewals, looks_at) = {
            let mut state = shared.lock();
            let (starts, renewals) = take_due(&mut state, now);
            state.looks_at = match state.due.keys().next() {
                Some(&(at, _)) => Some(at.min(after(now, LINGER))),
                None if state.busy => Some(after(now, LINGER)),
                None => None,
            };
            state.busy = false;
            (starts, renewals, state.looks_at)
        };
        for start in starts {
            start();
        }
        if !renewals.is_empty() {
            // One task for the tick's renewals, so a slow server delays no start or later tick.
            tokio::spawn(renew_due(Arc::downgrade(shared), renewals));
        }
        match looks_at {
            Some(at) => {
                tokio::select! {
                    _ = &mut notified => {}
                    _ = sleep_until(at) => {}
                }
            }
            None => notified.await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn counter() -> (Arc<AtomicUsize>, impl Fn() -> Box<dyn FnOnce() + Send>) {
        let count = Arc::new(AtomicUsize::new(0));
        let make = {
            let count = count.clone();
            move || -> Box<dyn FnOnce() + Send> {
                let count = count.clone();
                Box::new(move || {
                    count.fetch_add(1, Ordering::SeqCst);
                })
            }
        };
        (count, make)
    }

    #[tokio::test(start_paused = true)]
    async fn runs_what_comes_due_and_nothing_cancelled() {
        let timer = GuardTimer::new();
        let (count, start) = counter();
        let now = Instant::now();
        let kept = timer.schedule_boxed(now + Duration::from_secs(10), start());
        let cancelled = timer.schedule_boxed(now + Duration::from_secs(5), start());
        drop(cancelled);
        let early = timer.schedule_boxed(now + Duration::from_secs(2), start());
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(count.load(Ordering::SeqCst), 1, "the 2 s start ran");
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(
            count.load(Ordering::SeqCst),
            2,
            "the 10 s start ran, the 5 s one never"
        );
        drop((kept, early));
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_grant_wakes_a_sleeping_timer() {
        let timer = GuardTimer::new();
        let (count, start) = counter();
        let _late = timer.schedule_boxed(Instant::now() + Duration::from_secs(60), start());
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _soon = timer.schedule_boxed(Instant::now() + Duration::from_millis(100), start());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn starts_again_on_a_new_runtime() {
        let timer = GuardTimer::new();
        let (count, start) = counter();
        for _ in 0..2 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async {
                let _s = timer.schedule_boxed(Instant::now() + Duration::from_secs(1), start());
                tokio::time::sleep(Duration::from_secs(2)).await;
            });
        }
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_runtime_that_ends_takes_only_its_own_starts_along() {
        let timer = GuardTimer::new();
        let (count, start) = counter();
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        let (first, second) = (runtime(), runtime());
        let _on_first = first.block_on(async { timer.schedule_boxed(Instant::now(), start()) });
        let _on_second = second.block_on(async {
            timer.schedule_boxed(Instant::now() + Duration::from_secs(1), start())
        });
        drop(first);
        second.block_on(async { tokio::time::sleep(Duration::from_secs(2)).await });
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "the second runtime's start ran"
        );
    }

    #[test]
    fn outside_a_runtime_nothing_is_scheduled() {
        let timer = GuardTimer::new();
        let (_, start) = counter();
        assert!(timer.schedule_boxed(Instant::now(), start()).is_none());
    }
}
