//! The UNKNOWN ledger: a call whose outcome stayed unknown is a queue entry, worked down by a
//! reconciler, not a log line ([`docs::unknowns`](crate::docs::unknowns)).
//!
//! A POST that timed out after it was sent may have placed the order. When the retry layer
//! cannot send it again and no [resolver](crate::retry::Resolve) could settle it before the call
//! returned, the caller gets [`Outcome::Unknown`](crate::Outcome::Unknown) — and somebody still
//! has to find out what happened. The ledger keeps that question until it is answered:
//!
//! * **Recorded as part of the call.** A [`LedgerRecorder`] in the client stack's recorder
//!   writes an entry for every call that ends unknown, with its [`Evidence`]: the call, the
//!   business or idempotency key, the operation, every attempt (number, times, class, phase,
//!   timeout, downstream request id) and why the call stopped. A write that fails is retried,
//!   and one that keeps failing is reported (`tracing` error, [`LedgerWrites::failed`]), never
//!   dropped in silence.
//! * **Worked down.** A [`Reconciler`] claims open entries with a lease (several may run), asks
//!   the downstream by key through the same [`Resolve`](crate::retry::Resolve) hook the retry
//!   layer uses, and settles each entry **once**: succeeded or failed, with the query's answer
//!   as evidence. An entry the query cannot settle is tried again with backoff; past a number
//!   of tries or an age it goes to the **manual queue**, where a person
//!   [settles it](Ledger::settle_manually), and the ledger keeps who and why.
//! * **Idempotent.** A settlement is fenced by its claim: a reconciler whose lease passed cannot
//!   overwrite another's, and settling a settled entry returns the first settlement
//!   ([`Settled::Already`]). Running the reconciler twice gives the same single settlement.
//! * **Nothing unsettled is deleted.** [`Ledger::sweep`] removes settled entries past a
//!   retention, never an open, claimed or manual one.
//! * **Queryable, and watched.** [`Ledger::list`] by key, state and age; [`Ledger::stats`] counts
//!   the entries by state and gives the oldest unsettled one's age, and the reconciler warns
//!   about entries older than a limit.
//!
//! [`MemoryLedger`] is the embedded default (one process, and tests); [`PostgresLedger`] (feature
//! `postgres`) is the one for services with more than one instance.
//!
//! ```
//! use std::time::Duration;
//! use surely::fault::{Fault, InjectFaultLayer, Schedule};
//! use surely::ledger::{Ledger, LedgerRecorder, MemoryLedger, Reconciler, Verdict};
//! use surely::record::BusinessKey;
//! use surely::retry::{Query, Resolution};
//! use surely::Outcome;
//! use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let ledger = MemoryLedger::new();
//! let recorder = LedgerRecorder::new(ledger.clone());
//! let mut client = surely::client()
//!     .recorder(recorder.clone())
//!     .build(
//!         ServiceBuilder::new()
//!             // The order is placed, and the reply is lost.
//!             .layer(InjectFaultLayer::new(Schedule::new().at(0, Fault::ResetAfterSend)))
//!             .service(service_fn(|_req: http::Request<String>| async {
//!                 Ok::<_, std::io::Error>(http::Response::new(String::from("placed")))
//!             })),
//!     )
//!     .unwrap();
//! let mut order = http::Request::post("/orders").body("o-7".to_owned()).unwrap();
//! order.extensions_mut().insert(BusinessKey::new("o-7"));
//! let err = client.ready().await.unwrap().call(order).await.unwrap_err();
//! assert_eq!(err.outcome(), Outcome::Unknown);
//!
//! // The unknown is an entry, with its evidence.
//! recorder.flush().await;
//! let entry = ledger.by_key("o-7").await.unwrap().remove(0);
//! assert_eq!(entry.evidence.operation.as_deref(), Some("POST /orders"));
//!
//! // Later, a reconciler asks the order service, and settles it.
//! let lookup = |q: Query| async move {
//!     match q.key {
//!         Some(order) => Resolution::Succeeded(format!("{order} found in the order table")),
//!         None => Resolution::Unknown,
//!     }
//! };
//! let mut reconciler = Reconciler::builder(ledger.clone(), lookup).build().unwrap();
//! let round = reconciler.run_once().await.unwrap();
//! assert_eq!(round.succeeded, 1);
//! let settled = ledger.get(&entry.evidence.id).await.unwrap().unwrap();
//! assert_eq!(settled.settlement.unwrap().verdict, Verdict::Succeeded);
//! # }
//! ```
#![cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "`PostgresLedger`",
    )
)]

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::classify::{AttemptClass, BoxError, Classification, DeliveryPhase};
use crate::record::{AttemptRecord, CallRecord};
use crate::{Semantics, StopReason};

mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod reconciler;
mod recorder;
mod sweeper;

pub use self::memory::MemoryLedger;
#[cfg(feature = "postgres")]
pub use self::postgres::PostgresLedger;
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::POSTGRES_COMPONENT;
pub use self::reconciler::{ReconcileRound, Reconciler, ReconcilerBuilder};
pub use self::recorder::{LedgerRecorder, LedgerWrites};
pub use self::sweeper::LedgerSweeper;

/// The longest text a ledger keeps for a person's name ([`SettledBy::Manual`]).
pub(crate) const MAX_WHO: usize = 256;
/// The longest text a ledger keeps for a reason or a piece of evidence; a reconciler cuts a
/// longer answer to this, a manual settlement with a longer one is refused.
pub(crate) const MAX_TEXT: usize = 16 * 1024;

/// An entry's id: `unk-` and 32 hex digits, fresh for every unknown call (a call id is only
/// unique within one process).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId(Arc<str>);

impl EntryId {
    /// A fresh, random id.
    pub fn generate() -> Self {
        EntryId(format!("unk-{:032x}", crate::ids::random_u128()).into())
    }

    /// The id of a journaled call's entry: `unk-` and the intent's 32 hex digits.
    pub fn of_intent(intent: crate::journal::IntentId) -> Self {
        EntryId(format!("unk-{intent}").into())
    }

