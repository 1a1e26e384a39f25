//! What a server's adaptive concurrency limit records.

use std::fmt;
use std::sync::Arc;

use crate::Criticality;

/// Why a server's [adaptive limit](crate::server::limit) or its
/// [start check](crate::server::deadline::RecheckLayer) refused a request before its handler
/// ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RefusalReason {
    /// As many requests were in flight as the limit allows, and the request's partition had
    /// used its reserved share.
    Limit,
    /// The request's [`Criticality`] had filled its share of the limit: less critical work is
    /// refused before the limit itself is reached, so that more critical work still gets in.
    Shed,
    /// The request's deadline left less than the work needs: it could no longer finish in
    /// time.
    Deadline,
}

impl RefusalReason {
    /// A short snake-case name, for logs and metric attributes: `limit`, `shed`, `deadline`.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Limit => "limit",
            RefusalReason::Shed => "shed",
            RefusalReason::Deadline => "deadline",
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened at a server's [adaptive limit](crate::server::limit).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitEventKind {
    /// A request was refused before its handler ran (`503` with `Retry-After` and
    /// `surely-not-processed`, or gRPC `UNAVAILABLE` with `grpc-retry-pushback-ms`).
    Refused {
        /// Why.
        reason: RefusalReason,
        /// The request's criticality.
        criticality: Criticality,
        /// The name of the request's partition, if the limit has partitions.
        partition: Option<Arc<str>>,
    },
    /// The limit moved to [`limit`](LimitEvent::limit) from `from`.
    Changed {
        /// The limit before.
        from: u32,
    },
    /// A report asked for ([`AdaptiveLimitLayer::report`](crate::server::limit::AdaptiveLimitLayer::report)):
    /// the limit and the requests in flight now, so that gauges follow a quiet server too.
    Snapshot,
}

impl LimitEventKind {
    /// A short snake-case name: `refused`, `changed`, `snapshot`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LimitEventKind::Refused { .. } => "refused",
            LimitEventKind::Changed { .. } => "changed",
            LimitEventKind::Snapshot => "snapshot",
        }
    }
}

/// An event of a server's [adaptive limit](crate::server::limit), as a
/// [`Recorder`](super::Recorder) receives it in [`record_limit`](super::Recorder::record_limit):
/// what happened, with the limit and the requests in flight at that moment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitEvent {
    /// What happened.
    pub kind: LimitEventKind,
    /// The concurrency limit.
    pub limit: u32,
    /// Requests in flight (admitted and not yet answered).
    pub in_flight: u32,
}

impl LimitEvent {
    pub(crate) fn new(kind: LimitEventKind, limit: u32, in_flight: u32) -> Self {
        LimitEvent {
            kind,
            limit,
            in_flight,
        }
    }
}

impl fmt::Display for LimitEvent {
    /// One readable line: `limit refused reason=shed criticality=sheddable limit=20
    /// in-flight=18`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "limit {}", self.kind.as_str())?;
        match &self.kind {
            LimitEventKind::Refused {
                reason,
                criticality,
                partition,
            } => {
                write!(f, " reason={reason} criticality={criticality}")?;
                if let Some(p) = partition {
                    write!(f, " partition={p:?}")?;
                }
            }
            LimitEventKind::Changed { from } => write!(f, " from={from}")?,
            LimitEventKind::Snapshot => {}
        }
        write!(f, " limit={} in-flight={}", self.limit, self.in_flight)
    }
}
