//! Leader election: one leader at a time with rising terms, hand-over on resignation and crash,
//! observers that see every term, a deposed leader refused, a candidate whose session ended
//! never told it leads. Ported in dlock's words from the peers' election tests and bugs:
//! Curator's `TestLeaderLatch` / `TestLeaderSelector` (session loss, reconnect: CURATOR-696),
//! etcd's `client/v3/concurrency` election tests and etcd-io/etcd #19597 (a candidate whose
//! lease expired while it waited told it leads) and #21128 (a failed campaign leaves its key).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_api::{
    DistributedLock, DistributedLockExt, FencingToken, LeaderEvent, LeaderStream, LockError,
    LockName, LockOptions, LockStatus, MAX_LEADER_VALUE,
};
use futures::StreamExt;

use crate::{CaseResult, Ctx, Failure, ensure};

fn waiting(ctx: &Ctx) -> LockOptions {
    LockOptions::new().with_wait_timeout(ctx.timing().bound)
}

/// The next event of `stream` that `wanted` accepts, within the timing's bound; errors and
/// `Missed` on the way are skipped (an observer reconnecting is allowed to say so).
async fn next_matching(
    ctx: &Ctx,
    what: &str,
    stream: &mut LeaderStream,
    mut wanted: impl FnMut(&LeaderEvent) -> bool,
) -> Result<LeaderEvent, Failure> {
    let mut seen = Vec::new();
    let found = ctx
        .within(what, async {
            while let Some(item) = stream.next().await {
                match item {
                    Ok(event) if wanted(&event) => return Some(event),
                    Ok(event) => seen.push(format!("{event:?}")),
                    Err(error) => seen.push(format!("error: {error}")),
                }
            }
            None
        })
        .await
        .map_err(|Failure(why)| Failure(format!("{why}; the observer saw {seen:?}")))?;
    found.ok_or_else(|| Failure(format!("{what}: the observer's stream ended")))
}

/// A campaign of `client`'s running as a task of its own.
fn spawn_campaign(
    client: &Arc<dyn DistributedLock>,
    name: &LockName,
    value: &'static [u8],
    options: LockOptions,
) -> tokio::task::JoinHandle<dlock_api::Result<dlock_api::Leadership>> {
    let (client, name) = (client.clone(), name.clone());
    tokio::spawn(async move { client.campaign(&name, value, &options).await })
}

fn leads(event: &LeaderEvent, term: FencingToken, value: &[u8]) -> bool {
    matches!(event, LeaderEvent::Leads(leader) if leader.term() == term && leader.value() == value)
}

/// Candidates on several clients campaign at once: never two leaders, every term above the
/// one before, and `leader` names the one leading (Curator `testWithLeaderLatch`, etcd
/// `TestElectionWait`).
pub async fn one_leader_at_a_time(ctx: Ctx) -> CaseResult {
    const CANDIDATES: u32 = 6;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(ctx.client().await?);
    }
    let name = ctx.name("election");
    let leading = Arc::new(AtomicU32::new(0));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CANDIDATES {
        let client = clients[(c as usize).checked_rem(clients.len()).unwrap_or(0)].clone();
        let observer = clients[0].clone();
        let (name, opts) = (name.clone(), waiting(&ctx));
        let (leading, terms) = (leading.clone(), terms.clone());
        tasks.spawn(async move {
            let value = format!("candidate-{c}");
            let leadership = client.campaign(&name, value.as_bytes(), &opts).await?;
            let at_once = leading.fetch_add(1, Ordering::SeqCst).saturating_add(1);
            terms
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(leadership.term());
            let said = observer.leader(&name).await?;
            tokio::time::sleep(Duration::from_millis(5)).await;
            leading.fetch_sub(1, Ordering::SeqCst);
            let term = leadership.term();
            leadership.resign().await?;
            Ok::<_, LockError>((at_once, term, value, said))
        });
    }
    for result in ctx
        .join_all("every candidate to lead and resign", tasks)
        .await?
    {
        let (at_once, term, value, said) = result?;
        ensure!(at_once == 1, "{at_once} candidates led at once");
        let said =
            said.ok_or_else(|| Failure(format!("leader() said nobody while {value} led")))?;
        ensure!(
            said.term() == term && said.value() == value.as_bytes(),
            "leader() said {said:?} while {value} led in term {}",
            term.get()
        );
    }
    let terms = terms.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms did not rise in the order candidates led: {terms:?}"
    );
    let after = clients[0].leader(&name).await?;
    ensure!(
        after.is_none(),
        "leader() after every resignation: {after:?}"
    );
    Ok(())
}

