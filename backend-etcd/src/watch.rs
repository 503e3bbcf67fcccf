//! One watch stream per client, multiplexing every waiter's and holder's watch.
//!
//! A [`Watcher`] task owns the stream. Each [`WatchHandle`] watches one key from a start
//! revision and receives [`WatchEvent`]s; dropping the handle cancels the watch. When the stream
//! fails (a member died, lost its leader, refused an expired token), the task reopens it with
//! back-off and re-creates every watch from the revision after the last event it delivered, so
//! no event is skipped; a watch whose start was compacted away meanwhile is told to re-read.
//!
//! The task runs on the connection's runtime. When that runtime shuts down, the task and every
//! watch it kept go with it: each handle then reads `Reread` (its sender is gone), and the task
//! starts anew, with no watches, on the next connection; a re-read watches there again.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use etcd_client::{Client, EventType, WatchOptions, WatchRequestSender, WatchResponseStream};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio_util::sync::CancellationToken;

use crate::connection::{Conn, Running};

/// What a watch reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WatchEvent {
    /// Keys were deleted: the watched one, or these under the watched prefix; all the
    /// deletions of one server response, in revision order (a revision is never split across
    /// responses, so a lease's keys that went together arrive together).
    Deleted { keys: Vec<Box<[u8]>> },
    /// The watch could not go on from where it was (compaction, a refused re-create): read the
    /// key again and watch anew.
    Reread,
    /// Keys of a watched range changed (put or deleted) at these revisions, in order: every
    /// revision of one server response (see [`Watcher::watch_range`]).
    Changed { revisions: Vec<i64> },
}

/// Which keys a watch covers, and which events it reports.
#[derive(Clone, Debug)]
enum Scope {
    /// One key, every event.
    Key,
    /// Every key under the prefix, deletions only.
    DeletionsUnder,
    /// Every key from the key to this end (exclusive), every event, reported as
    /// [`WatchEvent::Changed`].
    Range(Vec<u8>),
}

enum Command {
    Watch {
        id: i64,
        key: Vec<u8>,
        scope: Scope,
        start: i64,
        events: UnboundedSender<WatchEvent>,
    },
    Cancel {
        id: i64,
    },
}

/// The client's watch multiplexer.
#[derive(Debug)]
pub(crate) struct Watcher {
    /// To the task on the current connection's runtime.
    commands: RwLock<UnboundedSender<Command>>,
    next_id: AtomicI64,
    pub(crate) probe: Arc<Probe>,
    running: Running,
    /// Ends the task (the client is gone).
    stop: CancellationToken,
}

/// What the fault tests look at or set in the watch task: the paths they exercise (a compacted
/// re-create, the fallback re-reads) cannot be told apart from the outside otherwise.
#[derive(Debug, Default)]
pub(crate) struct Probe {
    /// Watches the server refused or ended as compacted.
    pub(crate) compacted: AtomicU64,
    /// While set, deletion events are dropped as they arrive, as etcd 3.4 before 3.4.31 can
    /// lose them after a compaction; only the fallback re-reads can then notice a deletion.
    pub(crate) lose_deletions: AtomicBool,
}

/// One watch (on one key, a range, or a few keys at once); dropping it cancels the watch.
#[derive(Debug)]
pub(crate) struct WatchHandle {
    /// Our ids of the server watches that feed this handle: one, or one per key of
    /// [`Watcher::watch_keys`].
    ids: Vec<i64>,
    commands: UnboundedSender<Command>,
    events: UnboundedReceiver<WatchEvent>,
}

impl WatchHandle {
    /// The next event; `Reread` if the watcher is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: an event not returned stays queued.
    pub(crate) async fn next(&mut self) -> WatchEvent {
        self.events.recv().await.unwrap_or(WatchEvent::Reread)
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        for &id in &self.ids {
            let _ = self.commands.send(Command::Cancel { id });
        }
    }
}

impl Watcher {
    /// A watcher with no task yet ([`run_on`](Self::run_on) starts it); the task ends when
    /// `stop` fires.
    pub(crate) fn new(stop: CancellationToken) -> Self {
        let (commands, _) = unbounded_channel();
        Self {
            commands: RwLock::new(commands),
            next_id: AtomicI64::new(1),
            probe: Arc::new(Probe::default()),
            running: Running::default(),
            stop,
        }
    }

