//! The records' types, as plain data: what an attempt and a call did, the breaker's, the
//! server's and the relay's events, and the [`Recorder`] trait with its recorders. Below every
//! layer (the architecture chapter's plumbing), so that any layer, the server half and the
//! durable half report without naming the record layers. Users name them at
//! [`surely::record`](crate::record), which re-exports them.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::HeaderValue;
use tokio::time::Instant;

use crate::classify::{AttemptClass, Classification, DeliveryPhase};
use crate::error::Elapsed;
use crate::{Outcome, Semantics, StopReason};

mod breaker_event;
#[cfg(feature = "server")]
mod limit;
mod maintenance;
mod reconcile;
mod relay;
#[cfg(feature = "server")]
mod server;

#[cfg(feature = "opentelemetry")]
mod otel;
mod tracing_recorder;

pub use self::breaker_event::{BreakerEvent, BreakerEventKind, TransitionReason};
#[cfg(feature = "server")]
pub use self::limit::{LimitEvent, LimitEventKind, RefusalReason};
pub use self::maintenance::{MaintenanceOutcome, MaintenanceReport};
#[cfg(feature = "opentelemetry")]
pub use self::otel::OtelRecorder;
pub use self::reconcile::ReconcileReport;
pub use self::relay::{OutboxStats, RelayReport, RelayRound};
#[cfg(feature = "server")]
pub use self::server::{AbandonedVerdict, RecoveryVerdict, ServerEvent, ServerEventKind};
pub use self::tracing_recorder::TracingRecorder;
pub use crate::ids::{BusinessKey, CallId, Operation};

/// The key of a request, for its records: a [`BusinessKey`] extension, else the
/// `Idempotency-Key` header.
pub(crate) fn key_of<Req: crate::Envelope>(req: &Req) -> Option<BusinessKey> {
    if let Some(k) = req.extensions().and_then(|e| e.get::<BusinessKey>()) {
        return Some(k.clone());
    }
    let v = req.headers()?.get(crate::headers::IDEMPOTENCY_KEY)?;
    Some(BusinessKey::new(String::from_utf8_lossy(v.as_bytes())))
}

/// One attempt: what went out, how far it got, and what came back.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AttemptRecord {
    /// The logical call it belongs to, when a [`RecordCallLayer`](crate::record::RecordCallLayer) is outside.
    pub call: Option<CallId>,
    /// The business or idempotency key.
    pub key: Option<BusinessKey>,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// When the attempt started.
    pub started: Instant,
    /// When it ended.
    pub ended: Instant,
    /// The call's budget left when the attempt started; `None` without a deadline.
    pub deadline_left: Option<Duration>,
    /// How the attempt was classified; its phase says how far the request got.
    pub classification: Classification,
    /// The timeout that ended the attempt, if one did: where it fired, and which limit.
    pub timeout: Option<Elapsed>,
    /// Whether the attempt was dropped before it finished (its caller went away).
    pub cancelled: bool,
    /// Whether the attempt was a hedge: a copy of the request sent by the
    /// [hedge layer](crate::hedge) while an earlier attempt of the same call was still running.
    /// A hedge that lost the race is `cancelled`.
    pub hedge: bool,
    /// The downstream request id, from the configured response header.
    pub request_id: Option<HeaderValue>,
}

impl AttemptRecord {
    /// How long the attempt took.
    pub fn duration(&self) -> Duration {
        self.ended.saturating_duration_since(self.started)
    }

    /// How far the request got.
    pub fn phase(&self) -> DeliveryPhase {
        self.classification.phase()
    }

    /// The attempt's class.
    pub fn class(&self) -> AttemptClass {
        self.classification.class()
    }
}