/// `leader` reads the value and term a leader published, follows its proclaims, and says
/// nobody after it resigns (etcd `TestElectionProclaim`).
pub async fn leader_follows_proclaims(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("election");
    ensure!(b.leader(&name).await?.is_none(), "a new name has a leader");
    let leadership = a.campaign(&name, b"first", &waiting(&ctx)).await?;
    let term = leadership.term();
    let said = b.leader(&name).await?;
    ensure!(
        said.as_ref()
            .is_some_and(|l| l.term() == term && l.value() == b"first"),
        "leader() said {said:?}, term {} published `first`",
        term.get()
    );
    leadership.proclaim(b"second").await?;
    ensure!(
        leadership.value() == b"second",
        "the guard kept its old value"
    );
    let said = b.leader(&name).await?;
    ensure!(
        said.as_ref()
            .is_some_and(|l| l.term() == term && l.value() == b"second"),
        "leader() after a proclaim said {said:?}"
    );
    leadership.resign().await?;
    let said = b.leader(&name).await?;
    ensure!(
        said.is_none(),
        "leader() after the resignation said {said:?}"
    );
    Ok(())
}

/// A resignation lets the next candidate in, with a higher term (Curator
/// `testLeaderLatchClose`, etcd `TestElectionFailover` without the crash).
pub async fn resign_hands_over(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("election");
    let first = a.campaign(&name, b"a", &waiting(&ctx)).await?;
    let next = spawn_campaign(&b, &name, b"b", waiting(&ctx));
    let first_term = first.term();
    // Queued behind the first, the second candidate must not lead while the first does.
    ctx.until_queued(&*a, &name).await?;
    ensure!(
        !next.is_finished(),
        "a second candidate led beside the first"
    );
    first.resign().await?;
    let second = ctx
        .within("the next candidate after the resignation", next)
        .await?
        .map_err(|e| Failure(format!("the candidate task panicked: {e}")))??;
    ensure!(
        second.term() > first_term,
        "term {} followed term {}",
        second.term().get(),
        first_term.get()
    );
    let said = a.leader(&name).await?;
    ensure!(
        said.as_ref().is_some_and(|l| l.value() == b"b"),
        "leader() after the hand-over said {said:?}"
    );
    second.resign().await?;
    Ok(())
}

/// A leader killed on the server (its connection, lease or session ended) hands over to the
/// waiting candidate by itself; the old leadership fires `lost` and its proclaim is refused
/// without touching the new leader's value (etcd `TestElectionSessionRecampaign`, Curator
/// `testSessionErrorPolicy`).
pub async fn crashed_leader_hands_over(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("election");
    let first = a.campaign(&name, b"a", &waiting(&ctx)).await?;
    let next = spawn_campaign(&b, &name, b"b", waiting(&ctx));
    ctx.require_faults()?
        .kill_holder(&name)
        .await
        .map_err(Failure)?;
    let second = ctx
        .within("the next candidate after the leader was killed", next)
        .await?
        .map_err(|e| Failure(format!("the candidate task panicked: {e}")))??;
    ctx.within("the killed leader's lost signal", first.lost())
        .await?;
    ensure!(!first.is_held(), "the killed leader still says it leads");
    let refused = first.proclaim(b"stale").await;
    ensure!(
        matches!(
            refused,
            Err(LockError::Lost { .. } | LockError::NotHeld { .. })
        ),
        "a deposed leader's proclaim returned {refused:?}"
    );
    let said = b.leader(&name).await?;
    ensure!(
        said.as_ref()
            .is_some_and(|l| l.term() == second.term() && l.value() == b"b"),
        "leader() after the crash said {said:?}"
    );
    second.resign().await?;
    let _ = first.resign().await;
    Ok(())
}

