//! The spans and events the engine reports (`dlock_api::observability`), read back through a
//! capturing `tracing` layer on the memory backend: the fields a subscriber sees are the
//! documented ones, with the right values.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_api::{DistributedLockExt, LockError, LockOptions, MemoryLock, Renewal};
use futures::FutureExt;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span's or event's fields as text, plus `span` (the span's name) or `message`.
type Fields = BTreeMap<String, String>;

struct FieldVisitor<'a>(&'a mut Fields);

impl Visit for FieldVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

/// Keeps every closed span and every event, with their fields.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Fields>>>,
    events: Arc<Mutex<Vec<Fields>>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        fields.insert("span".into(), attrs.metadata().name().into());
        attrs.record(&mut FieldVisitor(&mut fields));
        ctx.span(id)
            .expect("new span")
            .extensions_mut()
            .insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("recorded span");
        let mut extensions = span.extensions_mut();
        let fields = extensions.get_mut::<Fields>().expect("fields kept");
        values.record(&mut FieldVisitor(fields));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).expect("closed span");
        if let Some(fields) = span.extensions_mut().remove::<Fields>() {
            self.spans.lock().unwrap().push(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        fields.insert("level".into(), event.metadata().level().to_string());
        event.record(&mut FieldVisitor(&mut fields));
        self.events.lock().unwrap().push(fields);
    }
}

impl Capture {
    /// Captures what this thread reports (a current-thread runtime runs every task here) until
    /// the returned guard is dropped.
    fn install() -> (Self, tracing::subscriber::DefaultGuard) {
        let capture = Self::default();
        let subscriber = tracing_subscriber::registry().with(capture.clone());
        (capture, tracing::subscriber::set_default(subscriber))
    }

    fn acquire_spans(&self) -> Vec<Fields> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|s| s["span"] == "dlock.acquire")
            .cloned()
            .collect()
    }

    fn events_with(&self, message_start: &str) -> Vec<Fields> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .filter(|e| {
                e.get("message")
                    .is_some_and(|m| m.starts_with(message_start))
            })
            .cloned()
            .collect()
    }
}

fn field<'a>(fields: &'a Fields, name: &str) -> &'a str {
    fields
        .get(name)
        .unwrap_or_else(|| panic!("no field `{name}` in {fields:?}"))
}

fn opts() -> LockOptions {
    LockOptions::new().with_wait_timeout(Duration::from_secs(1))
}

#[tokio::test(start_paused = true)]
async fn acquire_span_carries_backend_name_outcome_token_and_wait() {
    let (capture, _installed) = Capture::install();
    let locks = MemoryLock::new();

    let guard = locks.acquire_str("span:a", &opts()).await.unwrap();
    let token = guard.fencing_token().get().to_string();
    let busy = locks.try_acquire_str("span:a", &opts()).await.unwrap();
    assert!(busy.is_none());
    let timed_out = locks.acquire_str("span:a", &opts()).await.unwrap_err();
    assert!(matches!(timed_out, LockError::Timeout { .. }));
    guard.release().await.unwrap();
    let again = locks.try_acquire_str("span:a", &opts()).await.unwrap();
    let again_token = again.as_ref().unwrap().fencing_token().get().to_string();
    again.unwrap().release().await.unwrap();

    let spans = capture.acquire_spans();
    assert_eq!(spans.len(), 4, "one span per call: {spans:?}");
    for span in &spans {
        assert_eq!(field(span, "backend"), "memory");
        assert_eq!(field(span, "name"), "span:a");
    }

    let acquired = &spans[0];
    assert_eq!(field(acquired, "op"), "acquire");
    assert_eq!(field(acquired, "outcome"), "acquired");
    assert_eq!(field(acquired, "token"), token);
    assert!(field(acquired, "wait_ms").parse::<f64>().unwrap() >= 0.0);

    let busy = &spans[1];
    assert_eq!(field(busy, "op"), "try_acquire");
    assert_eq!(field(busy, "outcome"), "busy");
    assert!(!busy.contains_key("token"), "no token without a grant");

    let timeout = &spans[2];
    assert_eq!(field(timeout, "op"), "acquire");
    assert_eq!(field(timeout, "outcome"), "timeout");
    assert!(field(timeout, "wait_ms").parse::<f64>().unwrap() >= 1000.0);
    assert!(field(timeout, "error").contains("span:a"));

    let granted_try = &spans[3];
    assert_eq!(field(granted_try, "outcome"), "acquired");
    assert_eq!(field(granted_try, "token"), again_token);
}

