//! `dlock status`: who holds each name, with what token and lease left, and how many wait.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use dlock_api::{DistributedLock, Inspection, LeaseKind, LockError, LockName};

use crate::{BackendArgs, parse_duration};

/// The backends whose servers can answer `dlock status`, for the message of one that cannot.
const INSPECTING: &str = "memory, redis, redlock, mysql/mariadb, postgres and etcd";

/// Arguments of `dlock status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// Print JSON (one document per refresh, one line each) instead of a table.
    #[arg(long)]
    json: bool,
    /// Refresh until Ctrl-C (or --count refreshes).
    #[arg(long)]
    watch: bool,
    /// Time between refreshes with --watch.
    #[arg(long, value_parser = parse_duration, default_value = "1s", requires = "watch")]
    interval: Duration,
    /// Stop after this many refreshes with --watch.
    #[arg(long, requires = "watch")]
    count: Option<u64>,
    /// The names are semaphores of this many permits: show how many are held (`2/3`).
    #[arg(long)]
    permits: Option<u32>,
    /// The lock names.
    #[arg(required = true)]
    names: Vec<String>,
}

pub(super) async fn status(args: StatusArgs) -> Result<ExitCode, LockError> {
    let names = args
        .names
        .iter()
        .map(LockName::new)
        .collect::<Result<Vec<_>, _>>()?;
    if args.interval.is_zero() {
        return Err(LockError::invalid("interval", "must be above 0"));
    }
    args.backend.require_given("status")?;
    let permits = args.permits;
    let shown = dlock::redact(&args.backend.url()?);
    let locks = loop {
        match args.backend.connect().await {
            Ok(locks) => break locks,
            // A watch started while the backend is down waits for it, as it rides out an
            // outage once running; a bad URL or config is no outage.
            Err(error) if args.watch && error.is_retryable() => {
                eprintln!("dlock: {}; trying again", crate::error_chain(&error));
                tokio::select! {
                    () = tokio::time::sleep(args.interval) => {}
                    _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
                }
            }
            Err(error) => return Err(error),
        }
    };
    let mut out = std::io::stdout();
    let mut round: u64 = 0;
    loop {
        match report(&*locks, &shown, (&names, permits), args.json, &mut out).await {
            Ok(()) => {}
            Err(LockError::Unsupported {
                backend,
                operation: "semaphores",
            }) => {
                eprintln!("dlock: {backend} has no semaphores; --permits needs a backend that has");
                return Ok(ExitCode::from(64));
            }
            Err(LockError::Unsupported { backend, .. }) => {
                eprintln!(
                    "dlock: {backend} cannot tell who holds a lock (no holder inspection on this \
                     backend); dlock status works on {INSPECTING}"
                );
                return Ok(ExitCode::from(64));
            }
            // A watch rides out a server that stops answering for a while.
            Err(error) if args.watch => eprintln!("dlock: {}", crate::error_chain(&error)),
            Err(error) => return Err(error),
        }
        round = round.saturating_add(1);
        if !args.watch || args.count.is_some_and(|count| round >= count) {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
        if !args.json {
            println!();
        }
    }
}

/// One name as the server showed it: its inspection and, for a semaphore, how many of how many
/// permits are held.
type Seen<'a> = (&'a LockName, Inspection, Option<(u32, u32)>);

/// Inspects every name (and counts the permits of each, when they are semaphores of `permits`),
/// then prints them together (a table, or one JSON line).
async fn report(
    locks: &dyn DistributedLock,
    shown: &str,
    (names, permits): (&[LockName], Option<u32>),
    json: bool,
    out: &mut impl Write,
) -> Result<(), LockError> {
    if permits == Some(0) {
        return Err(LockError::invalid(
            "permits",
            "a semaphore has at least one permit",
        ));
    }
    let mut seen = Vec::with_capacity(names.len());
    for name in names {
        let Some(of) = permits else {
            seen.push((name, locks.inspect(name).await?, None));
            continue;
        };
        let held = locks.count_permits(name).await?;
        let counted = || {
            if held > 0 {
                Inspection::held(None)
            } else {
                Inspection::free(None)
            }
        };
        // A semaphore's permits are counted even where no holder can be inspected, and where
        // the semaphore is apart from the name's lock (MySQL), the lock's inspection says
        // nothing of it.
        let state = if locks.capabilities().one_limit_per_name {
            match locks.inspect(name).await {
                Err(LockError::Unsupported { .. }) => counted(),
                inspected => inspected?,
            }
        } else {
            counted()
        };
        seen.push((name, state, Some((held, of))));
    }
    let session = locks.capabilities().lease == LeaseKind::Session;
    let at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    let written = if json {
        writeln!(out, "{}", to_json(shown, &at, session, &seen))
    } else {
        write!(out, "{}", to_table(shown, &at, session, &seen))
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| LockError::backend("dlock", e))
}