/// Work run with `with_leadership` is stopped when leadership is lost, and the call says so
/// (the spring-integration #2098 leader that kept working after losing its lock).
pub async fn with_leadership_stops_work_when_lost(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let name = ctx.name("election");
    let started = Arc::new(tokio::sync::Notify::new());
    let work = {
        let (client, name, opts, started) =
            (client.clone(), name.clone(), waiting(&ctx), started.clone());
        tokio::spawn(async move {
            client
                .with_leadership(&name, b"worker", &opts, |_ctx| async move {
                    started.notify_one();
                    std::future::pending::<()>().await;
                })
                .await
        })
    };
    ctx.within("the work to start", started.notified()).await?;
    ctx.require_faults()?
        .kill_holder(&name)
        .await
        .map_err(Failure)?;
    let ended = ctx
        .within("with_leadership after the leader was killed", work)
        .await?
        .map_err(|e| Failure(format!("the leader task panicked: {e}")))?;
    ensure!(
        matches!(ended, Err(LockError::Lost { .. })),
        "with_leadership returned {ended:?} after its leadership was lost"
    );
    Ok(())
}

/// Campaigns dropped while waiting, timed out, or cut off at once leave no candidate behind:
/// after the leader resigns, a new candidate leads at once and nobody else is reported
/// (etcd-io/etcd #21128).
pub async fn dropped_campaign_leaves_nothing(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("election");
    let leader = a.campaign(&name, b"a", &waiting(&ctx)).await?;
    let short = LockOptions::new().with_wait_timeout(Duration::from_millis(20));
    let timed_out = b.campaign(&name, b"late", &short).await;
    ensure!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "a campaign against a held name returned {timed_out:?}"
    );
    for delay_ms in [0u64, 1, 5, 20] {
        let _ = tokio::time::timeout(
            Duration::from_millis(delay_ms),
            b.campaign(&name, b"dropped", &waiting(&ctx)),
        )
        .await;
    }
    leader.resign().await?;
    let next = ctx
        .within(
            "a fresh campaign after the dropped ones",
            b.campaign(&name, b"next", &LockOptions::new()),
        )
        .await??;
    let said = a.leader(&name).await?;
    ensure!(
        said.as_ref().is_some_and(|l| l.value() == b"next"),
        "leader() said {said:?}; a dropped campaign may have been let in"
    );
    next.resign().await?;
    Ok(())
}

/// An observer sees the current state first, then every term in order, each proclaim, and each
/// resignation (etcd `TestElectionObserve`, which checks every leader in order).
pub async fn observe_sees_every_term(ctx: Ctx) -> CaseResult {
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(ctx.client().await?);
    }
    let name = ctx.name("election");
    let mut changes = clients[0].observe(&name).await?;
    next_matching(&ctx, "the first state, nobody leading", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await?;
    let mut last_term = FencingToken::new(0);
    for (i, client) in clients.iter().enumerate() {
        let value = format!("leader-{i}");
        let leadership = client
            .campaign(&name, value.as_bytes(), &waiting(&ctx))
            .await?;
        let term = leadership.term();
        ensure!(
            term > last_term,
            "term {} after {}",
            term.get(),
            last_term.get()
        );
        last_term = term;
        next_matching(
            &ctx,
            &format!("term {} of {value}", term.get()),
            &mut changes,
            |e| leads(e, term, value.as_bytes()),
        )
        .await?;
        let proclaimed = format!("{value}-again");
        leadership.proclaim(proclaimed.as_bytes()).await?;
        next_matching(&ctx, "the proclaimed value", &mut changes, |e| {
            leads(e, term, proclaimed.as_bytes())
        })
        .await?;
        leadership.resign().await?;
        next_matching(
            &ctx,
            "nobody leading after the resignation",
            &mut changes,
            |e| *e == LeaderEvent::Vacant,
        )
        .await?;
    }
    Ok(())
}

/// An observer of a leader that crashes sees the name fall vacant by itself, within the lease
/// or session, with nobody else calling anything (Curator `testKillSessionThenCloseShouldElectNewLeader`).
pub async fn observer_sees_a_crashed_leader_go(ctx: Ctx) -> CaseResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let name = ctx.name("election");
    let leadership = a.campaign(&name, b"doomed", &waiting(&ctx)).await?;
    let term = leadership.term();
    let mut changes = b.observe(&name).await?;
    next_matching(&ctx, "the leader before the crash", &mut changes, |e| {
        leads(e, term, b"doomed")
    })
    .await?;
    ctx.require_faults()?
        .kill_holder(&name)
        .await
        .map_err(Failure)?;
    next_matching(&ctx, "nobody leading after the crash", &mut changes, |e| {
        *e == LeaderEvent::Vacant
    })
    .await?;
    drop(leadership);
    Ok(())
}

