use tracing::field::Empty;

use super::{AttemptRecord, BusinessKey, CallId, CallRecord, Recorder};
use crate::classify::Outcome;
use crate::Semantics;

/// Records to [`tracing`]: a `surely.call` span per call and a `surely.attempt` span per attempt,
/// each closed with an event carrying the record.
///
/// Field names follow the OpenTelemetry semantic conventions where one exists
/// (`http.request.resend_count`, `error.type`), and are
/// prefixed `surely.` otherwise. Calls whose outcome is unknown are logged at `WARN`, other
/// calls at `INFO`, attempts at `DEBUG`.
///
/// ```
/// use surely::record::{RecordCallLayer, TracingRecorder};
/// let layer = RecordCallLayer::new(TracingRecorder::new());
/// # let _ = layer;
/// ```
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
        if r.timeout.is_some() {
            span.record("error.type", "timeout");
        } else if r.cancelled {
            span.record("error.type", "cancelled");
        }
        tracing::debug!(
            surely.attempt = r.attempt,
            surely.deadline_left_ms = r.deadline_left.map(|d| d.as_millis() as u64),
            surely.duration_ms = r.duration().as_millis() as u64,
            surely.phase = r.phase().as_str(),
            surely.class = r.class().as_str(),
            "attempt ended"
        );
    }

    fn record_call(&self, r: &CallRecord) {
        let span = tracing::Span::current();
        span.record("surely.attempts", r.attempts);
        span.record("surely.outcome", r.outcome.as_str());
        span.record("surely.stop_reason", r.stop.as_str());
        if r.outcome == Outcome::Unknown {
            tracing::warn!(
                surely.attempts = r.attempts,
                surely.outcome = r.outcome.as_str(),
                surely.stop_reason = r.stop.as_str(),
                surely.duration_ms = r.duration().as_millis() as u64,
                "call outcome unknown: the effect may have happened"
            );
        } else {
            tracing::info!(
                surely.attempts = r.attempts,
                surely.outcome = r.outcome.as_str(),
                surely.stop_reason = r.stop.as_str(),
                surely.duration_ms = r.duration().as_millis() as u64,
                "call ended"
            );
        }
    }
}
