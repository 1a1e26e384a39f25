//! Where the server layer keeps its records: one async trait, three stores (in memory, on
//! PostgreSQL, on Redis; [`docs::server_states`](crate::docs::server_states#which-store) says
//! which promises what).
//!
//! A record is addressed by a [`RecordKey`] (tenant, operation, key) and moves through four
//! states, each move one **atomic** store operation (never a read followed by a write). The
//! [`docs::server_states`](crate::docs::server_states) chapter tells the same states from the
//! caller's side; this is the store's:
//!
//! ```text
//!              acquire (new key)          complete(fence)
//!   (absent) ──────────────────► PROCESSING ──────────────► COMPLETED ──(retention)──► expired
//!                                 │ │ ▲  │ ▲                    ▲                           │
//!             release(fence) ◄────┘ │ │  │ └ checkpoint(fence)  │ complete(fence)           │
//!                 │                 │ │  └── lease passed: acquire takes over, fence + 1   │
//!                 │ mark_unknown(fence) │                       │                           │
//!                 │                 ▼ │                         │    sweep(keep_expired_for)│
//!                 │               UNKNOWN ──────────────────────┘                           │
//!                 │                 │ release(fence): it did not happen                     │
//!                 ▼                 ▼                                                       │
//!             RELEASED ───acquire───┘                          (absent) ◄───────────────────┘
//! ```
//!
//! * [`acquire`](IdempotencyStore::acquire) inserts the record if absent, or takes over a
//!   `RELEASED` record or a `PROCESSING` one whose lease has passed, raising its **fence** (the
//!   fencing token) by one; otherwise it reports what is there: still in flight, completed (the
//!   stored response), a different request digest, or expired. A takeover of a `PROCESSING`
//!   record says so ([`Acquire::TakenOver`]), with how long the record was held past its lease:
//!   the server layer reports it as a
//!   [`LeaseTakeover`](crate::record::ServerEventKind::LeaseTakeover).
//! * [`complete`](IdempotencyStore::complete) stores the response, only if the caller's fence is
//!   still the record's and the record is `PROCESSING`: a stale owner, whose lease passed and
//!   whose record was taken over, is refused ([`StoreError::is_stale`]).
//! * [`release`](IdempotencyStore::release) marks a record not processed, with the same fence
//!   check, so that the next request with the key runs. The record is kept (not deleted) so that
//!   its fence keeps rising: a stale owner can never complete a record that was released and
//!   acquired again.
//! * [`checkpoint`](IdempotencyStore::checkpoint) adds a step to a `PROCESSING` record, with
//!   the same fence check; a takeover keeps the record's checkpoints and hands them to the new
//!   owner ([`Acquire::TakenOver`]), and a release drops them.
//! * [`mark_unknown`](IdempotencyStore::mark_unknown) turns a `PROCESSING` record `UNKNOWN`,
//!   with its evidence, under the same fence check: its work may have taken effect, so no
//!   request runs it again ([`Acquire::Unknown`]) until [`complete`](IdempotencyStore::complete)
//!   (it happened: this is the answer) or [`release`](IdempotencyStore::release) (it did not)
//!   settles it with that fence. [`unknowns`](IdempotencyStore::unknowns) lists them.
//! * [`take_abandoned`](IdempotencyStore::take_abandoned) takes over, with no request, the
//!   `PROCESSING` records whose lease passed (their owner died with its client), each as
//!   `acquire` would (fence + 1, a new lease, its checkpoints kept), oldest lease first, never
//!   one record for two callers: the layer's
//!   [recovery round](crate::server::idempotency::IdempotencyLayer::recover_abandoned) then
//!   completes, releases or marks each one unknown.
//! * [`sweep`](IdempotencyStore::sweep) deletes terminal records (completed or released) whose
//!   retention ended more than `keep_expired_for` ago; never a `PROCESSING` or `UNKNOWN` one. Between the end
//!   of retention and the sweep, a request with the key gets [`Acquire::Expired`], an explicit
//!   error rather than a new resource; after the sweep the key is forgotten.
//!
//! # Why `impl Future` in the trait, not boxed futures
//!
//! The trait's methods return `impl Future + Send` (return-position `impl Trait` in traits,
//! stable since Rust 1.75). The in-memory store answers every call without waiting, so its
//! futures are ready values that cost no allocation: the hot path of an embedded server stays
//! allocation-free in the store. The price is that the trait is not dyn-compatible: a server that
//! picks its store at run time wraps the choice in an enum, or in a small `Box<dyn>` adapter of
//! its own. Boxed futures would have made every call on the memory store allocate, for a
//! flexibility that a server, which chooses its store once at start-up, rarely needs.
//!
//! Stores are shared by reference: `Arc<S>` is a store when `S` is, and every built-in store is a
//! cheap handle already (clones share the same records).

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use sha2::{Digest as _, Sha256};

use crate::classify::BoxError;

mod checkpoint;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;

