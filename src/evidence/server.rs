//! What the server idempotency layer records.

use std::fmt;
use std::time::Duration;

use http::{Method, StatusCode};

use crate::ids::{Fence, RecordKey};

/// What happened to a keyed request at the server's
/// [`IdempotencyLayer`](crate::server::idempotency::IdempotencyLayer), or what its stuck-record
/// report found: the events an operator alerts on. A first request that runs its handler and
/// completes its record is the normal case and makes no event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerEventKind {
    /// A duplicate of a completed request got the stored response (`idempotent-replayed: true`).
    Replayed {
        /// The stored response's status.
        status: StatusCode,
    },
    /// A duplicate came while the key's first request was still running, and got `409` with
    /// `Retry-After`: its handler did not run.
    InFlight {
        /// The time left on the owner's lease.
        lease_left: Duration,
    },
    /// The key was used before with a different request body: the request got `422`.
    KeyMismatch,
    /// The key's record outlived its retention: the request got `410 Gone`, and its client
    /// cannot learn from the replay whether its first request took effect.
    Expired,
    /// The request took the record over from an owner whose lease had passed without it
    /// completing or releasing the record: that owner crashed, hung, or ran longer than its
    /// lease (and renewals). What happens next is the [`Recovered`](Self::Recovered) event.
    LeaseTakeover {
        /// The new owner's fence.
        fence: Fence,
        /// How long the record had been held past its lease, stuck `PROCESSING`, when it was
        /// taken over.
        overdue: Duration,
    },
    /// An owner whose handler was dropped before it answered (its caller went away with
    /// [`cancel_with_caller`](crate::server::idempotency::IdempotencyLayerBuilder::cancel_with_caller),
    /// or the runtime shut down) released its key, so that the next request runs at once.
    Released {
        /// The fence of the owner that released it.
        fence: Fence,
    },
    /// The store could not be reached before the handler ran: the request got `503` with
    /// `Retry-After` and `not-processed`.
    StoreUnavailable,
    /// The handler answered, but the store failed to record the result (complete or release):
    /// the client got its answer, and the record stays `PROCESSING` until its lease passes, after
    /// which a retry runs the handler again.
    NotStored {
        /// The owner's fence.
        fence: Fence,
    },
    /// The handler stored its own answer in its transaction
    /// ([`PostgresStore::complete_in`][crate::server::store::PostgresStore::complete_in]) and
    /// committed it, and the answer that left it is another: a header the framework or a layer
    /// between the idempotency layer and the handler added (a `content-type` left out of a
    /// [`StoredResponse`](crate::server::store::StoredResponse) built by hand), another status,
    /// another body. Its client got the answer sent; every replay of the key gets the stored
    /// one. The layer also logs it at `warn`, naming the headers. Store the response returned,
    /// with [`StoredResponse::buffer`](crate::server::store::StoredResponse::buffer).
    ///
    /// The layer tells it when its own completion with the answer sent is refused because the
    /// record is already completed: a handler whose transaction rolled back after its
    /// `complete_in` makes no event, as the answer sent is then the one stored.
    #[cfg_attr(
        not(all(feature = "server", feature = "postgres")),
        doc = crate::docs::links::to_features!("crate::server::store::PostgresStore::complete_in")
    )]
    StoredAnswerDiffers {
        /// The owner's fence.
        fence: Fence,
        /// Whether the statuses differ.
        status: bool,
        /// How many of the headers the layer stores differ (a value, or one answer has it and
        /// the other has not).
        headers: usize,
        /// Whether the bodies differ.
        body: bool,
    },
    /// After a takeover, the recovery decided what became of the previous owner's work (the
    /// layer's recovery hook, or without one the rule: rerun a record without checkpoints,
    /// mark one with checkpoints unknown).
    Recovered {
        /// The new owner's fence.
        fence: Fence,
        /// What was decided.
        verdict: RecoveryVerdict,
    },
    /// A duplicate came for a record whose outcome is unknown, and got `202` with
    /// `IDEMPOTENCY_OUTCOME_UNKNOWN`: its handler did not run.
    UnknownAnswered,
    /// A round over the store's unknown records settled one (the resolver found out).
    Settled {
        /// The fence the record was settled with.
        fence: Fence,
        /// Whether the work had taken effect (the record is completed, and replayed) or not (it
        /// is released, and the next request runs it).
        happened: bool,
    },
    /// A [stuck-record report](crate::server::idempotency::IdempotencyLayer::report_stuck)
    /// ran: how many records were still `PROCESSING` past its threshold. Reported on every run,
    /// zero included, so that a gauge falls back when the records are settled.
    Stuck {
        /// Records found (the report reads at most 100).
        records: usize,
        /// How long the oldest of them has been processing; `None` without any.
        oldest: Option<Duration>,
    },
    /// A [round over abandoned records](crate::server::idempotency::IdempotencyLayer::recover_abandoned)
    /// took this record over (its owner's lease had passed, and no request came for it) and
    /// decided, or left it for the next round.
    Abandoned {
        /// The fence the round took it with.
        fence: Fence,
        /// What became of it.
        verdict: AbandonedVerdict,
    },
    /// A round over abandoned records could not take any over: the store failed. Every record
    /// stays as it was, for the next round.
    AbandonedRoundFailed,
}

