//! The layer and its builder.

use crate::review::{Boundary, IdempotencySettings};
use crate::server::problem::Problems;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method};
use tower_layer::Layer;

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use super::recovery::{
    AbandonedFn, AbandonedRecovery, AbandonedRound, RecoverFn, Recovery, SettleRound, Takeover,
};
use super::service::Idempotency;
use super::stored::{ArchiveFn, RebuildFn, Seal, DEFAULT_MAX_STORED};
use super::TicketStore;
use crate::classify::BoxError;
use crate::record::{Recorder, ServerEvent, ServerEventKind};
use crate::resolve::Resolve;
use crate::server::store::{
    AbandonedRecord, BoxFuture, Checkpoint, ExpiredRecord, Fence, IdempotencyStore, Opened,
    RecordKey, RequestDigest, StoreError, StoredResponse, StuckRecord,
};
use crate::ConfigError;

type TenantFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type OperationFn = dyn Fn(&Parts) -> String + Send + Sync;
type RetentionFn = dyn Fn(&Parts) -> Option<Duration> + Send + Sync;

impl<St: IdempotencyStore> Config<St> {
    fn describe(&self) -> IdempotencySettings {
        let c = self;
        IdempotencySettings {
            store: c.store.kind().to_owned(),
            boundary: if c.open.is_some() {
                Boundary::InTransaction
            } else {
                Boundary::Separate
            },
            lease: c.lease,
            retention: c.retention,
            max_stored_bytes: c.max_stored,
            require_key_for: c.required.iter().map(|m| m.as_str().to_owned()).collect(),
            store_server_errors: c.store_server_errors,
        }
    }
}

/// The settings shared by every service a layer makes.
#[derive(Clone)]
pub(super) struct Config<St> {
    pub(super) store: St,
    pub(super) lease: Duration,
    /// How long an owner renews its lease while its handler runs; `None`: it does not.
    pub(super) renew_for: Option<Duration>,
    pub(super) retry_after: Duration,
    pub(super) retention: Duration,
    /// The retention of some requests' records, where it differs from `retention`.
    pub(super) retention_by: Option<Arc<RetentionFn>>,
    pub(super) max_body: usize,
    pub(super) required: Vec<Method>,
    pub(super) store_server_errors: bool,
    /// Whether a keyed request's handler runs on a task of its own, to completion, whatever
    /// its caller does.
    pub(super) detach: bool,
    pub(super) tenant: Option<Arc<TenantFn>>,
    pub(super) operation: Option<Arc<OperationFn>>,
    /// Where events go; `None` when no recorder wants them.
    pub(super) recorder: Option<Arc<dyn Recorder + Send + Sync>>,
    /// What decides after a takeover; `None`: the rule (see `recovery::by_rule`).
    pub(super) recover: Option<Arc<RecoverFn>>,
    /// What decides about an abandoned record; `None`: the rule (see
    /// `recovery::abandoned_by_rule`).
    pub(super) recover_abandoned: Option<Arc<AbandonedFn>>,
    /// How long the abandoned-record hook may take over one record.
    pub(super) abandoned_timeout: Duration,
    pub(super) abandoned_grace: Duration,
    /// Headers never stored, beyond the built-in ones.
    pub(super) never_store: Vec<HeaderName>,
    /// The largest body stored; a larger one is left out.
    pub(super) max_stored: usize,
    /// Bodies of at least this many bytes are compressed; `None`: none is.
    pub(super) compress_over: Option<usize>,
    pub(super) seal: Option<Arc<dyn Seal>>,
    pub(super) rebuild: Option<Arc<RebuildFn>>,
    pub(super) archive: Option<Arc<ArchiveFn>>,
    /// Opens a claim in the handler's transaction; `None`: the store's `acquire`, before the
    /// handler, in a statement of its own.
    pub(super) open: Option<OpenFn<St>>,
    /// Where the problem details' types point.
    pub(super) problems: Problems,
}

/// Opens a claim in the handler's transaction on the store `St`.
pub(super) type OpenFn<St> = for<'a> fn(
    &'a St,
    &'a RecordKey,
    &'a RequestDigest,
    Duration,
) -> BoxFuture<'a, Result<Opened, StoreError>>;

impl<St> Config<St> {
    /// Records `kind` for a request with `method` on `record`, if a recorder wants it. The
    /// method and record are cloned only then.
    pub(super) fn emit(&self, kind: ServerEventKind, method: &Method, record: &RecordKey) {
        if let Some(recorder) = self.recorder.as_ref().filter(|r| r.enabled()) {
            recorder.record_server(&ServerEvent::request(kind, method.clone(), record.clone()));
        }
    }

    /// Records `kind`, about no one record, if a recorder wants it.
    pub(super) fn emit_report(&self, kind: ServerEventKind) {
        if let Some(recorder) = self.recorder.as_ref().filter(|r| r.enabled()) {
            recorder.record_server(&ServerEvent::report(kind));
        }
    }

    /// Records `kind` about `record`, made by no request.
    pub(super) fn emit_record(&self, kind: ServerEventKind, record: &RecordKey) {
        if let Some(recorder) = self.recorder.as_ref().filter(|r| r.enabled()) {
            recorder.record_server(&ServerEvent::record(kind, record.clone()));
        }
    }
}

impl<St: IdempotencyStore> TicketStore for Config<St> {
    fn write<'a>(
        &'a self,
        key: &'a RecordKey,
        fence: Fence,
        checkpoint: &'a Checkpoint,
    ) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>> {
        Box::pin(self.store.checkpoint(key, fence, checkpoint))
    }

    fn encode(&self, key: &RecordKey, plain: &StoredResponse) -> Result<StoredResponse, BoxError> {
        if plain.resource().is_some() || plain.flags() != 0 {
            return Ok(plain.clone());
        }
        Config::encode(self, key, plain.status(), plain.headers(), plain.body())
    }
}