/// A candidate whose session ends while it waits gets an error, never leadership, even when
/// the name falls free right after: the server dropped its place, so a leadership granted to it
/// then would rest on a place it no longer has (etcd-io/etcd #19597). A lock's waiter, by
/// contrast, joins the line again (`waiting::waiter_survives_killed_connection`).
pub async fn expired_candidate_never_leads(ctx: Ctx) -> CaseResult {
    let faults = ctx.require_faults()?;
    let (candidate, session) = faults.session_client().await.map_err(Failure)?;
    let other = ctx.client().await?;
    let name = ctx.name("election");
    let leader = other.campaign(&name, b"leader", &waiting(&ctx)).await?;
    let campaign = spawn_campaign(&candidate, &name, b"expired", waiting(&ctx));
    ctx.until_queued(&*other, &name).await?;
    session.expire().await.map_err(Failure)?;
    // Free for anyone who still has a place: the expired candidate has none.
    let leader_term = leader.term();
    leader.resign().await?;
    let outcome = ctx
        .within("the expired candidate's campaign", campaign)
        .await?
        .map_err(|e| Failure(format!("the candidate task panicked: {e}")))?;
    match outcome {
        Err(LockError::Lost { .. } | LockError::Unavailable { .. }) => {}
        Err(other) => {
            return Err(Failure(format!(
                "an expired candidate's campaign failed with {other:?}, not Lost"
            )));
        }
        Ok(leadership) => {
            let term = leadership.term();
            let _ = leadership.resign().await;
            return Err(Failure(format!(
                "a candidate whose session expired while it waited was told it leads (term {}, \
                 after term {})",
                term.get(),
                leader_term.get()
            )));
        }
    }
    let said = other.leader(&name).await?;
    ensure!(
        said.is_none(),
        "leader() after the candidate's session expired said {said:?}"
    );
    Ok(())
}

/// A leader whose session is suspended and comes back leads on, and no one else leads in
/// between: one leader across a reconnect, never two (CURATOR-696, CURATOR-620).
pub async fn reconnected_leader_stays_the_only_one(ctx: Ctx) -> CaseResult {
    let faults = ctx.require_faults()?;
    let (client, session) = faults.session_client().await.map_err(Failure)?;
    let other = ctx.client().await?;
    let name = ctx.name("election");
    let leadership = client.campaign(&name, b"suspended", &waiting(&ctx)).await?;
    session.suspend(ctx.timing().bound).await.map_err(Failure)?;
    ensure!(
        matches!(leadership.status(), LockStatus::Suspended { .. }),
        "a suspended leader's status: {:?}",
        leadership.status()
    );
    let rival = other
        .campaign(
            &name,
            b"rival",
            &LockOptions::new().with_wait_timeout(Duration::from_millis(50)),
        )
        .await;
    ensure!(
        matches!(rival, Err(LockError::Timeout { .. })),
        "a rival campaign while the leader was suspended returned {rival:?}"
    );
    session.resume().await.map_err(Failure)?;
    ensure!(
        matches!(leadership.status(), LockStatus::Held { .. }),
        "the leader's status after its session came back: {:?}",
        leadership.status()
    );
    let said = other.leader(&name).await?;
    ensure!(
        said.as_ref().is_some_and(|l| l.term() == leadership.term()),
        "leader() after the reconnect said {said:?}"
    );
    leadership.proclaim(b"back").await?;
    leadership.resign().await?;
    Ok(())
}

/// A value too long for every backend is refused before any network call.
pub async fn bad_values_refused(ctx: Ctx) -> CaseResult {
    let client = ctx.client().await?;
    let name = ctx.name("election");
    let long = vec![b'x'; MAX_LEADER_VALUE.saturating_add(1)];
    let refused = client.campaign(&name, &long, &LockOptions::new()).await;
    ensure!(
        matches!(refused, Err(LockError::InvalidArgument { .. })),
        "a campaign with a {} byte value returned {refused:?}",
        long.len()
    );
    let longest = vec![b'x'; MAX_LEADER_VALUE];
    let leadership = client.campaign(&name, &longest, &waiting(&ctx)).await?;
    let refused = leadership.proclaim(&long).await;
    ensure!(
        matches!(refused, Err(LockError::InvalidArgument { .. })),
        "a proclaim of {} bytes returned {refused:?}",
        long.len()
    );
    let said = client.leader(&name).await?;
    ensure!(
        said.as_ref()
            .is_some_and(|l| l.value().len() == MAX_LEADER_VALUE),
        "the longest value did not come back whole"
    );
    leadership.resign().await?;
    Ok(())
}
