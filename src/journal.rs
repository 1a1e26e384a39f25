//! The intent journal: a write whose outcome may stay unknown is made durable *before* it is
//! sent, so that a process killed mid-call still leaves its question behind
//! ([`docs::unknowns`](crate::docs::unknowns#a-client-that-dies-mid-call)).
//!
//! The [UNKNOWN ledger][crate::ledger] learns of an unknown call when the call ends. A client
//! process killed while a call is in flight never gets there: the order may have been placed,
//! and nothing says so. For the calls it is told to journal, the
//! [retry layer](crate::retry::RetryLayerBuilder::journal) (and so the
//! [client stack](crate::client::ClientBuilder::journal)) first writes an [`Intent`] (its id,
//! key, operation, semantics, request digest and deadline) to an [`IntentJournal`] and waits
//! for the write; only then does the first attempt go out. When the call ends:
//!
//! * **succeeded or failed** (definitively, a resolver's answer included): the intent is
//!   [ended](IntentJournal::end) and the journal forgets it;
//! * **unknown**: it stays; the ledger's recorder turns it into an open entry with the call's
//!   attempts (one entry per call: both use the call's [`IntentId`]);
//! * **never** (the process died): it stays *in doubt*, invisible to reconcilers for
//!   [`Intent::hold`] (the call's remaining budget and a grace), after which a reconciler takes
//!   it like any unknown call and asks the downstream by key.
//!
//! The ledgers journal: [`LedgerRecorder`][crate::ledger::LedgerRecorder] implements
//! [`IntentJournal`] over any [`Ledger`][crate::ledger::Ledger] (one awaited insert per journaled
//! call; the forgetting is batched off the call's path). A call that is not journaled costs one
//! branch.
//!
//! **Which calls.** With a journal, every call that is not [safe](crate::Semantics::Safe) is
//! journaled; a [`Journaled`] extension decides for one request.
//!
//! **When the journal cannot write**, the call is not sent: it fails with a [`JournalError`]
//! (nothing happened downstream; [`Outcome::Failed`], zero attempts). A journal that answers
//! slowly spends the call's deadline, as any attempt would.
#![cfg_attr(
    not(feature = "durable"),
    doc = crate::docs::links::to_features!(
        "crate::ledger",
        "crate::ledger::LedgerRecorder",
        "crate::ledger::Ledger",
    )
)]

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use http::HeaderName;

use crate::context::Context;
use crate::envelope::Envelope;
use crate::ids::CallId;
use crate::outcome::Outcome;
use crate::semantics::Semantics;

pub use crate::error::JournalError;

/// How long an intent stays in doubt after its call's deadline, so that a reconciler does not
/// ask about a call whose last attempt may still be arriving.
pub const GRACE: Duration = Duration::from_secs(5);

/// How long an intent whose call has no deadline stays in doubt.
pub const HOLD_WITHOUT_DEADLINE: Duration = Duration::from_secs(10 * 60);

/// The longest request digest an intent keeps ([`IntentDigest`]).
const MAX_DIGEST: usize = 256;

/// The header a request's digest is read from when no [`IntentDigest`] is given (RFC 9530).
const CONTENT_DIGEST: HeaderName = HeaderName::from_static("content-digest");

/// An intent's id: 128 bits, written as 32 hex digits. A call's intent and the ledger entry its
/// recorder writes if the call ends unknown share it, so that they are one entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IntentId {
    // Two words, not a `u128`: kept where the retry layer's future keeps its rare state, whose
    // alignment a `u128` would double.
    hi: u64,
    lo: u64,
}

impl IntentId {
    /// A fresh, random id.
    pub fn generate() -> Self {
        Self::from_u128(crate::ids::random_u128())
    }

    /// The id of a call of this process: a random number drawn once per process, and the
    /// call's number. Unique across processes (as a call id alone is not).
    pub(crate) fn for_call(call: CallId) -> Self {
        static PROCESS: OnceLock<u64> = OnceLock::new();
        let process = *PROCESS.get_or_init(|| crate::ids::random_u128() as u64);
        IntentId {
            hi: process,
            lo: call.get(),
        }
    }

