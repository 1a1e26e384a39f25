//! Cross-system reconciliation: two or more systems' facts compared key by key, and every
//! difference made a durable item with one repair, applied once
//! ([`docs::reconciliation`](crate::docs::reconciliation)).
//!
//! The [ledger](crate::ledger) settles calls whose outcome stayed unknown, one call at a time.
//! Reconciliation is the safeguard behind it: it compares what the systems *hold*. An order
//! still waiting for payment while the payment channel's statement shows the charge, an event
//! the outbox published that the projection never applied, stock released while the order is
//! still cancelling: each is a **difference** somebody has to act on.
//!
//! * **Sources.** Each system is a [`Source`]: its facts (business key, a value such as a status,
//!   the fact's version and when it last changed), read in pages in ascending key order, as of a
//!   time. [`MemorySource`] holds facts in memory; `PostgresSource` (feature `postgres`) pages
//!   through a query of yours with keyset pagination. The [`Reconciler`] merges the sources'
//!   pages by key, so a comparison of millions of keys holds one page per source in memory.
//! * **Rules.** A [`Rule`] names the sources it compares, the combinations of their facts that
//!   are consistent, and the repair each known difference needs; any other combination is a
//!   difference for a person. Its **grace** window leaves alone a key whose facts changed
//!   recently: work still in flight is not a difference. Rules are checked when the reconciler
//!   is built, and a mistake is a [`RuleError`], never a panic.
//! * **Differences** are items of a [`DifferenceStore`] ([`MemoryDifferences`], or
//!   `PostgresDifferences`), each with a [`RepairId`]: a digest of the rule, the key and the
//!   facts' versions. The same facts give the same id, so a rerun records nothing new, and the
//!   target of a repair can deduplicate on it.
//! * **Repairs** are applied by a [`Repairer`] through a `tower::Service<`[`RepairRequest`]`>`:
//!   claimed with a lease, marked with the claim's fencing token (a runner whose lease passed
//!   cannot mark), retried with [backoff](crate::retry::backoff), and moved to the manual queue
//!   with who and why when they cannot be applied.
//! * **Reports**: [`DifferenceStats`] counts open differences by rule with the oldest one's
//!   age; the reconciler sends them to its [recorder](crate::record::Recorder) as a
//!   [`ReconcileReport`](crate::record::ReconcileReport).
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use surely::reconcile::{
//!     DifferenceStore, MemoryDifferences, MemorySource, Reconciler, RepairAnswer, RepairRequest,
//!     Repairer, Rule, Want,
//! };
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let long_ago = SystemTime::now() - Duration::from_secs(3600);
//! let orders = MemorySource::new();
//! let payments = MemorySource::new();
//! orders.put("o-1", "awaiting_payment", 3, long_ago);
//! payments.put("o-1", "charged", 1, long_ago);
//!
//! let store = MemoryDifferences::new();
//! let mut reconciler = Reconciler::builder(store.clone())
//!     .source("orders", orders.clone())
//!     .source("payments", payments.clone())
//!     .rule(
//!         Rule::new("paid-order", ["orders", "payments"])
//!             .grace(Duration::from_secs(300))
//!             .consistent([Want::is("paid"), Want::is("charged")])
//!             .consistent([Want::Any, Want::Missing])
//!             .repair([Want::is("awaiting_payment"), Want::is("charged")], "mark-paid"),
//!     )
//!     .build()
//!     .unwrap();
//! let pass = reconciler.run_once(SystemTime::now()).await.unwrap();
//! assert_eq!(pass.new, 1);
//!
//! // The repair: the order service, deduplicating on the repair id.
//! let target = tower::service_fn(|req: RepairRequest| async move {
//!     assert_eq!(req.action, "mark-paid");
//!     Ok::<_, std::io::Error>(RepairAnswer::Applied)
//! });
//! let mut repairer = Repairer::builder(store.clone(), target).build().unwrap();
//! assert_eq!(repairer.run_once().await.unwrap().repaired, 1);
//!
//! // The same facts again: the same difference, already known, nothing new to apply.
//! let pass = reconciler.run_once(SystemTime::now()).await.unwrap();
//! assert_eq!((pass.new, pass.known), (0, 1));
//! assert_eq!(repairer.run_once().await.unwrap().claimed, 0);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use crate::classify::BoxError;

mod memory;
#[cfg(feature = "postgres")]
mod postgres;
mod reconciler;
mod repairer;
mod rule;
mod source;
mod sweeper;

pub use self::memory::MemoryDifferences;
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::POSTGRES_COMPONENT;
#[cfg(feature = "postgres")]
pub use self::postgres::{PostgresDifferences, PostgresSource};
pub use self::reconciler::{Pass, Reconciler, ReconcilerBuilder};
pub use self::repairer::{RepairAnswer, RepairRequest, RepairRound, Repairer, RepairerBuilder};
pub use self::rule::{Rule, RuleError, Want};
pub use self::source::{MemorySource, PageRequest, Source};
pub use self::sweeper::DifferenceSweeper;

use crate::ledger::check_text;
/// The longest texts kept for who moved or resolved an item (256 bytes) and for a note or a
/// reason (16 KiB; longer ones are cut), the ledger's, and the ledger's checks and cut.
pub(crate) use crate::ledger::{truncate as cut, MAX_TEXT, MAX_WHO};
/// Who sends a difference without a repair to the manual queue.
pub(crate) const RULES: &str = "rules";
/// Why.
pub(crate) const NO_REPAIR: &str =
    "no repair is declared for this combination of facts: a person must decide";

/// One system's fact about one business key: a value (a status, a digest of the record: what
/// the rules compare), the fact's version, and when it last changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fact {
    /// The business key. Any bytes: keys are compared byte by byte, never read as text.
    pub key: Bytes,
    /// What the rules compare: `awaiting_payment`, `charged`.
    pub value: String,
    /// The fact's version in its system (a row version, a sequence number): part of the
    /// repair id, so that a difference between later versions is a new one.
    pub version: u64,
    /// When the fact last changed (wall clock): a key whose facts changed within a rule's grace
    /// window is in flight, and is not compared.
    pub at: SystemTime,
}

