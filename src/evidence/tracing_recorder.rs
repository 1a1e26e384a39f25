use tracing::field::Empty;

use super::{AttemptRecord, BusinessKey, CallId, CallRecord, Recorder, RelayReport};
use super::{BreakerEvent, BreakerEventKind};
#[cfg(feature = "server")]
use super::{LimitEvent, LimitEventKind, ServerEvent, ServerEventKind};
use super::{MaintenanceOutcome, MaintenanceReport};
use crate::classify::AttemptClass;
use crate::error::BreakerState;
use crate::Outcome;
use crate::Semantics;

/// Records to [`tracing`]: a `surely.call` span per call and a `surely.attempt` span per attempt,
/// each closed with an event carrying the record.
///
/// Field names follow the OpenTelemetry HTTP client semantic conventions where one exists
/// (`http.request.method`, `url.full` with its query left out, `server.address`,
/// `server.port`, `http.request.resend_count`, `error.type`), and are prefixed `surely.`
/// otherwise. The call span's `surely.semantics` is what the call was treated as (a POST a key
/// layer made keyed says `Keyed`).
///
/// Levels: calls whose outcome is unknown are logged at `WARN`, other calls at `INFO`. An
/// attempt that failed (and so was retried, or ended the call) or was a hedge is `INFO`, with
/// `error.type` its timeout, cancellation or class; a plain successful attempt is `DEBUG`. A
/// circuit breaker opening (or isolated) is logged at `WARN`, its other state changes at
/// `INFO`, its refusals at `DEBUG`. A call's event carries `surely.retry_wait_ms`, the time
/// its retries spent waiting (backoff and pushback).
///
/// The server [idempotency layer][crate::server::idempotency]'s events
/// ([`ServerEventKind`]) are logged with `surely.event` (their name), `http.request.method`,
/// `surely.tenant`, `surely.operation` and `surely.key`: at `WARN` when they need a look (a key
/// reused with another body, an expired key, a lease takeover, which means an owner crashed or
/// hung, a store that could not be reached or could not record a result), at `INFO` for
/// replays, duplicates refused while in flight and keys released by a dropped handler. A
/// stuck-record report is `INFO` when it found records (each is also warned about on its own),
/// `DEBUG` otherwise.
///
/// ```
/// use surely::record::{RecordCallLayer, TracingRecorder};
/// let layer = RecordCallLayer::new(TracingRecorder::new());
/// # let _ = layer;
/// ```
#[cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::idempotency",
        "`ServerEventKind`",
    )
)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TracingRecorder {
    _priv: (),
}

impl TracingRecorder {
    /// The recorder.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Recorder for TracingRecorder {
    /// Whether anything listens: a `tracing` subscriber that takes this recorder's events at
    /// `WARN` (the most severe level it writes). Without one, the record layers skip building
    /// records at all, so a `TracingRecorder` with nobody listening costs what `()` costs, plus
    /// this check (a load of the callsite's cached interest).
    #[inline]
    fn enabled(&self) -> bool {
        tracing::enabled!(tracing::Level::WARN)
    }

    fn call_span(
        &self,
        call: CallId,
        key: Option<&BusinessKey>,
        semantics: Semantics,
    ) -> tracing::Span {
        tracing::info_span!(
            "surely.call",
            surely.call_id = call.get(),
            surely.key = key.map(BusinessKey::as_str),
            surely.semantics = ?semantics,
            http.request.method = Empty,
            url.full = Empty,
            server.address = Empty,
            server.port = Empty,
            surely.attempts = Empty,
            surely.outcome = Empty,
            surely.stop_reason = Empty,
        )
    }

    fn attempt_span(&self, call: Option<CallId>, attempt: u32) -> tracing::Span {
        let span = tracing::info_span!(
            "surely.attempt",
            surely.call_id = call.map(CallId::get),
            surely.attempt = attempt,
            http.request.resend_count = Empty,
            surely.phase = Empty,
            surely.class = Empty,
            error.type = Empty,
            surely.request_id = Empty,
            surely.hedge = Empty,
        );
        if attempt > 1 {
            span.record("http.request.resend_count", attempt - 1);
        }
        span
    }

