//! The service.

use crate::server::problem::Problems;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::Config;
use super::recovery::{self, Recovery, Takeover};
use super::stored::Differences;
use super::IdempotencyLayer;
use super::{ErrorCode, Ticket, IDEMPOTENCY_ERROR, IDEMPOTENT_REPLAYED};
use crate::classify::BoxError;
use crate::context::Context as CallContext;
use crate::headers::IDEMPOTENCY_KEY;
use crate::headers::KEY_IN_FLIGHT;
use crate::headers::NOT_PROCESSED;
use crate::idempotency::IdempotencyKey;
use crate::ids::InvalidKey;
use crate::record::ServerEventKind;
use crate::server::store::{
    Acquire, Claim, CommitError, Fence, IdempotencyStore, Opened, RecordKey, RequestDigest,
    StoreError,
};
use crate::time::later;

/// The service made by [`IdempotencyLayer`]: see the [module docs](super) for what it does.
///
/// # Readiness
///
/// `poll_ready` is the handler's. The call moves the ready handler into its future and leaves a
/// clone in its place (tower's usual pattern for services whose future calls the inner service
/// later), so the handler must be `Clone`; requests the layer answers itself (invalid key,
/// duplicate, replay) never use the readiness reserved for them.
pub struct Idempotency<S, St> {
    inner: S,
    config: Arc<Config<St>>,
}

impl<S, St> Idempotency<S, St> {
    pub(super) fn from_config(inner: S, config: Arc<Config<St>>) -> Self {
        Idempotency { inner, config }
    }

    /// Wraps `inner` with a layer of the default settings over `store`, as
    /// [`IdempotencyLayer::new`] does.
    pub fn new(inner: S, store: St) -> Self
    where
        St: IdempotencyStore,
    {
        tower_layer::Layer::layer(&IdempotencyLayer::new(store), inner)
    }

    /// The layer with the default settings over `store`: [`IdempotencyLayer::new`].
    pub fn layer(store: St) -> IdempotencyLayer<St>
    where
        St: IdempotencyStore,
    {
        IdempotencyLayer::new(store)
    }

    inner_accessors!();
}

impl<S: Clone, St> Clone for Idempotency<S, St> {
    fn clone(&self) -> Self {
        Idempotency {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, St> fmt::Debug for Idempotency<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, St, B, RB> Service<Request<B>> for Idempotency<S, St>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: IdempotencyStore,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let config = self.config.clone();
        let plan = plan(&config, &parts);
        if let Plan::Answer(res) = plan {
            return ResponseFuture::ready(res);
        }
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        // A keyed request runs to its end even if its caller goes away, in the context
        // (deadline, span) it was called in: its key is not stranded.
        let orphan = (matches!(plan, Plan::Keyed(..)) && config.detach)
            .then(|| (CallContext::current(), tracing::Span::current()));
        ResponseFuture::new(Box::pin(run(config, inner, parts, body, plan)), orphan)
    }
}

/// Releases an owner's key if its handler is dropped before it answers (its caller went away
/// while it ran in the caller's task, or the runtime shut down): the next request with the key
/// runs at once instead of waiting out the lease. Disarmed as soon as the handler answers.
struct ReleaseIfDropped<St: IdempotencyStore> {
    armed: Option<Owned<St>>,
}

/// What an owner releases if its handler is dropped.
struct Owned<St> {
    config: Arc<Config<St>>,
    ticket: Ticket,
    /// The request's method, when a recorder wants the release reported.
    method: Option<Method>,
}

impl<St: IdempotencyStore> ReleaseIfDropped<St> {
    fn disarm(&mut self) {
        self.armed = None;
    }
}

impl<St: IdempotencyStore> Drop for ReleaseIfDropped<St> {
    fn drop(&mut self) {
        let Some(Owned {
            config,
            ticket,
            method,
        }) = self.armed.take()
        else {
            return;
        };
        let (key, fence) = (ticket.record_key().clone(), ticket.fence());
        if ticket.has_checkpoints() {
            // A step may have reached a system outside the handler's transaction: a rerun could
            // do it twice. The record stays PROCESSING; after the lease, the takeover recovers.
            tracing::debug!(
                ?key,
                "handler dropped after a checkpoint: key left for recovery"
            );
            return;
        }
        // No runtime (or one that is shutting down, which drops the task): the lease passes,
        // and the next request takes over.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                match config.store.release(&key, fence).await {
                    Ok(()) => {
                        tracing::debug!(?key, "handler dropped: idempotency key released");
                        if let Some(method) = &method {
                            config.emit(ServerEventKind::Released { fence }, method, &key);
                        }
                    }
                    Err(e) => tracing::warn!(
                        ?key,
                        error = &e as &dyn std::error::Error,
                        "handler dropped: idempotency key not released"
                    ),
                }
            });
        }
    }
}