    /// Starts the task on `conn`'s runtime, unless it runs on a runtime that has not stopped.
    pub(crate) fn run_on(&self, conn: &Conn) {
        self.running.ensure(conn, || {
            let (commands, receiver) = unbounded_channel();
            *self.commands.write().unwrap_or_else(|e| e.into_inner()) = commands;
            let (client, probe, stop) =
                (conn.client.clone(), self.probe.clone(), self.stop.clone());
            async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = run(client, receiver, &probe) => {}
                }
            }
        });
    }

    /// Watches `key` from revision `start` (use the revision after the read that showed the
    /// key: a start above the current revision joins the server's synced watchers, which are
    /// told of a change as it is applied).
    pub(crate) fn watch(&self, key: &str, start: i64) -> WatchHandle {
        self.create(key, Scope::Key, start)
    }

    /// Watches every put and deletion of the keys from `key` to `end` (exclusive) from revision
    /// `start`, reported as the revisions they happened at.
    pub(crate) fn watch_range(&self, key: &str, end: Vec<u8>, start: i64) -> WatchHandle {
        self.create(key, Scope::Range(end), start)
    }

    /// Watches the deletions of every key under `prefix` from revision `start`, as
    /// [`watch`](Self::watch) does one key's. One watch delivers its events in revision order,
    /// whichever keys they are about.
    pub(crate) fn watch_deletions_under(&self, prefix: &str, start: i64) -> WatchHandle {
        self.create(prefix, Scope::DeletionsUnder, start)
    }

    /// Watches every event of each of `keys` from revision `start`, all reported on one
    /// handle. Unlike one watch on a prefix, a change to a key not listed costs nothing here:
    /// this is how a waiter deep in a line hears of the few keys it waits on only. Events of
    /// different keys are separate server responses, so two keys deleted at one revision may
    /// arrive in either order: only an event that makes its receiver read again is safe here.
    pub(crate) fn watch_keys<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a str>,
        start: i64,
    ) -> WatchHandle {
        self.create_all(keys.into_iter().map(|key| (key, Scope::Key)), start)
    }

    fn create(&self, key: &str, scope: Scope, start: i64) -> WatchHandle {
        self.create_all([(key, scope)], start)
    }

    fn create_all<'a>(
        &self,
        watches: impl IntoIterator<Item = (&'a str, Scope)>,
        start: i64,
    ) -> WatchHandle {
        let (events, receiver) = unbounded_channel();
        let commands = self
            .commands
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut ids = Vec::new();
        for (key, scope) in watches {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            ids.push(id);
            if commands
                .send(Command::Watch {
                    id,
                    key: key.as_bytes().to_vec(),
                    scope,
                    start,
                    events: events.clone(),
                })
                .is_err()
            {
                let _ = events.send(WatchEvent::Reread);
                break;
            }
        }
        WatchHandle {
            ids,
            commands,
            events: receiver,
        }
    }
}

struct Entry {
    key: Vec<u8>,
    /// Which keys, and which events.
    scope: Scope,
    /// The revision to (re)start from: one after the last event delivered.
    next: i64,
    events: UnboundedSender<WatchEvent>,
    /// The server's id for this watch on the current stream, once created.
    server_id: Option<i64>,
}

#[derive(Default)]
struct State {
    entries: HashMap<i64, Entry>,
    /// Our ids of the creates sent on the current stream and not yet acknowledged, in order
    /// (the server answers creates in the order it gets them).
    pending: VecDeque<i64>,
    /// Creates acknowledged for watches cancelled meanwhile: cancel them on the server.
    by_server: HashMap<i64, i64>,
}

struct Open {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
}

fn options(entry: &Entry) -> WatchOptions {
    let options = WatchOptions::new().with_start_revision(entry.next);
    match &entry.scope {
        Scope::Key => options,
        Scope::DeletionsUnder => options
            .with_prefix()
            .with_filters([etcd_client::WatchFilterType::NoPut]),
        Scope::Range(end) => options.with_range(end.clone()),
    }
}

async fn open(client: &Client, state: &mut State) -> Option<Open> {
    let mut ids: Vec<i64> = state.entries.keys().copied().collect();
    ids.sort_unstable();
    let first = *ids.first()?;
    let entry = &state.entries[&first];
    let mut watches = client.watch_client();
    let stream = tokio::time::timeout(
        Duration::from_secs(5),
        watches.watch(entry.key.clone(), Some(options(entry))),
    )
    .await;
    let (mut sender, responses) = match stream {
        Ok(Ok(stream)) => stream.split(),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "etcd watch stream failed to open");
            return None;
        }
        Err(_) => return None,
    };
    state.pending.clear();
    state.by_server.clear();
    state.pending.push_back(first);
    for id in ids.into_iter().skip(1) {
        let entry = &state.entries[&id];
        if sender
            .watch(entry.key.clone(), Some(options(entry)))
            .await
            .is_err()
        {
            return None;
        }
        state.pending.push_back(id);
    }
    Some(Open { sender, responses })
}

