//! `dlock leader` and `dlock observe`: who leads an election, once or as it changes.

use std::io::Write;

use dlock_api::{Leader, LeaderEvent, LockError, LockName};
use futures::StreamExt;

use crate::BackendArgs;

/// Arguments of `dlock leader`.
#[derive(Debug, clap::Args)]
pub struct LeaderArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// One JSON object: `{"name": …, "leader": {"term": …, "value": …} | null}`.
    #[arg(long)]
    json: bool,
    /// The election's name.
    name: String,
}

/// Arguments of `dlock observe`.
#[derive(Debug, clap::Args)]
pub struct ObserveArgs {
    #[command(flatten)]
    backend: BackendArgs,
    /// One JSON object per line: `{"name": …, "event": "leads" | "vacant" | "missed", "term": …,
    /// "value": …}`.
    #[arg(long)]
    json: bool,
    /// The election's name.
    name: String,
}

pub(super) async fn leader(args: LeaderArgs) -> Result<(), LockError> {
    let name = LockName::new(&args.name)?;
    args.backend.require_given("leader")?;
    let locks = args.backend.connect().await?;
    let leader = locks.leader(&name).await?;
    let line = if args.json {
        serde_json::json!({ "name": name.as_str(), "leader": leader.as_ref().map(leader_json) })
            .to_string()
    } else {
        match &leader {
            Some(leader) => format!("{name}: {leader}"),
            None => format!("{name}: no leader"),
        }
    };
    write_line(&line)
}

pub(super) async fn observe(args: ObserveArgs) -> Result<(), LockError> {
    let name = LockName::new(&args.name)?;
    args.backend.require_given("observe")?;
    let locks = args.backend.connect().await?;
    let mut changes = locks.observe(&name).await?;
    loop {
        let item = tokio::select! {
            item = changes.next() => item,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let Some(item) = item else { return Ok(()) };
        let line = match item {
            Ok(event) => event_line(&name, &event, args.json),
            Err(error) => {
                eprintln!(
                    "dlock: observing `{name}`: {}; reconnecting",
                    crate::error_chain(&error)
                );
                continue;
            }
        };
        write_line(&line)?;
    }
}

fn event_line(name: &LockName, event: &LeaderEvent, json: bool) -> String {
    match (event, json) {
        (LeaderEvent::Leads(leader), false) => format!("{name}: {leader}"),
        (LeaderEvent::Vacant, false) => format!("{name}: no leader"),
        (LeaderEvent::Missed, false) => format!("{name}: changes may have been missed"),
        (LeaderEvent::Leads(leader), true) => {
            let mut line = leader_json(leader);
            line["name"] = name.as_str().into();
            line["event"] = "leads".into();
            line.to_string()
        }
        (other, true) => {
            let event = if *other == LeaderEvent::Vacant {
                "vacant"
            } else {
                "missed"
            };
            serde_json::json!({ "name": name.as_str(), "event": event }).to_string()
        }
        (_, false) => format!("{name}: {event:?}"),
    }
}

fn leader_json(leader: &Leader) -> serde_json::Value {
    let value = match leader.value_str() {
        Some(text) => serde_json::Value::from(text),
        None => serde_json::Value::from(leader.value().to_vec()),
    };
    serde_json::json!({ "term": leader.term().get(), "value": value })
}

/// One line to stdout, flushed (an observer's reader acts on each line as it comes); a closed
/// pipe ends the command quietly.
fn write_line(line: &str) -> Result<(), LockError> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(error) => Err(LockError::invalid("stdout", error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use dlock_api::FencingToken;

    use super::*;

    #[test]
    fn json_lines_carry_the_event() {
        let name = LockName::new("scheduler").unwrap();
        let leads = LeaderEvent::Leads(Leader::new(FencingToken::new(7), "host-a:1"));
        let doc: serde_json::Value =
            serde_json::from_str(&event_line(&name, &leads, true)).unwrap();
        assert_eq!(doc["event"], "leads");
        assert_eq!(doc["term"], 7);
        assert_eq!(doc["value"], "host-a:1");
        assert_eq!(doc["name"], "scheduler");
        let doc: serde_json::Value =
            serde_json::from_str(&event_line(&name, &LeaderEvent::Vacant, true)).unwrap();
        assert_eq!(doc["event"], "vacant");
        assert_eq!(
            event_line(&name, &leads, false),
            "scheduler: term 7: host-a:1"
        );
    }
}