/// Honours `Idempotency-Key` on a server: first request wins, duplicates wait or replay. See the
/// [module docs](super).
///
/// Clones share the store and the settings.
pub struct IdempotencyLayer<St> {
    pub(super) config: Arc<Config<St>>,
}

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// The layer's settings, as [`IdempotencyLayerBuilder::describe`] says them.
    pub fn describe(&self) -> IdempotencySettings {
        self.config.describe()
    }
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            config: self.config.clone(),
        }
    }
}

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// A layer over `store` with the default settings.
    pub fn new(store: St) -> Self {
        IdempotencyLayer {
            config: Arc::new(IdempotencyLayerBuilder::new(store).config),
        }
    }

    /// A builder over `store`.
    pub fn builder(store: St) -> IdempotencyLayerBuilder<St> {
        IdempotencyLayerBuilder::new(store)
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.config.store
    }

    /// Reports the records that have been `PROCESSING` for `older_than` or more, as
    /// [`report_stuck`](crate::server::store::report_stuck) does (a `tracing` warning
    /// for each, at most 100, oldest first), and tells the layer's
    /// [recorder](IdempotencyLayerBuilder::recorder) how many there were and the oldest's age
    /// ([`ServerEventKind::Stuck`]), zero included: an
    /// `OtelRecorder` (feature `opentelemetry`) turns that into gauges to alert on.
    ///
    /// Run it on a schedule, with a threshold well over the longest a handler should take
    /// (and over the lease, unless the owners [renew](IdempotencyLayerBuilder::renew_for)
    /// theirs). A store that fails is reported to nothing but the caller.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    /// use surely::record::{InMemoryRecorder, ServerEventKind};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let events = InMemoryRecorder::new();
    /// let layer = IdempotencyLayer::builder(MemoryStore::new())
    ///     .recorder(events.clone())
    ///     .build()
    ///     .unwrap();
    /// // In production: every minute, on a task of its own.
    /// let stuck = layer.report_stuck(Duration::from_secs(300)).await.unwrap();
    /// assert!(stuck.is_empty());
    /// assert_eq!(
    ///     events.server_events()[0].kind,
    ///     ServerEventKind::Stuck { records: 0, oldest: None }
    /// );
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The store failed.
    pub async fn report_stuck(&self, older_than: Duration) -> Result<Vec<StuckRecord>, StoreError> {
        let stuck = crate::server::store::report_stuck(&self.config.store, older_than).await?;
        if let Some(recorder) = self.config.recorder.as_ref().filter(|r| r.enabled()) {
            let kind = ServerEventKind::Stuck {
                records: stuck.len(),
                oldest: stuck.iter().map(|s| s.age).max(),
            };
            recorder.record_server(&ServerEvent::report(kind));
        }
        Ok(stuck)
    }
}

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// Settles the store's `UNKNOWN` records (at most `limit`, oldest first) by asking
    /// `resolver`, the same [`Resolve`] hook a client's retry layer and the ledger's reconciler
    /// take, given the record's key as the business key, its operation, and its fence as the
    /// attempt count:
    ///
    /// | the resolver says | the record |
    /// | --- | --- |
    /// | [`Succeeded(res)`](crate::resolve::Resolution::Succeeded) | completed with `res`: every duplicate from now on gets it replayed |
    /// | [`Failed`](crate::resolve::Resolution::Failed) | released: the work did not happen, and the client's next request runs it |
    /// | [`Unknown`](crate::resolve::Resolution::Unknown), declines, or no answer within `query_timeout` | still unknown; tried again next round |
    ///
    /// `Failed` must be final. A record is `UNKNOWN` because its handler recorded a step (a
    /// checkpoint, such as a payment's request id) and then its owner went away: an owner that
    /// only paused may still hold that id, and call the third party after the resolver looked.
    /// Answer `Failed` only once the step can no longer happen (the request id cancelled or
    /// voided at the third party), else `Unknown`; the model of this protocol
    /// ([`docs::how_we_know`](crate::docs::how_we_know)) finds a second payment otherwise.
    ///
    /// Each settlement is fenced by the fence that made the record unknown, so two rounds (on
    /// two instances) settle a record once. Each is reported as
    /// [`ServerEventKind::Settled`]. Records nobody can settle stay listed by
    /// [`IdempotencyStore::unknowns`] for an operator, who settles them with
    /// [`complete`](IdempotencyStore::complete) or [`release`](IdempotencyStore::release) and
    /// the record's fence; they are never swept.
    ///
    /// Run it on a schedule, as the ledger's reconciler runs.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use surely::retry::{Query, Resolution};
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = IdempotencyLayer::new(MemoryStore::new());
    /// let resolver = |q: Query| async move {
    ///     // Ask the payment channel about the payment `q.key` names.
    ///     Resolution::Succeeded(http::Response::new(Bytes::from(format!("{:?} paid", q.key))))
    /// };
    /// let round = layer.settle_unknowns(&resolver, Duration::from_secs(2), 100).await.unwrap();
    /// assert_eq!(round.seen, 0);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The store failed (listing, or settling a record).
    pub async fn settle_unknowns<R>(
        &self,
        resolver: &R,
        query_timeout: Duration,
        limit: usize,
    ) -> Result<SettleRound, StoreError>
    where
        R: Resolve<http::Response<Bytes>>,
    {
        super::recovery::settle(&self.config, resolver, query_timeout, limit).await
    }
}

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// One round of recovery **without a request**: takes over up to `limit` abandoned
    /// records (still `PROCESSING`, their owner's lease passed: an owner and its client that
    /// died together leave such a record, and no request with the key may ever come), oldest
    /// lease first, each fenced as a takeover by a request is
    /// ([`IdempotencyStore::take_abandoned`]), and decides each one's fate without running the
    /// handler (there is no request to run it with):
    ///
    /// | the [abandoned-record hook](IdempotencyLayerBuilder::recover_abandoned) answers | the record |
    /// | --- | --- |
    /// | [`Completed(res)`](AbandonedRecovery::Completed) or [`Failed(res)`](AbandonedRecovery::Failed) | completed with `res`, stored as a handler's answer is, and replayed to the next request with the key |
    /// | [`Unknown(evidence)`](AbandonedRecovery::Unknown) | `UNKNOWN`, for [`settle_unknowns`](Self::settle_unknowns) |
    /// | [`Released`](AbandonedRecovery::Released) | released: the next request with the key runs it |
    /// | panics, or no answer within [its timeout](IdempotencyLayerBuilder::abandoned_timeout) | left as it was: `PROCESSING` under the round's fence until the round's lease passes, then taken again by a later round |
    ///
    /// Without a hook: a record with a checkpoint becomes `UNKNOWN`, its evidence naming the
    /// checkpoints (a step outside may have happened); one without is released.
    ///
    /// The round's lease is the layer's [lease](IdempotencyLayerBuilder::lease), or the hook's
    /// timeout if that is longer, so that no request takes the record over while the hook
    /// decides. Two rounds at once (on two instances over one store) never take the same
    /// record. A decision the store refuses as stale (an operator, or a request, moved the
    /// record meanwhile) is theirs, not a failure: the record is not counted.
    ///
    /// Each record taken is reported as [`ServerEventKind::Abandoned`], with its verdict and
    /// fence; a round whose store failed to take any as
    /// [`ServerEventKind::AbandonedRoundFailed`]. Run it on a schedule, a few times per lease.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::idempotency::IdempotencyKey;
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::{IdempotencyStore, MemoryStore, RecordKey, RequestDigest};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let store = MemoryStore::new();
    /// let layer = IdempotencyLayer::builder(store.clone())
    ///     .lease(Duration::from_secs(10))
    ///     .build()
    ///     .unwrap();
    /// // An owner that died with its client, before any step outside.
    /// let key = RecordKey::new("", "POST /orders", IdempotencyKey::new("k-1").unwrap());
    /// store.acquire(&key, &RequestDigest::of(b"o-1"), Duration::from_secs(10)).await.unwrap();
    ///
    /// tokio::time::advance(Duration::from_secs(11)).await;
    /// let round = layer.recover_abandoned(100).await.unwrap();
    /// assert_eq!((round.seen, round.released), (1, 1));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The store failed to take records over: nothing was taken, and the next round tries
    /// again. A store failure while recording one record's decision is not an error: that
    /// record is left for the next round, and counted in [`left`](AbandonedRound::left).
    pub async fn recover_abandoned(&self, limit: usize) -> Result<AbandonedRound, StoreError> {
        super::recovery::recover_abandoned(&self.config, limit).await
    }
}

