//! Reader-writer locks: readers share, the writer (the name's lock) excludes them, and a waiting
//! writer goes before readers that come after it. Ported in dlock's words from the peers' own
//! tests (madelson's `DistributedReaderWriterLockCoreTestCases`, Curator's
//! `TestInterProcessReadWriteLock`, Redisson's `RedissonReadWriteLockTest`) and from the bugs
//! their users met: readers that starve a waiting writer and are let in one at a time after it
//! (Redisson #1542), a waiter whose lease ended that still wins (etcd #16221).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use dlock_api::{DistributedLock, DistributedLockExt, LockError, LockGuard, LockName, LockOptions};
use tokio::task::JoinHandle;

use crate::{CaseResult, Ctx, Failure, ensure};

/// A lease far longer than the case's bound: a share a case forgot is still held when it looks.
fn outlasting(ctx: &Ctx) -> LockOptions {
    LockOptions::new().with_ttl(ctx.timing().bound.saturating_mul(4))
}

/// `outlasting`, waiting up to the bound.
pub(crate) fn waiting(ctx: &Ctx) -> LockOptions {
    outlasting(ctx).with_wait_timeout(ctx.timing().bound)
}

/// A reader's share of `name` on `client`, which must be free for readers now.
async fn share(
    client: &dyn DistributedLock,
    name: &LockName,
    ctx: &Ctx,
) -> Result<LockGuard, Failure> {
    client
        .try_read(name, &outlasting(ctx))
        .await?
        .ok_or_else(|| Failure("a reader was refused while only readers held".into()))
}

pub(crate) fn spawn_read(
    client: &Arc<dyn DistributedLock>,
    name: &LockName,
    opts: LockOptions,
) -> JoinHandle<dlock_api::Result<LockGuard>> {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move { client.read(&name, &opts).await })
}

pub(crate) fn spawn_write(
    client: &Arc<dyn DistributedLock>,
    name: &LockName,
    opts: LockOptions,
) -> JoinHandle<dlock_api::Result<LockGuard>> {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move { client.write(&name, &opts).await })
}

/// The guard a spawned read or write returned, within the bound.
pub(crate) async fn granted(
    ctx: &Ctx,
    what: &str,
    task: JoinHandle<dlock_api::Result<LockGuard>>,
) -> Result<LockGuard, Failure> {
    ctx.within(what, task)
        .await?
        .map_err(|e| Failure(format!("{what}: the task panicked: {e}")))?
        .map_err(|e| Failure(format!("{what}: {e}")))
}

/// Readers on two clients hold together; while they do, no writer gets in; while a writer
/// holds, neither readers nor another writer do (madelson `TestMultipleReadersSingleWriter`,
/// Curator `testBasic`).
pub async fn readers_share_and_a_writer_excludes(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("rw");
    let opts = outlasting(&ctx);
    let first = share(&*a, &name, &ctx).await?;
    let second = share(&*b, &name, &ctx).await?;
    let writer = b.try_write(&name, &opts).await?;
    ensure!(writer.is_none(), "a writer got in beside two readers");
    ensure!(
        first.fencing_token() != second.fencing_token() || first.fencing_token().get() == 0,
        "two readers' grants shared the token {:?}",
        first.fencing_token()
    );
    first.release().await?;
    second.release().await?;
    let writer = a
        .try_write(&name, &opts)
        .await?
        .ok_or_else(|| Failure("the writer was refused after every reader left".into()))?;
    let reader = b.try_read(&name, &opts).await?;
    ensure!(reader.is_none(), "a reader got in beside the writer");
    let other = b.try_write(&name, &opts).await?;
    ensure!(other.is_none(), "a second writer got in beside the first");
    writer.release().await?;
    let reader = share(&*b, &name, &ctx).await?;
    reader.release().await?;
    Ok(())
}

