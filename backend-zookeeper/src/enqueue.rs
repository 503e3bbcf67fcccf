//! Joining a name's queue: the create of our ephemeral sequential node, counted in the same
//! round trip, found again by its marker when the answer is lost, and undone by an armed
//! cleanup when the acquire is dropped before its grant.

use std::sync::Arc;
use std::time::Duration;

use dlock_api::raw::{Claim, Detach, PendingAcquire};
use dlock_api::{LockError, Result};
use tokio::sync::oneshot;
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, MultiWriteResult};

use crate::config::NodeAcl;
use crate::error::{Fail, timed};
use crate::lease::delete_node;
use crate::names::protected_marker;
use crate::session::{Queued, ZkSession};

/// Our node in a name's queue.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) path: String,
    pub(crate) czxid: i64,
    pub(crate) version: i32,
    /// The campaign value its data carries (a candidate's node, `election::candidate_data`).
    pub(crate) leads_with: Option<Arc<[u8]>>,
}

impl Node {
    pub(crate) fn child_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }
}

/// What a create attempt left on the server, for the cleanup of a dropped acquire.
#[derive(Debug)]
enum Outcome {
    Created(Node),
    NotCreated,
    Unknown,
}

/// Puts a node of ours, queued for `claim`, in the queue under `parent`, with its
/// cleanup armed: the node, what its create told of the nodes ahead, and the cleanup, which
/// deletes the node unless disarmed once it is a guard's or deleted (also when the create's
/// answer was lost). A candidate's node (`leads_with` its campaign value) carries the value in
/// its data from its create, so it leads with it from the moment it heads the queue.
///
/// # Cancel safety
/// Cancel safe: dropped before it returns, the armed cleanup deletes whatever the create left.
pub(crate) async fn join_queue(
    acl: NodeAcl,
    session: &Arc<ZkSession>,
    parent: &str,
    (claim, leads_with): (Claim, Option<Arc<[u8]>>),
) -> Result<(Node, Ahead, PendingAcquire)> {
    let marker = protected_marker(claim);
    let queued = session.queue(&marker);
    let (pending, report) = arm(session, parent, &marker, queued);
    let (node, ahead) =
        enqueue_detached(acl, session, (parent, &marker), leads_with, report).await?;
    Ok((node, ahead, pending))
}

fn acls(acl: NodeAcl) -> Acls<'static> {
    match acl {
        NodeAcl::Open => Acls::anyone_all(),
        NodeAcl::Creator => Acls::creator_all(),
    }
}

/// Creates the name's node and the prefix above it as containers (the server removes a
/// container once its last child is gone, so nothing is left behind and no cleanup races a
/// new waiter).
async fn make_parents(
    acl: NodeAcl,
    client: &Client,
    parent: &str,
    timeout: Duration,
) -> Result<()> {
    let options = CreateMode::Container.with_acls(acls(acl));
    timed(timeout.saturating_mul(2), client.mkdir(parent, &options))
        .await
        .map_err(LockError::from)
}