    /// The id as a number.
    pub fn get(self) -> u128 {
        (u128::from(self.hi) << 64) | u128::from(self.lo)
    }

    /// The id whose number is `id`.
    pub fn from_u128(id: u128) -> Self {
        IntentId {
            hi: (id >> 64) as u64,
            lo: id as u64,
        }
    }
}

impl fmt::Display for IntentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}{:016x}", self.hi, self.lo)
    }
}

impl fmt::Debug for IntentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What a journaled call means to do, written before its first attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Intent {
    /// Its id, the call's entry id in the ledger.
    pub id: IntentId,
    /// The call's id in the process that made it, when a call record layer is outside.
    pub call: Option<u64>,
    /// The business key, else the idempotency key: what a reconciler asks by.
    pub key: Option<String>,
    /// What the call does: `POST /orders`.
    pub operation: Option<String>,
    /// The request's semantics.
    pub semantics: Semantics,
    /// The request's digest, when the caller gave one ([`IntentDigest`], or a
    /// `Content-Digest` header): what proves that a later request is the same intent. The layers
    /// do not read bodies.
    pub digest: Option<String>,
    /// The call's deadline (wall clock), if it has one.
    pub deadline: Option<SystemTime>,
    /// How long the intent stays in doubt, from when it is written: the call's remaining
    /// budget and a [grace](GRACE), or [`HOLD_WITHOUT_DEADLINE`]. Until then a reconciler
    /// leaves it alone, since the call may still be running.
    pub hold: Duration,
    /// When it was written (wall clock).
    pub started_at: SystemTime,
}

impl Intent {
    /// An intent of your own, for a call the crate's stack does not make: a fresh id, the key
    /// and operation given, not idempotent, no deadline.
    pub fn new(key: impl Into<String>, operation: impl Into<String>) -> Self {
        Intent {
            id: IntentId::generate(),
            call: None,
            key: Some(key.into()),
            operation: Some(operation.into()),
            semantics: Semantics::NonIdempotent,
            digest: None,
            deadline: None,
            hold: HOLD_WITHOUT_DEADLINE,
            started_at: SystemTime::now(),
        }
    }

    /// With this deadline, `left` from now: held for `left` and the [grace](GRACE).
    pub fn with_deadline_in(mut self, left: Duration) -> Self {
        self.deadline = self.started_at.checked_add(left);
        self.hold = left.saturating_add(GRACE);
        self
    }

    /// With this digest.
    pub fn with_digest(mut self, digest: impl Into<String>) -> Self {
        self.digest = Some(digest.into());
        self
    }

    /// The intent of a request about to be sent, in the current call's context.
    fn of_request<Req: Envelope>(req: &Req) -> Self {
        let call = Context::current().call;
        let left = crate::context::budget_left_now();
        let started_at = SystemTime::now();
        Intent {
            id: call.map_or_else(IntentId::generate, IntentId::for_call),
            call: call.map(CallId::get),
            key: crate::evidence::key_of(req).map(|k| k.as_str().to_owned()),
            operation: req.operation().map(|o| o.to_string()),
            semantics: req.semantics(),
            digest: digest_of(req),
            deadline: left.and_then(|left| started_at.checked_add(left)),
            hold: left.map_or(HOLD_WITHOUT_DEADLINE, |left| left.saturating_add(GRACE)),
            started_at,
        }
    }
}

/// The caller's digest of a request, kept only if it is printable and at most 256 bytes.
fn digest_of<Req: Envelope>(req: &Req) -> Option<String> {
    let given = match req.extensions().and_then(|e| e.get::<IntentDigest>()) {
        Some(d) => Some(d.0.to_string()),
        None => req
            .headers()
            .and_then(|h| h.get(CONTENT_DIGEST))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    };
    given.filter(|d| valid_digest(d))
}