/// What to do with a request, decided from its head alone.
enum Plan {
    /// Answer without reading the body or calling the handler.
    Answer(Response<Full<Bytes>>),
    /// No key, none required: read the body and call the handler.
    PassThrough,
    /// A keyed request, and how long its record is kept once complete.
    Keyed(RecordKey, Duration),
}

fn plan<St>(config: &Config<St>, parts: &Parts) -> Plan {
    if let Some(len) = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > config.max_body as u64
    {
        return Plan::Answer(too_large(&config.problems, config.max_body));
    }
    let mut values = parts.headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        if config.required.contains(&parts.method) {
            return Plan::Answer(error(
                &config.problems,
                StatusCode::BAD_REQUEST,
                ErrorCode::KeyMissing,
                "this method requires an Idempotency-Key header",
            ));
        }
        return Plan::PassThrough;
    };
    let key = match values.next() {
        Some(_) => Err(InvalidKey::repeated()),
        None => IdempotencyKey::from_header_value(value),
    };
    let key = match key {
        Ok(key) => key,
        Err(e) => {
            // What was wrong, without the key's bytes: a detail never repeats the request.
            let detail = match e.len_over_limit() {
                Some(len) => {
                    format!("the Idempotency-Key is {len} bytes long, at most 255 allowed")
                }
                None if e.is_repeated() => {
                    "the Idempotency-Key header appears more than once".to_owned()
                }
                None if e.is_empty() => "the Idempotency-Key is empty".to_owned(),
                None => "the Idempotency-Key is not visible ASCII (0x21..=0x7e)".to_owned(),
            };
            return Plan::Answer(error(
                &config.problems,
                StatusCode::BAD_REQUEST,
                ErrorCode::KeyInvalid,
                &detail,
            ));
        }
    };
    let tenant = match &config.tenant {
        None => String::new(),
        Some(f) => match f(parts) {
            Some(t) => t,
            None => {
                return Plan::Answer(error(
                    &config.problems,
                    StatusCode::UNAUTHORIZED,
                    ErrorCode::TenantMissing,
                    "no tenant for this request",
                ))
            }
        },
    };
    let operation = match &config.operation {
        Some(f) => f(parts),
        None => format!("{} {}", parts.method, parts.uri.path()),
    };
    let retention = config
        .retention_by
        .as_ref()
        .and_then(|by| by(parts))
        .map_or(config.retention, |r| r.min(crate::MAX_DURATION));
    Plan::Keyed(RecordKey::new(tenant, operation, key), retention)
}