pub(crate) use self::checkpoint::latest;
pub use self::checkpoint::{Checkpoint, InvalidCheckpoint, UnknownRecord};

pub use self::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::POSTGRES_COMPONENT;
#[cfg(feature = "postgres")]
pub use self::postgres::{HandlerTransaction, KeyedTransaction, PostgresStore, TransactionClient};
#[cfg(feature = "redis")]
pub use self::redis::RedisStore;
/// The PostgreSQL pool and driver that [`PostgresStore`] is built on, re-exported so that a
/// handler uses the same versions.
#[cfg(feature = "postgres")]
pub use {deadpool_postgres, tokio_postgres};

pub use crate::ids::{Fence, RecordKey};

/// The SHA-256 digest of a request's body: what tells a repeat of a request from another request
/// that reuses its key. Stable across processes and versions, as a shared store needs.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestDigest([u8; 32]);

impl RequestDigest {
    /// The digest of `body`.
    ///
    /// ```
    /// use surely::server::store::RequestDigest;
    /// assert_eq!(RequestDigest::of(b"o-1"), RequestDigest::of(b"o-1"));
    /// assert_ne!(RequestDigest::of(b"o-1"), RequestDigest::of(b"o-2"));
    /// ```
    pub fn of(body: &[u8]) -> Self {
        RequestDigest(Sha256::digest(body).into())
    }

    /// A digest computed elsewhere.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        RequestDigest(bytes)
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for RequestDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RequestDigest(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..)")
    }
}

/// A response as a store keeps it, to replay. Two forms, two different promises (see
/// [`docs::server_states`](crate::docs::server_states#what-is-stored)):
///
/// * **the full response** ([`new`](Self::new)): status, the headers worth replaying, and the
///   body, replayed byte for byte: a duplicate gets exactly what the first request got;
/// * **a reference** ([`reference`](Self::reference)): the status, the resource the request
///   made (`orders/o-1`) and a stable result code (`created`), and no body; a duplicate gets an
///   answer rebuilt from the resource as it is now, by the layer's
///   [rebuild hook](crate::server::idempotency::IdempotencyLayerBuilder::rebuild). Smaller, and
///   nothing the client sent or got lingers in the store; the replay shows the resource's
///   current state, not the first answer.
///
/// A handler that stores its own answer
/// ([`PostgresStore::complete_in`][crate::server::store::PostgresStore::complete_in]) stores
/// the response it returns, exactly: [`buffer`](Self::buffer) takes that response (an axum
/// handler's `into_response()`, with the `content-type` its `Json` or `String` set), and gives
/// back the answer to store and the same response to return. Built by hand with
/// [`new`](Self::new), the headers are whatever map it is given: an empty one stores an answer
/// without the `content-type` the framework gave the first, and every replay of the key lacks
/// it (the layer warns of such a difference: see
/// [`StoredAnswerDiffers`](crate::record::ServerEventKind::StoredAnswerDiffers)).
///
/// [`new`](Self::new) drops the headers that describe one connection or one moment rather than
/// the result: `connection`, `keep-alive`, `transfer-encoding`, `content-length` (the replay sets
/// its own), `date`, `set-cookie` (a session belongs to the response that made it), and the
/// crate's own replay and not-processed markers. Clones share the bytes.
///
/// The body a store is given may be encoded by the layer (compressed, sealed: see
/// [`flags`](Self::flags)); a store keeps the bytes and the flags as they are.
///
/// ```
/// use surely::server::store::StoredResponse;
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("location", "/orders/o-1".parse().unwrap());
/// headers.insert("date", "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap());
/// let stored = StoredResponse::new(http::StatusCode::CREATED, &headers, "o-1".into());
/// assert_eq!(stored.headers().len(), 1);
/// assert_eq!(stored.body(), "o-1");
///
/// let by_reference = StoredResponse::reference(http::StatusCode::CREATED, "orders/o-1", "created");
/// assert_eq!(by_reference.resource(), Some("orders/o-1"));
/// assert_eq!(by_reference.result_code(), Some("created"));
/// assert!(by_reference.body().is_empty());
/// ```
#[cfg_attr(
    not(all(feature = "server", feature = "postgres")),
    doc = crate::docs::links::to_features!("crate::server::store::PostgresStore::complete_in")
)]
#[derive(Clone)]
pub struct StoredResponse(Arc<Stored>);

struct Stored {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    /// The resource and result code of a reference; `None` for a full response.
    reference: Option<(Box<str>, Box<str>)>,
    flags: u8,
}

/// Headers never stored for a replay.
pub(crate) fn replayable(name: &HeaderName) -> bool {
    use http::header;
    !(name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::CONTENT_LENGTH
        || name == header::DATE
        || name == header::SET_COOKIE
        || name == header::TE
        || name == header::TRAILER
        || name == header::UPGRADE
        || name.as_str() == "keep-alive"
        || name == crate::headers::IDEMPOTENT_REPLAYED
        || name == crate::headers::NOT_PROCESSED)
}