/// Creates our node (`PARENT/MARKER<seq>`) and learns in the same round trip whether it is
/// alone: one transaction creates the node and writes the (empty) data of the name's node,
/// and the write answers with the name's node's stat after the create, whose child count
/// is exact. A lone node holds the lock with no listing at all. A create whose answer is
/// lost is looked up by its marker.
async fn enqueue(
    acl: NodeAcl,
    session: &ZkSession,
    (parent, marker): (&str, &str),
    data: &[u8],
) -> std::result::Result<(Node, Ahead), (LockError, Outcome)> {
    let mut client = session
        .client()
        .await
        .map_err(|e| (e, Outcome::NotCreated))?;
    let timeout = session.command_timeout;
    let path = format!("{parent}/{marker}");
    let options = CreateMode::EphemeralSequential.with_acls(acls(acl));
    let mut counted = true;
    let mut attempt: u32 = 0;
    loop {
        attempt = attempt.saturating_add(1);
        let sent = Instant::now();
        let created = if counted {
            timed(
                timeout,
                create_counted(&client, (&path, data), parent, &options),
            )
            .await
        } else {
            timed(timeout, client.create(&path, data, &options))
                .await
                .map(|(stat, sequence)| {
                    let created = format!("{path}{sequence}");
                    (created, stat.czxid, None)
                })
        };
        let fail = match created {
            Ok((created, czxid, children)) => {
                session.acked(sent);
                let node = Node {
                    path: created,
                    czxid,
                    version: 0,
                    leads_with: None,
                };
                let ahead = match children {
                    Some(1) => Ahead::Nobody,
                    _ => Ahead::Unknown,
                };
                return Ok((node, ahead));
            }
            Err(fail) if fail.is(&ZkError::NoNode) && attempt < 5 => {
                make_parents(acl, &client, parent, timeout)
                    .await
                    .map_err(|e| (e, Outcome::NotCreated))?;
                continue;
            }
            // The name's node was made by someone else, without letting us write to it:
            // create alone and list.
            Err(fail) if counted && fail.is(&ZkError::NoAuth) => {
                counted = false;
                continue;
            }
            Err(fail) => fail,
        };
        if !fail.outcome_unknown() {
            return Err((fail.into(), Outcome::NotCreated));
        }
        if fail.task_gone() && attempt < 5 {
            // The runtime whose task carried the create ended: attach again from this one,
            // then look for the node; if the create never landed, create it again.
            session.note(&fail).await;
            client = session.client().await.map_err(|e| (e, Outcome::Unknown))?;
            match find_own(&client, session, parent, marker).await {
                Ok(Some((node, children))) => return Ok((node, Ahead::Listed(children))),
                Ok(None) => continue,
                Err(_) => return Err((fail.into(), Outcome::Unknown)),
            }
        }
        // The create may have been applied: find it by its marker, as ours.
        return match find_own(&client, session, parent, marker).await {
            Ok(Some((node, children))) => Ok((node, Ahead::Listed(children))),
            Ok(None) | Err(_) => Err((fail.into(), Outcome::Unknown)),
        };
    }
}

/// What the create of our node told about the nodes ahead of it.
#[derive(Debug)]
pub(crate) enum Ahead {
    /// Our node is the name's only child: the lock (or a permit, whatever the limit) is ours.
    Nobody,
    /// The name's children, listed after our create.
    Listed(Vec<String>),
    /// Not known: list.
    Unknown,
}

/// Creates an ephemeral sequential node at `path` and, in the same transaction, writes empty
/// data to `parent`, whose answered stat counts its children just after the create. Gives the
/// node's path, its `czxid` (the transaction's zxid, which is also the parent's new
/// `mzxid`: the create's own stat is not filled in by every server version), and the count.
/// An operation's failure comes back as that operation's error.
async fn create_counted(
    client: &Client,
    (path, data): (&str, &[u8]),
    parent: &str,
    options: &zookeeper_client::CreateOptions<'_>,
) -> std::result::Result<(String, i64, Option<i32>), ZkError> {
    let mut writer = client.new_multi_writer();
    writer.add_create(path, data, options)?;
    writer.add_set_data(parent, &[], None)?;
    let results = writer.commit().await.map_err(ZkError::from)?;
    match results.as_slice() {
        [
            MultiWriteResult::Create { path: created, .. },
            MultiWriteResult::SetData { stat },
        ] => {
            if crate::names::sequence(created).is_none() {
                return Err(ZkError::UnexpectedError(
                    "a sequential create answered without a sequence".into(),
                ));
            }
            Ok((created.clone(), stat.mzxid, Some(stat.num_children)))
        }
        _ => Err(ZkError::UnexpectedError(
            "a create-and-count transaction answered out of shape".into(),
        )),
    }
}