/// The abandoned-record hook's timeout unless set.
const DEFAULT_ABANDONED_TIMEOUT: Duration = Duration::from_secs(10);

/// The archive refused a batch (its error is the source).
#[derive(Debug, thiserror::Error)]
#[error("archive refused a batch")]
pub(super) struct ArchiveRefused(#[source] pub(super) BoxError);

/// How many expired records [`IdempotencyLayer::sweep`] reads, archives and deletes at a time.
const SWEEP_BATCH: usize = 500;

impl<St: IdempotencyStore> IdempotencyLayer<St> {
    /// Deletes the completed and released records whose retention ended `keep_expired_for`
    /// ago or more, after handing each batch to the [archive](IdempotencyLayerBuilder::archive)
    /// if there is one, and returns how many it deleted. Never a `PROCESSING` or `UNKNOWN`
    /// record. Run it on a schedule.
    ///
    /// # Errors
    ///
    /// The store failed, or the archive refused a batch ([`StoreError::is_backend`]): that
    /// batch and the rest are kept, for the next run.
    pub async fn sweep(&self, keep_expired_for: Duration) -> Result<u64, StoreError> {
        if self.config.archive.is_none() {
            return self.config.store.sweep(keep_expired_for).await;
        }
        let mut deleted = 0;
        loop {
            let (n, full) =
                super::chores::sweep_batch(&self.config, keep_expired_for, SWEEP_BATCH).await?;
            deleted += n;
            // A batch none of which could be deleted (all acquired again since) would come
            // back forever.
            if !full || n == 0 {
                return Ok(deleted);
            }
        }
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = Idempotency<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_config(inner, self.config.clone())
    }
}

impl<St> fmt::Debug for IdempotencyLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<St> fmt::Debug for Config<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("store", &std::any::type_name::<St>())
            .field("lease", &self.lease)
            .field("renew_for", &self.renew_for)
            .field("retry_after", &self.retry_after)
            .field("retention", &self.retention)
            .field("retention_by", &self.retention_by.as_ref().map(|_| "fn"))
            .field("max_body", &self.max_body)
            .field("required", &self.required)
            .field("store_server_errors", &self.store_server_errors)
            .field("detach", &self.detach)
            .field("tenant", &self.tenant.as_ref().map(|_| "fn"))
            .field("operation", &self.operation.as_ref().map(|_| "fn"))
            .field("recorder", &self.recorder.is_some())
            .field("recover", &self.recover.as_ref().map(|_| "fn"))
            .field(
                "recover_abandoned",
                &self.recover_abandoned.as_ref().map(|_| "fn"),
            )
            .field("abandoned_timeout", &self.abandoned_timeout)
            .field("abandoned_grace", &self.abandoned_grace)
            .field("never_store", &self.never_store)
            .field("max_stored", &self.max_stored)
            .field("compress_over", &self.compress_over)
            .field("seal", &self.seal.is_some())
            .field("rebuild", &self.rebuild.as_ref().map(|_| "fn"))
            .field("archive", &self.archive.as_ref().map(|_| "fn"))
            .field("in_transaction", &self.open.is_some())
            .finish()
    }
}

