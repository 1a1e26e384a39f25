//! The effective settings of the stacks, as plain data: what each `describe()` returns and what
//! a chain file's sections become.

use std::time::Duration;

use crate::backoff::Jitter;

#[cfg(feature = "serde")]
use self::human::{duration, opt_duration};

/// A client stack's effective settings, as
/// [`ClientBuilder::describe`](crate::client::ClientBuilder::describe) reports them: every
/// default filled in.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClientSettings {
    /// The call's total budget; `None` when the client keeps only the deadline it inherits
    /// ([`inherit_deadline`](crate::client::ClientBuilder::inherit_deadline)).
    #[cfg_attr(feature = "serde", serde(serialize_with = "opt_duration"))]
    pub timeout: Option<Duration>,
    /// The longest one attempt may take; `None` when only the remaining budget bounds it.
    #[cfg_attr(feature = "serde", serde(serialize_with = "opt_duration"))]
    pub per_try_timeout: Option<Duration>,
    /// Whether the deadline goes on the wire to the next hop, in this crate's HTTP header (off
    /// after [`no_internal_headers`](crate::client::ClientBuilder::no_internal_headers); a gRPC
    /// request carries `grpc-timeout` either way).
    pub propagates_deadline: bool,
    /// Whether a POST or PATCH gets a generated idempotency key.
    pub generates_keys: bool,
    /// Whether the client was told that the server honours keys
    /// ([`server_honours_keys`](crate::client::ClientBuilder::server_honours_keys)): a keyed
    /// write is then sent again after a lost reply.
    pub server_honours_keys: bool,
    /// Whether request bodies are buffered so that a retry can send them again.
    pub replays_bodies: bool,
    /// The retries.
    pub retry: RetrySettings,
    /// The hedge, if the stack has one.
    pub hedge: Option<HedgeSettings>,
    /// The breaker, if the stack has one.
    pub breaker: Option<BreakerSettings>,
}

/// How a client retries.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RetrySettings {
    /// Attempts per call, the first included (1: no retries).
    pub max_attempts: u32,
    /// The waits between attempts.
    pub backoff: BackoffSettings,
    /// The retry budget.
    pub budget: BudgetSettings,
    /// The longest server pushback (`Retry-After`) obeyed.
    #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
    pub max_pushback: Duration,
    /// No retry starts with less than this left of the budget.
    #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
    pub min_attempt_time: Duration,
    /// Whether each attempt carries the retry-owner marker, so that the next hop (if it trusts
    /// this caller) leaves retries to this one.
    pub marks_owner: bool,
    /// Whether the intent of each call that is not safe is written to a journal first.
    pub journal: bool,
    /// Whether a resolver asks the server what became of a call that ended unknown.
    pub resolver: bool,
}

/// The waits between attempts.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BackoffSettings {
    /// The first wait.
    #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
    pub base: Duration,
    /// The longest wait.
    #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
    pub max: Duration,
    /// Each wait's growth.
    pub multiplier: f64,
    /// The randomness.
    pub jitter: Jitter,
}

/// The retry budget a client's retries (and hedges) spend from.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(tag = "kind", rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum BudgetSettings {
    /// No budget: every retry the attempts allow is sent.
    None,
    /// A [`RatioBudget`](crate::budget::RatioBudget): retries at most `ratio` of first
    /// attempts over `ttl`, or `min_per_sec` a second when that is more.
    Ratio {
        /// Retries per first attempt.
        ratio: f64,
        /// The window.
        #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
        ttl: Duration,
        /// The reserve, retries a second.
        min_per_sec: f64,
    },
    /// A [`TokenBucket`](crate::budget::TokenBucket): a retry costs a token, a success earns
    /// `token_ratio`, and retries stop below half of `max_tokens`.
    TokenBucket {
        /// The bucket's size.
        max_tokens: u32,
        /// Tokens earned per success.
        token_ratio: f64,
    },
    /// A budget of the caller's own, which does not say how it bounds retries.
    Custom,
}

/// A client's hedge.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct HedgeSettings {
    /// Copies of a call at most, the first included.
    pub max_attempts: u32,
    /// The fixed delay before a copy; `None` when the delay is learned from a percentile.
    #[cfg_attr(feature = "serde", serde(serialize_with = "opt_duration"))]
    pub delay: Option<Duration>,
    /// Whether idempotent requests are hedged too, not only safe ones.
    pub hedges_idempotent: bool,
}