/// One logical call: its attempts folded into an outcome, and why it stopped.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CallRecord {
    /// The call's id; its attempt records carry the same.
    pub call: CallId,
    /// The business or idempotency key.
    pub key: Option<BusinessKey>,
    /// The request's semantics.
    pub semantics: Semantics,
    /// When the call started.
    pub started: Instant,
    /// When it ended.
    pub ended: Instant,
    /// The budget left when the call started; `None` without a deadline.
    pub deadline_left: Option<Duration>,
    /// How many attempts were made (0 if the call was refused before any).
    pub attempts: u32,
    /// The call's outcome.
    pub outcome: Outcome,
    /// The last attempt's classification, if any attempt was made.
    pub last: Option<Classification>,
    /// Why the call stopped.
    pub stop: StopReason,
    /// The query that settled an unknown outcome, if a
    /// [resolver](crate::retry::Resolve) was asked; `outcome` is then its answer (unless it
    /// said "still unknown").
    pub resolution: Option<ResolutionRecord>,
    /// The retries the [retry layer](crate::retry) decided, in order: which attempt each one
    /// followed, how long it waited, and whether the server's pushback set the wait. Every
    /// attempt but the last was retried (or hedged); the last one's fate is [`stop`](Self::stop).
    pub retries: Vec<RetryRecord>,
    /// What the call did ([`Operation`]): an extension of the request, or its method and path.
    pub operation: Option<Operation>,
    /// Whether the answer was the server's stored result for the call's idempotency key
    /// (`idempotent-replayed: true`): an earlier call with the key took effect.
    pub replayed: bool,
}

/// A retry the retry layer decided after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryRecord {
    /// The attempt that was retried (1-based).
    pub after: u32,
    /// How long the retry waited before the next attempt.
    pub wait: Duration,
    /// Whether the server's pushback (`Retry-After`, `grpc-retry-pushback-ms`) set the wait,
    /// rather than the backoff.
    pub pushback: bool,
}

/// A resolver's query for a call whose outcome was unknown: what it answered, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResolutionRecord {
    /// What the query found: [`Succeeded`](Outcome::Succeeded) (the server did the work),
    /// [`Failed`](Outcome::Failed) (it did not), or still [`Unknown`](Outcome::Unknown).
    pub answer: Outcome,
    /// When the query started.
    pub started: Instant,
    /// When it answered.
    pub ended: Instant,
}

impl CallRecord {
    /// How long the call took.
    pub fn duration(&self) -> Duration {
        self.ended.saturating_duration_since(self.started)
    }
}

fn fmt_key(key: &Option<BusinessKey>) -> &str {
    key.as_ref().map_or("-", BusinessKey::as_str)
}

fn fmt_left(left: Option<Duration>) -> String {
    left.map_or_else(|| "none".to_owned(), |d| format!("{}ms", d.as_millis()))
}

/// A duration for a human: whole milliseconds, or microseconds below one.
fn fmt_took(d: Duration) -> String {
    if d < Duration::from_millis(1) {
        format!("{}µs", d.as_micros())
    } else {
        format!("{}ms", d.as_millis())
    }
}

impl fmt::Display for AttemptRecord {
    /// One readable line: `call-7 attempt 1 key=o-1 left=1500ms phase=sent class=maybe committed ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.call {
            Some(call) => write!(f, "{call} ")?,
            None => f.write_str("call-? ")?,
        }
        write!(
            f,
            "attempt {} key={} left={} took={} phase={} class={}",
            self.attempt,
            fmt_key(&self.key),
            fmt_left(self.deadline_left),
            fmt_took(self.duration()),
            self.phase().as_str(),
            self.class().as_str(),
        )?;
        if let Some(t) = &self.timeout {
            write!(f, " timeout=\"{t}\"")?;
        }
        if self.hedge {
            f.write_str(" hedge")?;
        }
        if self.cancelled {
            f.write_str(" cancelled")?;
        }
        if let Some(id) = self.request_id.as_ref().and_then(|v| v.to_str().ok()) {
            write!(f, " request-id={id}")?;
        }
        Ok(())
    }
}