    /// An id of your own: 1 to 128 characters of `[A-Za-z0-9_.:-]`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::is_invalid`] for anything else.
    pub fn new(id: impl Into<Arc<str>>) -> Result<Self, LedgerError> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= 128
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
        if ok {
            Ok(EntryId(id))
        } else {
            Err(LedgerError::invalid(format!(
                "a ledger entry id is 1 to 128 characters of [A-Za-z0-9_.:-], not {:?}",
                truncate(&id, 64)
            )))
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One attempt of an unknown call, as the ledger keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptEvidence {
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// When it started (wall clock).
    pub started_at: SystemTime,
    /// How long it took.
    pub took: Duration,
    /// How it was classified.
    pub class: AttemptClass,
    /// How far the request got.
    pub phase: DeliveryPhase,
    /// The timeout that ended it, if one did.
    pub timeout: Option<String>,
    /// Whether it was a hedge.
    pub hedge: bool,
    /// Whether it was dropped before it finished.
    pub cancelled: bool,
    /// The downstream's request id, if the response carried one.
    pub downstream_id: Option<String>,
}

impl AttemptEvidence {
    /// An attempt; the rest (timeout, hedge, cancelled, downstream id) empty.
    pub fn new(
        attempt: u32,
        started_at: SystemTime,
        took: Duration,
        class: AttemptClass,
        phase: DeliveryPhase,
    ) -> Self {
        AttemptEvidence {
            attempt,
            started_at,
            took,
            class,
            phase,
            timeout: None,
            hedge: false,
            cancelled: false,
            downstream_id: None,
        }
    }

    /// Its downstream request id.
    pub fn with_downstream_id(mut self, id: impl Into<String>) -> Self {
        self.downstream_id = Some(id.into());
        self
    }

    /// Its record, its wall-clock start taken from `now` and the record's instants.
    fn from_record(
        record: &AttemptRecord,
        now: SystemTime,
        now_instant: tokio::time::Instant,
    ) -> Self {
        let ago = now_instant.saturating_duration_since(record.started);
        AttemptEvidence {
            attempt: record.attempt,
            started_at: now.checked_sub(ago).unwrap_or(now),
            took: record.duration(),
            class: record.class(),
            phase: record.phase(),
            timeout: record.timeout.as_ref().map(ToString::to_string),
            hedge: record.hedge,
            cancelled: record.cancelled,
            downstream_id: record
                .request_id
                .as_ref()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        }
    }
}

/// What an unknown call left behind: enough for a reconciler, or a person, to find out what
/// became of it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Evidence {
    /// The entry's id.
    pub id: EntryId,
    /// The call's id in the process that made it ([`CallId`](crate::ids::CallId)).
    pub call: Option<u64>,
    /// The business or idempotency key: what the reconciler queries by.
    pub key: Option<String>,
    /// What the call did: `POST /orders`.
    pub operation: Option<String>,
    /// The request's semantics.
    pub semantics: Semantics,
    /// Why the call stopped.
    pub stop: StopReason,
    /// Its attempts, in order.
    pub attempts: Vec<AttemptEvidence>,
    /// When the call ended (wall clock); for an intent, when it was written.
    pub recorded_at: SystemTime,
    /// The request's digest, when the call was journaled with one
    /// ([`Intent::digest`](crate::journal::Intent::digest)).
    pub digest: Option<String>,
    /// The call's deadline (wall clock), when it was journaled with one.
    pub deadline: Option<SystemTime>,
}

impl Evidence {
    /// The evidence of an unknown call of your own (one the crate's stack did not make): a
    /// fresh id, the key and operation given, no attempts, stopped as unknown, now.
    pub fn new(key: impl Into<String>, operation: impl Into<String>) -> Self {
        Evidence {
            id: EntryId::generate(),
            call: None,
            key: Some(key.into()),
            operation: Some(operation.into()),
            semantics: Semantics::NonIdempotent,
            stop: StopReason::Unknown,
            attempts: Vec::new(),
            recorded_at: SystemTime::now(),
            digest: None,
            deadline: None,
        }
    }

    /// The evidence of a journaled call's intent: its id, key, operation, semantics, digest and
    /// deadline; no attempts yet.
    pub fn of_intent(intent: &crate::journal::Intent) -> Self {
        Evidence {
            id: EntryId::of_intent(intent.id),
            call: intent.call,
            key: intent.key.clone(),
            operation: intent.operation.clone(),
            semantics: intent.semantics,
            stop: StopReason::Unknown,
            attempts: Vec::new(),
            recorded_at: intent.started_at,
            digest: intent.digest.clone(),
            deadline: intent.deadline,
        }
    }

    /// With this id.
    pub fn with_id(mut self, id: EntryId) -> Self {
        self.id = id;
        self
    }

    /// With these semantics.
    pub fn with_semantics(mut self, semantics: Semantics) -> Self {
        self.semantics = semantics;
        self
    }

    /// With this stop reason.
    pub fn with_stop(mut self, stop: StopReason) -> Self {
        self.stop = stop;
        self
    }

    /// With one more attempt.
    pub fn with_attempt(mut self, attempt: AttemptEvidence) -> Self {
        self.attempts.push(attempt);
        self
    }

    /// The evidence of a call the crate's record layers saw end unknown.
    pub fn from_records(call: &CallRecord, attempts: &[AttemptRecord]) -> Self {
        let (now, now_instant) = (SystemTime::now(), tokio::time::Instant::now());
        let ago = now_instant.saturating_duration_since(call.ended);
        let mut attempts: Vec<AttemptEvidence> = attempts
            .iter()
            .map(|a| AttemptEvidence::from_record(a, now, now_instant))
            .collect();
        attempts.sort_by_key(|a| (a.attempt, a.started_at));
        Evidence {
            // The id its intent had, if the call was journaled: one entry per call.
            id: EntryId::of_intent(crate::journal::IntentId::for_call(call.call)),
            call: Some(call.call.get()),
            key: call.key.as_ref().map(|k| k.as_str().to_owned()),
            operation: call.operation.as_ref().map(ToString::to_string),
            semantics: call.semantics,
            stop: call.stop,
            attempts,
            recorded_at: now.checked_sub(ago).unwrap_or(now),
            digest: None,
            deadline: None,
        }
    }

