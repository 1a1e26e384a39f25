//! Metrics through the OpenTelemetry metrics API.

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter};
use opentelemetry::KeyValue;

use super::MaintenanceReport;
use super::{AttemptRecord, CallRecord, ReconcileReport, Recorder, RelayReport, StopReason};
use super::{BreakerEvent, BreakerEventKind};
#[cfg(feature = "server")]
use super::{LimitEvent, LimitEventKind, ServerEvent, ServerEventKind};
use crate::ids::OperationKind;

/// Bucket bounds of the call duration histogram, in seconds: those the OpenTelemetry HTTP
/// semantic conventions advise for `http.client.request.duration`, extended to 60 s because a
/// call with retries lasts up to its deadline (10 s by default, often more).
const DURATION_BOUNDS: [f64; 17] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 30.0,
    60.0,
];

/// Records to the [OpenTelemetry metrics API](opentelemetry::metrics): counters and a histogram
/// an operator can alert on, the rate of calls whose outcome is *unknown* first.
///
/// The instruments are made once, by [`new`](Self::new), from the [`Meter`] you give; every
/// record then adds to them with attributes whose values are static strings, so recording
/// allocates nothing beyond what the SDK does. Combine it with [`TracingRecorder`] as a pair,
/// `(TracingRecorder::new(), OtelRecorder::new(&meter))`, to get spans and logs as well.
///
/// # Why the OpenTelemetry API, and not the `metrics` facade
///
/// Both separate the code that records from the code that exports. The OpenTelemetry API is
/// the vendor-neutral standard: its data model (histograms with explicit buckets, units,
/// descriptions, typed attributes) is what the OTLP collector, Prometheus (natively or through
/// the collector) and every commercial backend read, and its semantic conventions give the
/// names that dashboards already know (`http.request.method`, `error.type`). The `metrics`
/// facade is smaller, but its exporters each define their own data model, and a service that
/// already runs an OpenTelemetry SDK for its traces would need a bridge to see surely's
/// numbers next to them. Behind the `opentelemetry` feature, the crate depends only on the API
/// crate (no SDK, no exporter): the application chooses those.
///
/// # Instruments
///
/// | name | kind, unit | attributes | from |
/// | --- | --- | --- | --- |
/// | `surely.client.call.duration` | histogram, `s` | `surely.outcome`, `surely.stop_reason`, `http.request.method` | each call |
/// | `surely.client.calls` | counter, `{call}` | the same | each call |
/// | `surely.client.attempts` | counter, `{attempt}` | `surely.class`, `surely.phase` | each attempt |
/// | `surely.client.retries` | counter, `{retry}` | `surely.retry.pushback`, `http.request.method` | each retry the retry layer decided |
/// | `surely.client.hedges` | counter, `{hedge}` | `surely.class`, `surely.hedge.won` | each hedge sent |
/// | `surely.client.budget.refusals` | counter, `{call}` | `http.request.method` | each call whose retry the budget refused |
/// | `surely.client.breaker.transitions` | counter, `{transition}` | `surely.breaker`, `surely.breaker.from`, `surely.breaker.to` | each state change |
/// | `surely.client.breaker.rejections` | counter, `{call}` | `surely.breaker`, `surely.breaker.state` | each refused call |
/// | `surely.client.breaker.state` | gauge, `1` | `surely.breaker`, `surely.breaker.state` | 1 for the state entered, 0 for the one left |
/// | `surely.server.idempotency.events` | counter, `{event}` | `surely.event`, `http.request.method` | each event of the server idempotency layer |
/// | `surely.server.idempotency.abandoned` | counter, `{record}` | `surely.verdict` | each abandoned record a [recovery round][crate::server::idempotency::IdempotencyLayer::recover_abandoned] took over: `completed`, `failed`, `unknown`, `released`, or left for the next round (`hook_panicked`, `hook_timed_out`, `store_failed`) |
/// | `surely.server.idempotency.stuck` | gauge, `{record}` | none | each stuck-record report: records still `PROCESSING` past its threshold |
/// | `surely.server.idempotency.stuck.oldest_age` | gauge, `s` | none | each stuck-record report: how long the oldest has been processing (0 without any) |
/// | `surely.server.limit.refused` | counter, `{request}` | `surely.refusal.reason`, `surely.criticality`, `surely.partition` (if any) | each request an [adaptive limit][crate::server::limit] refused |
/// | `surely.server.limit` | gauge, `{request}` | none | each event of an adaptive limit: its concurrency limit |
/// | `surely.server.limit.in_flight` | gauge, `{request}` | none | each event of an adaptive limit: requests admitted and not yet answered |
/// | `surely.outbox.relay.published` | counter, `{event}` | none | each relay round: events published and marked |
/// | `surely.outbox.relay.failed` | counter, `{event}` | none | each relay round: publishes that failed |
/// | `surely.outbox.relay.quarantined` | counter, `{event}` | none | each relay round: events quarantined |
/// | `surely.outbox.relay.stale` | counter, `{event}` | none | each relay round: events published whose mark came too late (sent more than once) |
/// | `surely.outbox.backlog` | gauge, `{event}` | none | each stats read: events waiting to be published |
/// | `surely.outbox.oldest_age` | gauge, `s` | none | each stats read: how long the oldest waiting event has waited (0 without any) |
/// | `surely.outbox.quarantine` | gauge, `{event}` | none | each stats read: events in quarantine |
/// | `surely.reconcile.open` | gauge, `{difference}` | `surely.rule` | each reconciliation pass: differences neither repaired nor resolved, per rule (0 for a rule seen before that has none left) |
/// | `surely.reconcile.manual` | gauge, `{difference}` | none | each reconciliation pass: differences in the manual queue |
/// | `surely.reconcile.oldest_age` | gauge, `s` | none | each reconciliation pass: how long the oldest open difference has been open (0 without any) |
///
/// The attribute values are the records' own names ([`Outcome::as_str`], [`StopReason::as_str`],
/// [`AttemptClass::as_str`], [`DeliveryPhase::as_str`], [`BreakerState::as_str`]), the same as
/// in [`TracingRecorder`]'s fields. `http.request.method` is set when the call's
/// [`Operation`](super::Operation) is an HTTP request, as the semantic conventions say: a known
/// method by its name, any other as `_OTHER`. `surely.breaker` is the breaker's name, or `-`.
///
/// The duration is the whole logical call, retries and their waits included, which is why it is
/// not named `http.client.request.duration` (one HTTP request each, in the conventions): an
/// attempt is that. A breaker's state gauge says nothing until its first state change; a
/// breaker reports to the recorder given to its own builder
/// ([`CircuitBreakerBuilder::recorder`](crate::breaker::CircuitBreakerBuilder::recorder)).
///
/// # The server side and the outbox
///
/// The server [idempotency layer][crate::server::idempotency] reports to the recorder given to
/// its builder
/// ([`IdempotencyLayerBuilder::recorder`][crate::server::idempotency::IdempotencyLayerBuilder::recorder]).
/// Its events share **one counter**,
/// `surely.server.idempotency.events`, whose `surely.event` attribute is the
/// [event's name][ServerEventKind::as_str]: `replayed`, `in_flight`, `key_mismatch`, `expired`,
/// `lease_takeover`, `released`, `store_unavailable`, `not_stored`, `stored_answer_differs`,
/// and the others of [`ServerEventKind::as_str`]. One instrument rather than
/// one per kind, because a dashboard reads them together: one query stacks them by
/// `surely.event`, the share of duplicates that came too early (`in_flight`) against those
/// that found the answer (`replayed`) is a ratio of two series of the same metric, and a kind
/// added later shows up on the existing panel instead of needing a new one. An alert picks its
/// kind by attribute (`surely_event="lease_takeover"` in Prometheus). The attributes are the
/// event's name and the method only: the tenant, the operation and the key are unbounded, and
/// go to [`TracingRecorder`] instead.
///
/// The stuck-record gauges come from
/// [`IdempotencyLayer::report_stuck`][crate::server::idempotency::IdempotencyLayer::report_stuck],
/// run on a schedule; they say nothing until its first run. Alert on
/// `surely.server.idempotency.stuck` above zero: a record held that long is an owner that
/// crashed or hangs.
///
/// An [outbox relay][crate::outbox::Relay] reports to the recorder given to its builder
/// ([`RelayBuilder::recorder`][crate::outbox::RelayBuilder::recorder]): the counters from each
/// round, the gauges from the outbox's stats when they are read. They carry no attribute: give
/// two relays in one process meters of their own to tell them apart. Alert on a rising
/// `surely.outbox.oldest_age`, and on `surely.outbox.quarantine` above zero.
///
/// ```
/// use surely::record::{OtelRecorder, TracingRecorder};
///
/// // The application's meter provider, installed with `opentelemetry::global::set_meter_provider`
/// // (without one, the global meter records nothing).
/// let meter = opentelemetry::global::meter("orders-service");
/// let recorder = (TracingRecorder::new(), OtelRecorder::new(&meter));
///
/// let transport = tower::service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::io::Error>(http::Response::new(String::from("created")))
/// });
/// let client = surely::client().recorder(recorder).build(transport).unwrap();
/// # let _ = client;
/// ```
///
/// [`TracingRecorder`]: super::TracingRecorder
/// [`Outcome::as_str`]: crate::Outcome::as_str
/// [`AttemptClass::as_str`]: crate::classify::AttemptClass::as_str
/// [`DeliveryPhase::as_str`]: crate::classify::DeliveryPhase::as_str
/// [`BreakerState::as_str`]: crate::breaker::BreakerState::as_str
#[cfg_attr(
    not(feature = "durable"),
    doc = crate::docs::links::to_features!(
        "crate::outbox::Relay",
        "crate::outbox::RelayBuilder::recorder",
    )
)]
#[cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::idempotency::IdempotencyLayer::recover_abandoned",
        "crate::server::limit",
        "crate::server::idempotency",
        "ServerEventKind::as_str",
        "crate::server::idempotency::IdempotencyLayer::report_stuck",
        "crate::server::idempotency::IdempotencyLayerBuilder::recorder",
    )
)]
#[derive(Clone, Debug)]
pub struct OtelRecorder {
    call_duration: Histogram<f64>,
    calls: Counter<u64>,
    attempts: Counter<u64>,
    retries: Counter<u64>,
    hedges: Counter<u64>,
    budget_refusals: Counter<u64>,
    breaker_transitions: Counter<u64>,
    breaker_rejections: Counter<u64>,
    breaker_state: Gauge<u64>,
    #[cfg(feature = "server")]
    server_events: Counter<u64>,
    #[cfg(feature = "server")]
    server_abandoned: Counter<u64>,
    #[cfg(feature = "server")]
    server_stuck: Gauge<u64>,
    #[cfg(feature = "server")]
    server_stuck_oldest: Gauge<f64>,
    #[cfg(feature = "server")]
    limit_refused: Counter<u64>,
    #[cfg(feature = "server")]
    limit: Gauge<u64>,
    #[cfg(feature = "server")]
    limit_in_flight: Gauge<u64>,
    relay_published: Counter<u64>,
    relay_failed: Counter<u64>,
    relay_quarantined: Counter<u64>,
    relay_stale: Counter<u64>,
    outbox_backlog: Gauge<u64>,
    outbox_log_lag: Gauge<u64>,
    outbox_log_lag_age: Gauge<f64>,
    outbox_oldest: Gauge<f64>,
    outbox_quarantine: Gauge<u64>,
    reconcile_open: Gauge<u64>,
    maintenance_done: Counter<u64>,
    maintenance_rounds: Counter<u64>,
    reconcile_manual: Gauge<u64>,
    reconcile_oldest: Gauge<f64>,
    /// The rules reported so far, so that a rule whose differences are all repaired reads 0
    /// instead of its last count: at most [`MAX_RULES`] names.
    reconcile_rules: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

/// The rule names an [`OtelRecorder`] remembers, to report 0 for a rule once it has no open
/// differences: past them a new rule's count is reported while it has any, and its last count
/// stays once it has none.
const MAX_RULES: usize = 1_000;

impl OtelRecorder {
    /// Makes the instruments from `meter`.
    pub fn new(meter: &Meter) -> Self {
        OtelRecorder {
            call_duration: meter
                .f64_histogram("surely.client.call.duration")
                .with_unit("s")
                .with_description("How long logical calls took, retries included.")
                .with_boundaries(DURATION_BOUNDS.to_vec())
                .build(),
            calls: meter
                .u64_counter("surely.client.calls")
                .with_unit("{call}")
                .with_description("Logical calls, by outcome and stop reason.")
                .build(),
            attempts: meter
                .u64_counter("surely.client.attempts")
                .with_unit("{attempt}")
                .with_description("Attempts, by class and how far they got.")
                .build(),
            retries: meter
                .u64_counter("surely.client.retries")
                .with_unit("{retry}")
                .with_description("Retries the retry layer decided.")
                .build(),
            hedges: meter
                .u64_counter("surely.client.hedges")
                .with_unit("{hedge}")
                .with_description("Hedged attempts sent.")
                .build(),
            budget_refusals: meter
                .u64_counter("surely.client.budget.refusals")
                .with_unit("{call}")
                .with_description("Calls that stopped because the retry budget refused a retry.")
                .build(),
            breaker_transitions: meter
                .u64_counter("surely.client.breaker.transitions")
                .with_unit("{transition}")
                .with_description("Circuit breaker state changes.")
                .build(),
            breaker_rejections: meter
                .u64_counter("surely.client.breaker.rejections")
                .with_unit("{call}")
                .with_description("Calls a circuit breaker refused.")
                .build(),
            breaker_state: meter
                .u64_gauge("surely.client.breaker.state")
                .with_unit("1")
                .with_description("1 for a circuit breaker's current state, 0 for the others.")
                .build(),
            #[cfg(feature = "server")]
            server_events: meter
                .u64_counter("surely.server.idempotency.events")
                .with_unit("{event}")
                .with_description(
                    "Events of the server idempotency layer (replays, refused duplicates, \
                     takeovers, store failures), by kind.",
                )
                .build(),
            #[cfg(feature = "server")]
            server_abandoned: meter
                .u64_counter("surely.server.idempotency.abandoned")
                .with_unit("{record}")
                .with_description(
                    "Abandoned idempotency records a recovery round took over, by what became \
                     of them.",
                )
                .build(),
            #[cfg(feature = "server")]
            server_stuck: meter
                .u64_gauge("surely.server.idempotency.stuck")
                .with_unit("{record}")
                .with_description(
                    "Idempotency records still processing past the stuck-record threshold.",
                )
                .build(),
            #[cfg(feature = "server")]
            server_stuck_oldest: meter
                .f64_gauge("surely.server.idempotency.stuck.oldest_age")
                .with_unit("s")
                .with_description(
                    "How long the oldest stuck idempotency record has been processing.",
                )
                .build(),
            #[cfg(feature = "server")]
            limit_refused: meter
                .u64_counter("surely.server.limit.refused")
                .with_unit("{request}")
                .with_description(
                    "Requests a server's adaptive limit refused before their handler ran, by \
                     reason and criticality.",
                )
                .build(),
            #[cfg(feature = "server")]
            limit: meter
                .u64_gauge("surely.server.limit")
                .with_unit("{request}")
                .with_description("A server's adaptive concurrency limit.")
                .build(),
            #[cfg(feature = "server")]
            limit_in_flight: meter
                .u64_gauge("surely.server.limit.in_flight")
                .with_unit("{request}")
                .with_description(
                    "Requests a server's adaptive limit admitted and that are not yet answered.",
                )
                .build(),
            relay_published: meter
                .u64_counter("surely.outbox.relay.published")
                .with_unit("{event}")
                .with_description("Outbox events a relay published and marked.")
                .build(),
            relay_failed: meter
                .u64_counter("surely.outbox.relay.failed")
                .with_unit("{event}")
                .with_description("Outbox publishes that failed.")
                .build(),
            relay_quarantined: meter
                .u64_counter("surely.outbox.relay.quarantined")
                .with_unit("{event}")
                .with_description("Outbox events quarantined after too many failed publishes.")
                .build(),
            relay_stale: meter
                .u64_counter("surely.outbox.relay.stale")
                .with_unit("{event}")
                .with_description(
                    "Outbox events published whose mark came after another relay claimed them.",
                )
                .build(),
            outbox_backlog: meter
                .u64_gauge("surely.outbox.backlog")
                .with_unit("{event}")
                .with_description("Outbox events waiting to be published.")
                .build(),
            outbox_log_lag: meter
                .u64_gauge("surely.outbox.log.lag")
                .with_unit("By")
                .with_description(
                    "Write-ahead log the server keeps for the slowest log relay's slot.",
                )
                .build(),
            outbox_log_lag_age: meter
                .f64_gauge("surely.outbox.log.lag_age")
                .with_unit("s")
                .with_description("How long ago the slowest log relay last confirmed its slot.")
                .build(),
            outbox_oldest: meter
                .f64_gauge("surely.outbox.oldest_age")
                .with_unit("s")
                .with_description("How long the oldest waiting outbox event has waited.")
                .build(),
            outbox_quarantine: meter
                .u64_gauge("surely.outbox.quarantine")
                .with_unit("{event}")
                .with_description("Outbox events in quarantine.")
                .build(),
            reconcile_open: meter
                .u64_gauge("surely.reconcile.open")
                .with_unit("{difference}")
                .with_description(
                    "Reconciliation differences neither repaired nor resolved, per rule.",
                )
                .build(),
            reconcile_manual: meter
                .u64_gauge("surely.reconcile.manual")
                .with_unit("{difference}")
                .with_description("Reconciliation differences in the manual queue.")
                .build(),
            reconcile_oldest: meter
                .f64_gauge("surely.reconcile.oldest_age")
                .with_unit("s")
                .with_description(
                    "How long the oldest open reconciliation difference has been open.",
                )
                .build(),
            reconcile_rules: Default::default(),
            maintenance_done: meter
                .u64_counter("surely.maintenance.done")
                .with_unit("{row}")
                .with_description(
                    "Rows or records a maintenance chore deleted, recovered or moved, per chore.",
                )
                .build(),
            maintenance_rounds: meter
                .u64_counter("surely.maintenance.rounds")
                .with_unit("{round}")
                .with_description(
                    "Maintenance rounds per chore and outcome (done, out_of_time, held_elsewhere, failed).",
                )
                .build(),
        }
    }
}

/// The `http.request.method` value: a known method's name, `_OTHER` for any other, as the
/// semantic conventions say (and so no allocation).
fn method_name(method: &http::Method) -> &'static str {
    match *method {
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::DELETE => "DELETE",
        http::Method::PATCH => "PATCH",
        http::Method::HEAD => "HEAD",
        http::Method::OPTIONS => "OPTIONS",
        http::Method::CONNECT => "CONNECT",
        http::Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

fn method_of(record: &CallRecord) -> Option<&'static str> {
    match &record.operation.as_ref()?.kind() {
        OperationKind::Http(method, _) => Some(method_name(method)),
        OperationKind::Named(_) => None,
    }
}

impl Recorder for OtelRecorder {
    fn record_attempt(&self, record: &AttemptRecord) {
        let class = record.class().as_str();
        self.attempts.add(
            1,
            &[
                KeyValue::new("surely.class", class),
                KeyValue::new("surely.phase", record.phase().as_str()),
            ],
        );
        if record.hedge {
            self.hedges.add(
                1,
                &[
                    KeyValue::new("surely.class", class),
                    KeyValue::new("surely.hedge.won", !record.cancelled),
                ],
            );
        }
    }