/// What a round over abandoned records did with one: see
/// [`AbandonedRecovery`](crate::server::idempotency::AbandonedRecovery). The last three leave
/// the record as it was, `PROCESSING` under the round's fence until that lease passes, when the
/// next round takes it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AbandonedVerdict {
    /// The work had been done: its answer is stored and replayed.
    Completed,
    /// The work failed for good: that answer is stored and replayed.
    Failed,
    /// Nobody can tell yet: the record is `UNKNOWN` until settled.
    Unknown,
    /// Nothing happened: released, the next request with the key runs it.
    Released,
    /// The hook panicked: left as it was.
    HookPanicked,
    /// The hook did not answer within its timeout: left as it was.
    HookTimedOut,
    /// The store failed to record the decision: left as it was.
    StoreFailed,
}

impl AbandonedVerdict {
    /// A short lower-case name: `completed`, `failed`, `unknown`, `released`, `hook_panicked`,
    /// `hook_timed_out`, `store_failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            AbandonedVerdict::Completed => "completed",
            AbandonedVerdict::Failed => "failed",
            AbandonedVerdict::Unknown => "unknown",
            AbandonedVerdict::Released => "released",
            AbandonedVerdict::HookPanicked => "hook_panicked",
            AbandonedVerdict::HookTimedOut => "hook_timed_out",
            AbandonedVerdict::StoreFailed => "store_failed",
        }
    }

    /// Whether the record was left as it was, for the next round.
    pub fn is_left(self) -> bool {
        matches!(
            self,
            AbandonedVerdict::HookPanicked
                | AbandonedVerdict::HookTimedOut
                | AbandonedVerdict::StoreFailed
        )
    }
}

/// What a recovery after a takeover decided: see
/// [`Recovery`](crate::server::idempotency::Recovery).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecoveryVerdict {
    /// The handler runs again, and sees the previous owners' checkpoints.
    Resumed,
    /// The work had been done: its answer is stored and replayed.
    Completed,
    /// The work failed for good: that answer is stored and replayed.
    Failed,
    /// Nobody can tell yet: the record is `UNKNOWN` until settled.
    Unknown,
}

impl RecoveryVerdict {
    /// A short lower-case name: `resumed`, `completed`, `failed`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecoveryVerdict::Resumed => "resumed",
            RecoveryVerdict::Completed => "completed",
            RecoveryVerdict::Failed => "failed",
            RecoveryVerdict::Unknown => "unknown",
        }
    }
}

impl ServerEventKind {
    /// A short snake-case name, for records, logs and metric attributes: `replayed`,
    /// `in_flight`, `key_mismatch`, `expired`, `lease_takeover`, `released`,
    /// `store_unavailable`, `not_stored`, `stored_answer_differs`, `recovered`,
    /// `unknown_answered`, `settled`, `stuck`, `abandoned`, `abandoned_round_failed`.
    ///
    /// ```
    /// use surely::record::ServerEventKind;
    /// assert_eq!(ServerEventKind::KeyMismatch.as_str(), "key_mismatch");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            ServerEventKind::Replayed { .. } => "replayed",
            ServerEventKind::InFlight { .. } => "in_flight",
            ServerEventKind::KeyMismatch => "key_mismatch",
            ServerEventKind::Expired => "expired",
            ServerEventKind::LeaseTakeover { .. } => "lease_takeover",
            ServerEventKind::Released { .. } => "released",
            ServerEventKind::StoreUnavailable => "store_unavailable",
            ServerEventKind::NotStored { .. } => "not_stored",
            ServerEventKind::StoredAnswerDiffers { .. } => "stored_answer_differs",
            ServerEventKind::Recovered { .. } => "recovered",
            ServerEventKind::UnknownAnswered => "unknown_answered",
            ServerEventKind::Settled { .. } => "settled",
            ServerEventKind::Stuck { .. } => "stuck",
            ServerEventKind::Abandoned { .. } => "abandoned",
            ServerEventKind::AbandonedRoundFailed => "abandoned_round_failed",
        }
    }
}