async fn run<S, St, B, RB>(
    config: Arc<Config<St>>,
    mut inner: S,
    mut parts: Parts,
    body: B,
    plan: Plan,
) -> Result<Response<Full<Bytes>>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    St: IdempotencyStore,
    B: Body,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    let body = match Limited::new(body, config.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(too_large(&config.problems, config.max_body))
        }
        Err(e) => {
            // The error stays in the server's log: a detail never repeats the request.
            tracing::debug!(error = %e, "reading the request body failed");
            return Ok(error(
                &config.problems,
                StatusCode::BAD_REQUEST,
                ErrorCode::RequestBodyFailed,
                "reading the request body failed; the request was not processed",
            ));
        }
    };
    let (key, retention) = match plan {
        Plan::Keyed(key, retention) => (key, retention),
        Plan::Answer(res) => return Ok(res),
        Plan::PassThrough => {
            let res = inner
                .call(Request::from_parts(parts, Full::new(body)))
                .await?;
            let (head, body) = res.into_parts();
            return Ok(match body.collect().await {
                Ok(b) => Response::from_parts(head, Full::new(b.to_bytes())),
                Err(_) => body_failed(),
            });
        }
    };
    let digest = RequestDigest::of(&body);
    let method = &parts.method;
    let acquired = match config.open {
        Some(open) => match open(&config.store, &key, &digest, config.lease).await {
            Ok(Opened::Claimed(claim)) => {
                return run_claimed(&config, inner, parts, body, key, retention, claim).await
            }
            Ok(Opened::Found(found)) => Ok(found),
            Err(e) => Err(e),
        },
        None => config.store.acquire(&key, &digest, config.lease).await,
    };
    let (fence, previous, taken) = match acquired {
        Ok(Acquire::Owner(fence)) => (fence, Vec::new(), None),
        Ok(Acquire::TakenOver {
            fence,
            overdue,
            age,
            checkpoints,
        }) => {
            config.emit(
                ServerEventKind::LeaseTakeover { fence, overdue },
                method,
                &key,
            );
            (fence, checkpoints, Some((overdue, age)))
        }
        Ok(Acquire::InFlight { retry_after }) => {
            let kind = ServerEventKind::InFlight {
                lease_left: retry_after,
            };
            config.emit(kind, method, &key);
            return Ok(in_flight(
                &config.problems,
                retry_after.min(config.retry_after),
            ));
        }
        Ok(Acquire::Completed(stored)) => {
            let status = stored.status();
            config.emit(ServerEventKind::Replayed { status }, method, &key);
            return Ok(config.replay(&key, stored).await);
        }
        Ok(Acquire::Unknown { .. }) => {
            config.emit(ServerEventKind::UnknownAnswered, method, &key);
            return Ok(outcome_unknown(&config.problems));
        }
        Ok(Acquire::Mismatch) => {
            config.emit(ServerEventKind::KeyMismatch, method, &key);
            return Ok(error(
                &config.problems,
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::KeyMismatch,
                "this idempotency key was used with a different request body",
            ));
        }
        Ok(Acquire::Expired) => {
            config.emit(ServerEventKind::Expired, method, &key);
            return Ok(error(
                &config.problems,
                StatusCode::GONE,
                ErrorCode::KeyExpired,
                "this idempotency key has expired; its result is no longer kept",
            ));
        }
        Err(e) if e.is_rejected() => {
            tracing::debug!(
                ?key,
                error = &e as &dyn std::error::Error,
                "idempotency store refused the request"
            );
            let mut res = error(
                &config.problems,
                StatusCode::BAD_REQUEST,
                ErrorCode::RequestRejected,
                "the idempotency store refused a value this request brought; the request was \
                 not processed",
            );
            res.headers_mut()
                .insert(NOT_PROCESSED, HeaderValue::from_static("idempotency-store"));
            return Ok(res);
        }
        Err(e) => {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "idempotency store unavailable"
            );
            config.emit(ServerEventKind::StoreUnavailable, method, &key);
            return Ok(unavailable(&config.problems));
        }
    };
    let ticket = Ticket::new(key.clone(), fence, retention, previous, config.clone());
    // Kept for the events after the handler, which takes the request.
    let method = config.recorder.as_ref().map(|_| parts.method.clone());
    let mut guard = ReleaseIfDropped {
        armed: Some(Owned {
            config: config.clone(),
            ticket: ticket.clone(),
            method: method.clone(),
        }),
    };
    if let Some((overdue, age)) = taken {
        // Never a blind rerun: the hook (or the rule) decides what became of the previous
        // owner's work first.
        let recovery = match &config.recover {
            Some(hook) => {
                let mut request = Request::new(body.clone());
                *request.method_mut() = parts.method.clone();
                *request.uri_mut() = parts.uri.clone();
                *request.version_mut() = parts.version;
                *request.headers_mut() = parts.headers.clone();
                hook(Takeover {
                    key: key.clone(),
                    fence,
                    age,
                    overdue,
                    checkpoints: ticket.checkpoints().to_vec(),
                    digest,
                    request,
                })
                .await
            }
            None => recovery::by_rule(ticket.checkpoints()),
        };
        if let Some(method) = &method {
            let kind = ServerEventKind::Recovered {
                fence,
                verdict: recovery.verdict(),
            };
            config.emit(kind, method, &key);
        }
        let answer = match recovery {
            Recovery::Resume => None,
            Recovery::Completed(res) | Recovery::Failed(res) => {
                let (head, body) = res.into_parts();
                let done = match config.to_store(&key, &head, &body) {
                    Ok(stored) => config.store.complete(&key, fence, &stored, retention).await,
                    Err(e) => Err(StoreError::backend(e)),
                };
                let mut res = Response::from_parts(head, Full::new(body));
                res.headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
                Some((done, res))
            }
            Recovery::Unknown(evidence) => {
                let evidence = recovery::bounded(evidence);
                let marked = config.store.mark_unknown(&key, fence, &evidence).await;
                Some((marked, outcome_unknown(&config.problems)))
            }
        };
        if let Some((stored, res)) = answer {
            // Decided: whatever happens to this future now, the key is not released.
            guard.disarm();
            if let Err(e) = stored {
                // The record stays PROCESSING: after the lease, the next takeover asks again.
                tracing::warn!(
                    ?key,
                    fence = fence.get(),
                    error = &e as &dyn std::error::Error,
                    "recovered idempotency record not stored"
                );
                if let Some(method) = &method {
                    config.emit(ServerEventKind::NotStored { fence }, method, &key);
                }
            }
            return Ok(res);
        }
    }
    parts.extensions.insert(ticket.clone());
    // An error from the handler leaves the record PROCESSING: its lease passes, and the next
    // attempt takes over, as after a crash. A handler dropped before it answered (its caller
    // went away with it, or the runtime stopped) releases the key at once (`guard`).
    let handled = async {
        let res = inner
            .call(Request::from_parts(parts, Full::new(body)))
            .await?;
        let (head, body) = res.into_parts();
        let collected = body.collect().await.map(|b| b.to_bytes()).map_err(drop);
        Ok::<_, S::Error>((head, collected))
    };
    let handled = match config.renew_for {
        Some(max) => renewing(&config, &key, fence, max, handled).await,
        None => handled.await,
    };
    // The handler answered (or failed, which leaves the lease to pass, as a crash would):
    // whatever happens to this future now, the key is not released for a rerun.
    guard.disarm();
    let (head, collected) = handled?;
    let Ok(body) = collected else {
        return Ok(body_failed());
    };
    // The answer the handler stored itself (in its own transaction), and how the one that left
    // it differs.
    let stored_in = ticket.stored_in();
    let differs = stored_in.and_then(|stored| config.differences(stored, &head, &body));
    let outcome = if stored_in.is_some() && differs.is_none() {
        // Completed in the handler's own transaction with this very answer: nothing left to
        // store.
        Ok(())
    } else if released(head.status, &head.headers, config.store_server_errors) {
        config.store.release(&key, fence).await
    } else {
        match config.to_store(&key, &head, &body) {
            Ok(stored) => config.store.complete(&key, fence, &stored, retention).await,
            Err(e) => Err(StoreError::backend(e)),
        }
    };
    if let Err(e) = outcome {
        // Refused when the handler completed the record itself (in its own transaction), or when
        // a later owner took over; either way this response is still this client's answer.
        if let (true, Some(d)) = (e.is_stale(), &differs) {
            // Another answer than the one the handler stored (its transaction failed after the
            // completion, or the framework or a layer below changed the answer) is stored here,
            // unless the handler's completion committed: then it stands, and every replay
            // differs from what this client got.
            stored_answer_differs(&config, &key, fence, &head, d, method.as_ref());
        } else if e.is_stale() {
            tracing::debug!(
                ?key,
                fence = fence.get(),
                "idempotency record not updated: {e}"
            );
        } else {
            tracing::warn!(
                ?key,
                fence = fence.get(),
                error = &e as &dyn std::error::Error,
                "idempotency record not updated"
            );
            if let Some(method) = &method {
                config.emit(ServerEventKind::NotStored { fence }, method, &key);
            }
        }
    }
    Ok(Response::from_parts(head, Full::new(body)))
}