    fn record_call(&self, record: &CallRecord) {
        // The method first, so that the attributes without it are a suffix of the array and
        // those with the method only a prefix: no allocation.
        let method = method_of(record);
        let from = usize::from(method.is_none());
        let with_method = usize::from(method.is_some());
        let attrs = [
            KeyValue::new("http.request.method", method.unwrap_or("")),
            KeyValue::new("surely.outcome", record.outcome.as_str()),
            KeyValue::new("surely.stop_reason", record.stop.as_str()),
        ];
        let attrs = &attrs[from..];
        self.call_duration
            .record(record.duration().as_secs_f64(), attrs);
        self.calls.add(1, attrs);

        if record.stop == StopReason::BudgetExhausted {
            self.budget_refusals.add(1, &attrs[..with_method]);
        }
        let pushed = record.retries.iter().filter(|r| r.pushback).count() as u64;
        let backoff = record.retries.len() as u64 - pushed;
        for (count, pushback) in [(backoff, false), (pushed, true)] {
            if count > 0 {
                let retry = [
                    KeyValue::new("surely.retry.pushback", pushback),
                    KeyValue::new("http.request.method", method.unwrap_or("")),
                ];
                self.retries.add(count, &retry[..1 + with_method]);
            }
        }
    }

    fn record_breaker(&self, event: &BreakerEvent) {
        let name = KeyValue::new(
            "surely.breaker",
            event
                .breaker
                .clone()
                .map_or_else(|| opentelemetry::Value::from("-"), Into::into),
        );
        match event.kind {
            BreakerEventKind::Transition { from, to, .. } => {
                self.breaker_transitions.add(
                    1,
                    &[
                        name.clone(),
                        KeyValue::new("surely.breaker.from", from.as_str()),
                        KeyValue::new("surely.breaker.to", to.as_str()),
                    ],
                );
                self.breaker_state.record(
                    0,
                    &[
                        name.clone(),
                        KeyValue::new("surely.breaker.state", from.as_str()),
                    ],
                );
                self.breaker_state.record(
                    1,
                    &[name, KeyValue::new("surely.breaker.state", to.as_str())],
                );
            }
            BreakerEventKind::Rejected { state, .. } => {
                self.breaker_rejections.add(
                    1,
                    &[name, KeyValue::new("surely.breaker.state", state.as_str())],
                );
            }
        }
    }

