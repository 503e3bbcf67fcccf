//! [`Subscriptions`]: a client's pub/sub subscriptions by channel, each shared by all the
//! client's waiters on that channel.

use foldhash::HashMap;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

/// A client's subscriptions by channel: one per channel, however many of its tasks wait on it.
///
/// The first waiter of a channel creates its entry ([`join`](Self::join)); the last to
/// [`leave`](Self::leave) removes it and unsubscribes in the background. Subscribe commands are
/// sent holding [`ordered`](Self::ordered), which the unsubscribe holds too, so a late
/// unsubscribe of an old entry never undoes the subscribe of a new one. `T` is what the backend
/// keeps per channel: whether its subscription is live, and how to wake its waiters.
pub struct Subscriptions<T> {
    channels: Mutex<HashMap<String, Arc<Subscription<T>>>>,
    order: tokio::sync::Mutex<()>,
}

/// One channel's entry in [`Subscriptions`]; it dereferences to the backend's state `T`.
pub struct Subscription<T> {
    name: String,
    waiters: Mutex<usize>,
    state: T,
}

impl<T> Subscription<T> {
    /// The channel.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl<T> Deref for Subscription<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.state
    }
}

impl<T> Default for Subscriptions<T> {
    fn default() -> Self {
        Self {
            channels: Mutex::new(HashMap::default()),
            order: tokio::sync::Mutex::new(()),
        }
    }
}

impl<T: Send + Sync + 'static> Subscriptions<T> {
    /// No subscriptions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one more waiter on `channel`, creating its entry with `new` if it has none. Each
    /// join is paired with one [`leave`](Self::leave).
    pub fn join(&self, channel: &str, new: impl FnOnce() -> T) -> Arc<Subscription<T>> {
        let mut channels = self.channels();
        let entry = channels
            .entry(channel.to_owned())
            .or_insert_with(|| {
                Arc::new(Subscription {
                    name: channel.to_owned(),
                    waiters: Mutex::new(0),
                    state: new(),
                })
            })
            .clone();
        {
            let mut waiters = entry.waiters.lock().unwrap_or_else(|e| e.into_inner());
            *waiters = waiters.saturating_add(1);
        }
        entry
    }

    /// Calls `f` with `channel`'s entry, if it has one, while no waiter can join or leave it.
    pub fn with<R>(&self, channel: &str, f: impl FnOnce(&Subscription<T>) -> R) -> Option<R> {
        self.channels().get(channel).map(|entry| f(entry))
    }

    /// Calls `f` with every entry (when the connection carrying them dropped, say).
    pub fn for_each(&self, f: impl FnMut(&Arc<Subscription<T>>)) {
        self.channels().values().for_each(f);
    }

    /// The turn to send a subscribe command: hold it until the reply.
    pub async fn ordered(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.order.lock().await
    }

    /// One waiter leaves `entry`. When it was the last, a background task removes the entry,
    /// unless a new waiter has joined it since, and then runs `unsubscribe` in its turn among
    /// the subscribe commands. Outside a tokio runtime nothing runs, and the idle entry stays
    /// for the next waiter.
    pub fn leave<F, Fut>(self: &Arc<Self>, entry: &Arc<Subscription<T>>, unsubscribe: F)
    where
        F: FnOnce(Arc<Subscription<T>>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let last = {
            let mut waiters = entry.waiters.lock().unwrap_or_else(|e| e.into_inner());
            *waiters = waiters.saturating_sub(1);
            *waiters == 0
        };
        if !last {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (subscriptions, entry) = (self.clone(), entry.clone());
        runtime.spawn(async move {
            let _ordered = subscriptions.ordered().await;
            let removed = {
                let mut channels = subscriptions.channels();
                let idle = *entry.waiters.lock().unwrap_or_else(|e| e.into_inner()) == 0;
                let same = channels
                    .get(&entry.name)
                    .is_some_and(|current| Arc::ptr_eq(current, &entry));
                if idle && same {
                    channels.remove(&entry.name);
                }
                idle && same
            };
            if removed {
                unsubscribe(entry).await;
            }
        });
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Subscription<T>>>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T: fmt::Debug> fmt::Debug for Subscription<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("name", &self.name)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Subscriptions<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Subscriptions")
            .field("channels", &channels.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn the_last_waiter_to_leave_unsubscribes_once() {
        let subscriptions = Arc::new(Subscriptions::new());
        let created = AtomicUsize::new(0);
        let first = subscriptions.join("c", || created.fetch_add(1, Ordering::SeqCst));
        let second = subscriptions.join("c", || created.fetch_add(1, Ordering::SeqCst));
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(created.load(Ordering::SeqCst), 1);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for entry in [first, second] {
            let tx = tx.clone();
            subscriptions.leave(&entry, move |entry| async move {
                let _ = tx.send(entry.name().to_owned());
            });
        }
        drop(tx);
        assert_eq!(rx.recv().await.as_deref(), Some("c"));
        assert_eq!(rx.recv().await, None);
        assert!(subscriptions.with("c", |_| ()).is_none());
    }

    #[tokio::test]
    async fn a_waiter_joining_again_keeps_the_subscription() {
        let subscriptions = Arc::new(Subscriptions::new());
        let entry = subscriptions.join("c", || ());
        let ordered = subscriptions.ordered().await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        subscriptions.leave(&entry, move |_| async move {
            let _ = tx.send(());
        });
        let again = subscriptions.join("c", || ());
        assert!(Arc::ptr_eq(&entry, &again));
        drop(ordered);
        assert_eq!(rx.recv().await, None);
        assert!(subscriptions.with("c", |_| ()).is_some());
    }
}