impl fmt::Display for CallRecord {
    /// One readable line: `call-7 key=o-1 attempts=2 outcome=unknown stop=unknown took=...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} key={} semantics={:?} left={} attempts={} took={} outcome={} stop={}",
            self.call,
            fmt_key(&self.key),
            self.semantics,
            fmt_left(self.deadline_left),
            self.attempts,
            fmt_took(self.duration()),
            self.outcome.as_str(),
            self.stop.as_str(),
        )?;
        for (i, r) in self.retries.iter().enumerate() {
            let sep = if i == 0 { " retries=" } else { "," };
            let by = if r.pushback { "(pushback)" } else { "" };
            write!(f, "{sep}{}+{}{by}", r.after, fmt_took(r.wait))?;
        }
        if let Some(q) = &self.resolution {
            write!(
                f,
                " resolved={} query-took={}",
                q.answer.as_str(),
                fmt_took(q.ended.saturating_duration_since(q.started))
            )?;
        }
        Ok(())
    }
}

/// A record, as a closure [`Recorder`] receives it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Record<'a> {
    /// An attempt ended.
    Attempt(&'a AttemptRecord),
    /// A call ended.
    Call(&'a CallRecord),
    /// A circuit breaker changed state or refused a call.
    Breaker(&'a BreakerEvent),
    /// An outbox relay's round, or its outbox's stats.
    Relay(&'a RelayReport),
    /// Reconciliation's open differences, after a pass.
    Reconcile(&'a ReconcileReport),
    /// A maintenance task's round of one chore.
    Maintenance(&'a MaintenanceReport),
    #[cfg(feature = "server")]
    /// An event of the server idempotency layer.
    Server(&'a ServerEvent),
    #[cfg(feature = "server")]
    /// An event of a server's adaptive concurrency limit.
    Limit(&'a LimitEvent),
}

/// Where records go.
///
/// Shaped like tower-http's `on_failure` hooks: a no-op for `()`, a blanket impl for closures
/// `Fn(Record<'_>)`, and named recorders ([`TracingRecorder`], [`InMemoryRecorder`]).
///
/// ```
/// use surely::record::{Record, RecordCallLayer};
///
/// let layer = RecordCallLayer::new(|record: Record<'_>| {
///     if let Record::Call(call) = record {
///         println!("{call}");
///     }
/// });
/// # let _ = layer;
/// ```
pub trait Recorder {
    /// Whether records are wanted at all. When false, the record layers skip all work, clock
    /// reads included.
    fn enabled(&self) -> bool {
        true
    }

    /// A span for a call, entered while the call runs. The default is none.
    fn call_span(
        &self,
        call: CallId,
        key: Option<&BusinessKey>,
        semantics: Semantics,
    ) -> tracing::Span {
        let _ = (call, key, semantics);
        tracing::Span::none()
    }

    /// A span for an attempt, entered while the attempt runs. The default is none.
    fn attempt_span(&self, call: Option<CallId>, attempt: u32) -> tracing::Span {
        let _ = (call, attempt);
        tracing::Span::none()
    }

    /// An attempt ended. Called inside the attempt's span.
    fn record_attempt(&self, record: &AttemptRecord);

    /// A call ended. Called inside the call's span.
    fn record_call(&self, record: &CallRecord);

    /// A [circuit breaker](crate::breaker) changed state or refused a call. The default
    /// ignores it.
    fn record_breaker(&self, event: &BreakerEvent) {
        let _ = event;
    }

    /// An [outbox relay][crate::outbox::Relay] ran a round that claimed events, or read its
    /// outbox's stats (backlog, oldest waiting event, quarantined events). The default ignores
    /// it.
    #[cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::outbox::Relay",
        )
    )]
    fn record_relay(&self, report: &RelayReport) {
        let _ = report;
    }

    /// A [reconciler][crate::reconcile::Reconciler] finished a pass: the differences still
    /// open, by rule, the manual queue, and the oldest open one's age. The default ignores it.
    #[cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::reconcile::Reconciler",
        )
    )]
    fn record_reconcile(&self, report: &ReconcileReport) {
        let _ = report;
    }

    /// A [maintenance task][crate::maintenance::Maintenance] ran, or tried to run, one chore's
    /// round. The default ignores it.
    #[cfg_attr(
        not(any(feature = "server", feature = "durable")),
        doc = crate::docs::links::to_features!(
            "crate::maintenance::Maintenance",
        )
    )]
    fn record_maintenance(&self, report: &MaintenanceReport) {
        let _ = report;
    }

    #[cfg(feature = "server")]
    /// The server [idempotency layer](crate::server::idempotency) replayed a response, refused
    /// a duplicate or a reused key, took over a stuck record, or could not reach its store;
    /// or its stuck-record report ran (see [`ServerEventKind`]). The layer reports to the
    /// recorder given to its builder
    /// ([`IdempotencyLayerBuilder::recorder`](crate::server::idempotency::IdempotencyLayerBuilder::recorder)).
    /// The default ignores it.
    fn record_server(&self, event: &ServerEvent) {
        let _ = event;
    }

    #[cfg(feature = "server")]
    /// A server's [adaptive limit](crate::server::limit) refused a request, moved its limit, or
    /// was asked for a snapshot (see [`LimitEventKind`]). The layer reports to the recorder
    /// given to its builder
    /// ([`AdaptiveLimitLayerBuilder::recorder`](crate::server::limit::AdaptiveLimitLayerBuilder::recorder)).
    /// The default ignores it.
    fn record_limit(&self, event: &LimitEvent) {
        let _ = event;
    }
}