    #[cfg(feature = "server")]
    fn record_server(&self, event: &ServerEvent) {
        if let ServerEventKind::Stuck { records, oldest } = event.kind {
            self.server_stuck.record(records as u64, &[]);
            self.server_stuck_oldest
                .record(oldest.map_or(0.0, |d| d.as_secs_f64()), &[]);
            return;
        }
        if let ServerEventKind::Abandoned { verdict, .. } = event.kind {
            self.server_abandoned
                .add(1, &[KeyValue::new("surely.verdict", verdict.as_str())]);
        }
        let attrs = [
            KeyValue::new("surely.event", event.kind.as_str()),
            KeyValue::new(
                "http.request.method",
                event.method.as_ref().map_or("", method_name),
            ),
        ];
        let with_method = usize::from(event.method.is_some());
        self.server_events.add(1, &attrs[..1 + with_method]);
    }

    #[cfg(feature = "server")]
    fn record_limit(&self, event: &LimitEvent) {
        if let LimitEventKind::Refused {
            reason,
            criticality,
            partition,
        } = &event.kind
        {
            let reason = KeyValue::new("surely.refusal.reason", reason.as_str());
            let criticality = KeyValue::new("surely.criticality", criticality.as_str());
            match partition {
                Some(p) => {
                    let p = opentelemetry::StringValue::from(p.clone());
                    let attrs = [reason, criticality, KeyValue::new("surely.partition", p)];
                    self.limit_refused.add(1, &attrs);
                }
                None => self.limit_refused.add(1, &[reason, criticality]),
            }
        }
        self.limit.record(u64::from(event.limit), &[]);
        self.limit_in_flight.record(u64::from(event.in_flight), &[]);
    }