fn valid_digest(d: &str) -> bool {
    !d.is_empty() && d.len() <= MAX_DIGEST && d.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// A request's digest for its [`Intent`] (a hash of its body, as the caller computes it):
/// 1 to 256 printable ASCII characters.
///
/// ```
/// use surely::journal::IntentDigest;
///
/// let mut req = http::Request::post("/orders").body(()).unwrap();
/// req.extensions_mut().insert(IntentDigest::new("sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:").unwrap());
/// assert!(IntentDigest::new("two\nlines").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntentDigest(Arc<str>);

impl IntentDigest {
    /// A digest.
    ///
    /// # Errors
    ///
    /// Empty, longer than 256 bytes, or not printable ASCII.
    pub fn new(digest: impl Into<Arc<str>>) -> Result<Self, JournalError> {
        let digest = digest.into();
        if valid_digest(&digest) {
            Ok(IntentDigest(digest))
        } else {
            Err(JournalError::new(format!(
                "a request digest is 1 to {MAX_DIGEST} printable ASCII characters, not {} bytes{}",
                digest.len(),
                if digest.len() <= MAX_DIGEST {
                    " with a control or non-ASCII character"
                } else {
                    ""
                }
            )))
        }
    }

    /// The digest.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether to journal one request, whatever the layer's rule: put it in its extensions.
///
/// ```
/// use surely::journal::Journaled;
///
/// // A read whose answer drives a payment: journal it too.
/// let mut req = http::Request::get("/quotes/q-1").body(()).unwrap();
/// req.extensions_mut().insert(Journaled::Yes);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Journaled {
    /// Journal this request.
    Yes,
    /// Do not.
    No,
}

/// Where intents are written. [`LedgerRecorder`][crate::ledger::LedgerRecorder] implements it
/// over any ledger; implement it for a store of your own.
#[cfg_attr(
    not(feature = "durable"),
    doc = crate::docs::links::to_features!(
        "crate::ledger::LedgerRecorder",
    )
)]
pub trait IntentJournal: Send + Sync + 'static {
    /// Writes the intent durably. The call's first attempt waits for it: return only once a
    /// crash can no longer lose it. Writing the same intent twice must not fail.
    ///
    /// # Errors
    ///
    /// The intent could not be written: the call is not sent.
    fn begin(&self, intent: &Intent) -> impl Future<Output = Result<(), JournalError>> + Send;

    /// The call ended definitively (succeeded or failed, never unknown): the intent may go.
    /// Must not block; a journal that cannot forget it leaves it for a reconciler, which
    /// finds the call's outcome and settles it.
    fn end(&self, id: IntentId, outcome: Outcome);
}

pub(crate) type BeginFuture = Pin<Box<dyn Future<Output = Result<(), JournalError>> + Send>>;

/// A journal as the retry layer keeps it.
#[derive(Clone)]
pub(crate) struct JournalHook(Arc<dyn Erased>);

trait Erased: Send + Sync {
    fn begin(&self, intent: Intent) -> BeginFuture;
    fn end(&self, id: IntentId, outcome: Outcome);
}

struct Hooked<J>(Arc<J>);

impl<J: IntentJournal> Erased for Hooked<J> {
    fn begin(&self, intent: Intent) -> BeginFuture {
        let journal = self.0.clone();
        Box::pin(async move { journal.begin(&intent).await })
    }

    fn end(&self, id: IntentId, outcome: Outcome) {
        self.0.end(id, outcome);
    }
}

impl JournalHook {
    pub(crate) fn new<J: IntentJournal>(journal: J) -> Self {
        JournalHook(Arc::new(Hooked(Arc::new(journal))))
    }

    /// The write of this request's intent, if it is to be journaled.
    pub(crate) fn begin<Req: Envelope>(&self, req: &Req) -> Option<(IntentId, BeginFuture)> {
        let wanted = match req.extensions().and_then(|e| e.get::<Journaled>()) {
            Some(Journaled::Yes) => true,
            Some(Journaled::No) => false,
            None => req.semantics() != Semantics::Safe,
        };
        if !wanted {
            return None;
        }
        let intent = Intent::of_request(req);
        Some((intent.id, self.0.begin(intent)))
    }

    /// The call ended: forgets its intent unless the outcome is unknown.
    pub(crate) fn end(&self, id: IntentId, outcome: Outcome) {
        if outcome != Outcome::Unknown {
            self.0.end(id, outcome);
        }
    }
}

impl fmt::Debug for JournalHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JournalHook")
    }
}