    /// The query a [`Resolve`](crate::retry::Resolve)r gets for this entry: its key,
    /// semantics, number of attempts and last classification.
    pub(crate) fn query(&self) -> crate::resolve::Query {
        let last = self
            .attempts
            .last()
            .map_or(Classification::failure_at(DeliveryPhase::Sent), |a| {
                Classification::new(a.class, a.phase)
            });
        crate::resolve::Query {
            key: self.key.as_deref().map(crate::ids::BusinessKey::new),
            operation: self.operation.as_deref().map(crate::ids::Operation::named),
            semantics: self.semantics,
            attempts: self.attempts.len() as u32,
            last,
        }
    }
}

/// Where an entry stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum EntryState {
    /// A journaled call's intent ([`journal`](crate::journal)): the call may still be running,
    /// or its process died. A reconciler leaves it alone until its hold passes, then takes it
    /// like an open entry; the call's own recorder makes it open if the call ends unknown, and
    /// the journal forgets it if the call ends definitively.
    InDoubt,
    /// Waiting for a reconciler (now, or after its backoff).
    Open,
    /// A reconciler holds it, until it settles it or its lease passes.
    Claimed,
    /// The reconciler gave up: a person must settle it.
    Manual,
    /// Settled: succeeded or failed, with its evidence.
    Settled,
}

impl EntryState {
    /// A short lower-case name, as the PostgreSQL ledger stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryState::InDoubt => "in_doubt",
            EntryState::Open => "open",
            EntryState::Claimed => "claimed",
            EntryState::Manual => "manual",
            EntryState::Settled => "settled",
        }
    }

    /// The state named `name` ([`as_str`](Self::as_str)).
    pub fn parse(name: &str) -> Option<Self> {
        [
            EntryState::InDoubt,
            EntryState::Open,
            EntryState::Claimed,
            EntryState::Manual,
            EntryState::Settled,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    /// Whether the entry still waits for an answer.
    pub fn is_unsettled(self) -> bool {
        self != EntryState::Settled
    }
}

/// An entry is an item of the leased work queue: in doubt and open ones are due when their
/// hold or backoff has passed, claimed ones when their lease has; the manual queue is never
/// claimed; settled ones are swept after their retention.
impl crate::queue::States for EntryState {
    const ALL: &'static [Self] = &[
        EntryState::InDoubt,
        EntryState::Open,
        EntryState::Claimed,
        EntryState::Manual,
        EntryState::Settled,
    ];
    const CLAIMED: Self = EntryState::Claimed;

    fn claimable(self) -> bool {
        matches!(
            self,
            EntryState::InDoubt | EntryState::Open | EntryState::Claimed
        )
    }

    fn settled(self) -> bool {
        self == EntryState::Settled
    }
}

/// What became of an unknown call, once somebody found out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The downstream did it.
    Succeeded,
    /// The downstream did not do it, and will not.
    Failed,
}

impl Verdict {
    /// `succeeded` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Succeeded => "succeeded",
            Verdict::Failed => "failed",
        }
    }

    /// The verdict named `name` ([`as_str`](Self::as_str)).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "succeeded" => Some(Verdict::Succeeded),
            "failed" => Some(Verdict::Failed),
            _ => None,
        }
    }
}

/// Who settled an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettledBy {
    /// A [`Reconciler`], from the downstream's answer.
    Reconciler,
    /// A person, from the manual queue.
    Manual {
        /// Who.
        who: String,
    },
}

/// How an entry was settled: the verdict, its evidence, and who gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settlement {
    /// What became of the call.
    pub verdict: Verdict,
    /// The evidence: the downstream's answer, or the person's reason.
    pub evidence: String,
    /// Who settled it.
    pub by: SettledBy,
    /// When (wall clock).
    pub at: SystemTime,
}