/// The bits of [`StoredResponse::flags`].
pub(crate) mod flag {
    /// The body is deflate-compressed.
    pub(crate) const COMPRESSED: u8 = 1;
    /// The body is sealed (encrypted) by the layer's seal.
    pub(crate) const SEALED: u8 = 2;
    /// The body was over the stored-size limit and is not kept.
    pub(crate) const OMITTED: u8 = 4;
    /// Every bit this version knows.
    pub(crate) const KNOWN: u8 = COMPRESSED | SEALED | OMITTED;
}

impl StoredResponse {
    /// The full response to store: `status`, the replayable ones of `headers`, and `body`.
    pub fn new(status: StatusCode, headers: &HeaderMap, body: Bytes) -> Self {
        Self::encoded(status, headers, body, 0, &[])
    }

    /// The response `res` as it is sent, to store, and `res` itself to send: its status, its
    /// headers (the replayable ones, as [`new`](Self::new) keeps them) and its whole body, read
    /// into memory (the layer reads the handler's answer whole anyway, to store it). Its
    /// trailers, if any, are neither stored nor returned, as the layer keeps none.
    ///
    /// For a handler that stores its own answer
    /// ([`PostgresStore::complete_in`][crate::server::store::PostgresStore::complete_in]): build
    /// the response as the handler returns it, store the first half, return the second. The
    /// answer stored is then the answer sent, headers included, however the response was made.
    ///
    /// ```
    /// use axum::response::IntoResponse;
    /// use surely::server::store::StoredResponse;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// // axum's `String` answer sets `content-type: text/plain; charset=utf-8`.
    /// let res = (http::StatusCode::CREATED, String::from("o-1")).into_response();
    /// let (stored, res) = StoredResponse::buffer(res).await.unwrap();
    /// assert_eq!(stored.status(), 201);
    /// assert_eq!(stored.headers()["content-type"], "text/plain; charset=utf-8");
    /// assert_eq!(stored.body(), "o-1");
    /// assert_eq!(res.headers()["content-type"], "text/plain; charset=utf-8");
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The body's own error, if reading it failed: nothing is stored, and the handler answers
    /// as it would for any failure before its commit.
    #[cfg_attr(
        not(all(feature = "server", feature = "postgres")),
        doc = crate::docs::links::to_features!("crate::server::store::PostgresStore::complete_in")
    )]
    pub async fn buffer<B>(
        res: http::Response<B>,
    ) -> Result<(StoredResponse, http::Response<http_body_util::Full<Bytes>>), B::Error>
    where
        B: http_body::Body,
    {
        use http_body_util::BodyExt as _;
        let (head, body) = res.into_parts();
        let body = body.collect().await?.to_bytes();
        let stored = StoredResponse::new(head.status, &head.headers, body.clone());
        Ok((
            stored,
            http::Response::from_parts(head, http_body_util::Full::new(body)),
        ))
    }

    /// As [`new`](Self::new), with the body encoded as `flags` say, and also leaving out the
    /// headers named in `never`.
    pub(crate) fn encoded(
        status: StatusCode,
        headers: &HeaderMap,
        body: Bytes,
        flags: u8,
        never: &[HeaderName],
    ) -> Self {
        let mut kept = HeaderMap::with_capacity(headers.len());
        for (name, value) in headers {
            if replayable(name) && !never.contains(name) {
                kept.append(name.clone(), value.clone());
            }
        }
        StoredResponse(Arc::new(Stored {
            status,
            headers: kept,
            body,
            reference: None,
            flags,
        }))
    }

    /// A reference to store: the `status`, the `resource` the request made and a stable
    /// `result_code`, with no headers and no body; the replay is rebuilt from the resource.
    pub fn reference(
        status: StatusCode,
        resource: impl Into<Box<str>>,
        result_code: impl Into<Box<str>>,
    ) -> Self {
        StoredResponse(Arc::new(Stored {
            status,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            reference: Some((resource.into(), result_code.into())),
            flags: 0,
        }))
    }

    /// From parts a store read back: `(name, value)` pairs that are not valid header names or
    /// values are skipped.
    pub fn from_parts<'a>(
        status: StatusCode,
        headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
        body: Bytes,
    ) -> Self {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) {
                map.append(name, value);
            }
        }
        StoredResponse::new(status, &map, body)
    }

    /// The same response with `flags` as a store read them back ([`flags`](Self::flags));
    /// bits this version does not know are kept, and make the replay fail rather than send
    /// bytes it cannot read.
    pub fn with_flags(self, flags: u8) -> Self {
        self.map(|s| s.flags = flags)
    }

    fn map(self, f: impl FnOnce(&mut Stored)) -> Self {
        let mut stored = Arc::try_unwrap(self.0).unwrap_or_else(|shared| Stored {
            status: shared.status,
            headers: shared.headers.clone(),
            body: shared.body.clone(),
            reference: shared.reference.clone(),
            flags: shared.flags,
        });
        f(&mut stored);
        StoredResponse(Arc::new(stored))
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.0.status
    }

    /// The stored headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.0.headers
    }

    /// The body, as stored (encoded when [`flags`](Self::flags) say so).
    pub fn body(&self) -> &Bytes {
        &self.0.body
    }

    /// The resource of a reference ([`reference`](Self::reference)); `None` for a full response.
    pub fn resource(&self) -> Option<&str> {
        self.0.reference.as_ref().map(|(r, _)| &**r)
    }

    /// The result code of a reference; `None` for a full response.
    pub fn result_code(&self) -> Option<&str> {
        self.0.reference.as_ref().map(|(_, c)| &**c)
    }

    /// How the layer encoded the body (compressed, sealed, left out for its size), as bits
    /// that a store keeps as they are, beside the body. Zero for a body stored as it came.
    pub fn flags(&self) -> u8 {
        self.0.flags
    }
}