/// Tells that the answer leaving the handler is not the one it stored itself and committed:
/// once, at `warn`, naming what differs, and to the recorder. The client still gets the answer
/// sent; replays get the stored one.
fn stored_answer_differs<St>(
    config: &Config<St>,
    key: &RecordKey,
    fence: Fence,
    head: &http::response::Parts,
    d: &Differences,
    method: Option<&Method>,
) {
    let headers = d
        .headers
        .iter()
        .map(http::HeaderName::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    tracing::warn!(
        ?key,
        fence = fence.get(),
        stored_status = d.stored_status.map(|s| s.as_u16()),
        sent_status = head.status.as_u16(),
        headers = %headers,
        body = d.body,
        "the answer sent is not the one the handler stored for this idempotency key: replays \
         get the stored one (store the response returned, e.g. with StoredResponse::buffer)"
    );
    if let Some(method) = method {
        let kind = ServerEventKind::StoredAnswerDiffers {
            fence,
            status: d.stored_status.is_some(),
            headers: d.headers.len(),
            body: d.body,
        };
        config.emit(kind, method, key);
    }
}

/// A keyed request whose key is claimed in the handler's transaction: the handler writes in it,
/// and its answer is stored and committed with its writes, or rolled back with them.
async fn run_claimed<S, St, RB>(
    config: &Arc<Config<St>>,
    mut inner: S,
    mut parts: Parts,
    body: Bytes,
    key: RecordKey,
    retention: Duration,
    claim: Box<dyn Claim>,
) -> Result<Response<Full<Bytes>>, S::Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    St: IdempotencyStore,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    let fence = claim.fence();
    let ticket = Ticket::new(key.clone(), fence, retention, Vec::new(), config.clone());
    parts.extensions.insert(ticket);
    claim.attach(&mut parts.extensions);
    let method = config.recorder.as_ref().map(|_| parts.method.clone());
    // From here, a future dropped drops the claim: its connection closes, and the server rolls
    // the transaction back.
    let res = match inner
        .call(Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(res) => res,
        Err(e) => {
            roll_back(claim, &key).await;
            return Err(e);
        }
    };
    let (head, body) = res.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        roll_back(claim, &key).await;
        return Ok(body_failed());
    };
    // A 5xx is never stored here: nothing of it commits, so the retry may run again, safely.
    if released(head.status, &head.headers, false) {
        roll_back(claim, &key).await;
        return Ok(Response::from_parts(head, Full::new(body)));
    }
    let stored = match config.to_store(&key, &head, &body) {
        Ok(stored) => stored,
        Err(e) => {
            // Committing the handler's writes without the record would let a retry run them
            // again: nothing commits.
            tracing::warn!(
                ?key,
                error = &*e as &dyn std::error::Error,
                "idempotency record not stored: the handler's transaction is rolled back"
            );
            roll_back(claim, &key).await;
            return Ok(unavailable(&config.problems));
        }
    };
    let committed = claim.commit(&stored, retention).await;
    let (error, answer) = match committed {
        Ok(()) => return Ok(Response::from_parts(head, Full::new(body))),
        Err(CommitError::NotCommitted(e)) => (e, unavailable(&config.problems)),
        Err(CommitError::Unknown(e)) => (e, commit_unknown(&config.problems)),
    };
    tracing::warn!(
        ?key,
        fence = fence.get(),
        error = &error as &dyn std::error::Error,
        "idempotency claim not committed"
    );
    if let Some(method) = &method {
        config.emit(ServerEventKind::NotStored { fence }, method, &key);
    }
    Ok(answer)
}