/// Builds an [`IdempotencyLayer`].
///
/// ```
/// use std::time::Duration;
/// use surely::server::idempotency::IdempotencyLayer;
/// use surely::server::store::MemoryStore;
///
/// let layer = IdempotencyLayer::builder(MemoryStore::new())
///     .lease(Duration::from_secs(10))
///     .retention(Duration::from_secs(24 * 3600))
///     .max_body_bytes(64 * 1024)
///     .require_key_for([http::Method::POST])
///     // The tenant is the authenticated account; no account, no record.
///     .tenant(|parts: &http::request::Parts| {
///         parts.headers.get("x-account").and_then(|v| v.to_str().ok()).map(str::to_owned)
///     })
///     .operation(|parts: &http::request::Parts| format!("{} /orders", parts.method))
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
#[must_use]
pub struct IdempotencyLayerBuilder<St> {
    config: Config<St>,
    /// The problem types' base as given, checked when the layer is built.
    problem_base: Option<String>,
}

/// A copy of the settings, sharing the store (a store is a handle: clones share its records)
/// and the hooks.
impl<St: Clone> Clone for IdempotencyLayerBuilder<St> {
    fn clone(&self) -> Self {
        IdempotencyLayerBuilder {
            config: self.config.clone(),
            problem_base: self.problem_base.clone(),
        }
    }
}

