//! Idempotency keys, server side: honour the key, so that a client may retry a POST.
//!
//! [`IdempotencyLayer`] sits in front of a handler. For a request that carries an
//! `Idempotency-Key` header (IETF `draft-ietf-httpapi-idempotency-key-header`) it:
//!
//! 1. **validates** the key as the client side does ([`IdempotencyKey`]: 1 to 255 bytes of
//!    visible ASCII, one header) and answers `400` otherwise; a request without a key on a
//!    method that [requires](IdempotencyLayerBuilder::require_key_for) one gets `400` too;
//! 2. reads the body, up to a [limit](IdempotencyLayerBuilder::max_body_bytes) (`413` past it,
//!    before anything is hashed), and takes its SHA-256 digest;
//! 3. **acquires** the record (tenant, operation, key) in the [store](super::store), in one
//!    atomic operation. The tenant comes from a [user extractor](IdempotencyLayerBuilder::tenant)
//!    (one tenant by default), the operation from the method and a
//!    [route template](IdempotencyLayerBuilder::operation) (method and path by default), so one
//!    tenant never reads or blocks another's record. Then:
//!    * the first request becomes the **owner** (`PROCESSING`, with a lease and a fencing token)
//!      and runs the handler, which finds its [`Ticket`] (fence included) in the request's
//!      extensions;
//!    * a duplicate while the owner runs gets `409 Conflict` with `Retry-After` (the lease's
//!      remaining time, at most [1 s](IdempotencyLayerBuilder::in_flight_retry_after)) and the
//!      [`KEY_IN_FLIGHT`] header, and never runs the handler. The client's
//!      [`HttpClassifier`](crate::classify::HttpClassifier) reads that as *rejected, not
//!      processed* for a keyed request: retry later, with the same key;
//!    * a duplicate after completion, with the same digest, gets the stored response (status,
//!      headers, body) with [`IDEMPOTENT_REPLAYED`]` : true`;
//!    * the same key with another digest gets `422` ([`ErrorCode::KeyMismatch`]);
//!    * a key whose record outlived its retention gets `410 Gone` with
//!      [`ErrorCode::KeyExpired`]: an explicit error, never a new resource;
//! 4. once the handler answers, **completes** the record with the response, or **releases** it
//!    when the response says the request was not processed, so that the next attempt runs.
//!
//! # What is stored
//!
//! | handler's response | record |
//! | --- | --- |
//! | 1xx, 2xx, 3xx, 4xx other than those below | completed: replayed to every duplicate |
//! | 408, 409, 425, 429, 503; any response with [`NOT_PROCESSED`] | released: the next attempt runs |
//! | other 5xx (500, 502, 504, ...) | completed (the default), or released with [`store_server_errors(false)`](IdempotencyLayerBuilder::store_server_errors) |
//! | an error from the handler service, a body that fails | left `PROCESSING`: the lease passes, then the next attempt takes over |
//! | none: the handler was dropped before it answered | released at once (see [a caller that goes away](#a-caller-that-goes-away)) |
//!
//! A 500 is stored by default because the handler ran and may have committed part of its work
//! before failing: running it again could do that part twice. Replaying the 500 is the honest
//! answer, and the client classifies it *maybe committed*. A handler that knows it wrote nothing
//! says so with [`NOT_PROCESSED`] (or 503), and the key is released. Services whose handlers
//! always roll back on error may prefer `store_server_errors(false)`.
//!
//! How a response is stored (in full, or as a reference rebuilt on replay; headers never
//! stored, a size limit, compression, a seal for encryption at rest, an archive before the
//! sweep) is in [`docs::server_states`](crate::docs::server_states#what-is-stored).
//!
//! The layer never stores a response that it made itself (400, 409, 413, 422, ...). Those carry
//! an [`ErrorCode`] in the [`IDEMPOTENCY_ERROR`] header and their
//! [problem details](crate::server::problem) (RFC 9457) as the body, with the code as `code`.
//!
//! # Leases and fencing
//!
//! The owner holds the record for its [lease](IdempotencyLayerBuilder::lease) (30 s by default).
//! With [`renew_for`](IdempotencyLayerBuilder::renew_for), it renews the lease while its handler
//! runs, so that a handler slower than the lease is not run twice; the renewals are bounded, so
//! that a hung handler does not hold its key forever. An owner that crashes, or hangs past its
//! lease (and its renewals), leaves a `PROCESSING` record; the next request with the key after
//! the lease takes over with a **higher fence**. Should the old owner wake up
//! and complete, the store refuses it (the fence is stale): it cannot overwrite the new owner's
//! result. Its own client still gets its response. A handler that writes elsewhere can guard
//! those writes with [`Ticket::fence`].
//!
//! # A caller that goes away
//!
//! A client whose attempt timed out closes its connection, and hyper drops the request's future.
//! Were the handler dropped with it, its record would stay `PROCESSING` until the lease ran out,
//! and every retry would get `409` meanwhile: the payment made by nobody, within the client's
//! deadline. So a keyed request that its caller leaves **goes on, on a task of its own**: when
//! its future is dropped before it answered, the work in flight (body, acquire, handler,
//! completion) is spawned on the current runtime, in the call context and `tracing` span it was
//! called in (so it keeps the deadline a
//! [`ServerDeadlineLayer`](crate::server::deadline::ServerDeadlineLayer) gave it); it runs to its end,
//! its result is stored, and the client's retry gets the replay. While the caller waits, the work
//! runs in the caller's task, and costs nothing more. That is why the handler and its future
//! must be `Send + 'static` (as any service hyper serves already is).
//!
//! [`cancel_with_caller`](IdempotencyLayerBuilder::cancel_with_caller) keeps the handler in the
//! request's own future, dropped with it. Whenever an owner's handler is dropped before it
//! answered (so opted out, or the runtime shutting down), the owner releases its key at once rather than
//! holding it for the lease: safe for a handler whose writes commit with its completion (a
//! dropped transaction rolls back), a second run of work done in part for one that does not.
//! A runtime that shuts down cannot run the release; the lease then passes, and the next request
//! takes over as after a crash.
//!
//! # The response body
//!
//! The layer reads the handler's whole response to store it, and answers with a
//! [`Full<Bytes>`](http_body_util::Full) body. Request bodies reach the handler as
//! `Full<Bytes>` too: the digest needs the whole body, and so does the handler then. Requests
//! without a key (not required) pass through with their body read the same way and the same
//! limit; mount the layer on the routes that take keys.
//!
//! # Errors of the store
//!
//! If the store cannot be reached before the handler runs, the layer answers `503` with
//! `Retry-After` and [`NOT_PROCESSED`]: nothing ran. What the client sends never makes a
//! 5xx: an over-long tenant or operation is kept bounded by the [record key](super::store::RecordKey)
//! (a readable prefix and a digest), and a store that refuses a value the request brought
//! answers `400` ([`ErrorCode::RequestRejected`]), never "unavailable". If completing fails after the handler ran,
//! the client still gets the handler's response and the failure is logged (`tracing`, `warn`);
//! the record stays `PROCESSING` until its lease passes, and a retry after that runs again. A
//! [`PostgresStore`][super::store::PostgresStore] closes that gap by completing inside the
//! handler's own transaction.
//!
//! # Events
//!
//! Give the builder a [recorder](IdempotencyLayerBuilder::recorder) to see what the layer
//! did, beyond running handlers: a replay, a duplicate refused while in flight, a key reused
//! with another body, an expired key, a **lease takeover** (with how long the record was held
//! past its lease: an owner crashed or hung), a key released by a dropped handler, a store that
//! could not be reached (`503`) or could not record a result. Each is a
//! [`ServerEvent`](crate::record::ServerEvent) with the request's method and record; the
//! [`TracingRecorder`](crate::record::TracingRecorder) logs them, the
//! `OtelRecorder` (feature `opentelemetry`) counts them.
//! [`IdempotencyLayer::report_stuck`], run on a schedule, reports the records still
//! `PROCESSING` past a threshold, to `tracing` and to the recorder. Without a recorder, the
//! layer builds no event.
//!
//! # Example
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use surely::server::idempotency::{IdempotencyLayer, Ticket};
//! use surely::headers::IDEMPOTENT_REPLAYED;
//! use surely::server::store::MemoryStore;
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let layer = IdempotencyLayer::builder(MemoryStore::new())
//!     .require_key_for([http::Method::POST])
//!     .build()
//!     .unwrap();
//! let svc = layer.layer(service_fn(|req: http::Request<Full<Bytes>>| async move {
//!     let fence = req.extensions().get::<Ticket>().map(|t| t.fence().get());
//!     assert_eq!(fence, Some(1));
//!     let res = http::Response::builder().status(201).body(Full::new(Bytes::from("o-1")));
//!     Ok::<_, std::convert::Infallible>(res.unwrap())
//! }));
//!
//! let post = || {
//!     http::Request::post("/orders")
//!         .header("idempotency-key", "k-1")
//!         .body(Full::new(Bytes::from("o-1")))
//!         .unwrap()
//! };
//! let first = svc.clone().oneshot(post()).await.unwrap();
//! assert_eq!(first.status(), 201);
//! let again = svc.clone().oneshot(post()).await.unwrap();
//! assert_eq!(again.status(), 201);
//! assert_eq!(again.headers()[IDEMPOTENT_REPLAYED], "true");
//! assert_eq!(again.into_body().collect().await.unwrap().to_bytes(), "o-1");
//! # }
//! ```
//!
//! [`IdempotencyKey`]: crate::idempotency::IdempotencyKey
//! [`KEY_IN_FLIGHT`]: crate::headers::KEY_IN_FLIGHT
//! [`NOT_PROCESSED`]: crate::headers::NOT_PROCESSED
#![cfg_attr(
    not(all(feature = "server", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::store::PostgresStore",
    )
)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod chores;
mod code;
pub mod future;
mod layer;
mod recovery;
mod service;
mod stored;