impl Recorder for () {
    #[inline(always)]
    fn enabled(&self) -> bool {
        false
    }

    fn record_attempt(&self, _: &AttemptRecord) {}

    fn record_call(&self, _: &CallRecord) {}
}

impl<F> Recorder for F
where
    F: Fn(Record<'_>),
{
    fn record_attempt(&self, record: &AttemptRecord) {
        self(Record::Attempt(record))
    }

    fn record_call(&self, record: &CallRecord) {
        self(Record::Call(record))
    }

    fn record_breaker(&self, event: &BreakerEvent) {
        self(Record::Breaker(event))
    }

    fn record_relay(&self, report: &RelayReport) {
        self(Record::Relay(report))
    }

    fn record_reconcile(&self, report: &ReconcileReport) {
        self(Record::Reconcile(report))
    }

    fn record_maintenance(&self, report: &MaintenanceReport) {
        self(Record::Maintenance(report))
    }

    #[cfg(feature = "server")]
    fn record_server(&self, event: &ServerEvent) {
        self(Record::Server(event))
    }

    #[cfg(feature = "server")]
    fn record_limit(&self, event: &LimitEvent) {
        self(Record::Limit(event))
    }
}

/// Both recorders get every record: `(TracingRecorder::default(), ledger_recorder)`. Spans
/// are the first one's.
impl<A: Recorder, B: Recorder> Recorder for (A, B) {
    fn enabled(&self) -> bool {
        self.0.enabled() || self.1.enabled()
    }

    fn call_span(
        &self,
        call: CallId,
        key: Option<&BusinessKey>,
        semantics: Semantics,
    ) -> tracing::Span {
        self.0.call_span(call, key, semantics)
    }

    fn attempt_span(&self, call: Option<CallId>, attempt: u32) -> tracing::Span {
        self.0.attempt_span(call, attempt)
    }

    fn record_attempt(&self, record: &AttemptRecord) {
        self.0.record_attempt(record);
        self.1.record_attempt(record);
    }

    fn record_call(&self, record: &CallRecord) {
        self.0.record_call(record);
        self.1.record_call(record);
    }

    fn record_breaker(&self, event: &BreakerEvent) {
        self.0.record_breaker(event);
        self.1.record_breaker(event);
    }

    fn record_relay(&self, report: &RelayReport) {
        self.0.record_relay(report);
        self.1.record_relay(report);
    }

    fn record_reconcile(&self, report: &ReconcileReport) {
        self.0.record_reconcile(report);
        self.1.record_reconcile(report);
    }

    fn record_maintenance(&self, report: &MaintenanceReport) {
        self.0.record_maintenance(report);
        self.1.record_maintenance(report);
    }

    #[cfg(feature = "server")]
    fn record_server(&self, event: &ServerEvent) {
        self.0.record_server(event);
        self.1.record_server(event);
    }

    #[cfg(feature = "server")]
    fn record_limit(&self, event: &LimitEvent) {
        self.0.record_limit(event);
        self.1.record_limit(event);
    }
}

/// Keeps the records in memory, for tests and demos. Clones share the same store.
///
/// # Memory
///
/// It keeps the newest [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY) records of each kind
/// (100 000 attempts, 100 000 calls, and so on); [`with_capacity`](Self::with_capacity) sets
/// another bound. A record past it drops the oldest of its kind.
///
/// ```
/// let recorder = surely::record::InMemoryRecorder::new();
/// assert!(recorder.attempts().is_empty());
/// ```
#[derive(Clone, Debug, Default)]
pub struct InMemoryRecorder {
    inner: Arc<Mutex<Store>>,
}

#[derive(Debug)]
struct Store {
    attempts: VecDeque<AttemptRecord>,
    calls: VecDeque<CallRecord>,
    breaker: VecDeque<BreakerEvent>,
    relay: VecDeque<RelayReport>,
    reconcile: VecDeque<ReconcileReport>,
    maintenance: VecDeque<MaintenanceReport>,
    #[cfg(feature = "server")]
    server: VecDeque<ServerEvent>,
    #[cfg(feature = "server")]
    limit: VecDeque<LimitEvent>,
    /// The most records of each kind it keeps.
    capacity: usize,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            attempts: VecDeque::new(),
            calls: VecDeque::new(),
            breaker: VecDeque::new(),
            relay: VecDeque::new(),
            reconcile: VecDeque::new(),
            maintenance: VecDeque::new(),
            #[cfg(feature = "server")]
            server: VecDeque::new(),
            #[cfg(feature = "server")]
            limit: VecDeque::new(),
            capacity: InMemoryRecorder::DEFAULT_CAPACITY,
        }
    }
}