    fn record_attempt(&self, r: &AttemptRecord) {
        let span = tracing::Span::current();
        span.record("surely.phase", r.phase().as_str());
        span.record("surely.class", r.class().as_str());
        if let Some(id) = r.request_id.as_ref().and_then(|v| v.to_str().ok()) {
            span.record("surely.request_id", id);
        }
        if r.hedge {
            span.record("surely.hedge", true);
        }
        let error_type = if r.timeout.is_some() {
            Some("timeout")
        } else if r.cancelled {
            Some("cancelled")
        } else if r.class() != AttemptClass::Success {
            Some(r.class().as_str())
        } else {
            None
        };
        if let Some(error_type) = error_type {
            span.record("error.type", error_type);
        }
        macro_rules! attempt_ended {
            ($level:ident) => {
                tracing::$level!(
                    surely.attempt = r.attempt,
                    surely.deadline_left_ms = r.deadline_left.map(|d| d.as_millis() as u64),
                    surely.duration_ms = r.duration().as_millis() as u64,
                    surely.phase = r.phase().as_str(),
                    surely.class = r.class().as_str(),
                    error.type = error_type,
                    surely.hedge = r.hedge,
                    "attempt ended"
                )
            };
        }
        if error_type.is_some() || r.hedge {
            attempt_ended!(info);
        } else {
            attempt_ended!(debug);
        }
    }

    fn record_call(&self, r: &CallRecord) {
        let retry_wait_ms: u64 = r.retries.iter().map(|x| x.wait.as_millis() as u64).sum();
        let span = tracing::Span::current();
        span.record("surely.semantics", tracing::field::debug(r.semantics));
        if let Some(op) = &r.operation {
            op.record_http(&span);
        }
        span.record("surely.attempts", r.attempts);
        span.record("surely.outcome", r.outcome.as_str());
        span.record("surely.stop_reason", r.stop.as_str());
        if r.outcome == Outcome::Unknown {
            tracing::warn!(
                surely.attempts = r.attempts,
                surely.outcome = r.outcome.as_str(),
                surely.stop_reason = r.stop.as_str(),
                surely.duration_ms = r.duration().as_millis() as u64,
                surely.retry_wait_ms = retry_wait_ms,
                "call outcome unknown: the effect may have happened"
            );
        } else if let Some(q) = &r.resolution {
            tracing::info!(
                surely.attempts = r.attempts,
                surely.outcome = r.outcome.as_str(),
                surely.stop_reason = r.stop.as_str(),
                surely.duration_ms = r.duration().as_millis() as u64,
                surely.retry_wait_ms = retry_wait_ms,
                surely.resolution = q.answer.as_str(),
                "call outcome settled by a query"
            );
        } else {
            tracing::info!(
                surely.attempts = r.attempts,
                surely.outcome = r.outcome.as_str(),
                surely.stop_reason = r.stop.as_str(),
                surely.duration_ms = r.duration().as_millis() as u64,
                surely.retry_wait_ms = retry_wait_ms,
                "call ended"
            );
        }
    }

    fn record_breaker(&self, e: &BreakerEvent) {
        let name = e.breaker.as_deref().unwrap_or("-");
        match e.kind {
            BreakerEventKind::Transition {
                from,
                to,
                reason,
                break_duration,
            } => {
                let break_ms = break_duration.map(|d| d.as_millis() as u64);
                if matches!(to, BreakerState::Open | BreakerState::Isolated) {
                    tracing::warn!(
                        surely.breaker = name,
                        surely.breaker.from = from.as_str(),
                        surely.breaker.to = to.as_str(),
                        surely.breaker.reason = %reason,
                        surely.breaker.break_ms = break_ms,
                        "circuit breaker {}", to.as_str()
                    );
                } else {
                    tracing::info!(
                        surely.breaker = name,
                        surely.breaker.from = from.as_str(),
                        surely.breaker.to = to.as_str(),
                        surely.breaker.reason = %reason,
                        "circuit breaker {}", to.as_str()
                    );
                }
            }
            BreakerEventKind::Rejected { state, retry_after } => {
                tracing::debug!(
                    surely.breaker = name,
                    surely.breaker.state = state.as_str(),
                    surely.breaker.retry_after_ms = retry_after.map(|d| d.as_millis() as u64),
                    "call refused by the circuit breaker"
                );
            }
        }
    }

