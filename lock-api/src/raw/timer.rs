//! [`GuardTimer`]: one task per client that starts a guard's background work (its watchdog, a
//! watch on its key) when it comes due, instead of a task per guard from the moment it is
//! granted.
//!
//! Most locks are released long before their first renewal (a third of the TTL: 10 s by
//! default). A task spawned per guard costs a spawn, two wake-ups and, on a multi-thread runtime,
//! the unparking of another worker thread: on a short hold that is a large part of the acquire
//! and release pair. With a timer, a grant is one map insertion and a release one removal, under
//! a lock nobody holds for long; the timer task is woken only when a grant comes due earlier than
//! the timer next looks, which it never does when every lock has the same TTL.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

use super::runtime::PerRuntime;
use super::time::after;

/// With nothing scheduled, how soon after a grant the timer looks again anyway: grants that keep
/// coming (each released before it comes due) then always find a look planned before they are
/// due and need no wake-up. A timer that saw no grant for this long sleeps until the next one.
const LINGER: Duration = Duration::from_secs(1);

/// Starts the background work of one client's guards when it comes due.
///
/// A backend keeps one per client. Returned from
/// [`RawLease::guard_timer`](super::RawLease::guard_timer), it starts the shared watchdog of a
/// guard that renews its own lease ([`RenewedBy::Guard`](super::RenewedBy::Guard)) only at its
/// first renewal; a backend may also [`schedule`](Self::schedule) its own per-guard work (a watch
/// on the held key, started a moment after the grant, so a lock released sooner never costs one).
///
/// Each runtime that schedules has a task of its own ([`PerRuntime`]), so a guard's background
/// work runs on the runtime that took the guard: another runtime that ends (a parallel
/// `#[tokio::test]` sharing the client) does not take it along. The tasks end when the timer is
/// dropped. They keep time with tokio's clock, so paused time in tests moves them as it moves
/// everything else.
pub struct GuardTimer {
    shared: PerRuntime<Arc<Shared>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Notify,
    /// Set when the `GuardTimer` is dropped: the task ends.
    closed: AtomicBool,
}

type Start = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    due: BTreeMap<(Instant, u64), Start>,
    next_id: u64,
    /// When the task will next look without being woken (`None`: only when woken).
    looks_at: Option<Instant>,
    /// A grant was scheduled since the task last looked.
    busy: bool,
    /// The task is alive (it clears this if its runtime drops it).
    running: bool,
}

/// A start scheduled on a [`GuardTimer`], cancelled when dropped (the guard let go first): keep
/// it with the guard's lease.
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
        state.due.insert(key, start);
        state.busy = true;
        if !state.running {
            state.running = true;
            state.looks_at = Some(at);
            drop(state);
            runtime.spawn(run(shared.clone()));
        } else if state.looks_at.is_none_or(|looks_at| at < looks_at) {
            state.looks_at = Some(at);
            drop(state);
            shared.wake.notify_one();
        }
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
            // Dropped outside the lock: a start may hold the last reference to a client.
            let removed = shared.lock().due.remove(&self.key);
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
        let (starts, looks_at) = {
            let mut state = shared.lock();
            let later = state.due.split_off(&(now, u64::MAX));
            let starts = std::mem::replace(&mut state.due, later);
            state.looks_at = match state.due.keys().next() {
                Some(&(at, _)) => Some(at.min(after(now, LINGER))),
                None if state.busy => Some(after(now, LINGER)),
                None => None,
            };
            state.busy = false;
            (starts, state.looks_at)
        };
        for (_, start) in starts {
            start();
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