impl fmt::Display for ServerEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event of the server [idempotency layer](crate::server::idempotency), as a
/// [`Recorder`](super::Recorder) receives it in
/// [`record_server`](super::Recorder::record_server).
///
/// The record (tenant, operation, key) is for logs and traces only: the key and the tenant are
/// unbounded, and `OtelRecorder` never puts them in metric attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerEvent {
    /// What happened.
    pub kind: ServerEventKind,
    /// The request's method; `None` for an event that no request made
    /// ([`Stuck`](ServerEventKind::Stuck)).
    pub method: Option<Method>,
    /// The record: tenant, operation and key; `None` for an event about no one record
    /// ([`Stuck`](ServerEventKind::Stuck)).
    pub record: Option<RecordKey>,
}

impl ServerEvent {
    pub(crate) fn request(kind: ServerEventKind, method: Method, record: RecordKey) -> Self {
        ServerEvent {
            kind,
            method: Some(method),
            record: Some(record),
        }
    }

    /// An event about one record that no request made (a settlement).
    pub(crate) fn record(kind: ServerEventKind, record: RecordKey) -> Self {
        ServerEvent {
            kind,
            method: None,
            record: Some(record),
        }
    }

    pub(crate) fn report(kind: ServerEventKind) -> Self {
        ServerEvent {
            kind,
            method: None,
            record: None,
        }
    }

    /// The tenant, if a request made the event.
    pub fn tenant(&self) -> Option<&str> {
        self.record.as_ref().map(RecordKey::tenant)
    }

    /// The operation (`POST /orders`), if a request made the event.
    pub fn operation(&self) -> Option<&str> {
        self.record.as_ref().map(RecordKey::operation)
    }

    /// The idempotency key, if a request made the event.
    pub fn key(&self) -> Option<&str> {
        self.record.as_ref().map(|r| r.key().as_str())
    }
}

impl fmt::Display for ServerEvent {
    /// One readable line: `idempotency lease_takeover POST tenant=acme operation="POST /orders"
    /// key=k-1 fence=2 overdue=3000ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "idempotency {}", self.kind)?;
        if let Some(method) = &self.method {
            write!(f, " {method}")?;
        }
        if let Some(r) = &self.record {
            write!(
                f,
                " tenant={} operation={:?} key={}",
                r.tenant(),
                r.operation(),
                r.key().as_str()
            )?;
        }
        match self.kind {
            ServerEventKind::Replayed { status } => write!(f, " status={}", status.as_u16()),
            ServerEventKind::InFlight { lease_left } => {
                write!(f, " lease-left={}ms", lease_left.as_millis())
            }
            ServerEventKind::LeaseTakeover { fence, overdue } => write!(
                f,
                " fence={} overdue={}ms",
                fence.get(),
                overdue.as_millis()
            ),
            ServerEventKind::Released { fence } | ServerEventKind::NotStored { fence } => {
                write!(f, " fence={}", fence.get())
            }
            ServerEventKind::Stuck { records, oldest } => {
                write!(f, " records={records}")?;
                match oldest {
                    Some(d) => write!(f, " oldest={}ms", d.as_millis()),
                    None => Ok(()),
                }
            }
            ServerEventKind::StoredAnswerDiffers {
                fence,
                status,
                headers,
                body,
            } => write!(
                f,
                " fence={} status-differs={status} headers-differ={headers} body-differs={body}",
                fence.get()
            ),
            ServerEventKind::Recovered { fence, verdict } => {
                write!(f, " fence={} verdict={}", fence.get(), verdict.as_str())
            }
            ServerEventKind::Settled { fence, happened } => {
                write!(f, " fence={} happened={happened}", fence.get())
            }
            ServerEventKind::Abandoned { fence, verdict } => {
                write!(f, " fence={} verdict={}", fence.get(), verdict.as_str())
            }
            ServerEventKind::AbandonedRoundFailed
            | ServerEventKind::KeyMismatch
            | ServerEventKind::Expired
            | ServerEventKind::StoreUnavailable
            | ServerEventKind::UnknownAnswered => Ok(()),
        }
    }
}
