//! What the breaker records: its states, transitions and rejections.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::BreakerState;

/// Why a breaker changed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransitionReason {
    /// Closed → open: the failure rate over the window reached the threshold, with at least
    /// the minimum throughput. Slow calls are counted as failures when enabled.
    FailureRate {
        /// Failures in the window (slow calls included).
        failures: u32,
        /// Calls in the window.
        calls: u32,
    },
    /// Open → half-open: the break ended and a call came.
    BreakEnded,
    /// Half-open → open: a probe failed.
    ProbeFailed,
    /// Half-open → closed: every probe succeeded.
    ProbesSucceeded,
    /// Isolated by hand.
    Isolated,
    /// Reset by hand.
    Reset,
}

impl fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransitionReason::FailureRate { failures, calls } => {
                write!(f, "{failures} failures in {calls} calls")
            }
            TransitionReason::BreakEnded => f.write_str("break ended"),
            TransitionReason::ProbeFailed => f.write_str("probe failed"),
            TransitionReason::ProbesSucceeded => f.write_str("probes succeeded"),
            TransitionReason::Isolated => f.write_str("isolated by hand"),
            TransitionReason::Reset => f.write_str("reset by hand"),
        }
    }
}

/// What happened to a breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerEventKind {
    /// The breaker changed state.
    Transition {
        /// The state before.
        from: BreakerState,
        /// The state after.
        to: BreakerState,
        /// Why.
        reason: TransitionReason,
        /// For a transition to [`Open`](BreakerState::Open), how long the break lasts.
        break_duration: Option<Duration>,
    },
    /// The breaker refused a call without calling the inner service.
    Rejected {
        /// The state that refused it.
        state: BreakerState,
        /// How long until the break ends, for an open breaker.
        retry_after: Option<Duration>,
    },
}

/// A breaker's state change or rejection, as a [`Recorder`](crate::record::Recorder) receives
/// it in [`record_breaker`](crate::record::Recorder::record_breaker).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerEvent {
    /// The breaker's name, if it was given one.
    pub breaker: Option<Arc<str>>,
    /// When it happened.
    pub at: Instant,
    /// What happened.
    pub kind: BreakerEventKind,
}

impl BreakerEvent {
    /// The state after the event: the new state of a transition, the refusing state of a
    /// rejection.
    pub fn state(&self) -> BreakerState {
        match self.kind {
            BreakerEventKind::Transition { to, .. } => to,
            BreakerEventKind::Rejected { state, .. } => state,
        }
    }

    /// Whether the breaker refused a call.
    pub fn is_rejection(&self) -> bool {
        matches!(self.kind, BreakerEventKind::Rejected { .. })
    }
}

impl fmt::Display for BreakerEvent {
    /// One readable line: `breaker payments: closed -> open (12 failures in 20 calls), break 5000ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "breaker {}: ", self.breaker.as_deref().unwrap_or("-"))?;
        match &self.kind {
            BreakerEventKind::Transition {
                from,
                to,
                reason,
                break_duration,
            } => {
                write!(f, "{from} -> {to} ({reason})")?;
                if let Some(d) = break_duration {
                    write!(f, ", break {}ms", d.as_millis())?;
                }
                Ok(())
            }
            BreakerEventKind::Rejected { state, retry_after } => {
                write!(f, "call rejected ({state})")?;
                if let Some(d) = retry_after {
                    write!(f, ", retry after {}ms", d.as_millis())?;
                }
                Ok(())
            }
        }
    }
}