async fn run(client: Client, mut commands: UnboundedReceiver<Command>, probe: &Probe) {
    let mut state = State::default();
    let mut stream: Option<Open> = None;
    let mut failures: u32 = 0;
    loop {
        if stream.is_none() && !state.entries.is_empty() {
            for entry in state.entries.values_mut() {
                entry.server_id = None;
            }
            stream = open(&client, &mut state).await;
            if stream.is_none() {
                failures = failures.saturating_add(1);
                let pause = Duration::from_millis(25u64 << failures.min(5));
                // Keep taking commands while pausing, so watches come and go meanwhile.
                let until = dlock_api::raw::time::after(tokio::time::Instant::now(), pause);
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => break,
                        command = commands.recv() => match command {
                            Some(command) => apply_offline(&mut state, command),
                            None => return,
                        },
                    }
                }
                continue;
            }
        }
        let Some(open) = stream.as_mut() else {
            match commands.recv().await {
                Some(command) => apply_offline(&mut state, command),
                None => return,
            }
            continue;
        };
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { return };
                if apply(&mut state, open, command).await.is_err() {
                    stream = None;
                }
            }
            message = open.responses.message() => match message {
                Ok(Some(response)) => {
                    failures = 0;
                    if handle(&mut state, open, response, probe).await.is_err() {
                        stream = None;
                    }
                }
                Ok(None) => stream = None,
                Err(e) => {
                    tracing::debug!(error = %e, "etcd watch stream failed; reopening");
                    stream = None;
                }
            },
        }
    }
}

fn apply_offline(state: &mut State, command: Command) {
    match command {
        Command::Watch {
            id,
            key,
            scope,
            start,
            events,
        } => {
            state.entries.insert(
                id,
                Entry {
                    key,
                    scope,
                    next: start,
                    events,
                    server_id: None,
                },
            );
        }
        Command::Cancel { id } => {
            state.entries.remove(&id);
        }
    }
}

async fn apply(state: &mut State, open: &mut Open, command: Command) -> Result<(), ()> {
    match command {
        Command::Watch {
            id,
            key,
            scope,
            start,
            events,
        } => {
            let entry = Entry {
                key,
                scope,
                next: start,
                events,
                server_id: None,
            };
            open.sender
                .watch(entry.key.clone(), Some(options(&entry)))
                .await
                .map_err(drop)?;
            state.entries.insert(id, entry);
            state.pending.push_back(id);
        }
        Command::Cancel { id } => {
            if let Some(entry) = state.entries.remove(&id) {
                if let Some(server_id) = entry.server_id {
                    state.by_server.remove(&server_id);
                    open.sender.cancel(server_id).await.map_err(drop)?;
                }
                // Not created yet: the create's answer finds no entry and cancels it then.
            }
        }
    }
    Ok(())
}

async fn handle(
    state: &mut State,
    open: &mut Open,
    response: etcd_client::WatchResponse,
    probe: &Probe,
) -> Result<(), ()> {
    let server_id = response.watch_id();
    if response.created() {
        let Some(id) = state.pending.pop_front() else {
            return Ok(());
        };
        match state.entries.get_mut(&id) {
            Some(entry) => {
                entry.server_id = Some(server_id);
                state.by_server.insert(server_id, id);
            }
            None if !response.canceled() => {
                open.sender.cancel(server_id).await.map_err(drop)?;
                return Ok(());
            }
            None => return Ok(()),
        }
        if response.canceled() {
            if response.compact_revision() > 0 {
                probe.compacted.fetch_add(1, Ordering::Relaxed);
            }
            // Refused at once (e.g. a compacted start): re-read.
            if let Some(entry) = state.entries.remove(&id) {
                state.by_server.remove(&server_id);
                let _ = entry.events.send(WatchEvent::Reread);
            }
        }
        return Ok(());
    }
    let Some(&id) = state.by_server.get(&server_id) else {
        return Ok(());
    };
    if response.canceled() || response.compact_revision() > 0 {
        if response.compact_revision() > 0 {
            probe.compacted.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(entry) = state.entries.remove(&id) {
            state.by_server.remove(&server_id);
            let _ = entry.events.send(WatchEvent::Reread);
        }
        return Ok(());
    }
    if let Some(entry) = state.entries.get_mut(&id) {
        let mut deleted = Vec::new();
        let mut revisions: Vec<i64> = Vec::new();
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            entry.next = entry.next.max(kv.mod_revision().saturating_add(1));
            let delete = event.event_type() == EventType::Delete;
            if delete && probe.lose_deletions.load(Ordering::Relaxed) {
                continue;
            }
            if delete {
                deleted.push(kv.key().into());
            }
            if revisions.last() != Some(&kv.mod_revision()) {
                revisions.push(kv.mod_revision());
            }
        }
        if matches!(entry.scope, Scope::Range(_)) {
            if !revisions.is_empty() {
                let _ = entry.events.send(WatchEvent::Changed { revisions });
            }
        } else if !deleted.is_empty() {
            let _ = entry.events.send(WatchEvent::Deleted { keys: deleted });
        }
    }
    Ok(())
}
