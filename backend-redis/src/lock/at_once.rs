//! A set of locks in one script (`scripts/set.rs`), or none: on a single node and behind
//! Sentinels always, on a Cluster when every member's keys share one hash slot (each name is its
//! own hash tag, so only names whose tags happen to hash alike); else the names go one by one.

use std::sync::Arc;

use dlock_api::raw::{GrantedAtOnce, PendingAcquire};
use dlock_api::{LockError, LockName, LockOptions, Result};
use redis::cluster_routing::Slot;
use tokio::time::Instant;

use super::{Held, LOCK, RedisLock, owner_token, ttl_ms};
use crate::BACKEND;
use crate::keys::LockKeys;
use crate::lease::{Hold, RedisLease, lease_end};

/// One member of the set: its name, keys and owner value.
struct Member<'a> {
    name: &'a LockName,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
}

impl RedisLock {
    /// [`RawLock::try_grant_at_once`](dlock_api::raw::RawLock::try_grant_at_once): one script
    /// for the whole set, each member's cleanup armed across it as a single lock's is.
    pub(super) async fn try_set_at_once(
        &self,
        names: &[LockName],
        options: &LockOptions,
    ) -> Result<GrantedAtOnce> {
        let members: Vec<Member<'_>> = names
            .iter()
            .map(|name| Member {
                name,
                keys: Arc::new(self.keys(name)),
                owner: owner_token(),
            })
            .collect();
        if self.inner.conn.is_cluster() && !one_slot(&members) {
            return Ok(GrantedAtOnce::OneByOne);
        }
        let ttl_ms = ttl_ms(options);
        let key_names: Vec<&str> = members
            .iter()
            .flat_map(|m| [m.keys.lock.as_str(), m.keys.fence.as_str()])
            .collect();
        let mut args: Vec<&str> = Vec::with_capacity(members.len().saturating_add(1));
        args.push(&ttl_ms);
        args.extend(members.iter().map(|m| &*m.owner));
        let started = Instant::now();
        let pending: Vec<PendingAcquire> = members
            .iter()
            .map(|m| self.arm_cleanup(&m.keys, &m.owner, LOCK))
            .collect();
        let reply = self
            .inner
            .conn
            .run_script(
                self.inner.config.command_timeout,
                &self.inner.scripts.acquire_set,
                &key_names,
                &args,
            )
            .await;
        let reply: redis::Value = match reply {
            Ok(reply) => reply,
            Err(error) => {
                // The script may have run, or may still run, without our knowing.
                for (member, pending) in members.iter().zip(pending) {
                    pending.disarm();
                    RedisLease::spawn_cleanup_of_lost_reply(
                        self.inner.clone(),
                        member.keys.clone(),
                        member.owner.clone(),
                        LOCK,
                        options.ttl(),
                    );
                }
                return Err(error);
            }
        };
        let tokens = match reply {
            redis::Value::Array(tokens) if tokens.len() == members.len() => tokens,
            other => {
                pending.into_iter().for_each(PendingAcquire::disarm);
                return match other {
                    redis::Value::Int(0) => Ok(GrantedAtOnce::Busy),
                    redis::Value::Nil => Ok(GrantedAtOnce::OneByOne),
                    reply => Err(LockError::backend(
                        BACKEND,
                        format!("unexpected set acquire reply {reply:?}"),
                    )),
                };
            }
        };
        // Until every grant is built, the armed cleanups still release the whole set.
        if self.inner.config.wait_replicas > 0 {
            self.wait_for_replicas().await?;
        }
        let valid_until = lease_end(started, options.ttl());
        let mut grants = Vec::with_capacity(members.len());
        for ((member, pending), token) in members.iter().zip(pending).zip(tokens) {
            let redis::Value::Int(token) = token else {
                return Err(LockError::backend(
                    BACKEND,
                    format!("unexpected token {token:?} in a set acquire reply"),
                ));
            };
            pending.disarm();
            grants.push(self.guard(
                member.name,
                &member.keys,
                &member.owner,
                Held {
                    token,
                    valid_until,
                    hold: Hold::Lock { uncontended: true },
                    record: None,
                },
            ));
        }
        Ok(GrantedAtOnce::Taken(grants))
    }
}

/// Whether every member's keys live in one Cluster hash slot (each member's keys share its own).
fn one_slot(members: &[Member<'_>]) -> bool {
    let mut slots = members.iter().map(|m| Slot::for_key(&m.keys.lock));
    let first = slots.next();
    slots.all(|slot| Some(slot) == first)
}
