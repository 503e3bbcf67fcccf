//! The fault suite on reader-writer locks: worker processes take a reader's share of a name in
//! most rounds (and only read) and its writer's lock in the others (and write), while the
//! harness pauses and kills them; the checker's rule is that a writer's hold meets no other hold
//! of its name, while readers' holds meet freely (see [`crate::history::checker`],
//! "Reader-writer locks").

use std::time::Duration;

use dlock_api::{DistributedLockExt, LockName, LockOptions};

use super::shared_names::{Role, paused_and_killed, six_workers_checked_clean};
use super::steps::verify;
use crate::history::{Count, Expect, Input, Report};
use crate::nemesis::Run;
use crate::{CaseResult, Ctx, Failure, Harness};

/// The share of rounds that read.
const READER_ROUNDS: u8 = 75;

/// The longest a worker thinks between reading and writing: long enough for readers to meet.
const THINK: Duration = Duration::from_millis(50);

/// A negative control: the history judged with every reader taken for a writer must show holds
/// that met.
const READERS_MET: Expect = Expect {
    overlaps: Count::AtLeast(1),
    ..Expect::ANY
};

/// **Reader-writer locks, history-checked.** Six worker processes run rounds over two names,
/// three in four as readers (take a share → read the register → think → give it back) and the
/// rest as writers (take the lock → read → think → write → release). No writer's hold may meet
/// another hold of its name, no two grants share a token and each is above every grant that
/// returned before it was asked for, the register keeps a lock's rule (only writers write, one
/// at a time), a writer can take each name afterwards, and nothing is left on the server.
///
/// CONTRACT: "Readers share, the writer excludes", "Fenced across modes" (Reader-writer locks),
/// across processes.
pub async fn reader_writer_workers_keep_writers_alone(ctx: Ctx) -> CaseResult {
    let names = [ctx.name("a"), ctx.name("b")];
    let (run, input, report) = six_workers_checked_clean(&ctx, &names, (12, THINK), |spec| {
        spec.reader_rounds = Some(READER_ROUNDS);
    })
    .await?;
    every_name_free_for_a_writer(&ctx, &**ctx.harness(), &names).await?;
    readers_taken_for_writers_are_caught(&run, &input, &report)?;
    run.discard();
    Ok(())
}

/// **A paused reader and a killed writer.** A worker stopped with `SIGSTOP` while it holds a
/// reader's share, for three lease TTLs, and a worker killed (`SIGKILL`) while it holds the
/// writer's lock of a second name; four more workers run mixed rounds on both names meanwhile,
/// then the paused reader resumes and releases late.
///
/// - TTL leases: the paused share ends at its deadline, the dead writer's lock at its TTL, and
///   the others' writers get in after them; the checker must never see a writer meet another
///   hold (the paused share counts until its deadline, the dead writer's lock until its death).
/// - Session leases: the paused process's session keeps its share until it resumes, and writers
///   wait for it; the dead one's lock ends with its session. Same verdict.
///
/// Either way a writer can take each name afterwards, tokens are unique and rise, and nothing is
/// left.
///
/// CONTRACT: "Shares come back" and "Readers share, the writer excludes" (Reader-writer locks)
/// under a paused reader and a dead writer.
pub async fn reader_writer_workers_paused_and_killed(ctx: Ctx) -> CaseResult {
    let names = [ctx.name("read"), ctx.name("write")];
    let (run, input, report) = paused_and_killed(
        &ctx,
        (&names[0], &names[1], &names),
        (16, THINK.saturating_mul(2)),
        |spec, role| {
            spec.reader_rounds = Some(match role {
                Role::Paused => 100,
                Role::Killed => 0,
                Role::Beside => READER_ROUNDS,
            });
        },
    )
    .await?;
    every_name_free_for_a_writer(&ctx, &**ctx.harness(), &names).await?;
    readers_taken_for_writers_are_caught(&run, &input, &report)?;
    run.discard();
    Ok(())
}

/// Nothing lost: a writer on a fresh client of `harness` takes each of `names` (waiting, up to
/// the bound, for any share the server still gives back).
async fn every_name_free_for_a_writer(
    ctx: &Ctx,
    harness: &dyn Harness,
    names: &[LockName],
) -> CaseResult {
    let options = LockOptions::new()
        .with_ttl(ctx.timing().bound)
        .with_wait_timeout(ctx.timing().bound);
    for name in names {
        let client = harness.client().await?;
        let writer = client
            .write(name, &options)
            .await
            .map_err(|e| Failure(format!("{name} stayed held after the run: {e}")))?;
        writer.release().await?;
    }
    Ok(())
}

/// The negative control: if readers' holds met during the run, the same history with every
/// reader taken for a writer must be caught with holds that met. (A run whose readers never met
/// has nothing to show; it is safe, and its verdict says how many were held at once.)
fn readers_taken_for_writers_are_caught(
    run: &Run,
    input: &Input,
    report: &Report,
) -> Result<(), Failure> {
    if report.peak_holders.values().all(|peak| *peak < 2) {
        return Ok(());
    }
    let mut exclusive = input.clone();
    for event in &mut exclusive.events {
        event.shared = false;
    }
    verify(run, &READERS_MET, &exclusive).map(|_| ())
}