impl fmt::Debug for StoredResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredResponse")
            .field("status", &self.0.status)
            .field("headers", &self.0.headers)
            .field("body_len", &self.0.body.len())
            .field("reference", &self.0.reference)
            .field("flags", &self.0.flags)
            .finish()
    }
}

/// What [`IdempotencyStore::acquire`] found.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Acquire {
    /// The caller owns the record now (a new key, or a released record), with this fence. It
    /// should run the request and then complete or release.
    Owner(Fence),
    /// The caller owns the record now, with this fence, taken over from an owner whose lease
    /// passed while the record was still `PROCESSING` (that owner crashed, hung, or ran past
    /// its lease). It runs the request as an [`Owner`](Self::Owner) does.
    ///
    /// The record keeps its checkpoints: the server layer hands them to its
    /// [recovery hook](crate::server::idempotency::IdempotencyLayerBuilder::recover) before the
    /// handler may run again.
    ///
    /// A store of your own may report a takeover as a plain `Owner` only for a record without
    /// checkpoints; the server layer then reports no
    /// [`LeaseTakeover`](crate::record::ServerEventKind::LeaseTakeover).
    TakenOver {
        /// The new owner's fence.
        fence: Fence,
        /// How long the record had been held past its lease when it was taken over.
        overdue: Duration,
        /// How long ago the previous owner acquired it.
        age: Duration,
        /// The steps the previous owners recorded, oldest first.
        checkpoints: Vec<Checkpoint>,
    },
    /// Another owner holds an unexpired lease: try again after `retry_after` (the lease's
    /// remaining time).
    InFlight {
        /// The time left on the owner's lease.
        retry_after: Duration,
    },
    /// The record is completed: replay this response.
    Completed(StoredResponse),
    /// The record belongs to a request with a different digest: the key was reused for another
    /// request.
    Mismatch,
    /// The record's retention has ended; the stored response is no longer replayed, and the key
    /// may not be used again until the record is swept.
    Expired,
    /// The record's outcome is unknown (`UNKNOWN`): an owner's work may have taken effect, and
    /// nobody has settled it yet. Nothing runs the request until it is settled.
    Unknown {
        /// Why, as the owner wrote it.
        evidence: String,
    },
}

impl Acquire {
    /// The caller's fence, if it became the owner ([`Owner`](Self::Owner) or
    /// [`TakenOver`](Self::TakenOver)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::server::store::{Acquire, Fence};
    ///
    /// let taken = Acquire::TakenOver {
    ///     fence: Fence::new(2),
    ///     overdue: Duration::from_secs(3),
    ///     age: Duration::from_secs(33),
    ///     checkpoints: Vec::new(),
    /// };
    /// assert_eq!(taken.fence(), Some(Fence::new(2)));
    /// assert_eq!(Acquire::Mismatch.fence(), None);
    /// ```
    pub fn fence(&self) -> Option<Fence> {
        match self {
            Acquire::Owner(fence) | Acquire::TakenOver { fence, .. } => Some(*fence),
            _ => None,
        }
    }
}

/// A boxed future, as a claim in the handler's transaction hands them to the layer.
pub(crate) type BoxFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What opening a claim in the handler's transaction found: the record's answer (a replay, a key
/// in flight, another body...), or the claim.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum Opened {
    /// The key is not the caller's to run: answer as for [`Acquire`] (never an owner).
    Found(Acquire),
    /// The caller holds the key in an open transaction that the handler joins.
    Claimed(Box<dyn Claim>),
}

/// A key held in an open transaction: the handler writes in it ([`attach`](Claim::attach)),
/// then the layer commits it with the stored answer, or rolls it back. Dropped without either,
/// the transaction is abandoned (the connection closed): nothing of it commits.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) trait Claim: Send {
    /// The fence the record commits with.
    fn fence(&self) -> Fence;
    /// Puts the transaction's handle into the handler's request.
    fn attach(&self, extensions: &mut http::Extensions);
    /// Writes the completed record with `stored` and commits, the handler's writes with it.
    fn commit<'a>(
        self: Box<Self>,
        stored: &'a StoredResponse,
        retention: Duration,
    ) -> BoxFuture<'a, Result<(), CommitError>>;
    /// Rolls back: nothing the handler wrote commits, and the key is free.
    fn rollback(self: Box<Self>) -> BoxFuture<'static, Result<(), StoreError>>;
}