/// Keeps `record` as the newest of `kept`, dropping the oldest past `capacity`.
fn keep<T>(kept: &mut VecDeque<T>, capacity: usize, record: T) {
    if kept.len() >= capacity {
        kept.pop_front();
    }
    kept.push_back(record);
}

impl InMemoryRecorder {
    /// The records of each kind a recorder keeps unless [`with_capacity`](Self::with_capacity)
    /// says otherwise.
    pub const DEFAULT_CAPACITY: usize = 100_000;

    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same recorder, keeping the newest `records` records of each kind (at least 1).
    /// Clones share the bound.
    ///
    /// ```
    /// let recorder = surely::record::InMemoryRecorder::new().with_capacity(1_000);
    /// assert_eq!(recorder.capacity(), 1_000);
    /// ```
    #[must_use]
    pub fn with_capacity(self, records: usize) -> Self {
        self.store().capacity = records.max(1);
        self
    }

    /// The most records of each kind it keeps ([`with_capacity`](Self::with_capacity)).
    pub fn capacity(&self) -> usize {
        self.store().capacity
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        // A panic elsewhere while holding the lock leaves the records readable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The attempt records so far, oldest first.
    pub fn attempts(&self) -> Vec<AttemptRecord> {
        self.store().attempts.iter().cloned().collect()
    }

    /// The call records so far, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.store().calls.iter().cloned().collect()
    }

    /// The attempt records of one call.
    pub fn attempts_of(&self, call: CallId) -> Vec<AttemptRecord> {
        self.store()
            .attempts
            .iter()
            .filter(|a| a.call == Some(call))
            .cloned()
            .collect()
    }