impl Fact {
    /// A fact.
    pub fn new(
        key: impl Into<Bytes>,
        value: impl Into<String>,
        version: u64,
        at: SystemTime,
    ) -> Self {
        Fact {
            key: key.into(),
            value: value.into(),
            version,
            at,
        }
    }
}

/// What a difference saw of one source: its fact's value, version and time, or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Seen {
    /// The source's name.
    pub source: String,
    /// Its fact, `None` when the source has no fact for the key.
    pub fact: Option<SeenFact>,
}

/// A fact as a difference keeps it (the key is the difference's).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SeenFact {
    /// The fact's value.
    pub value: String,
    /// Its version.
    pub version: u64,
    /// When it last changed.
    pub at: SystemTime,
}

impl Seen {
    /// What a difference saw of `source`.
    pub fn new(source: impl Into<String>, fact: Option<SeenFact>) -> Self {
        Seen {
            source: source.into(),
            fact,
        }
    }
}

impl SeenFact {
    /// A fact as seen.
    pub fn new(value: impl Into<String>, version: u64, at: SystemTime) -> Self {
        SeenFact {
            value: value.into(),
            version,
            at,
        }
    }
}

/// A repair's id: `rep-` and 32 hex digits of the SHA-256 of the rule's name, the key, and
/// each of the rule's sources with its fact's version (or its absence). The same facts give
/// the same id, run after run and reconciler after reconciler; a fact at a new version gives a
/// new one.
///
/// ```
/// use std::time::SystemTime;
/// use surely::reconcile::{RepairId, Seen, SeenFact};
///
/// let at = SystemTime::UNIX_EPOCH;
/// let seen = |version| {
///     vec![
///         Seen::new("orders", Some(SeenFact::new("awaiting_payment", version, at))),
///         Seen::new("payments", Some(SeenFact::new("charged", 1, at))),
///     ]
/// };
/// let id = RepairId::of("payment-order", b"o-1", &seen(3));
/// assert_eq!(id, RepairId::of("payment-order", b"o-1", &seen(3)));
/// assert_ne!(id, RepairId::of("payment-order", b"o-1", &seen(4)));
/// assert!(id.as_str().starts_with("rep-"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepairId(Arc<str>);