pub use self::chores::{IdempotencyRecoverer, IdempotencySweeper};
pub use self::code::{ErrorCode, UnknownErrorCode};
pub use self::layer::{IdempotencyLayer, IdempotencyLayerBuilder};
pub use self::recovery::{AbandonedRecovery, AbandonedRound, Recovery, SettleRound, Takeover};
pub use self::service::Idempotency;
pub use self::stored::{Reference, Seal};

use super::store::{Checkpoint, Fence, RecordKey, StoreError, StoredResponse};

use crate::headers::IDEMPOTENT_REPLAYED;

use crate::headers::IDEMPOTENCY_ERROR;

/// What the owner's handler finds in its request's extensions: the record it owns, its fence,
/// and the steps earlier owners recorded.
///
/// A handler guards its own writes with [`fence`](Self::fence), or, with a
/// [`PostgresStore`][super::store::PostgresStore], completes the record inside its business
/// transaction with [`PostgresStore::complete_in`][super::store::PostgresStore::complete_in].
///
/// # Checkpoints
///
/// A handler that calls a system outside its own transaction (a payment channel, a stock
/// service) records the step on its record **before** it can be lost: the external request's
/// id, say, with [`checkpoint`](Self::checkpoint) (or, in its PostgreSQL transaction,
/// [`PostgresStore::checkpoint_in`][super::store::PostgresStore::checkpoint_in]). Should the
/// owner die after that, the request that takes its record over does not run the handler
/// blindly: the layer's [recovery hook](IdempotencyLayerBuilder::recover) reads the checkpoints
/// and asks the external system what became of the step; without a hook, the record becomes
/// `UNKNOWN`. A handler that resumes finds them in [`checkpoints`](Self::checkpoints).
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use surely::server::idempotency::{IdempotencyLayer, Ticket};
/// use surely::server::store::MemoryStore;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = IdempotencyLayer::new(MemoryStore::new());
/// let svc = layer.layer(service_fn(|req: http::Request<Full<Bytes>>| async move {
///     let ticket = req.extensions().get::<Ticket>().unwrap().clone();
///     // A step resumed after a takeover reuses the channel request id it had.
///     let channel_request = match ticket.recorded("charge") {
///         Some(id) => id.to_owned(),
///         None => format!("ch-{}", ticket.record_key().key().as_str()),
///     };
///     ticket.checkpoint("charge", &channel_request).await.unwrap();
///     // ... charge the payment channel with `channel_request` ...
///     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from("paid"))))
/// }));
/// let req = http::Request::post("/payments")
///     .header("idempotency-key", "pay-1")
///     .body(Full::new(Bytes::from("42 EUR")))
///     .unwrap();
/// assert_eq!(svc.oneshot(req).await.unwrap().status(), 200);
/// # }
/// ```
#[cfg_attr(
    not(all(feature = "server", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::store::PostgresStore",
        "super::store::PostgresStore::complete_in",
        "super::store::PostgresStore::checkpoint_in",
    )
)]
#[derive(Clone)]
pub struct Ticket(Arc<TicketInner>);