    /// The circuit breakers' events so far, oldest first.
    pub fn breaker_events(&self) -> Vec<BreakerEvent> {
        self.store().breaker.iter().cloned().collect()
    }

    /// The outbox relays' reports so far, oldest first.
    pub fn relay_reports(&self) -> Vec<RelayReport> {
        self.store().relay.iter().cloned().collect()
    }

    /// The reconcilers' reports so far, oldest first.
    pub fn reconcile_reports(&self) -> Vec<ReconcileReport> {
        self.store().reconcile.iter().cloned().collect()
    }

    /// The maintenance tasks' reports so far, oldest first.
    pub fn maintenance_reports(&self) -> Vec<MaintenanceReport> {
        self.store().maintenance.iter().cloned().collect()
    }

    #[cfg(feature = "server")]
    /// The server idempotency layers' events so far, oldest first.
    pub fn server_events(&self) -> Vec<ServerEvent> {
        self.store().server.iter().cloned().collect()
    }

    #[cfg(feature = "server")]
    /// The server adaptive limits' events so far, oldest first.
    pub fn limit_events(&self) -> Vec<LimitEvent> {
        self.store().limit.iter().cloned().collect()
    }

    /// Forgets every record.
    pub fn clear(&self) {
        let mut store = self.store();
        store.attempts.clear();
        store.calls.clear();
        store.breaker.clear();
        store.relay.clear();
        store.reconcile.clear();
        store.maintenance.clear();
        #[cfg(feature = "server")]
        store.server.clear();
        #[cfg(feature = "server")]
        store.limit.clear();
    }
}

impl Recorder for InMemoryRecorder {
    fn record_attempt(&self, record: &AttemptRecord) {
        let mut store = self.store();
        let capacity = store.capacity;
        keep(&mut store.attempts, capacity, record.clone());
    }

    fn record_call(&self, record: &CallRecord) {
        let mut store = self.store();
        let capacity = store.capacity;
        keep(&mut store.calls, capacity, record.clone());
    }

    fn record_breaker(&self, event: &BreakerEvent) {
        let mut store = self.store();
        let capacity = store.capacity;
        keep(&mut store.breaker, capacity, event.clone());
    }

    fn record_relay(&self, report: &RelayReport) {
        let mut store = self.store();
        let capacity = store.capacity;
        keep(&mut store.relay, capacity, *report);
    }

    fn record_reconcile(&self, report: &ReconcileReport) {
        let mut store = self.store();
        let capacity = store.capacity;
        keep(&mut store.reconcile, capacity, report.clone());
    }

    fn record_maintenance(&self, report: &MaintenanceReport) {
        let mut store = self.store();
        let capacity = store.capacity;
        keep(&mut store.maintenance, capacity, report.clone());
    }

    #[cfg(feature = "server")]
    fn record_server(&self, event: &ServerEvent) {
        let mut store = self.store();
        let capacity = store.capacity;
        keep(&mut store.server, capacity, event.clone());
    }

    #[cfg(feature = "server")]
    fn record_limit(&self, event: &LimitEvent) {
        let mut store = self.store();
        let capacity = store.capacity;
        keep(&mut store.limit, capacity, event.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A million reports into a recorder keeping 1 000 of each kind: it keeps the newest 1 000.
    #[test]
    fn a_million_records_keep_the_in_memory_recorder_at_its_capacity() {
        let recorder = InMemoryRecorder::new().with_capacity(1_000);
        for n in 0..1_000_000 {
            let round = RelayRound {
                published: n,
                ..RelayRound::default()
            };
            let report = RelayReport {
                round: Some(round),
                stats: None,
            };
            recorder.record_relay(&report);
        }
        let published = |r: &RelayReport| r.round.map(|r| r.published);
        let kept = recorder.relay_reports();
        assert_eq!(kept.len(), 1_000);
        assert_eq!(published(&kept[0]), Some(999_000));
        assert_eq!(published(&kept[999]), Some(999_999));
    }
}