    fn record_maintenance(&self, r: &MaintenanceReport) {
        match &r.outcome {
            MaintenanceOutcome::Failed(why) => tracing::warn!(
                surely.chore = r.chore.as_str(),
                surely.maintenance.done = r.done,
                surely.maintenance.batches = r.batches,
                "maintenance round failed; what it could not do is kept for the next round: {why}"
            ),
            outcome => tracing::debug!(
                surely.chore = r.chore.as_str(),
                surely.maintenance.done = r.done,
                surely.maintenance.batches = r.batches,
                surely.maintenance.outcome = outcome.as_str(),
                "maintenance round"
            ),
        }
    }

    fn record_relay(&self, r: &RelayReport) {
        if let Some(round) = &r.round {
            if round.failed > 0 || round.quarantined > 0 {
                tracing::warn!(
                    surely.outbox.claimed = round.claimed,
                    surely.outbox.published = round.published,
                    surely.outbox.failed = round.failed,
                    surely.outbox.quarantined_now = round.quarantined,
                    surely.outbox.stale = round.stale,
                    "outbox relay round had failures"
                );
            } else {
                tracing::debug!(
                    surely.outbox.claimed = round.claimed,
                    surely.outbox.published = round.published,
                    surely.outbox.stale = round.stale,
                    "outbox relay round"
                );
            }
        }
        if let Some(stats) = &r.stats {
            let oldest_ms = stats.oldest.map(|d| d.as_millis() as u64);
            let lag_ms = stats.log_lag.map(|d| d.as_millis() as u64);
            if stats.quarantined > 0 {
                tracing::warn!(
                    surely.outbox.backlog = stats.backlog,
                    surely.outbox.oldest_ms = oldest_ms,
                    surely.outbox.quarantined = stats.quarantined,
                    surely.outbox.log.lag_bytes = stats.log_lag_bytes,
                    surely.outbox.log.lag_ms = lag_ms,
                    "outbox has quarantined events"
                );
            } else {
                tracing::info!(
                    surely.outbox.backlog = stats.backlog,
                    surely.outbox.oldest_ms = oldest_ms,
                    surely.outbox.quarantined = stats.quarantined,
                    surely.outbox.log.lag_bytes = stats.log_lag_bytes,
                    surely.outbox.log.lag_ms = lag_ms,
                    "outbox stats"
                );
            }
        }
    }