/// Why a claim's commit failed.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum CommitError {
    /// The database refused it (or it never reached the commit): nothing committed.
    NotCommitted(StoreError),
    /// The connection failed with the commit sent: it may have committed, record and all.
    Unknown(StoreError),
}

/// A store operation failed: the backend failed, refused what the request brought, or a
/// completion or release came with a stale fence. [`is_stale`](Self::is_stale),
/// [`is_backend`](Self::is_backend) and [`is_rejected`](Self::is_rejected) tell them apart.
///
/// Its message says what failed; the cause (the driver's error, the value that did not
/// decode) is its [`source`](std::error::Error::source), once, so that an error-chain
/// printer shows each cause once.
///
/// ```
/// use std::error::Error as _;
/// use surely::server::store::StoreError;
///
/// let err = StoreError::backend("connection refused");
/// assert!(err.is_backend());
/// assert_eq!(err.to_string(), "idempotency store failed");
/// assert_eq!(err.source().unwrap().to_string(), "connection refused");
/// assert!(StoreError::stale().source().is_none());
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
}

#[derive(Debug)]
enum StoreErrorKind {
    Stale,
    Backend(BoxError),
    Rejected(BoxError),
    Full(usize),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            StoreErrorKind::Stale => {
                "idempotency record not updated: the fence is stale or the record is not processing"
            }
            StoreErrorKind::Backend(_) => "idempotency store failed",
            StoreErrorKind::Rejected(_) => "idempotency store refused the request's own content",
            StoreErrorKind::Full(capacity) => {
                return write!(
                    f,
                    "idempotency store is full: it holds its capacity of {capacity} records"
                );
            }
        })
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            StoreErrorKind::Stale | StoreErrorKind::Full(_) => None,
            StoreErrorKind::Backend(e) | StoreErrorKind::Rejected(e) => Some(&**e),
        }
    }
}

impl StoreError {
    /// A completion or release was refused: the record was taken over (its fence is higher), or
    /// is no longer `PROCESSING`.
    pub fn stale() -> Self {
        StoreError {
            kind: StoreErrorKind::Stale,
        }
    }

    /// The backend failed (connection, query, pool).
    pub fn backend(error: impl Into<BoxError>) -> Self {
        StoreError {
            kind: StoreErrorKind::Backend(error.into()),
        }
    }

    /// Whether the operation was refused for a stale fence.
    pub fn is_stale(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Stale)
    }

    /// The backend refused what the request itself brought (a value its limits or types do
    /// not take): retrying the same request would fail the same way, so it is the client's
    /// error, never a server's.
    pub fn rejected(error: impl Into<BoxError>) -> Self {
        StoreError {
            kind: StoreErrorKind::Rejected(error.into()),
        }
    }

    /// Whether the backend failed.
    pub fn is_backend(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Backend(_))
    }

    /// Whether the backend refused the request's own content ([`rejected`](Self::rejected)).
    pub fn is_rejected(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Rejected(_))
    }

    /// A new key was refused because the store holds its `capacity` of records (an in-memory
    /// store, [`MemoryStore::with_capacity`]). The store forgets no record to make room: a
    /// `PROCESSING` or `UNKNOWN` record lost would let a duplicate run again. Room comes back
    /// as a sweep deletes expired records; the layer answers the request `503 Service
    /// Unavailable` with `Retry-After`, not processed, as for a store that is down.
    pub fn full(capacity: usize) -> Self {
        StoreError {
            kind: StoreErrorKind::Full(capacity),
        }
    }

    /// Whether a new key was refused because the store is full ([`full`](Self::full)).
    pub fn is_full(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Full(_))
    }
}

/// A duration a store of the crate was given, at most [`MAX_DURATION`](crate::MAX_DURATION):
/// see [`IdempotencyStore`]'s "Durations".
fn bounded(d: Duration) -> Duration {
    d.min(crate::MAX_DURATION)
}