impl<St> fmt::Debug for IdempotencyLayerBuilder<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl<St: IdempotencyStore> IdempotencyLayerBuilder<St> {
    /// The layer's settings, for a [review](crate::review) of the service. The boundary is
    /// [`InTransaction`](Boundary::InTransaction) after
    /// [`in_transaction`][crate::server::idempotency::IdempotencyLayerBuilder::in_transaction], and
    /// [`Separate`](Boundary::Separate) otherwise: a handler that completes the record in its
    /// own transaction (`complete_in`) says so by setting the field to
    /// [`CompleteIn`](Boundary::CompleteIn).
    ///
    /// ```
    /// use surely::review::Boundary;
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    ///
    /// let builder = IdempotencyLayer::builder(MemoryStore::new()).require_key_for([http::Method::POST]);
    /// let settings = builder.describe();
    /// assert_eq!(settings.store, "memory");
    /// assert_eq!(settings.boundary, Boundary::Separate);
    /// assert_eq!(settings.require_key_for, ["POST"]);
    /// ```
    #[cfg_attr(
        not(feature = "postgres"),
        doc = crate::docs::links::to_features!(
            "crate::server::idempotency::IdempotencyLayerBuilder::in_transaction",
        )
    )]
    pub fn describe(&self) -> IdempotencySettings {
        self.config.describe()
    }

    /// Defaults: lease 30 s, in-flight `Retry-After` at most 1 s, retention 24 h, body limit 1 MiB, no method requires a key, 5xx
    /// stored, one tenant, operation = method and path.
    pub fn new(store: St) -> Self {
        IdempotencyLayerBuilder {
            config: Config {
                store,
                lease: Duration::from_secs(30),
                renew_for: None,
                retry_after: Duration::from_secs(1),
                retention: Duration::from_secs(24 * 3600),
                retention_by: None,
                max_body: 1024 * 1024,
                required: Vec::new(),
                store_server_errors: true,
                detach: true,
                tenant: None,
                operation: None,
                recorder: None,
                recover: None,
                recover_abandoned: None,
                abandoned_timeout: DEFAULT_ABANDONED_TIMEOUT,
                abandoned_grace: Duration::ZERO,
                never_store: Vec::new(),
                max_stored: DEFAULT_MAX_STORED,
                compress_over: None,
                seal: None,
                rebuild: None,
                archive: None,
                open: None,
                problems: Problems::default(),
            },
            problem_base: None,
        }
    }

    /// The base of the `type` URIs in the layer's problem details (RFC 9457): the service's
    /// own documentation of its errors, such as `https://api.example.com/problems/`; each
    /// answer's `type` is the base and the problem's name (`idempotency-key-missing`), and
    /// the answer links to it (`Link: <type>; rel="describedby"`). By default the types point at
    /// this crate's docs ([`server::problem`](crate::server::problem)) and no `Link` is sent.
    /// [`build`](Self::build) refuses a base that is not an absolute URI.
    pub fn problem_base(mut self, base: impl Into<String>) -> Self {
        self.problem_base = Some(base.into());
        self
    }

    /// How long an owner holds its record before another request may take over (default 30 s).
    /// Longer than the handler's worst latency, or a slow owner is taken over while it runs
    /// (its late completion is then refused, but the work was done twice), unless the owner
    /// [renews](Self::renew_for) it. Greater than zero, at most
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Renews the owner's lease while its handler runs, every third of the lease, for at most
    /// `max` after the handler started (by default the lease is not renewed). `max` is greater
    /// than zero, at most [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// A handler slower than the lease then keeps its key: duplicates get `409` until it
    /// answers, instead of taking over and running it a second time. `max` bounds a handler
    /// that hangs: once it has passed (or the handler's deadline, when a
    /// [`ServerDeadlineLayer`](crate::server::deadline::ServerDeadlineLayer) outside set one), the owner
    /// stops renewing, its lease runs out, and the next request with the key takes over as
    /// without renewal. An owner that crashes stops renewing with it. A renewal the store
    /// refuses as stale (another request took over while the store could not be reached) ends
    /// the renewals, and is logged.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    ///
    /// // Handlers answer in seconds, but a slow batch may take a few minutes.
    /// let layer = IdempotencyLayer::builder(MemoryStore::new())
    ///     .lease(Duration::from_secs(10))
    ///     .renew_for(Duration::from_secs(600))
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn renew_for(mut self, max: Duration) -> Self {
        self.config.renew_for = Some(max);
        self
    }

    /// The longest `Retry-After` a duplicate gets while the key is in flight (default 1 s): the
    /// header says the lease's remaining time, capped by this, in whole seconds (at least 1).
    /// At most [`MAX_DURATION`](crate::MAX_DURATION).
    /// The lease is sized for the slowest handler; most finish sooner, and a client told to
    /// wait for the whole lease would wait too long.
    pub fn in_flight_retry_after(mut self, max: Duration) -> Self {
        self.config.retry_after = max;
        self
    }

    /// How long a completed record is replayed (default 24 h). After that, the key gets
    /// [`ErrorCode::KeyExpired`](super::ErrorCode::KeyExpired) until the record is swept.
    /// Greater than zero, at most [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// The retention of the requests for which `by` says one, the default
    /// ([`retention`](Self::retention)) for the others: a payment's key may be kept for a month,
    /// a search's for an hour. A retention over ten years ([`MAX_DURATION`](crate::MAX_DURATION))
    /// is kept as ten years. The
    /// [sweeper](crate::server::store::IdempotencyStore::sweep) deletes each record when
    /// its own retention has ended, and never one still `PROCESSING`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    ///
    /// let layer = IdempotencyLayer::builder(MemoryStore::new())
    ///     .retention(Duration::from_secs(3600))
    ///     .retention_by(|parts| {
    ///         parts.uri.path().starts_with("/payments").then(|| Duration::from_secs(30 * 86_400))
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn retention_by<F>(mut self, by: F) -> Self
    where
        F: Fn(&Parts) -> Option<Duration> + Send + Sync + 'static,
    {
        self.config.retention_by = Some(Arc::new(by));
        self
    }

    /// The largest request body read (default 1 MiB): a larger one gets `413` before it is
    /// hashed, and a `content-length` over it before it is read at all.
    pub fn max_body_bytes(mut self, max: usize) -> Self {
        self.config.max_body = max;
        self
    }

    /// Requests with these methods must carry a key: without one they get `400`
    /// ([`ErrorCode::KeyMissing`](super::ErrorCode::KeyMissing)). By default no method
    /// requires one and unkeyed requests pass through.
    pub fn require_key_for(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.required = methods.into_iter().collect();
        self
    }

    /// Drops a keyed request's work (its handler included) with the request's future when the
    /// caller goes away, instead of finishing it on a task of its own (the default; see
    /// [a caller that goes away](super#a-caller-that-goes-away)).
    ///
    /// An owner whose handler is dropped before it answered releases its key at once, so the
    /// caller's retry runs the handler again instead of waiting out the lease. That is safe for
    /// a handler that writes in one transaction with its completion
    /// ([`PostgresStore::complete_in`][crate::server::store::PostgresStore::complete_in]):
    /// a dropped handler's transaction rolls back. A handler that is not transactional may have
    /// done part of its work when it was dropped, and the retry does it again: keep the
    /// default for those.
    ///
    /// ```
    /// # #[cfg(feature = "postgres")] {
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::PostgresStore;
    ///
    /// // Every handler writes and completes in one transaction: a dropped one rolls back.
    /// let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").unwrap();
    /// let layer = IdempotencyLayer::builder(store).cancel_with_caller().build().unwrap();
    /// # let _ = layer;
    /// # }
    /// ```
    #[cfg_attr(
        not(all(feature = "server", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "crate::server::store::PostgresStore::complete_in",
        )
    )]
    pub fn cancel_with_caller(mut self) -> Self {
        self.config.detach = false;
        self
    }

    /// Whether 5xx responses other than 503 are stored and replayed (default true; see the
    /// [module docs](super#what-is-stored)), or release the key. With
    /// [`in_transaction`][IdempotencyLayerBuilder::in_transaction], a 5xx is never stored: its
    /// transaction rolls back, and the key is free.
    #[cfg_attr(
        not(all(feature = "server", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "IdempotencyLayerBuilder::in_transaction",
        )
    )]
    pub fn store_server_errors(mut self, store: bool) -> Self {
        self.config.store_server_errors = store;
        self
    }

    /// The tenant of a request: typically the authenticated account, from a header the
    /// authentication layer in front has checked. `None` answers `401`
    /// ([`ErrorCode::TenantMissing`](super::ErrorCode::TenantMissing)) for keyed requests.
    /// By default every request is of one tenant.
    pub fn tenant<F>(mut self, tenant: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config.tenant = Some(Arc::new(tenant));
        self
    }

    /// The operation of a request: the method and the route template (`POST /orders/{id}/pay`).
    /// The default is the method and the path, which is right when a path names one operation.
    pub fn operation<F>(mut self, operation: F) -> Self
    where
        F: Fn(&Parts) -> String + Send + Sync + 'static,
    {
        self.config.operation = Some(Arc::new(operation));
        self
    }

    /// Where the layer's events go ([`Recorder::record_server`]): replays, duplicates refused
    /// while in flight (`409`), keys reused with another body (`422`), expired keys (`410`),
    /// lease takeovers, keys released by a dropped handler, and a store that could not be
    /// reached or could not record a result. See [`ServerEventKind`].
    ///
    /// The default is `()`: nothing is recorded, and no event is built. A recorder whose
    /// [`enabled`](Recorder::enabled) is false when it is given costs the same. Combine
    /// recorders as a pair: `(TracingRecorder::new(), OtelRecorder::new(&meter))`.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    /// use surely::record::{InMemoryRecorder, ServerEventKind, TracingRecorder};
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let events = InMemoryRecorder::new();
    /// let layer = IdempotencyLayer::builder(MemoryStore::new())
    ///     .recorder((TracingRecorder::new(), events.clone()))
    ///     .build()
    ///     .unwrap();
    /// let svc = layer.layer(service_fn(|_req: http::Request<Full<Bytes>>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from("o-1"))))
    /// }));
    /// let post = |body: &'static str| {
    ///     http::Request::post("/orders")
    ///         .header("idempotency-key", "k-1")
    ///         .body(Full::new(Bytes::from(body)))
    ///         .unwrap()
    /// };
    /// svc.clone().oneshot(post("o-1")).await.unwrap();
    /// svc.clone().oneshot(post("o-1")).await.unwrap(); // replayed
    /// svc.clone().oneshot(post("o-2")).await.unwrap(); // 422: the key was used for o-1
    ///
    /// let kinds: Vec<_> = events.server_events().iter().map(|e| e.kind.as_str()).collect();
    /// assert_eq!(kinds, ["replayed", "key_mismatch"]);
    /// assert_eq!(events.server_events()[1].key(), Some("k-1"));
    /// # }
    /// ```
    pub fn recorder<R: Recorder + Send + Sync + 'static>(mut self, recorder: R) -> Self {
        // Kept whatever it says now: a `TracingRecorder` is enabled once a subscriber listens,
        // which may be after the layer is built. Each event asks it again.
        self.config.recorder = Some(Arc::new(recorder));
        self
    }

    /// What decides, when a request takes over a record whose owner's lease passed while it
    /// was still `PROCESSING`, before the handler may run again. The hook is given the previous
    /// owner's record ([`Takeover`]: fence, age, checkpoints, digest, the request) and answers
    /// with a [`Recovery`]: resume the handler, a completed or failed answer to store and
    /// replay, or unknown.
    ///
    /// Without a hook, a record without checkpoints runs again (safe for a handler whose effects
    /// commit in its transaction, or that has none outside it), and a record with a checkpoint
    /// never runs again: it becomes `UNKNOWN`, and waits for
    /// [`settle_unknowns`](IdempotencyLayer::settle_unknowns). See
    /// [`docs::server_states`](crate::docs::server_states).
    ///
    /// The hook runs in the request's task, within its deadline and the new owner's lease:
    /// give its queries a timeout of their own (well under the lease), and answer
    /// [`Recovery::Unknown`] when they fail. A hook slower than the lease lets the next request
    /// take the record over again and ask again; the slower one's decision is then refused as
    /// stale.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use surely::server::idempotency::{IdempotencyLayer, Recovery, Takeover};
    /// use surely::server::store::MemoryStore;
    ///
    /// // Ask the payment channel about the charge the previous owner had started.
    /// async fn charged(channel_request: &str) -> Option<bool> {
    ///     Some(channel_request.starts_with("ch-"))
    /// }
    ///
    /// let layer = IdempotencyLayer::builder(MemoryStore::new())
    ///     .recover(|t: Takeover| async move {
    ///         let Some(request) = t.checkpoint("charge") else {
    ///             return Recovery::Resume; // it never reached the channel
    ///         };
    ///         match charged(request).await {
    ///             Some(true) => Recovery::Completed(http::Response::new(Bytes::from("paid"))),
    ///             Some(false) => Recovery::Resume, // the charge did not happen: run it again
    ///             None => Recovery::Unknown(format!("channel did not answer for {request}")),
    ///         }
    ///     })
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn recover<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Takeover) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Recovery> + Send + 'static,
    {
        self.config.recover = Some(Arc::new(move |t| Box::pin(hook(t))));
        self
    }

    /// What decides about an **abandoned** record in a round of
    /// [`recover_abandoned`](IdempotencyLayer::recover_abandoned): a record still
    /// `PROCESSING` whose owner's lease passed, with no request to take it over (the owner
    /// and its client died together). The hook is given the record's facts
    /// ([`AbandonedRecord`]: key, the round's fence, age, how overdue, digest, checkpoints;
    /// no request) and answers with an [`AbandonedRecovery`]: completed or failed with the
    /// answer to store and replay, unknown with evidence, or released. The handler never runs
    /// again from here.
    ///
    /// The hook runs on a task of its own, for at most
    /// [`abandoned_timeout`](Self::abandoned_timeout): one that panics or does not answer in
    /// time leaves the record as it was, for a later round. Without a hook, a record with a
    /// checkpoint becomes `UNKNOWN` and one without is released.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use surely::server::idempotency::{AbandonedRecovery, IdempotencyLayer};
    /// use surely::server::store::{AbandonedRecord, MemoryStore};
    ///
    /// // Ask the payment channel about the charge the dead owner had started.
    /// async fn charged(channel_request: &str) -> Option<bool> {
    ///     Some(channel_request.starts_with("ch-"))
    /// }
    ///
    /// let layer = IdempotencyLayer::builder(MemoryStore::new())
    ///     .recover_abandoned(|r: AbandonedRecord| async move {
    ///         let Some(request) = r.checkpoint("charge") else {
    ///             return AbandonedRecovery::Released; // it never reached the channel
    ///         };
    ///         match charged(request).await {
    ///             Some(true) => AbandonedRecovery::Completed(http::Response::new(Bytes::from("paid"))),
    ///             Some(false) => AbandonedRecovery::Released, // cancelled there: run it again
    ///             None => AbandonedRecovery::Unknown(format!("channel did not answer for {request}")),
    ///         }
    ///     })
    ///     .abandoned_timeout(Duration::from_secs(5))
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn recover_abandoned<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(AbandonedRecord) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AbandonedRecovery> + Send + 'static,
    {
        self.config.recover_abandoned = Some(Arc::new(move |r| Box::pin(hook(r))));
        self
    }

    /// How long the [abandoned-record hook](Self::recover_abandoned) may take over one record
    /// (default 10 s); past it, the record is left as it was for a later round. Greater than
    /// zero, at most [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn abandoned_timeout(mut self, timeout: Duration) -> Self {
        self.config.abandoned_timeout = timeout;
        self
    }

    /// How long past its lease a record waits before a
    /// [recovery round](IdempotencyLayer::recover_abandoned) takes it (default zero: as soon
    /// as the lease passes). A client that retries with the key within this grace takes the
    /// record over itself, with its request, and the [takeover hook](Self::recover) may then
    /// resume the work, which a round without a request cannot do: set it to about the time
    /// your clients take to come back (their deadline), and only records whose client is gone
    /// too are left to the round. At most [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn abandoned_grace(mut self, grace: Duration) -> Self {
        self.config.abandoned_grace = grace;
        self
    }

    /// Headers never stored for a replay, beyond those the layer never stores (`set-cookie`,
    /// `date`, the connection's own: see [`StoredResponse::new`]): a per-user token, a trace
    /// id, anything that belongs to the first answer alone or must not sit in the store.
    pub fn never_store_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.never_store = names.into_iter().collect();
        self
    }

    /// The largest response body stored (default 1 MiB). A response over it is still the
    /// first request's answer, but only its status and headers are stored: a duplicate gets
    /// them with an empty body and
    /// [`REPLAY_BODY_OMITTED`](crate::headers::REPLAY_BODY_OMITTED)` : true`. Store large
    /// results as a [`Reference`](super::Reference) instead.
    pub fn max_stored_bytes(mut self, max: usize) -> Self {
        self.config.max_stored = max;
        self
    }

    /// Compresses stored bodies of at least `bytes` bytes (deflate; kept only when it is
    /// smaller), and inflates them for a replay. Feature `compression`.
    #[cfg(feature = "compression")]
    pub fn compress_over(mut self, bytes: usize) -> Self {
        self.config.compress_over = Some(bytes);
        self
    }

    /// Seals every stored body with `seal` (after compression), and opens it for a replay:
    /// encryption at rest. See [`Seal`] for an example with an AEAD.
    pub fn seal<S: Seal>(mut self, seal: S) -> Self {
        self.config.seal = Some(Arc::new(seal));
        self
    }

    /// Builds the replay of a response stored as a **reference** (a handler's response with a
    /// [`Reference`](super::Reference) extension) from the resource as it is now. Given the
    /// record and what was stored ([`StoredResponse::resource`], [`result_code`](StoredResponse::result_code),
    /// [`status`](StoredResponse::status)). Without it, references are ignored and responses
    /// are stored in full.
    ///
    /// The two forms are two promises: a full response replays the first answer byte for
    /// byte; a reference replays an answer about the resource **now** (an order since shipped
    /// shows as shipped). See [`docs::server_states`](crate::docs::server_states#what-is-stored).
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::{BodyExt, Full};
    /// use surely::server::idempotency::{IdempotencyLayer, Reference};
    /// use surely::server::store::MemoryStore;
    /// use tower::{service_fn, Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = IdempotencyLayer::builder(MemoryStore::new())
    ///     .rebuild(|_record, stored| async move {
    ///         // Read the order as it is now.
    ///         let order = stored.resource().unwrap_or_default().to_owned();
    ///         http::Response::builder()
    ///             .status(stored.status())
    ///             .body(Bytes::from(format!("{order}: shipped")))
    ///             .unwrap()
    ///     })
    ///     .build()
    ///     .unwrap();
    /// let svc = layer.layer(service_fn(|_req: http::Request<Full<Bytes>>| async {
    ///     let mut res = http::Response::builder().status(201).body(Full::new(Bytes::from("orders/o-1: new"))).unwrap();
    ///     res.extensions_mut().insert(Reference::new("orders/o-1", "created"));
    ///     Ok::<_, std::convert::Infallible>(res)
    /// }));
    /// let post = || http::Request::post("/orders").header("idempotency-key", "k-1").body(Full::new(Bytes::new())).unwrap();
    /// let first = svc.clone().oneshot(post()).await.unwrap();
    /// assert_eq!(first.into_body().collect().await.unwrap().to_bytes(), "orders/o-1: new");
    /// let again = svc.clone().oneshot(post()).await.unwrap();
    /// assert_eq!(again.status(), 201);
    /// assert_eq!(again.into_body().collect().await.unwrap().to_bytes(), "orders/o-1: shipped");
    /// # }
    /// ```
    pub fn rebuild<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(RecordKey, StoredResponse) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = http::Response<Bytes>> + Send + 'static,
    {
        self.config.rebuild = Some(Arc::new(move |k, s| Box::pin(hook(k, s))));
        self
    }

    /// Hands the records that [`IdempotencyLayer::sweep`] is about to delete to `archive`
    /// first, in batches (key, fence, status, resource, checkpoints: the ids that tie the key
    /// to the outside world), so that an audit keeps the mapping. A batch is deleted only once
    /// the archive returned `Ok`.
    pub fn archive<F, Fut>(mut self, archive: F) -> Self
    where
        F: Fn(Vec<ExpiredRecord>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.config.archive = Some(Arc::new(move |batch| Box::pin(archive(batch))));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    ///
    /// A zero lease, renewal, retention or abandoned-record hook timeout, one (or an
    /// abandoned-record grace) over ten years
    /// ([`MAX_DURATION`](crate::MAX_DURATION)), an in-flight `Retry-After` over ten years, or a
    /// zero body limit; a renewal
    /// or a recovery or abandoned-record hook with [`in_transaction`][Self::in_transaction].
    #[cfg_attr(
        not(all(feature = "server", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "Self::in_transaction",
        )
    )]
    pub fn build(self) -> Result<IdempotencyLayer<St>, ConfigError> {
        let c = &self.config;
        ConfigError::positive_at_most_max("idempotency lease", c.lease)?;
        if let Some(max) = c.renew_for {
            if max.is_zero() {
                return Err(ConfigError::new(
                    "idempotency lease renewal",
                    "must be greater than zero (leave it unset for no renewal)",
                ));
            }
            ConfigError::at_most_max("idempotency lease renewal", max)?;
        }
        ConfigError::positive_at_most_max("idempotency retention", c.retention)?;
        ConfigError::at_most_max("idempotency abandoned-record grace", c.abandoned_grace)?;
        ConfigError::positive_at_most_max(
            "idempotency abandoned-record hook timeout",
            c.abandoned_timeout,
        )?;
        ConfigError::at_most_max("idempotency in-flight retry-after", c.retry_after)?;
        if c.compress_over == Some(0) {
            return Err(ConfigError::new(
                "idempotency compression threshold",
                "must be greater than zero",
            ));
        }
        if c.max_body == 0 {
            return Err(ConfigError::new(
                "idempotency body limit",
                "must be greater than zero",
            ));
        }
        if c.open.is_some() && c.renew_for.is_some() {
            return Err(ConfigError::new(
                "idempotency lease renewal",
                "has no use with in_transaction: the key is held as long as its transaction",
            ));
        }
        if c.open.is_some() && c.recover_abandoned.is_some() {
            return Err(ConfigError::new(
                "idempotency abandoned-record hook",
                "has no use with in_transaction: no record is left processing to recover",
            ));
        }
        if c.open.is_some() && c.recover.is_some() {
            return Err(ConfigError::new(
                "idempotency recovery hook",
                "has no use with in_transaction: no record is left processing to take over",
            ));
        }
        let mut config = self.config;
        if let Some(base) = &self.problem_base {
            config.problems = Problems::at(base, "idempotency problem base")?;
        }
        Ok(IdempotencyLayer {
            config: Arc::new(config),
        })
    }
}