impl RepairId {
    /// The id of the difference `rule` found at `key` between `seen`.
    pub fn of(rule: &str, key: &[u8], seen: &[Seen]) -> Self {
        let mut h = Sha256::new();
        // Every field length-prefixed: no two inputs share an encoding.
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        field(b"surely.reconcile.v1");
        field(rule.as_bytes());
        field(key);
        for s in seen {
            field(s.source.as_bytes());
            match &s.fact {
                Some(f) => field(&f.version.to_be_bytes()),
                None => field(b"-"),
            }
        }
        let digest = h.finalize();
        let mut id = String::with_capacity(36);
        id.push_str("rep-");
        for b in digest.iter().take(16) {
            id.push_str(&format!("{b:02x}"));
        }
        RepairId(id.into())
    }

    /// An id read back from a store: `rep-` and 32 lower-case hex digits.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::is_invalid`] for anything else.
    pub fn parse(id: &str) -> Result<Self, ReconcileError> {
        let ok = id.len() == 36
            && id.starts_with("rep-")
            && id[4..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if ok {
            Ok(RepairId(id.into()))
        } else {
            Err(ReconcileError::invalid(format!(
                "a repair id is `rep-` and 32 lower-case hex digits, not {:?}",
                cut(id, 64)
            )))
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RepairId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for RepairId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A difference a rule found: which rule, at which key, what each of its sources held, and
/// the repair it needs (`None`: no repair is declared for this combination, a person decides).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Difference {
    /// The repair's id, from the rule, the key and the facts' versions.
    pub id: RepairId,
    /// The rule's name.
    pub rule: String,
    /// The business key.
    pub key: Bytes,
    /// What each of the rule's sources held, in the rule's order.
    pub seen: Vec<Seen>,
    /// The repair's action, as the rule names it; `None` for the manual queue.
    pub action: Option<String>,
}

impl Difference {
    /// A difference, its id computed from the rest.
    pub fn new(
        rule: impl Into<String>,
        key: impl Into<Bytes>,
        seen: Vec<Seen>,
        action: Option<String>,
    ) -> Self {
        let (rule, key) = (rule.into(), key.into());
        Difference {
            id: RepairId::of(&rule, &key, &seen),
            rule,
            key,
            seen,
            action,
        }
    }

    /// The key, for people: as text if it is UTF-8 of at most 128 bytes without control
    /// characters or bidirectional overrides, else `0x` and the hex of its first 64 bytes (and
    /// `…` if there is more).
    pub fn key_display(&self) -> String {
        key_display(&self.key)
    }
}

/// A character that would hide or reorder what a person reads: a control character, or a
/// bidirectional override or isolate.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A key for people and logs: never the raw bytes of a hostile one.
pub(crate) fn key_display(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) if s.len() <= 128 && !s.chars().any(hidden) => s.to_owned(),
        _ => {
            let mut out = String::from("0x");
            for b in key.iter().take(64) {
                out.push_str(&format!("{b:02x}"));
            }
            if key.len() > 64 {
                out.push('…');
            }
            out
        }
    }
}

/// Where a difference stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ItemState {
    /// Waiting for a repairer (now, or after its backoff).
    Open,
    /// A repairer holds it, until it marks it or its lease passes.
    Claimed,
    /// The repair was applied and marked.
    Repaired,
    /// The repairer gave up, or no repair was declared: a person must resolve it.
    Manual,
    /// A person resolved it.
    Resolved,
}

impl ItemState {
    /// `open`, `claimed`, `repaired`, `manual`, `resolved`.
    pub fn as_str(self) -> &'static str {
        match self {
            ItemState::Open => "open",
            ItemState::Claimed => "claimed",
            ItemState::Repaired => "repaired",
            ItemState::Manual => "manual",
            ItemState::Resolved => "resolved",
        }
    }

    /// The state named `name` ([`as_str`](Self::as_str)).
    pub fn parse(name: &str) -> Option<Self> {
        [
            ItemState::Open,
            ItemState::Claimed,
            ItemState::Repaired,
            ItemState::Manual,
            ItemState::Resolved,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }

    /// Whether the difference still waits for its repair or a person.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            ItemState::Open | ItemState::Claimed | ItemState::Manual
        )
    }
}

/// A difference is an item of the leased work queue: open ones are due when their backoff has
/// passed, claimed ones when their lease has; the manual queue is never claimed; repaired and
/// resolved ones are done, and swept after their retention by a [`DifferenceSweeper`].
impl crate::queue::States for ItemState {
    const ALL: &'static [Self] = &[
        ItemState::Open,
        ItemState::Claimed,
        ItemState::Repaired,
        ItemState::Manual,
        ItemState::Resolved,
    ];
    const CLAIMED: Self = ItemState::Claimed;

    fn claimable(self) -> bool {
        matches!(self, ItemState::Open | ItemState::Claimed)
    }

    fn settled(self) -> bool {
        matches!(self, ItemState::Repaired | ItemState::Resolved)
    }
}