struct TicketInner {
    key: RecordKey,
    fence: Fence,
    retention: Duration,
    /// The steps recorded before this owner took the record over, oldest first.
    previous: Vec<Checkpoint>,
    /// Whether this owner recorded a step (or tried to): then a dropped handler does not
    /// release the key, and a takeover goes through recovery.
    checkpointed: AtomicBool,
    store: Arc<dyn TicketStore>,
    /// What the handler stored itself, in its transaction
    /// ([`PostgresStore::complete_in`](super::store::PostgresStore::complete_in)), before the
    /// layer encoded it: compared with the answer it returns.
    completed_in: std::sync::OnceLock<StoredResponse>,
}

/// What a ticket asks of the layer and its store, behind a pointer: the ticket does not name
/// its store.
pub(super) trait TicketStore: Send + Sync {
    /// Records a checkpoint.
    fn write<'a>(
        &'a self,
        key: &'a RecordKey,
        fence: Fence,
        checkpoint: &'a Checkpoint,
    ) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

    /// A response a handler stores itself, as the layer would store it (headers never stored
    /// left out, size limit, compression, seal).
    // Used by the PostgreSQL store's completion in the handler's own transaction.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn encode(
        &self,
        key: &RecordKey,
        plain: &StoredResponse,
    ) -> Result<StoredResponse, crate::classify::BoxError>;
}