/// Looks for the node a create with `marker` may have left: syncs the parent (so the server
/// answering has seen every write before), lists it, and takes the child with the marker only
/// if its ephemeral owner is this session (a node of another session with the same marker is
/// not ours, whatever its name says).
async fn find_own(
    client: &Client,
    session: &ZkSession,
    parent: &str,
    marker: &str,
) -> std::result::Result<Option<(Node, Vec<String>)>, Fail> {
    let timeout = session.command_timeout;
    let Some(children) = list_synced(client, parent, timeout).await? else {
        return Ok(None);
    };
    let Some(child) = children.iter().find(|c| c.starts_with(marker)) else {
        return Ok(None);
    };
    let path = format!("{parent}/{child}");
    let Some(stat) = timed(timeout, client.check_stat(&path)).await? else {
        return Ok(None);
    };
    if stat.ephemeral_owner != session.id {
        return Ok(None);
    }
    if crate::names::sequence(child).is_none() {
        return Ok(None);
    }
    let node = Node {
        path,
        czxid: stat.czxid,
        version: stat.version,
        leads_with: None,
    };
    Ok(Some((node, children)))
}

/// The children of `parent` after a `sync` sent with the listing (so the server answering has
/// seen every write before it), both within `timeout`; `None` if `parent` does not exist.
pub(crate) async fn list_synced(
    client: &Client,
    parent: &str,
    timeout: Duration,
) -> std::result::Result<Option<Vec<String>>, Fail> {
    let sync = client.sync(parent);
    let list = client.list_children(parent);
    let (_, listed) = tokio::time::timeout(timeout, futures::future::join(sync, list))
        .await
        .map_err(|_| Fail::TimedOut(timeout))?;
    match listed {
        Ok(children) => Ok(Some(children)),
        Err(ZkError::NoNode) => Ok(None),
        Err(error) => Err(Fail::Zk(error)),
    }
}

/// Arms the cleanup of one create attempt: if the acquire is dropped before its grant exists,
/// our node goes, also when the create's answer was lost. The create runs detached and reports
/// what it left through the returned sender, and the cleanup waits for that report, so its
/// delete always follows the create it undoes.
/// `queued` marks the acquire in progress for as long as the cleanup is armed.
fn arm(
    session: &Arc<ZkSession>,
    parent: &str,
    marker: &str,
    queued: Queued,
) -> (PendingAcquire, oneshot::Sender<Outcome>) {
    let (report, outcome) = oneshot::channel::<Outcome>();
    let (session, parent, marker) = (session.clone(), parent.to_owned(), marker.to_owned());
    let pending = PendingAcquire::arm(move || {
        drop(queued);
        dlock_api::raw::spawn_cleanup(async move {
            match outcome.await {
                Ok(Outcome::NotCreated) => {}
                Ok(Outcome::Created(node)) => {
                    let _ = delete_node(&session, &node.path, node.version).await;
                }
                Ok(Outcome::Unknown) | Err(_) => {
                    // The answer was lost: look for the node, and once more a little later in
                    // case the create lands after the first look.
                    for round in 0..2 {
                        if round > 0 {
                            tokio::time::sleep(session.command_timeout).await;
                        }
                        let Ok(client) = session.client().await else {
                            return;
                        };
                        if let Ok(Some((node, _))) =
                            find_own(&client, &session, &parent, &marker).await
                        {
                            let _ = delete_node(&session, &node.path, node.version).await;
                            return;
                        }
                    }
                }
            }
        });
    });
    (pending, report)
}

/// Runs [`enqueue`] detached (it finishes even if the acquire is dropped) and reports
/// what it left to the armed cleanup.
async fn enqueue_detached(
    acl: NodeAcl,
    session: &Arc<ZkSession>,
    (parent, marker): (&str, &str),
    leads_with: Option<Arc<[u8]>>,
    report: oneshot::Sender<Outcome>,
) -> std::result::Result<(Node, Ahead), LockError> {
    let (session, parent, marker) = (session.clone(), parent.to_owned(), marker.to_owned());
    Detach::new(async move {
        let data = match &leads_with {
            Some(value) => crate::election::candidate_data(value),
            None => Vec::new(),
        };
        match enqueue(acl, &session, (&parent, &marker), &data).await {
            Ok((mut node, ahead)) => {
                // Found again after a lost answer or created now, it is the node this data
                // was created with.
                node.leads_with = leads_with;
                let _ = report.send(Outcome::Created(node.clone()));
                Ok((node, ahead))
            }
            Err((error, outcome)) => {
                let _ = report.send(outcome);
                Err(error)
            }
        }
    })
    .await
}
