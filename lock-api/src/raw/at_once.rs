//! A set of locks taken in one step of the server, where the backend has one: each grant turned
//! into its guard exactly as a single acquire's is, so options, tokens, renewal and metrics stay
//! the engine's.

use super::engine::{Client, Grant, RawLock};
use crate::error::Result;
use crate::multi::{AtOnce, complete};
use crate::name::LockName;
use crate::observability::{AcquireProbe, Op, Outcome};
use crate::options::LockOptions;

/// What [`RawLock::try_grant_at_once`] got from the server.
#[derive(Debug)]
#[non_exhaustive]
pub enum GrantedAtOnce {
    /// A grant for each name, in the names' order.
    Taken(Vec<Grant>),
    /// A name is held by someone else: nothing was taken.
    Busy,
    /// This backend (or this set: keys on different servers) has no one step: the names are
    /// taken one by one.
    OneByOne,
}

/// [`DistributedLock::try_acquire_at_once`](crate::DistributedLock::try_acquire_at_once) for a
/// [`RawLock`]: the options checked against the capabilities before any network call, then the
/// backend's one step.
///
/// # Errors
/// As [`try_acquire`](super::try_acquire).
///
/// # Cancel safety
/// As the backend's [`RawLock::try_grant_at_once`].
pub async fn try_acquire_at_once<B: RawLock + ?Sized>(
    backend: &B,
    names: &[LockName],
    options: &LockOptions,
) -> Result<AtOnce> {
    let client = Client::of(backend);
    client.check(options)?;
    let tag = client.backend;
    if options.is_shared() {
        return Ok(AtOnce::OneByOne);
    }
    match backend.try_grant_at_once(names, options).await {
        Ok(GrantedAtOnce::Taken(grants)) => {
            let guards = grants
                .into_iter()
                .map(|grant| {
                    let mut probe = AcquireProbe::start(tag, Op::TryAcquire, Some(grant.name()));
                    grant.into_guard(&client, options, &mut probe)
                })
                .collect::<Result<Vec<_>>>()?;
            complete(guards).await.map(AtOnce::Taken)
        }
        Ok(GrantedAtOnce::Busy) => {
            AcquireProbe::start(tag, Op::TryAcquire, None).finish(Outcome::Busy);
            Ok(AtOnce::Busy)
        }
        Ok(GrantedAtOnce::OneByOne) => Ok(AtOnce::OneByOne),
        Err(error) => {
            AcquireProbe::start(tag, Op::TryAcquire, None).failed(&error);
            Err(error)
        }
    }
}