    fn record_relay(&self, report: &RelayReport) {
        if let Some(round) = &report.round {
            for (counter, n) in [
                (&self.relay_published, round.published),
                (&self.relay_failed, round.failed),
                (&self.relay_quarantined, round.quarantined),
                (&self.relay_stale, round.stale),
            ] {
                if n > 0 {
                    counter.add(n as u64, &[]);
                }
            }
        }
        if let Some(stats) = &report.stats {
            self.outbox_backlog.record(stats.backlog, &[]);
            self.outbox_oldest
                .record(stats.oldest.map_or(0.0, |d| d.as_secs_f64()), &[]);
            self.outbox_quarantine.record(stats.quarantined, &[]);
            if let Some(bytes) = stats.log_lag_bytes {
                self.outbox_log_lag.record(bytes, &[]);
            }
            if let Some(age) = stats.log_lag {
                self.outbox_log_lag_age.record(age.as_secs_f64(), &[]);
            }
        }
    }

    fn record_maintenance(&self, report: &MaintenanceReport) {
        let chore = KeyValue::new("surely.chore", report.chore.clone());
        if report.done > 0 {
            self.maintenance_done
                .add(report.done, std::slice::from_ref(&chore));
        }
        self.maintenance_rounds.add(
            1,
            &[
                chore,
                KeyValue::new("surely.outcome", report.outcome.as_str()),
            ],
        );
    }