/// A client's circuit breaker.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BreakerSettings {
    /// Its name in the records.
    pub name: Option<String>,
    /// The share of failed calls that opens it.
    pub failure_ratio: f64,
    /// Calls in the window before it may open.
    pub min_throughput: u32,
    /// The first break.
    #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
    pub break_duration: Duration,
    /// The longest break.
    #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
    pub max_break: Duration,
}

/// A service's own server layers.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ServerSettings {
    /// The server deadline layer, if the service runs it.
    pub deadline: Option<ServerDeadlineSettings>,
    /// The idempotency layer, if the service runs it.
    pub idempotency: Option<IdempotencySettings>,
}

/// The server deadline layer's settings.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ServerDeadlineSettings {
    /// The longest deadline a caller may ask for; `None`: any.
    #[cfg_attr(feature = "serde", serde(serialize_with = "opt_duration"))]
    pub max: Option<Duration>,
    /// Whether some callers' retry signals are trusted, so that the handler's own clients leave
    /// retries to them.
    pub trusts_retry_signals: bool,
}

/// Where the idempotency record is kept, against the business write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Boundary {
    /// In another store, or another transaction: a crash between the business write and the
    /// record's completion leaves the record in progress while the write committed.
    #[default]
    Separate,
    /// The handler completes the record in its own transaction
    /// ([`complete_in`](crate::docs::keys)): the record's outcome and the business write commit
    /// together, the claim before.
    CompleteIn,
    /// The claim, the business write and the completion in one transaction
    /// ([`in_transaction`](crate::docs::keys)).
    InTransaction,
}

/// The idempotency layer's settings.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct IdempotencySettings {
    /// The store's kind: `memory`, `postgres`, `redis`, or `custom`.
    pub store: String,
    /// Where the record is kept against the business write.
    pub boundary: Boundary,
    /// How long an owner's claim on a key lasts before another request may take it over.
    #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
    pub lease: Duration,
    /// How long a record is kept.
    #[cfg_attr(feature = "serde", serde(serialize_with = "duration"))]
    pub retention: Duration,
    /// The largest response body stored for replay; a larger one is left out.
    pub max_stored_bytes: usize,
    /// The methods that must carry a key.
    pub require_key_for: Vec<String>,
    /// Whether 5xx answers are stored and replayed.
    pub store_server_errors: bool,
}

/// How an inbox treats the versions of an aggregate's events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum VersionPolicy {
    /// No version check.
    #[default]
    Any,
    /// Each version after the last applied one, in turn.
    InOrder,
    /// Any version newer than the last applied one.
    Latest,
}

/// A service's inbox.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct InboxSettings {
    /// Its name.
    pub name: String,
    /// The version policy.
    pub versions: VersionPolicy,
    /// Whether the events it consumes are changes of an aggregate (which need a version policy)
    /// rather than facts that commute; `None` when nobody said.
    pub change_events: Option<bool>,
}

/// How a service's outbox reaches the broker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum RelayKind {
    /// The relay that claims and marks rows.
    #[default]
    Polling,
    /// The relay that reads the write-ahead log.
    Log,
}

/// A service's outbox.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct OutboxSettings {
    /// The relay.
    pub relay: RelayKind,
}

/// A service's UNKNOWN ledger and its reconciler.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LedgerSettings {
    /// Whether a reconciler with a resolver works the ledger down.
    pub resolver: bool,
    /// Entries older than this raise an alert; `None`: no alert.
    #[cfg_attr(feature = "serde", serde(serialize_with = "opt_duration"))]
    pub alert_after: Option<Duration>,
    /// Whether entries nobody could settle go to a manual queue a person works.
    pub manual_queue: bool,
}

#[cfg(feature = "serde")]
mod human {
    use std::time::Duration;

    use serde::Serializer;

    /// A duration as humantime writes it: `2s`, `1m 30s`.
    pub(super) fn duration<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    /// An optional duration as humantime writes it, or nothing.
    pub(super) fn opt_duration<S: Serializer>(
        d: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => duration(d, s),
            None => s.serialize_none(),
        }
    }
}