#[cfg(feature = "postgres")]
impl IdempotencyLayerBuilder<crate::server::store::PostgresStore> {
    /// Claims each key **in the handler's transaction**, for a handler whose every effect is a
    /// write to the store's database: the layer begins a transaction on one of the store's
    /// connections, locks the key in it and reads its record, in one round trip; the handler
    /// writes through that transaction (a
    /// [`KeyedTransaction`](crate::server::store::KeyedTransaction) in the request's
    /// extensions); the layer then inserts the completed record with the handler's answer and
    /// commits, in one more round trip. The record and the handler's writes commit together or
    /// not at all.
    ///
    /// - Nothing is written before the handler's writes: no record `PROCESSING`, no lease, no
    ///   takeover. A process that dies mid-request takes its transaction with it (the server
    ///   rolls back when the connection closes, and frees the lock), and the retry runs as the
    ///   first request did. The lease bounds how long the transaction may sit idle
    ///   (`idle_in_transaction_session_timeout`): a handler silent for longer loses its
    ///   connection, and its writes.
    /// - A second request with the key while the first runs gets `409` with `Retry-After`, as
    ///   in the default mode; a replay reads the record (and rolls back behind the answer).
    /// - A handler that fails (an error, any `5xx`, a `Surely-Not-Processed` answer) is rolled
    ///   back: nothing it wrote stays, and the key is free. A `5xx` is not stored here, whatever
    ///   [`store_server_errors`] says: with nothing committed, the retry may run again safely.
    ///   A `4xx` is a final answer: stored, and committed with whatever the handler wrote.
    /// - If the connection fails with the commit sent, the answer is `503` with
    ///   [`ErrorCode::CommitUnknown`](super::ErrorCode::CommitUnknown): the request may have
    ///   taken effect, and sent again with the same key it is replayed if it did, and runs if it
    ///   did not.
    ///
    /// Not for a handler with effects outside the database (a payment provider, a message
    /// sent): those are what the default mode's lease, [checkpoints](crate::server::store::Checkpoint)
    /// and [recovery](Self::recover) are for. Each keyed request holds one of the store's
    /// connections until it answers: a handler must not wait for another connection from the
    /// same pool. `PostgresStore::complete_in` and checkpoints do not apply (there is no record
    /// to update until the commit): the handler stores no answer itself, and the layer stores
    /// the response that leaves its inner service, headers included (an axum handler's
    /// `content-type` too). `docs::server_states` ("In the handler's transaction") has the
    /// whole protocol.
    ///
    /// [`store_server_errors`]: Self::store_server_errors
    ///
    /// ```no_run
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::PostgresStore;
    ///
    /// let store = PostgresStore::connect("postgres://postgres@127.0.0.1/test").unwrap();
    /// let layer = IdempotencyLayer::builder(store)
    ///     .in_transaction()
    ///     .require_key_for([http::Method::POST])
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    pub fn in_transaction(mut self) -> Self {
        self.config.open = Some(open_postgres);
        self
    }
}

#[cfg(feature = "postgres")]
fn open_postgres<'a>(
    store: &'a crate::server::store::PostgresStore,
    key: &'a RecordKey,
    digest: &'a RequestDigest,
    lease: Duration,
) -> BoxFuture<'a, Result<Opened, StoreError>> {
    Box::pin(store.open(key, digest, lease))
}