    fn record_reconcile(&self, report: &ReconcileReport) {
        let mut rules = self
            .reconcile_rules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (rule, open) in &report.open_by_rule {
            if rules.len() < MAX_RULES && !rules.contains(rule) {
                rules.insert(rule.clone());
            }
            self.reconcile_open
                .record(*open, &[KeyValue::new("surely.rule", rule.clone())]);
        }
        for rule in rules.iter() {
            if !report.open_by_rule.iter().any(|(r, _)| r == rule) {
                self.reconcile_open
                    .record(0, &[KeyValue::new("surely.rule", rule.clone())]);
            }
        }
        self.reconcile_manual.record(report.manual, &[]);
        self.reconcile_oldest
            .record(report.oldest_open.map_or(0.0, |d| d.as_secs_f64()), &[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten times the bound in rule names (a store shared with other deployments, renamed
    /// rules): the recorder remembers `MAX_RULES` of them. Not a million: each report walks
    /// the names remembered, so a million reports cost a billion comparisons in a debug build.
    #[test]
    fn rule_names_past_the_bound_are_not_remembered() {
        let recorder = OtelRecorder::new(&opentelemetry::global::meter("bounds"));
        let mut report = ReconcileReport::new(Vec::new(), 0, None);
        for n in 0..10 * MAX_RULES {
            report.open_by_rule = vec![(format!("rule-{n}"), 1)];
            recorder.record_reconcile(&report);
        }
        let rules = recorder.reconcile_rules.lock().unwrap().len();
        assert_eq!(rules, MAX_RULES);
    }
}