/// An idempotency store. See the [module docs](self) for the states and why every method is one
/// atomic operation.
///
/// # Durations
///
/// The stores of this crate count a lease, a retention, a sweep's `keep_expired_for` or a
/// `stuck` threshold over [`MAX_DURATION`](crate::MAX_DURATION) (ten years) as ten years: the
/// [`IdempotencyLayer`](crate::server::idempotency::IdempotencyLayer) never gives them more
/// (its builder refuses it), and a caller of its own that does gets neither a panic nor a
/// database's error for it.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// The store's kind in a [review](crate::review) (`memory`, `postgres`, `redis`); the
    /// default is `custom`.
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Becomes the owner of `key`'s record, atomically, or reports what is there.
    ///
    /// A new record, or a taken-over one, gets a lease of `lease` from the store's clock.
    fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> impl Future<Output = Result<Acquire, StoreError>> + Send;

    /// Stores `response` in the record owned with `fence`, and keeps it for `retention`.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_stale`] if `fence` is no longer the record's, or the record is not
    /// `PROCESSING` or `UNKNOWN` (settling an unknown record with the fence that made it so).
    fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks the record owned with `fence` not processed: the next request with the key runs.
    /// Its checkpoints are dropped with it. Settles an `UNKNOWN` record with its fence too
    /// (nothing happened, after all).
    ///
    /// # Errors
    ///
    /// As for [`complete`](Self::complete).
    fn release(
        &self,
        key: &RecordKey,
        fence: Fence,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Extends the lease of the record owned with `fence` to `lease` from the store's clock, for
    /// an owner whose handler is still running. The owner keeps the record even if its lease
    /// had passed, as long as no other request took over.
    ///
    /// # Errors
    ///
    /// As for [`complete`](Self::complete): [`StoreError::is_stale`] once another request took
    /// the record over (or it is no longer `PROCESSING`).
    fn renew(
        &self,
        key: &RecordKey,
        fence: Fence,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Adds `checkpoint` to the record owned with `fence`, after the ones it has.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_stale`] as for [`renew`](Self::renew); [`StoreError::is_rejected`] if the
    /// record holds 16 checkpoints already.
    fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks the record owned with `fence` `UNKNOWN`, with `evidence`: its work may have taken
    /// effect, and nothing may run it again until it is settled ([`complete`](Self::complete)
    /// or [`release`](Self::release) with the same fence).
    ///
    /// # Errors
    ///
    /// As for [`renew`](Self::renew).
    fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The `UNKNOWN` records, oldest first, at most `limit`: the server's queue of outcomes to
    /// settle.
    fn unknowns(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<UnknownRecord>, StoreError>> + Send;

    /// The completed and released records whose retention ended `keep_expired_for` ago or
    /// more, at most `limit`, oldest first: what [`sweep`](Self::sweep) would delete, for an
    /// archive to keep before [`forget`](Self::forget) deletes them.
    fn expired(
        &self,
        keep_expired_for: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ExpiredRecord>, StoreError>> + Send;

    /// Deletes `records`, each only if it is still terminal with the same fence (a released
    /// record acquired again since it was listed is kept), and returns how many.
    fn forget(
        &self,
        records: &[ExpiredRecord],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes the completed and released records whose retention ended `keep_expired_for` ago
    /// or more, and returns how many. Never deletes a `PROCESSING` or `UNKNOWN` record.
    fn sweep(
        &self,
        keep_expired_for: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The records still `PROCESSING` whose owner acquired them `older_than` ago or more (a
    /// renewal does not make a record younger), oldest first, at most `limit`: owners that
    /// crashed, hang, or are slower than anyone planned for. See [`report_stuck`].
    fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StuckRecord>, StoreError>> + Send;

    /// What the store holds for `key`, or `None` if it holds nothing: for support tools and
    /// operators ("what became of this key?"), never for deciding a request (the layer decides
    /// with one atomic move per step; a view is old once it is read).
    ///
    /// The stores of this crate read it in one step (one statement, one script). The default,
    /// for a store of your own that does not read single records, is an error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::idempotency::IdempotencyKey;
    /// use surely::server::store::{
    ///     IdempotencyStore, MemoryStore, RecordKey, RecordState, RequestDigest,
    /// };
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let store = MemoryStore::new();
    /// let key = RecordKey::new("", "POST /orders", IdempotencyKey::new("k-1").unwrap());
    /// assert!(store.inspect(&key).await.unwrap().is_none());
    /// store.acquire(&key, &RequestDigest::of(b"{}"), Duration::from_secs(30)).await.unwrap();
    /// let view = store.inspect(&key).await.unwrap().unwrap();
    /// assert_eq!(view.fence.get(), 1);
    /// assert!(matches!(view.state, RecordState::Processing { lease_left } if lease_left > Duration::ZERO));
    /// # }
    /// ```
    fn inspect(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<RecordView>, StoreError>> + Send {
        let _ = key;
        std::future::ready(Err(StoreError::backend(
            "this idempotency store does not read single records",
        )))
    }

    /// Takes over, in one atomic move, up to `limit` **abandoned** records: `PROCESSING`, with
    /// their owner's lease passed `overdue_by` ago or more (the owner and its client died
    /// together, and no request with the key came to take it over in that time). Each gets its fence plus one and a new lease of
    /// `lease` from the store's clock, as a takeover by a request does (a late owner is then
    /// refused as stale), and keeps its checkpoints. The oldest leases go first; the facts of
    /// each record taken come back ([`AbandonedRecord`]), for the
    /// [recovery round](crate::server::idempotency::IdempotencyLayer::recover_abandoned) to
    /// decide what became of its work.
    ///
    /// Two calls at once, on one instance or two, never take the same record: each record
    /// taken is the caller's alone, under its new fence, until that lease passes. A record
    /// whose lease has not passed, and one in any other state, is left alone.
    ///
    /// The default, for a store of your own that does not find abandoned records, is an error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::idempotency::IdempotencyKey;
    /// use surely::server::store::{IdempotencyStore, MemoryStore, RecordKey, RequestDigest};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let store = MemoryStore::new();
    /// let key = RecordKey::new("", "POST /orders", IdempotencyKey::new("k-1").unwrap());
    /// store.acquire(&key, &RequestDigest::of(b"{}"), Duration::from_secs(30)).await.unwrap();
    /// // The owner dies with its client: nobody sends the key again.
    /// let lease = Duration::from_secs(30);
    /// assert!(store.take_abandoned(Duration::ZERO, lease, 10).await.unwrap().is_empty());
    /// tokio::time::advance(Duration::from_secs(31)).await;
    /// let taken = store.take_abandoned(Duration::ZERO, lease, 10).await.unwrap();
    /// assert_eq!(taken.len(), 1);
    /// assert_eq!(taken[0].fence.get(), 2);
    /// assert_eq!(taken[0].overdue, Duration::from_secs(1));
    /// // Taken: the next round finds nothing until the new lease passes.
    /// assert!(store.take_abandoned(Duration::ZERO, lease, 10).await.unwrap().is_empty());
    /// # }
    /// ```
    fn take_abandoned(
        &self,
        overdue_by: Duration,
        lease: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AbandonedRecord>, StoreError>> + Send {
        let _ = (overdue_by, lease, limit);
        std::future::ready(Err(StoreError::backend(
            "this idempotency store does not recover abandoned records",
        )))
    }
}

/// A `PROCESSING` record whose owner's lease had passed, as
/// [`IdempotencyStore::take_abandoned`] took it over: what a recovery without a request knows
/// of it. There is no request: its body is gone with its client, only its digest is kept.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AbandonedRecord {
    /// Its scope: tenant, operation, key.
    pub key: RecordKey,
    /// The fence it was taken with (the previous owner's, plus one): what settles it.
    pub fence: Fence,
    /// How long ago the previous owner acquired it.
    pub age: Duration,
    /// How long it had been held past its lease when it was taken.
    pub overdue: Duration,
    /// The digest of the body the key was used with.
    pub digest: RequestDigest,
    /// The steps its owners recorded, oldest first.
    pub checkpoints: Vec<Checkpoint>,
}

impl AbandonedRecord {
    /// An abandoned record; for stores of your own.
    pub fn new(
        key: RecordKey,
        fence: Fence,
        age: Duration,
        overdue: Duration,
        digest: RequestDigest,
        checkpoints: Vec<Checkpoint>,
    ) -> Self {
        AbandonedRecord {
            key,
            fence,
            age,
            overdue,
            digest,
            checkpoints,
        }
    }

    /// The latest value its owners recorded under `name`.
    pub fn checkpoint(&self, name: &str) -> Option<&str> {
        latest(&self.checkpoints, name)
    }
}

/// What a store holds for one key, as [`IdempotencyStore::inspect`] read it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RecordView {
    /// Where the record stands.
    pub state: RecordState,
    /// Its fence: how many owners it has had.
    pub fence: Fence,
    /// The digest of the body the key was used with.
    pub digest: RequestDigest,
    /// The steps its owners recorded, oldest first.
    pub checkpoints: Vec<Checkpoint>,
}

impl RecordView {
    /// A view (for a store of your own).
    pub fn new(
        state: RecordState,
        fence: Fence,
        digest: RequestDigest,
        checkpoints: Vec<Checkpoint>,
    ) -> Self {
        RecordView {
            state,
            fence,
            digest,
            checkpoints,
        }
    }
}

/// Where a record stands ([`RecordView`]); the chapter `docs::server_states` tells what a
/// request with the key gets in each.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum RecordState {
    /// An owner holds it. `lease_left` is zero once the lease has passed: the next request takes
    /// it over.
    Processing {
        /// The time left on the owner's lease.
        lease_left: Duration,
    },
    /// Completed, with the answer replayed; `expired` once its retention has ended (a request
    /// with the key then gets `410`).
    Completed {
        /// The answer stored.
        response: StoredResponse,
        /// Whether its retention has ended.
        expired: bool,
    },
    /// Released: the next request with the key runs.
    Released,
    /// `UNKNOWN`: an owner's work may have taken effect; nothing runs until it is settled.
    Unknown {
        /// Why, as the owner wrote it.
        evidence: String,
    },
}