impl Settlement {
    /// A reconciler's settlement, from the downstream's answer (an answer over 16 KiB, 16,384
    /// bytes, is cut to that, ending in `…`).
    pub fn reconciled(verdict: Verdict, evidence: impl Into<String>) -> Self {
        let mut evidence = evidence.into();
        if evidence.len() > MAX_TEXT {
            evidence = format!("{}…", truncate(&evidence, MAX_TEXT - '…'.len_utf8()));
        }
        Settlement {
            verdict,
            evidence,
            by: SettledBy::Reconciler,
            at: SystemTime::now(),
        }
    }

    /// A person's settlement: who, and why.
    ///
    /// # Errors
    ///
    /// [`LedgerError::is_invalid`] if `who` is empty or longer than 256 bytes, or `why` is
    /// empty or longer than 16 KiB (16,384 bytes), or either holds a control character.
    pub fn manual(
        verdict: Verdict,
        who: impl Into<String>,
        why: impl Into<String>,
    ) -> Result<Self, LedgerError> {
        let (who, why) = (who.into(), why.into());
        check_text("who", &who, MAX_WHO, false).map_err(LedgerError::invalid)?;
        check_text("why", &why, MAX_TEXT, true).map_err(LedgerError::invalid)?;
        Ok(Settlement {
            verdict,
            evidence: why,
            by: SettledBy::Manual { who },
            at: SystemTime::now(),
        })
    }
}

/// Checks a person's text (a name, a reason) that the durable half keeps: not blank, at most
/// `max` bytes, and no control character (but a newline or a tab where `newlines`). The error
/// says why; each store wraps it in its own error type. The ledger and reconciliation share it.
pub(crate) fn check_text(name: &str, text: &str, max: usize, newlines: bool) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err(format!("{name} is empty"));
    }
    if text.len() > max {
        return Err(format!(
            "{name} is {} bytes, over the {max} kept",
            text.len()
        ));
    }
    if text
        .chars()
        .any(|c| c.is_control() && !(newlines && (c == '\n' || c == '\t')))
    {
        return Err(format!("{name} holds a control character"));
    }
    Ok(())
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// An entry: the evidence, where it stands, and its settlement once it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry {
    /// What the call left behind.
    pub evidence: Evidence,
    /// Where it stands.
    pub state: EntryState,
    /// How many queries left it unknown.
    pub tries: u32,
    /// The last try's note (the query's error, or why it went to the manual queue), at most
    /// 16 KiB (16,384 bytes).
    pub note: Option<String>,
    /// Its settlement, once settled.
    pub settlement: Option<Settlement>,
    /// How long ago it was recorded, by the ledger's clock when it was read.
    pub age: Duration,
}

impl Entry {
    /// An entry as a store of your own reads it back.
    pub fn new(
        evidence: Evidence,
        state: EntryState,
        tries: u32,
        note: Option<String>,
        settlement: Option<Settlement>,
        age: Duration,
    ) -> Self {
        Entry {
            evidence,
            state,
            tries,
            note,
            settlement,
            age,
        }
    }
}

/// An entry a reconciler claimed: it holds it until it settles it, or until the lease passes.
#[derive(Clone, Debug)]
pub struct Claim {
    /// The entry.
    pub entry: Entry,
    fence: u64,
}

impl Claim {
    /// A claim; for stores of your own.
    pub fn new(entry: Entry, fence: u64) -> Self {
        Claim { entry, fence }
    }

    /// The claim's number: a later claim of the entry has a higher one, and the ledger refuses
    /// a change made with an older one.
    pub fn fence(&self) -> u64 {
        self.fence
    }
}

/// What a settlement did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settled {
    /// The entry is settled, now, with this settlement.
    Now(Settlement),
    /// It already was, with this one (kept; the new one was not written).
    Already(Settlement),
}