/// A difference as a store keeps it: where it stands, its tries, and who did what.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Item {
    /// The difference.
    pub difference: Difference,
    /// Where it stands.
    pub state: ItemState,
    /// How many repairs failed.
    pub tries: u32,
    /// The last note: a failed repair's error, or why it went to the manual queue, or how a
    /// person resolved it (at most 16 KiB).
    pub note: Option<String>,
    /// Who moved it to the manual queue or resolved it: a repairer's name, or a person.
    pub who: Option<String>,
    /// How long ago it was recorded, by the store's clock.
    pub age: Duration,
}

impl Item {
    /// An item as a store of your own reads it back.
    pub fn new(
        difference: Difference,
        state: ItemState,
        tries: u32,
        note: Option<String>,
        who: Option<String>,
        age: Duration,
    ) -> Self {
        Item {
            difference,
            state,
            tries,
            note,
            who,
            age,
        }
    }
}

/// An item a repairer claimed: it holds it until it marks it, or until the lease passes.
#[derive(Clone, Debug)]
pub struct RepairClaim {
    /// The item.
    pub item: Item,
    fence: u64,
}

impl RepairClaim {
    /// A claim; for stores of your own.
    pub fn new(item: Item, fence: u64) -> Self {
        RepairClaim { item, fence }
    }

    /// The claim's fencing token: a later claim of the item has a higher one, and the store
    /// refuses a change made with an older one.
    pub fn fence(&self) -> u64 {
        self.fence
    }
}

/// What marking an item did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marked {
    /// Marked now.
    Now,
    /// It already was repaired or resolved; nothing changed.
    Already,
}

/// How the differences stand: what an operator watches.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DifferenceStats {
    /// Differences not yet repaired nor resolved (open, claimed or manual), by rule, in rule
    /// name order; a rule without any is not listed.
    pub open_by_rule: Vec<(String, u64)>,
    /// Of those, in the manual queue.
    pub manual: u64,
    /// Repaired differences.
    pub repaired: u64,
    /// Differences a person resolved.
    pub resolved: u64,
    /// The oldest open difference's age; `None` without any.
    pub oldest_open: Option<Duration>,
}

impl DifferenceStats {
    /// Open differences, all rules together.
    pub fn open(&self) -> u64 {
        self.open_by_rule.iter().map(|(_, n)| n).sum()
    }

    /// The report a recorder receives.
    pub fn report(&self) -> crate::record::ReconcileReport {
        crate::record::ReconcileReport::new(
            self.open_by_rule.clone(),
            self.manual,
            self.oldest_open,
        )
    }
}