fn to_json(shown: &str, at: &str, session: bool, seen: &[Seen<'_>]) -> String {
    let locks: Vec<serde_json::Value> = seen
        .iter()
        .map(|(name, state, permits)| {
            let mut lock = serde_json::json!({
                "name": name.as_str(),
                "held": state.held,
                "token": state.token.map(|t| t.get()),
                "remaining_ms": state.remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                "waiters": state.waiters,
                "holder": state.holder,
                "readers": state.readers,
                "waiting_readers": state.waiting_readers,
            });
            if let Some((held, of)) = permits {
                lock["permits"] = serde_json::json!({ "held": held, "of": of });
            }
            lock
        })
        .collect();
    serde_json::json!({
        "backend": shown,
        "at": at,
        "lease": if session { "session" } else { "ttl" },
        "locks": locks,
    })
    .to_string()
}

/// `free`, `held` (by a writer, or the one holder of a lock), or `read by N` while readers
/// share the name.
fn state_of(state: &Inspection) -> String {
    match state.readers {
        Some(readers) if state.held && readers > 0 => format!("read by {readers}"),
        _ if state.held => "held".to_owned(),
        _ => "free".to_owned(),
    }
}

/// A header line, then one aligned line per name: `-` where a free lock has nothing to show,
/// `unknown` where the backend cannot know, `session` for a lease without a TTL. Readers show in
/// the state (`read by 2`) and the waiters who wait to read beside their count (`3 (2 to
/// read)`). Semaphores get
/// a `PERMITS` column, `held/of`; a token, lease and holder are then those of one of the holders.
fn to_table(shown: &str, at: &str, session: bool, seen: &[Seen<'_>]) -> String {
    let semaphores = seen.iter().any(|(_, _, permits)| permits.is_some());
    let rows: Vec<Vec<String>> = seen
        .iter()
        .map(|(name, state, permits)| {
            let unknown = || "unknown".to_owned();
            let absent = |known: Option<String>| match (state.held, known) {
                (_, Some(text)) => text,
                (true, None) => unknown(),
                (false, None) => "-".to_owned(),
            };
            let lease = if session && state.held && state.remaining.is_none() {
                "session".to_owned()
            } else {
                absent(state.remaining.map(|d| format!("{:.3}s", d.as_secs_f64())))
            };
            let mut row = vec![name.to_string(), state_of(state)];
            if semaphores {
                row.push(permits.map_or_else(unknown, |(held, of)| format!("{held}/{of}")));
            }
            row.extend([
                absent(state.token.map(|t| t.to_string())),
                lease,
                state
                    .waiters
                    .map_or_else(unknown, |n| match state.waiting_readers {
                        Some(readers) if readers > 0 => format!("{n} ({readers} to read)"),
                        _ => n.to_string(),
                    }),
                absent(state.holder.clone()),
            ]);
            row
        })
        .collect();
    let mut header = vec!["NAME", "STATE"];
    if semaphores {
        header.push("PERMITS");
    }
    header.extend(["TOKEN", "LEASE LEFT", "WAITERS", "HOLDER"]);
    let header: Vec<String> = header.into_iter().map(String::from).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = format!("dlock status: {shown} at {at}\n");
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, &width)| format!("{cell:<width$}"))
            .collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_api::{FencingToken, LockGuard, LockOptions, MemoryLock};

    fn name(text: &str) -> LockName {
        LockName::new(text).unwrap()
    }

    #[test]
    fn the_table_says_unknown_only_for_what_the_backend_cannot_know() {
        let (a, b, c) = (name("a"), name("coupon:42"), name("c"));
        let seen = [
            (&a, Inspection::free(Some(0)), None),
            (
                &b,
                Inspection::held(Some(FencingToken::new(17)))
                    .with_remaining(Duration::from_millis(8_250))
                    .with_waiters(2)
                    .with_holder("abc"),
                None,
            ),
            (&c, Inspection::held(None), None),
        ];
        let table = to_table("redis://:***@h:1", "now", false, &seen);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "dlock status: redis://:***@h:1 at now");
        let cells = |line: &str| {
            line.split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(cells(lines[2]), ["a", "free", "-", "-", "0", "-"]);
        assert_eq!(
            cells(lines[3]),
            ["coupon:42", "held", "17", "8.250s", "2", "abc"]
        );
        assert_eq!(
            cells(lines[4]),
            ["c", "held", "unknown", "unknown", "unknown", "unknown"]
        );
        let session = to_table("pg", "now", true, &seen[2..]);
        assert!(
            session.lines().nth(2).unwrap().contains(" session "),
            "{session}"
        );
    }

    #[test]
    fn the_table_shows_readers_and_the_waiters_who_wait_to_read() {
        let (shared, written) = (name("config"), name("schema"));
        let seen = [
            (
                &shared,
                Inspection::held(Some(FencingToken::new(9)))
                    .with_waiters(1)
                    .with_readers(2, 0),
                None,
            ),
            (
                &written,
                Inspection::held(Some(FencingToken::new(4)))
                    .with_waiters(3)
                    .with_readers(0, 2),
                None,
            ),
        ];
        let table = to_table("memory", "now", false, &seen);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[2].starts_with("config") && lines[2].contains(" read by 2 "),
            "{table}"
        );
        assert!(lines[2].contains(" 1 "), "{table}");
        assert!(
            lines[3].contains(" held ") && lines[3].contains(" 3 (2 to read) "),
            "{table}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&to_json("memory", "now", false, &seen)).unwrap();
        assert_eq!(json["locks"][0]["readers"], 2);
        assert_eq!(json["locks"][1]["waiting_readers"], 2);
    }

    /// A backend that keeps the trait's default `inspect`.
    #[derive(Debug)]
    struct Blind;

    impl std::fmt::Display for Blind {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("blind")
        }
    }

    #[async_trait::async_trait]
    impl DistributedLock for Blind {
        fn capabilities(&self) -> dlock_api::Capabilities {
            dlock_api::Capabilities::SESSION_LEASE
        }
        async fn try_acquire(
            &self,
            _: &LockName,
            _: &LockOptions,
        ) -> dlock_api::Result<Option<LockGuard>> {
            Ok(None)
        }
        async fn acquire(&self, name: &LockName, _: &LockOptions) -> dlock_api::Result<LockGuard> {
            Err(LockError::Timeout {
                name: name.to_string(),
                waited: Duration::ZERO,
            })
        }
    }

    #[tokio::test]
    async fn a_backend_that_cannot_inspect_says_so_before_printing() {
        let mut out = Vec::new();
        let error = report(&Blind, "blind://", (&[name("x")], None), false, &mut out)
            .await
            .unwrap_err();
        assert!(matches!(error, LockError::Unsupported { .. }), "{error}");
        assert!(out.is_empty());
    }

    #[tokio::test]
    async fn json_carries_every_field() {
        let locks = MemoryLock::new();
        let x = name("x");
        let guard = locks
            .try_acquire(&x, &LockOptions::new())
            .await
            .unwrap()
            .unwrap();
        let mut out = Vec::new();
        report(
            &locks,
            "memory://",
            (&[x.clone(), name("y")], None),
            true,
            &mut out,
        )
        .await
        .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(doc["backend"], "memory://");
        assert_eq!(doc["lease"], "ttl");
        assert_eq!(doc["locks"][0]["held"], true);
        assert_eq!(doc["locks"][0]["token"], guard.fencing_token().get());
        assert!(doc["locks"][0]["remaining_ms"].as_u64().unwrap() <= 30_000);
        assert_eq!(doc["locks"][1]["held"], false);
        assert_eq!(doc["locks"][1]["token"], serde_json::Value::Null);
        guard.release().await.unwrap();
    }

    /// With `--permits 3`, each name shows how many of its three permits are held, in the
    /// table and in JSON; a number the backend cannot keep is refused before any call.
    #[tokio::test]
    async fn semaphores_show_their_permits() {
        let locks = MemoryLock::new();
        let backups = name("backups");
        let opts = LockOptions::new();
        let first = locks.acquire_permit(&backups, 3, &opts).await.unwrap();
        let second = locks.acquire_permit(&backups, 3, &opts).await.unwrap();
        let mut out = Vec::new();
        let names = [backups.clone(), name("idle")];
        report(&locks, "memory://", (&names, Some(3)), false, &mut out)
            .await
            .unwrap();
        let table = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[1].starts_with("NAME") && lines[1].contains("PERMITS"),
            "{table}"
        );
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(cells[..3], ["backups", "held", "2/3"], "{table}");
        let cells: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(cells[..3], ["idle", "free", "0/3"], "{table}");
        let mut out = Vec::new();
        report(&locks, "memory://", (&names[..1], Some(3)), true, &mut out)
            .await
            .unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(doc["locks"][0]["permits"]["held"], 2);
        assert_eq!(doc["locks"][0]["permits"]["of"], 3);
        let zero = report(
            &locks,
            "memory://",
            (&names, Some(0)),
            false,
            &mut Vec::new(),
        )
        .await;
        assert!(
            matches!(zero, Err(LockError::InvalidArgument { .. })),
            "{zero:?}"
        );
        first.release().await.unwrap();
        second.release().await.unwrap();
    }
}