impl Settled {
    /// The settlement the entry holds.
    pub fn settlement(&self) -> &Settlement {
        match self {
            Settled::Now(s) | Settled::Already(s) => s,
        }
    }

    /// Whether this call settled it.
    pub fn is_now(&self) -> bool {
        matches!(self, Settled::Now(_))
    }
}

/// Which entries to [list](Ledger::list): oldest first, at most `limit` (100 unless set).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a filter does nothing until a ledger lists with it"]
pub struct Filter {
    /// Only entries with this key.
    pub key: Option<String>,
    /// Only entries in this state.
    pub state: Option<EntryState>,
    /// Only entries at least this old.
    pub older_than: Option<Duration>,
    /// At most this many.
    pub limit: usize,
}

impl Default for Filter {
    fn default() -> Self {
        Filter {
            key: None,
            state: None,
            older_than: None,
            limit: 100,
        }
    }
}

impl Filter {
    /// Every entry (the first 100).
    pub fn new() -> Self {
        Self::default()
    }

    /// Only those with this key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Only those in this state.
    pub fn state(mut self, state: EntryState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only those at least this old (at most [`MAX_DURATION`](crate::MAX_DURATION), ten years,
    /// counted: a longer age is taken as ten years).
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// At most this many.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Whether `entry` passes the filter (limit aside).
    pub fn matches(&self, entry: &Entry) -> bool {
        self.key
            .as_deref()
            .is_none_or(|k| entry.evidence.key.as_deref() == Some(k))
            && self.state.is_none_or(|s| entry.state == s)
            && self
                .older_than
                .is_none_or(|d| entry.age >= d.min(crate::MAX_DURATION))
    }
}

/// How a ledger stands: what an operator watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LedgerStats {
    /// Journaled calls still in doubt (running, or their process died).
    pub in_doubt: u64,
    /// Entries waiting for a reconciler.
    pub open: u64,
    /// Entries a reconciler holds.
    pub claimed: u64,
    /// Entries in the manual queue.
    pub manual: u64,
    /// Settled entries not yet swept.
    pub settled: u64,
    /// The oldest unsettled entry's age; `None` without any.
    pub oldest_unsettled: Option<Duration>,
}

impl LedgerStats {
    /// In-doubt, open, claimed and manual entries: the calls nobody has settled yet.
    pub fn unsettled(&self) -> u64 {
        self.in_doubt + self.open + self.claimed + self.manual
    }
}

/// Where unknown calls wait for their answer. [`MemoryLedger`] and [`PostgresLedger`] implement
/// it; every method is one atomic operation of the store.
///
/// Every duration a method takes (a lease, a wait, a hold, a retention) counts as at most
/// [`MAX_DURATION`](crate::MAX_DURATION), ten years: a longer one, `Duration::MAX` included, is
/// taken as ten years, never a panic nor a database's refusal.
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "`PostgresLedger`",
    )
)]
pub trait Ledger: Send + Sync + 'static {
    /// Records an entry, open; returns false (and changes nothing) if an entry with its id is
    /// already here: recording is idempotent. An [in-doubt](EntryState::InDoubt) entry with
    /// the id is the same call's intent: it becomes open, with this evidence (true).
    fn record(&self, evidence: &Evidence)
        -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// Records a journaled call's intent, [in doubt](EntryState::InDoubt): no reconciler
    /// claims it until `hold` has passed (on the ledger's clock). Returns false (and changes
    /// nothing) if an entry with its id is already here.
    fn record_in_doubt(
        &self,
        evidence: &Evidence,
        hold: Duration,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send;

    /// Deletes the entries among `ids` that are still in doubt (their calls ended
    /// definitively), and returns how many; an entry in any other state stays.
    fn forget_in_doubt(
        &self,
        ids: &[EntryId],
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send;

    /// Claims up to `max` entries for `lease`, oldest first: open ones whose backoff has
    /// passed, and claimed ones whose lease has.
    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Claim>, LedgerError>> + Send;

    /// Settles a claimed entry. An entry already settled keeps its settlement
    /// ([`Settled::Already`]), whoever holds it.
    ///
    /// # Errors
    ///
    /// [`LedgerError::is_stale`] if the entry is unsettled and the claim is no longer its own
    /// (its lease passed and another reconciler claimed it, or it went to the manual queue).
    fn settle(
        &self,
        claim: &Claim,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Settled, LedgerError>> + Send;

    /// Puts a claimed entry back, open, to be claimed again after `after`; counts a try and
    /// keeps `note` (its first 16 KiB, 16,384 bytes, cut on a character boundary).
    ///
    /// # Errors
    ///
    /// As for [`settle`](Self::settle), and stale if the entry was settled meanwhile.
    fn retry_later(
        &self,
        claim: &Claim,
        note: &str,
        after: Duration,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// Moves a claimed entry to the manual queue, with the reason (kept as the entry's note, cut
    /// like [`retry_later`](Self::retry_later)'s); counts a try.
    ///
    /// # Errors
    ///
    /// As for [`retry_later`](Self::retry_later).
    fn to_manual(
        &self,
        claim: &Claim,
        reason: &str,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// A person settles an entry, in whatever unsettled state it is (usually manual). An
    /// entry already settled keeps its settlement ([`Settled::Already`]).
    ///
    /// # Errors
    ///
    /// [`LedgerError::is_not_found`] if there is no such entry.
    fn settle_manually(
        &self,
        id: &EntryId,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Settled, LedgerError>> + Send;

    /// A person sends a manual (or open) entry back to the reconcilers, claimable at once,
    /// with `note` (cut like [`retry_later`](Self::retry_later)'s) saying who and why; its
    /// tries are kept, and its claim number moves on. For an answer that the downstream can
    /// give now (its outage is over) but could not when the entry went to the manual queue.
    ///
    /// # Errors
    ///
    /// [`LedgerError::is_not_found`] if there is no such entry; [`LedgerError::is_conflict`]
    /// if it is claimed (a reconciler holds it), settled or in doubt;
    /// [`LedgerError::is_unsupported`] from a store that does not implement it (the default,
    /// so that stores written before it still compile).
    fn retry_now(
        &self,
        id: &EntryId,
        note: &str,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        let _ = (id, note);
        std::future::ready(Err(LedgerError::unsupported(
            "send an entry back to the reconcilers",
        )))
    }

    /// The entry with this id.
    fn get(&self, id: &EntryId) -> impl Future<Output = Result<Option<Entry>, LedgerError>> + Send;

    /// The entries that pass `filter`, oldest first.
    fn list(&self, filter: &Filter)
        -> impl Future<Output = Result<Vec<Entry>, LedgerError>> + Send;

    /// The entries of a key, oldest first (the first 100).
    fn by_key(&self, key: &str) -> impl Future<Output = Result<Vec<Entry>, LedgerError>> + Send {
        let filter = Filter::new().key(key);
        async move { self.list(&filter).await }
    }

    /// Counts by state, and the oldest unsettled entry's age.
    fn stats(&self) -> impl Future<Output = Result<LedgerStats, LedgerError>> + Send;

    /// Deletes the entries settled `retention` ago or more, and returns how many. Never an
    /// unsettled one. The crate's ledgers delete them in [bounded batches](Self::sweep_batch),
    /// one statement each, until none is left.
    fn sweep(&self, retention: Duration) -> impl Future<Output = Result<u64, LedgerError>> + Send;

    /// Deletes at most `limit` of the entries settled `retention` ago or more, the longest
    /// settled first, and returns how many: one bounded step of [`sweep`](Self::sweep), what a
    /// [`LedgerSweeper`] runs. Never an unsettled one (in doubt, open, claimed or manual). On
    /// PostgreSQL, two batches at once delete disjoint entries, and neither waits for the
    /// other.
    ///
    /// The default sweeps them all at once, through [`sweep`](Self::sweep): a ledger written
    /// before this method still sweeps, unbounded.
    fn sweep_batch(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        let _ = limit;
        self.sweep(retention)
    }
}

/// A ledger operation failed: the backend failed, a change came with a stale claim, the entry
/// does not exist or is not in a state for the change, a value was refused, or the store
/// cannot do what was asked. Tell them apart with the `is_*` methods; a failure of the backend,
/// or the database's refusal of a value, is its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct LedgerError {
    kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
enum ErrorKind {
    #[error("ledger entry not changed: its claim is stale (another reconciler claimed it, or it left the claim)")]
    Stale,
    #[error("no ledger entry {0}")]
    NotFound(EntryId),
    #[error("refused by the ledger: {why}")]
    Invalid {
        why: String,
        #[source]
        source: Option<BoxError>,
    },
    #[error("ledger entry {0} is {state}, not open or manual", state = .1.as_str())]
    Conflict(EntryId, EntryState),
    #[error("this ledger store cannot {0}")]
    Unsupported(&'static str),
    #[error("ledger store failed")]
    Backend(#[source] BoxError),
    #[error("ledger is full: it holds its capacity of {0} entries")]
    Full(usize),
}

impl LedgerError {
    /// A change with a stale claim.
    pub fn stale() -> Self {
        LedgerError {
            kind: ErrorKind::Stale,
        }
    }

    /// No entry with this id.
    pub fn not_found(id: &EntryId) -> Self {
        LedgerError {
            kind: ErrorKind::NotFound(id.clone()),
        }
    }

    /// A value the ledger does not take, and why.
    pub fn invalid(why: impl Into<String>) -> Self {
        LedgerError {
            kind: ErrorKind::Invalid {
                why: why.into(),
                source: None,
            },
        }
    }

    /// A value the store refused (`why`), its refusal the source (the database's error).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn refused(why: &str, source: impl Into<BoxError>) -> Self {
        LedgerError {
            kind: ErrorKind::Invalid {
                why: why.to_owned(),
                source: Some(source.into()),
            },
        }
    }

    /// The backend failed, with this error (the source).
    pub fn backend(error: impl Into<BoxError>) -> Self {
        LedgerError {
            kind: ErrorKind::Backend(error.into()),
        }
    }

    /// The entry is in `state`, where the change does not apply.
    pub fn conflict(id: &EntryId, state: EntryState) -> Self {
        LedgerError {
            kind: ErrorKind::Conflict(id.clone(), state),
        }
    }

    /// The store does not implement an operation (`what`: "send an entry back to the
    /// reconcilers").
    pub fn unsupported(what: &'static str) -> Self {
        LedgerError {
            kind: ErrorKind::Unsupported(what),
        }
    }

    /// Whether the backend failed.
    pub fn is_backend(&self) -> bool {
        matches!(self.kind, ErrorKind::Backend(_))
    }

    /// Whether the entry is not in a state for the change.
    pub fn is_conflict(&self) -> bool {
        matches!(self.kind, ErrorKind::Conflict(..))
    }

    /// Whether the store does not implement the operation.
    pub fn is_unsupported(&self) -> bool {
        matches!(self.kind, ErrorKind::Unsupported(_))
    }

    /// Whether a change was refused for a stale claim.
    pub fn is_stale(&self) -> bool {
        matches!(self.kind, ErrorKind::Stale)
    }

    /// Whether the entry does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self.kind, ErrorKind::NotFound(_))
    }

    /// Whether a value was refused.
    pub fn is_invalid(&self) -> bool {
        matches!(self.kind, ErrorKind::Invalid { .. })
    }

    /// A new entry was refused because the ledger holds its `capacity` of entries, in every
    /// state (an in-memory ledger, [`MemoryLedger::with_capacity`]): none is dropped to make
    /// room.
    pub fn full(capacity: usize) -> Self {
        LedgerError {
            kind: ErrorKind::Full(capacity),
        }
    }

    /// Whether a new entry was refused because the ledger is full ([`full`](Self::full)).
    pub fn is_full(&self) -> bool {
        matches!(self.kind, ErrorKind::Full(_))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_states_are_what_the_queue_needs() {
        crate::queue::check_states::<super::EntryState>();
    }
}