    #[cfg(feature = "server")]
    fn record_server(&self, e: &ServerEvent) {
        let event = e.kind.as_str();
        let method = e.method.as_ref().map(http::Method::as_str);
        let (tenant, operation, key) = (e.tenant(), e.operation(), e.key());
        // The fields every event of a request carries, then the event's own.
        macro_rules! server_event {
            ($level:ident, $($rest:tt)+) => {
                tracing::$level!(
                    surely.event = event,
                    http.request.method = method,
                    surely.tenant = tenant,
                    surely.operation = operation,
                    surely.key = key,
                    $($rest)+
                )
            };
        }
        match e.kind {
            ServerEventKind::Replayed { status } => server_event!(
                info,
                http.response.status_code = status.as_u16(),
                "idempotent request replayed"
            ),
            ServerEventKind::InFlight { lease_left } => server_event!(
                info,
                surely.lease_left_ms = lease_left.as_millis() as u64,
                "idempotency key in flight: duplicate refused with 409"
            ),
            ServerEventKind::KeyMismatch => server_event!(
                warn,
                "idempotency key reused with a different request body: refused with 422"
            ),
            ServerEventKind::Expired => server_event!(
                warn,
                "idempotency key expired: refused with 410, its result is no longer kept"
            ),
            ServerEventKind::LeaseTakeover { fence, overdue } => server_event!(
                warn,
                surely.fence = fence.get(),
                surely.overdue_ms = overdue.as_millis() as u64,
                "idempotency lease taken over: the previous owner crashed or hung"
            ),
            ServerEventKind::Released { fence } => server_event!(
                info,
                surely.fence = fence.get(),
                "idempotency key released: its handler was dropped before it answered"
            ),
            ServerEventKind::StoreUnavailable => server_event!(
                warn,
                "idempotency store unavailable: refused with 503, not processed"
            ),
            ServerEventKind::NotStored { fence } => server_event!(
                warn,
                surely.fence = fence.get(),
                "idempotency result not stored: the record stays processing until its lease passes"
            ),
            ServerEventKind::StoredAnswerDiffers {
                fence,
                status,
                headers,
                body,
            } => server_event!(
                warn,
                surely.fence = fence.get(),
                surely.status_differs = status,
                surely.headers_differ = headers,
                surely.body_differs = body,
                "idempotency answer sent differs from the one the handler stored: replays get the stored one"
            ),
            ServerEventKind::Recovered { fence, verdict } => server_event!(
                warn,
                surely.fence = fence.get(),
                surely.recovery = verdict.as_str(),
                "idempotency record recovered after a takeover"
            ),
            ServerEventKind::UnknownAnswered => server_event!(
                info,
                "idempotency record unknown: duplicate answered 202, its handler did not run"
            ),
            ServerEventKind::Settled { fence, happened } => server_event!(
                info,
                surely.fence = fence.get(),
                surely.happened = happened,
                "unknown idempotency record settled"
            ),
            ServerEventKind::Abandoned { fence, verdict } if verdict.is_left() => server_event!(
                warn,
                surely.fence = fence.get(),
                surely.abandoned = verdict.as_str(),
                "abandoned idempotency record left for the next round"
            ),
            ServerEventKind::Abandoned { fence, verdict } => server_event!(
                warn,
                surely.fence = fence.get(),
                surely.abandoned = verdict.as_str(),
                "abandoned idempotency record recovered without a request"
            ),
            ServerEventKind::AbandonedRoundFailed => tracing::warn!(
                surely.event = event,
                "abandoned idempotency records not recovered: the store failed; the next round tries again"
            ),
            ServerEventKind::Stuck { records, oldest } => {
                let oldest_ms = oldest.map(|d| d.as_millis() as u64);
                if records > 0 {
                    tracing::info!(
                        surely.event = event,
                        surely.stuck.records = records,
                        surely.stuck.oldest_ms = oldest_ms,
                        "idempotency records stuck processing"
                    );
                } else {
                    tracing::debug!(
                        surely.event = event,
                        surely.stuck.records = records,
                        "no idempotency record stuck processing"
                    );
                }
            }
        }
    }

    #[cfg(feature = "server")]
    fn record_limit(&self, e: &LimitEvent) {
        match &e.kind {
            LimitEventKind::Refused {
                reason,
                criticality,
                partition,
            } => tracing::debug!(
                surely.event = "limit_refused",
                surely.refusal.reason = reason.as_str(),
                surely.criticality = criticality.as_str(),
                surely.partition = partition.as_deref(),
                surely.limit = e.limit,
                surely.in_flight = e.in_flight,
                "request refused before its handler ran: not processed"
            ),
            LimitEventKind::Changed { from } => tracing::debug!(
                surely.event = "limit_changed",
                surely.limit.from = *from,
                surely.limit = e.limit,
                surely.in_flight = e.in_flight,
                "concurrency limit moved"
            ),
            LimitEventKind::Snapshot => tracing::debug!(
                surely.event = "limit_snapshot",
                surely.limit = e.limit,
                surely.in_flight = e.in_flight,
                "concurrency limit"
            ),
        }
    }
}