async fn roll_back(claim: Box<dyn Claim>, key: &RecordKey) {
    if let Err(e) = claim.rollback().await {
        // The connection was closed instead: the server rolls back all the same.
        tracing::debug!(
            ?key,
            error = &e as &dyn std::error::Error,
            "idempotency claim: rollback failed"
        );
    }
}

/// The answer when the connection failed with the claim's commit sent: the request may have
/// taken effect, and the same key settles it.
fn commit_unknown(problems: &Problems) -> Response<Full<Bytes>> {
    let mut res = error(
        problems,
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::CommitUnknown,
        "the connection to the idempotency store failed during the commit; the request may have \
         taken effect: send it again with the same key (it is replayed if it did)",
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    res
}

/// Runs `work` (the handler) while renewing the lease of `key`, owned with `fence`, every third
/// of the lease, for at most `max` and never past the handler's deadline.
async fn renewing<St: IdempotencyStore, T>(
    config: &Config<St>,
    key: &RecordKey,
    fence: Fence,
    max: Duration,
    work: impl Future<Output = T>,
) -> T {
    let started = tokio::time::Instant::now();
    let every = config
        .lease
        .checked_div(3)
        .unwrap_or_default()
        .max(Duration::from_millis(1));
    let last = later(started, max);
    let until = crate::deadline::current().map_or(last, |d| d.instant().min(last));
    let renewals = async {
        let mut next = later(started, every);
        while next < until {
            tokio::time::sleep_until(next).await;
            let renewed = config.store.renew(key, fence, config.lease).await;
            // Counted from when the store answered: a slow store delays the next renewal
            // rather than bunching them.
            next = later(tokio::time::Instant::now(), every);
            match renewed {
                Ok(()) => {}
                Err(e) if e.is_stale() => {
                    tracing::warn!(?key, fence = fence.get(), "idempotency lease lost: {e}");
                    break;
                }
                Err(e) => {
                    tracing::warn!(
                        ?key,
                        fence = fence.get(),
                        error = &e as &dyn std::error::Error,
                        "idempotency lease not renewed"
                    );
                }
            }
        }
        std::future::pending::<std::convert::Infallible>().await
    };
    tokio::select! {
        biased;
        out = work => out,
        never = renewals => match never {},
    }
}

/// Whether the handler's response says the request was not processed (or is a 5xx that the
/// layer does not store).
fn released(status: StatusCode, headers: &http::HeaderMap, store_5xx: bool) -> bool {
    if headers.contains_key(NOT_PROCESSED) {
        return true;
    }
    match status.as_u16() {
        408 | 409 | 425 | 429 | 503 => true,
        500..=599 => !store_5xx,
        _ => false,
    }
}

fn in_flight(problems: &Problems, retry_after: Duration) -> Response<Full<Bytes>> {
    let mut res = error(
        problems,
        StatusCode::CONFLICT,
        ErrorCode::KeyInFlight,
        "a request with this idempotency key is in progress; retry later with the same key",
    );
    // Whole seconds, rounded up, at least one.
    let secs = retry_after
        .as_secs()
        .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
        .max(1);
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    res.headers_mut()
        .insert(KEY_IN_FLIGHT, HeaderValue::from_static("true"));
    res
}

/// The answer for a record whose outcome is unknown: `202` and the code, never a retry hint.
fn outcome_unknown(problems: &Problems) -> Response<Full<Bytes>> {
    error(
        problems,
        StatusCode::ACCEPTED,
        ErrorCode::OutcomeUnknown,
        "the outcome of the request with this idempotency key is unknown: it may have taken \
         effect, and is being settled; do not send it again with a new key",
    )
}

/// The answer when the store could not be asked: nothing ran.
fn unavailable(problems: &Problems) -> Response<Full<Bytes>> {
    let mut res = error(
        problems,
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::StoreUnavailable,
        "the idempotency store is unavailable; the request was not processed",
    );
    res.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    res.headers_mut()
        .insert(NOT_PROCESSED, HeaderValue::from_static("idempotency-store"));
    res
}

fn too_large(problems: &Problems, max: usize) -> Response<Full<Bytes>> {
    let why = format!("the request body is over the limit of {max} bytes");
    error(
        problems,
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::BodyTooLarge,
        &why,
    )
}

fn body_failed() -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::new()));
    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    res
}

/// One of the layer's own error answers: its status, its problem details (RFC 9457, with
/// `detail`, which never repeats the request's key, headers or body) and its code in
/// [`IDEMPOTENCY_ERROR`].
pub(super) fn error(
    problems: &Problems,
    status: StatusCode,
    code: ErrorCode,
    detail: &str,
) -> Response<Full<Bytes>> {
    let mut res = problems.respond(status, code.as_str(), code.title(), detail);
    res.headers_mut()
        .insert(IDEMPOTENCY_ERROR, HeaderValue::from_static(code.as_str()));
    res
}