/// Once a writer waits, a reader that comes after it is refused even though only readers hold,
/// and the writer gets in when they leave (madelson `TestWriterTrumpsReader`; Redisson #1542).
pub async fn writer_trumps_reader(ctx: Ctx) -> CaseResult {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let name = ctx.name("rw");
    let opts = outlasting(&ctx);
    let reader = share(&*a, &name, &ctx).await?;
    let writer = spawn_write(&b, &name, waiting(&ctx));
    // A reader asking before the writer has queued still gets in; once the writer waits, none
    // does. Asked until refused, each share given back at once, so the case holds whenever the
    // writer's place reaches the server.
    ctx.within("a reader to be refused behind the waiting writer", async {
        loop {
            match c.try_read(&name, &opts).await? {
                Some(early) => early.release().await?,
                None => return Ok::<_, LockError>(()),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await??;
    ensure!(!writer.is_finished(), "the writer got in beside a reader");
    let late = spawn_read(&c, &name, waiting(&ctx));
    reader.release().await?;
    let writer = granted(&ctx, "the writer after the reader left", writer).await?;
    ensure!(
        !late.is_finished(),
        "a reader that came after the waiting writer got in beside it"
    );
    writer.release().await?;
    let late = granted(&ctx, "the late reader after the writer left", late).await?;
    late.release().await?;
    Ok(())
}

/// Readers waiting behind a writer are let in together when it leaves, all before the next
/// writer behind them (Redisson #1542 let them in one at a time).
pub async fn waiting_readers_enter_together(ctx: Ctx) -> CaseResult {
    const READERS: usize = 3;
    let writer_client = ctx.client().await?;
    let name = ctx.name("rw");
    let first = writer_client
        .try_write(&name, &outlasting(&ctx))
        .await?
        .ok_or_else(|| Failure("a free name refused its writer".into()))?;
    let mut readers = Vec::new();
    for queued in 1..=READERS {
        let client = ctx.client().await?;
        readers.push(spawn_read(&client, &name, waiting(&ctx)));
        ctx.until_waiting(&*writer_client, &name, queued).await?;
    }
    let next_client = ctx.client().await?;
    let next_writer = spawn_write(&next_client, &name, waiting(&ctx));
    ctx.until_waiting(&*writer_client, &name, READERS.saturating_add(1))
        .await?;
    first.release().await?;
    let mut shares = Vec::new();
    for (i, reader) in readers.into_iter().enumerate() {
        let what = format!(
            "waiting reader {} after the writer left",
            i.saturating_add(1)
        );
        shares.push(granted(&ctx, &what, reader).await?);
    }
    ensure!(
        !next_writer.is_finished(),
        "the next writer got in beside the readers"
    );
    for share in shares {
        share.release().await?;
    }
    let next = granted(&ctx, "the next writer after the readers left", next_writer).await?;
    next.release().await?;
    Ok(())
}

/// Readers that keep overlapping (each takes its share before the last lets go) never keep a
/// waiting writer out: it gets in within the bound (Curator `testGetReadLockWhileHoldingWrite`'s
/// converse; Redisson #1542).
pub async fn reader_stream_never_starves_a_writer(ctx: Ctx) -> CaseResult {
    const READERS: usize = 4;
    let name = ctx.name("rw");
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU32::new(0));
    let mut stream = tokio::task::JoinSet::new();
    for _ in 0..READERS {
        let client = ctx.client().await?;
        let (name, stop, rounds, opts) =
            (name.clone(), stop.clone(), rounds.clone(), waiting(&ctx));
        stream.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let share = client.read(&name, &opts).await?;
                rounds.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                share.release().await?;
            }
            Ok::<_, LockError>(())
        });
    }
    let writer_client = ctx.client().await?;
    ctx.within("the readers to start", async {
        while rounds.load(Ordering::SeqCst) < 8 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await?;
    let writer = writer_client.write(&name, &waiting(&ctx)).await;
    stop.store(true, Ordering::SeqCst);
    let writer = writer.map_err(|e| Failure(format!("the writer starved behind readers: {e}")))?;
    writer.release().await?;
    for ended in ctx.join_all("the readers to stop", stream).await? {
        ended?;
    }
    Ok(())
}

/// A reader that vanishes without letting go (its guard forgotten, its renewal gone) frees its
/// share when its lease ends, and a waiting writer gets in (madelson's Redis reader set, whose
/// shared TTL kept a crashed reader alive while others renewed).
pub async fn forgotten_reader_frees_its_share(ctx: Ctx) -> CaseResult {
    let (a, b, c) = (
        ctx.client().await?,
        ctx.client().await?,
        ctx.client().await?,
    );
    let name = ctx.name("rw");
    let timing = ctx.timing();
    let short = LockOptions::new().with_ttl(timing.short_ttl);
    a.try_read(&name, &short)
        .await?
        .ok_or_else(|| Failure("a free name refused a reader".into()))?
        .forget();
    // A live reader renewing beside it must not keep the forgotten one's share alive.
    let live = b
        .try_read(&name, &outlasting(&ctx))
        .await?
        .ok_or_else(|| Failure("a second reader was refused".into()))?;
    let writer = spawn_write(&c, &name, waiting(&ctx));
    live.release().await?;
    let writer = granted(
        &ctx,
        "the writer after the forgotten reader's lease",
        writer,
    )
    .await?;
    writer.release().await?;
    Ok(())
}

/// A reader whose hold the server ends (a killed connection, an expired session) is told
/// `lost`, and a waiting writer gets in: a crashed reader never keeps writers out.
pub async fn killed_reader_frees_its_share(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("rw");
    let reader = share(&*a, &name, &ctx).await?;
    let writer = spawn_write(&b, &name, waiting(&ctx));
    ctx.until_queued(&*b, &name).await?;
    ctx.require_faults()?
        .kill_holder(&name)
        .await
        .map_err(Failure)?;
    let writer = granted(&ctx, "the writer after the reader was killed", writer).await?;
    ctx.within("the killed reader's lost signal", reader.lost())
        .await?;
    writer.release().await?;
    let _ = reader.release().await;
    Ok(())
}

/// Every grant's token is above every earlier grant's of the name, whichever the mode.
pub async fn tokens_rise_across_modes(ctx: Ctx) -> CaseResult {
    let a = ctx.client().await?;
    let name = ctx.name("rw");
    let mut last = None;
    for round in 0..4 {
        let guard = if round % 2 == 0 {
            share(&*a, &name, &ctx).await?
        } else {
            a.try_write(&name, &outlasting(&ctx))
                .await?
                .ok_or_else(|| Failure("a free name refused its writer".into()))?
        };
        let token = guard.fencing_token();
        ensure!(
            last.is_none_or(|last| token > last),
            "token {token:?} after {last:?}"
        );
        last = Some(token);
        guard.release().await?;
    }
    Ok(())
}

/// Reads and writes cut short at every point (wait timeouts, timeouts around the call, aborted
/// tasks) leave nothing held: a writer gets in at once afterwards.
pub async fn cancel_storm_leaves_nothing(ctx: Ctx) -> CaseResult {
    const TASKS: usize = 30;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(ctx.client().await?);
    }
    let name = ctx.name("rw");
    let long = outlasting(&ctx);
    let clients_ref = &clients;
    super::cancel::cut_short_round(&ctx, TASKS, &long, |t, opts, hold| {
        let client = clients_ref[t.checked_rem(clients_ref.len()).unwrap_or(0)].clone();
        let name = name.clone();
        async move {
            // Mostly readers, with a writer among them to be cut short too.
            let guard = if t % 5 == 4 {
                client.write(&name, &opts).await?
            } else {
                client.read(&name, &opts).await?
            };
            tokio::time::sleep(hold).await;
            guard.release().await
        }
    })
    .await?;
    let fresh = ctx.client().await?;
    ctx.until_free("the name to be free after the storm", &*fresh, &name)
        .await
}

/// A backend without reader-writer locks refuses a reader with `Unsupported`, before any
/// network call; one with them refuses a reader of a name in use as a semaphore of several
/// permits with `InvalidArgument`, and holds nothing after either.
pub async fn refusals_hold_nothing(ctx: Ctx) -> CaseResult {
    let a = ctx.client().await?;
    let name = ctx.name("rw");
    let opts = LockOptions::new();
    if !a.capabilities().reader_writer {
        let refused = a.try_read(&name, &opts).await;
        ensure!(
            matches!(refused, Err(LockError::Unsupported { .. })),
            "a reader on a backend without reader-writer locks answered {refused:?}"
        );
        let refused = a.read(&name, &opts).await;
        ensure!(
            matches!(refused, Err(LockError::Unsupported { .. })),
            "a waiting reader on a backend without reader-writer locks answered {refused:?}"
        );
    } else if a.capabilities().max_permits >= 2 {
        let permit = a
            .try_acquire_permit(&name, 2, &opts)
            .await?
            .ok_or_else(|| Failure("a free semaphore refused a permit".into()))?;
        let refused = a.try_read(&name, &opts).await;
        ensure!(
            matches!(refused, Err(LockError::InvalidArgument { .. })),
            "a reader of a name in use as a semaphore of 2 answered {refused:?}"
        );
        permit.release().await?;
    }
    let writer = a.try_write(&name, &opts).await?;
    ensure!(writer.is_some(), "a refused reader left the name held");
    if let Some(writer) = writer {
        writer.release().await?;
    }
    Ok(())
}