/// A terminal record (completed or released) whose retention has ended, as
/// [`IdempotencyStore::expired`] lists it for an archive before the sweeper deletes it: its key,
/// and the ids that tie it to the outside world (the resource it made, the external requests
/// its owners recorded), so that an audit keeps the mapping after the record is gone.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ExpiredRecord {
    /// Its scope: tenant, operation, key.
    pub key: RecordKey,
    /// Its last owner's fence: the sweep deletes it only if that is still its fence.
    pub fence: Fence,
    /// The stored status; `None` for a released record.
    pub status: Option<StatusCode>,
    /// The resource of a response stored as a reference.
    pub resource: Option<String>,
    /// The steps its owners recorded (external request ids), oldest first.
    pub checkpoints: Vec<Checkpoint>,
}

impl ExpiredRecord {
    /// An expired record; for stores of your own.
    pub fn new(
        key: RecordKey,
        fence: Fence,
        status: Option<StatusCode>,
        resource: Option<String>,
        checkpoints: Vec<Checkpoint>,
    ) -> Self {
        ExpiredRecord {
            key,
            fence,
            status,
            resource,
            checkpoints,
        }
    }
}

/// A record found `PROCESSING` for longer than a threshold by [`IdempotencyStore::stuck`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StuckRecord {
    /// Its scope: tenant, operation, key.
    pub key: RecordKey,
    /// Its owner: the fence the owner holds.
    pub fence: Fence,
    /// How long ago the owner acquired it.
    pub age: Duration,
}