impl Ticket {
    pub(super) fn new(
        key: RecordKey,
        fence: Fence,
        retention: Duration,
        previous: Vec<Checkpoint>,
        store: Arc<dyn TicketStore>,
    ) -> Self {
        Ticket(Arc::new(TicketInner {
            key,
            fence,
            retention,
            previous,
            checkpointed: AtomicBool::new(false),
            store,
            completed_in: std::sync::OnceLock::new(),
        }))
    }

    /// The record owned.
    pub fn record_key(&self) -> &RecordKey {
        &self.0.key
    }

    /// The owner's fencing token: higher than every earlier owner's of this record.
    pub fn fence(&self) -> Fence {
        self.0.fence
    }

    /// How long a completed record is kept and replayed.
    pub fn retention(&self) -> Duration {
        self.0.retention
    }

    /// The steps earlier owners of this record recorded, oldest first: empty for the first
    /// owner, and for one whose record was released.
    pub fn checkpoints(&self) -> &[Checkpoint] {
        &self.0.previous
    }

    /// The latest value an earlier owner recorded under `name`.
    pub fn recorded(&self, name: &str) -> Option<&str> {
        crate::server::store::latest(&self.0.previous, name)
    }

    /// Records a step on the record, fenced by this owner's fence: see
    /// [checkpoints](Self#checkpoints). From the moment it is called, the record is never
    /// released for a blind rerun: a takeover asks the recovery hook.
    ///
    /// # Errors
    ///
    /// [`StoreError::is_rejected`] for a checkpoint that breaks the rules of [`Checkpoint`]
    /// (nothing is written; answer the client with a 4xx), or a record that holds 16 already;
    /// [`StoreError::is_stale`] once another request took the record over: stop, and leave
    /// the work to the new owner.
    pub async fn checkpoint(&self, name: &str, value: &str) -> Result<(), StoreError> {
        let checkpoint = Checkpoint::new(name, value).map_err(StoreError::rejected)?;
        self.checkpointed();
        self.0
            .store
            .write(&self.0.key, self.0.fence, &checkpoint)
            .await
    }

    /// The response a handler stores itself (`complete_in`), as the layer would store it.
    // Used by the PostgreSQL store's completion in the handler's own transaction.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn encode(
        &self,
        plain: &StoredResponse,
    ) -> Result<StoredResponse, crate::classify::BoxError> {
        self.0.store.encode(&self.0.key, plain)
    }

    /// Notes that the handler completed the record with `plain` in its own transaction.
    // Used by the PostgreSQL store's completion in the handler's own transaction.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn completed_in(&self, plain: &StoredResponse) {
        // A second completion in the same record would be refused as stale: the first stands.
        let _ = self.0.completed_in.set(plain.clone());
    }

    /// The answer the handler stored itself, in its own transaction, as it gave it; `None` if
    /// it stored none.
    pub(super) fn stored_in(&self) -> Option<&StoredResponse> {
        self.0.completed_in.get()
    }

    /// Notes that this owner recorded a step.
    pub(crate) fn checkpointed(&self) {
        self.0.checkpointed.store(true, Ordering::Relaxed);
    }

    /// Whether the record holds (or may hold) a step: then it is never released for a rerun.
    pub(super) fn has_checkpoints(&self) -> bool {
        !self.0.previous.is_empty() || self.0.checkpointed.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("key", &self.0.key)
            .field("fence", &self.0.fence)
            .field("retention", &self.0.retention)
            .field("checkpoints", &self.0.previous)
            .finish()
    }
}