/// Where differences wait for their repair. [`MemoryDifferences`] and `PostgresDifferences`
/// implement it; every method is one atomic operation of the store.
///
/// Every duration a method takes (a lease, a wait, a hold, a retention) counts as at most
/// [`MAX_DURATION`](crate::MAX_DURATION), ten years: a longer one, `Duration::MAX` included, is
/// taken as ten years, never a panic nor a database's refusal.
///
/// A person works the manual queue through it:
///
/// ```
/// use surely::reconcile::{Difference, DifferenceStore, ItemState, Marked, MemoryDifferences};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let store = MemoryDifferences::new();
/// // A combination no rule declared: in the manual queue from the start.
/// store.record(&Difference::new("order-inventory", "o-9", vec![], None)).await.unwrap();
/// for item in store.list(Some(ItemState::Manual), 50).await.unwrap() {
///     let id = &item.difference.id;
///     let done = store.resolve_manually(id, "ana", "stock recounted by hand").await.unwrap();
///     assert_eq!(done, Marked::Now);
/// }
/// assert_eq!(store.stats().await.unwrap().resolved, 1);
/// # }
/// ```
pub trait DifferenceStore: Send + Sync + 'static {
    /// Records a difference, open (or in the manual queue, without an action); returns false,
    /// and changes nothing, if one with its id is already here, whatever its state: recording
    /// is idempotent.
    fn record(
        &self,
        difference: &Difference,
    ) -> impl Future<Output = Result<bool, ReconcileError>> + Send;

    /// Records many differences, in order, as [`record`](Self::record) does each; returns
    /// whether each was new. The default records them one by one; a store with round trips
    /// finds the known ones at once.
    fn record_many(
        &self,
        differences: &[Difference],
    ) -> impl Future<Output = Result<Vec<bool>, ReconcileError>> + Send {
        async move {
            let mut new = Vec::with_capacity(differences.len());
            for d in differences {
                new.push(self.record(d).await?);
            }
            Ok(new)
        }
    }

    /// Claims up to `max` items for `lease`, oldest first: open ones whose backoff has passed,
    /// and claimed ones whose lease has.
    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<RepairClaim>, ReconcileError>> + Send;

    /// Marks a claimed item repaired, with a note. An item already repaired or resolved stays
    /// as it is ([`Marked::Already`]).
    ///
    /// # Errors
    ///
    /// [`ReconcileError::is_stale`] if the claim is no longer the item's (its lease passed and
    /// another repairer claimed it, or it went to the manual queue).
    fn mark_repaired(
        &self,
        claim: &RepairClaim,
        note: &str,
    ) -> impl Future<Output = Result<Marked, ReconcileError>> + Send;

    /// Puts a claimed item back, open, to be claimed again after `after`; counts a try and
    /// keeps `note` (cut to 16 KiB).
    ///
    /// # Errors
    ///
    /// As for [`mark_repaired`](Self::mark_repaired), and stale if the item was repaired
    /// meanwhile.
    fn retry_later(
        &self,
        claim: &RepairClaim,
        note: &str,
        after: Duration,
    ) -> impl Future<Output = Result<(), ReconcileError>> + Send;

    /// Moves a claimed item to the manual queue: who moved it (a repairer's name), and why.
    ///
    /// # Errors
    ///
    /// As for [`retry_later`](Self::retry_later).
    fn to_manual(
        &self,
        claim: &RepairClaim,
        who: &str,
        why: &str,
    ) -> impl Future<Output = Result<(), ReconcileError>> + Send;

    /// A person resolves an item, in whatever state it is (usually manual): who, and how. An
    /// item already repaired or resolved stays as it is ([`Marked::Already`]).
    ///
    /// # Errors
    ///
    /// [`ReconcileError::is_not_found`] without such an item; [`ReconcileError::is_invalid`]
    /// if `who` or `why` is empty, too long (256 bytes, 16 KiB), or holds a control character
    /// (`why` may hold newlines and tabs).
    fn resolve_manually(
        &self,
        id: &RepairId,
        who: &str,
        why: &str,
    ) -> impl Future<Output = Result<Marked, ReconcileError>> + Send;

    /// The item with this id.
    fn get(
        &self,
        id: &RepairId,
    ) -> impl Future<Output = Result<Option<Item>, ReconcileError>> + Send;

    /// Up to `limit` items, oldest first; only those in `state` if given.
    fn list(
        &self,
        state: Option<ItemState>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Item>, ReconcileError>> + Send;

    /// Open differences by rule, the manual queue, and the oldest open one's age.
    fn stats(&self) -> impl Future<Output = Result<DifferenceStats, ReconcileError>> + Send;

    /// Deletes at most `limit` of the differences repaired or resolved `retention` ago or
    /// more, the longest done first, and returns how many: one batch of a
    /// [`DifferenceSweeper`]. Never an open, claimed or manual one. On PostgreSQL, two batches
    /// at once delete disjoint differences, and neither waits for the other.
    ///
    /// # Errors
    ///
    /// [`ReconcileError::is_unsupported`] from a store that does not implement it (the
    /// default, so that stores written before it still compile): it keeps every difference.
    fn sweep_batch(
        &self,
        retention: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, ReconcileError>> + Send {
        let _ = (retention, limit);
        std::future::ready(Err(ReconcileError::unsupported(
            "sweep repaired and resolved differences",
        )))
    }
}

/// Checks a person's `who` and `why`.
pub(crate) fn check_person(who: &str, why: &str) -> Result<(), ReconcileError> {
    check_text("who", who, MAX_WHO, false).map_err(ReconcileError::invalid)?;
    check_text("why", why, MAX_TEXT, true).map_err(ReconcileError::invalid)
}

/// Reconciliation failed: a source or the store failed, a source broke the key order, a
/// change came with a stale claim, an item does not exist, or a value was refused. Tell them
/// apart with the `is_*` methods; a failure of a source or of the store, or the database's
/// refusal of a value, is its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ReconcileError {
    kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
enum ErrorKind {
    #[error("difference not changed: its claim is stale (another repairer claimed it, or it left the claim)")]
    Stale,
    #[error("no difference {0}")]
    NotFound(RepairId),
    #[error("refused: {why}")]
    Invalid {
        why: String,
        #[source]
        source: Option<BoxError>,
    },
    #[error("source {source_name} failed")]
    Source {
        source_name: String,
        #[source]
        error: BoxError,
    },
    #[error("source {source_name} broke the key order: {why}")]
    Order { source_name: String, why: String },
    #[error("difference store failed")]
    Backend(#[source] BoxError),
    #[error("difference store is full: it holds its capacity of {0} differences")]
    Full(usize),
    #[error("the difference store cannot {0}")]
    Unsupported(&'static str),
}

impl ReconcileError {
    /// A change with a stale claim.
    pub fn stale() -> Self {
        ReconcileError {
            kind: ErrorKind::Stale,
        }
    }

    /// No item with this id.
    pub fn not_found(id: &RepairId) -> Self {
        ReconcileError {
            kind: ErrorKind::NotFound(id.clone()),
        }
    }

    /// A value refused, and why.
    pub fn invalid(why: impl Into<String>) -> Self {
        ReconcileError {
            kind: ErrorKind::Invalid {
                why: why.into(),
                source: None,
            },
        }
    }

    /// A value the store refused (`why`), its refusal the source (the database's error).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn refused(why: &str, source: impl Into<BoxError>) -> Self {
        ReconcileError {
            kind: ErrorKind::Invalid {
                why: why.to_owned(),
                source: Some(source.into()),
            },
        }
    }

    /// The store failed, with this error (the source).
    pub fn backend(error: impl Into<BoxError>) -> Self {
        ReconcileError {
            kind: ErrorKind::Backend(error.into()),
        }
    }

    /// The store does not implement an operation (`what`: "sweep repaired and resolved
    /// differences").
    pub fn unsupported(what: &'static str) -> Self {
        ReconcileError {
            kind: ErrorKind::Unsupported(what),
        }
    }

    /// A source failed, with this error (the source).
    pub fn source_failed(source: &str, error: impl Into<BoxError>) -> Self {
        ReconcileError {
            kind: ErrorKind::Source {
                source_name: source.to_owned(),
                error: error.into(),
            },
        }
    }

    pub(crate) fn order(source: &str, why: impl Into<String>) -> Self {
        ReconcileError {
            kind: ErrorKind::Order {
                source_name: source.to_owned(),
                why: why.into(),
            },
        }
    }

    /// Whether the store failed.
    pub fn is_backend(&self) -> bool {
        matches!(self.kind, ErrorKind::Backend(_))
    }

    /// Whether a change was refused for a stale claim.
    pub fn is_stale(&self) -> bool {
        matches!(self.kind, ErrorKind::Stale)
    }

    /// Whether the item does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self.kind, ErrorKind::NotFound(_))
    }

    /// Whether a value was refused.
    pub fn is_invalid(&self) -> bool {
        matches!(self.kind, ErrorKind::Invalid { .. })
    }

    /// Whether the store does not implement what was asked.
    pub fn is_unsupported(&self) -> bool {
        matches!(self.kind, ErrorKind::Unsupported(_))
    }

    /// Whether a source failed, or broke the key order (its keys were not strictly
    /// ascending, or it returned more than a page).
    pub fn is_source(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Source { .. } | ErrorKind::Order { .. }
        )
    }

    /// A new difference was refused because the store holds its `capacity` of them, in every
    /// state (an in-memory store, [`MemoryDifferences::with_capacity`]): none is dropped to
    /// make room.
    pub fn full(capacity: usize) -> Self {
        ReconcileError {
            kind: ErrorKind::Full(capacity),
        }
    }

    /// Whether a new difference was refused because the store is full ([`full`](Self::full)).
    pub fn is_full(&self) -> bool {
        matches!(self.kind, ErrorKind::Full(_))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_states_are_what_the_queue_needs() {
        crate::queue::check_states::<super::ItemState>();
    }
}