#[tokio::test(start_paused = true)]
async fn refused_options_and_dropped_acquires_have_their_outcome() {
    let (capture, _installed) = Capture::install();
    let locks = MemoryLock::new();
    let holder = locks.acquire_str("span:b", &opts()).await.unwrap();

    let refused = locks
        .acquire_str("span:b", &LockOptions::new().with_ttl(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(refused, LockError::InvalidArgument { .. }));

    // Polled once (queued behind the holder), then dropped.
    let wait = opts();
    let mut waiting = Box::pin(locks.acquire_str("span:b", &wait));
    assert!((&mut waiting).now_or_never().is_none());
    drop(waiting);
    holder.release().await.unwrap();

    let spans = capture.acquire_spans();
    let outcomes: Vec<&str> = spans.iter().map(|s| field(s, "outcome")).collect();
    assert_eq!(outcomes, ["acquired", "error", "cancelled"]);
    assert!(!spans[1].contains_key("wait_ms"), "refused before any wait");
    assert!(spans[1].contains_key("error"));
}

#[tokio::test(start_paused = true)]
async fn loss_renewal_and_suspension_events_carry_the_guards_fields() {
    let (capture, _installed) = Capture::install();
    let store = MemoryLock::new();

    // Evicted holder: lost with `session_closed`, reported with its name and token.
    let evicted = store.acquire_str("span:lost", &opts()).await.unwrap();
    assert!(store.evict(&dlock_api::LockName::new("span:lost").unwrap()));
    let lost = capture.events_with("lock lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(field(&lost[0], "backend"), "memory");
    assert_eq!(field(&lost[0], "name"), "span:lost");
    assert_eq!(field(&lost[0], "reason"), "session_closed");
    assert_eq!(
        field(&lost[0], "token"),
        evicted.fencing_token().get().to_string()
    );
    assert_eq!(field(&lost[0], "level"), "WARN");
    let _ = evicted.release().await;

    // A client cut off from its store: the watchdog's renewals fail, retry, and the lock is lost.
    let client = store.client();
    let ttl = Duration::from_secs(3);
    let renewing = client
        .acquire_str(
            "span:renew",
            &opts().with_ttl(ttl).with_renewal(Renewal::auto()),
        )
        .await
        .unwrap();
    client.cut_off();
    tokio::time::sleep(ttl * 2).await;
    assert!(!renewing.is_held());
    let failures = capture.events_with("renewal failed");
    assert!(failures.len() >= 2, "retried, then gave up: {failures:?}");
    assert!(failures.iter().all(|e| field(e, "name") == "span:renew"
        && field(e, "backend") == "memory"
        && field(e, "outcome") == "failed"));
    assert_eq!(field(failures.last().unwrap(), "retrying"), "false");
    assert_eq!(field(&failures[0], "retrying"), "true");
    let lost = capture.events_with("lock lost");
    assert_eq!(field(lost.last().unwrap(), "reason"), "renewal_failed");
    client.reconnect();
    let _ = renewing.release().await;

    // A suspended session and its return: one event each, for the session, not per guard.
    let session = store.client();
    let first = session.acquire_str("span:s1", &opts()).await.unwrap();
    let second = session.acquire_str("span:s2", &opts()).await.unwrap();
    session.suspend_session(Duration::from_secs(10));
    session.suspend_session(Duration::from_secs(10));
    session.resume_session();
    let suspended = capture.events_with("session suspended");
    assert_eq!(suspended.len(), 1, "{suspended:?}");
    assert_eq!(field(&suspended[0], "backend"), "memory");
    assert_eq!(field(&suspended[0], "until_ms"), "10000");
    let resumed = capture.events_with("session resumed");
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    first.release().await.unwrap();
    second.release().await.unwrap();
}