impl StuckRecord {
    /// A stuck record; for stores of your own.
    pub fn new(key: RecordKey, fence: Fence, age: Duration) -> Self {
        StuckRecord { key, fence, age }
    }
}

/// Reports the records that have been `PROCESSING` for `older_than` or more (at most 100, the
/// oldest first): a `tracing` warning for each, with its tenant, operation, key, owner's fence and
/// age, and the records themselves for an operator or a job to act on.
///
/// Run it on a schedule beside the [sweeper](IdempotencyStore::sweep), with a threshold well
/// over the longest a handler should take: a record still processing then is an owner that
/// crashed or hangs (its key answers `409` until the lease passes), or a handler slower than
/// anyone planned for. Nothing here changes the record: a takeover is still the next request's,
/// after the lease.
///
/// ```
/// use std::time::Duration;
/// use surely::server::store::{report_stuck, IdempotencyStore, MemoryStore, RecordKey, RequestDigest};
/// use surely::idempotency::IdempotencyKey;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let store = MemoryStore::new();
/// let key = RecordKey::new("acme", "POST /payments", IdempotencyKey::new("pay-1").unwrap());
/// store.acquire(&key, &RequestDigest::of(b"42"), Duration::from_secs(30)).await.unwrap();
///
/// tokio::time::advance(Duration::from_secs(600)).await;
/// let stuck = report_stuck(&store, Duration::from_secs(300)).await.unwrap();
/// assert_eq!(stuck.len(), 1);
/// assert_eq!(stuck[0].key.operation(), "POST /payments");
/// assert_eq!(stuck[0].fence.get(), 1);
/// # }
/// ```
pub async fn report_stuck<St: IdempotencyStore>(
    store: &St,
    older_than: Duration,
) -> Result<Vec<StuckRecord>, StoreError> {
    let stuck = store.stuck(older_than, 100).await?;
    for s in &stuck {
        tracing::warn!(
            tenant = s.key.tenant(),
            operation = s.key.operation(),
            key = s.key.key().as_str(),
            fence = s.fence.get(),
            age_secs = s.age.as_secs(),
            "idempotency record still processing after {:?}",
            s.age
        );
    }
    Ok(stuck)
}

impl<S: IdempotencyStore> IdempotencyStore for Arc<S> {
    fn kind(&self) -> &'static str {
        (**self).kind()
    }

    fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> impl Future<Output = Result<Acquire, StoreError>> + Send {
        (**self).acquire(key, digest, lease)
    }

    fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).complete(key, fence, response, retention)
    }

    fn release(
        &self,
        key: &RecordKey,
        fence: Fence,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).release(key, fence)
    }

    fn renew(
        &self,
        key: &RecordKey,
        fence: Fence,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).renew(key, fence, lease)
    }

    fn sweep(
        &self,
        keep_expired_for: Duration,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).sweep(keep_expired_for)
    }

    fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).checkpoint(key, fence, checkpoint)
    }

    fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).mark_unknown(key, fence, evidence)
    }

    fn unknowns(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<UnknownRecord>, StoreError>> + Send {
        (**self).unknowns(limit)
    }

    fn expired(
        &self,
        keep_expired_for: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ExpiredRecord>, StoreError>> + Send {
        (**self).expired(keep_expired_for, limit)
    }

    fn forget(
        &self,
        records: &[ExpiredRecord],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).forget(records)
    }

    fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<StuckRecord>, StoreError>> + Send {
        (**self).stuck(older_than, limit)
    }

    fn inspect(
        &self,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<RecordView>, StoreError>> + Send {
        (**self).inspect(key)
    }

    fn take_abandoned(
        &self,
        overdue_by: Duration,
        lease: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AbandonedRecord>, StoreError>> + Send {
        (**self).take_abandoned(overdue_by, lease, limit)
    }
}
