//! The HTTP (webhook) publisher.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf as _, Bytes};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::{BodyExt as _, Full};
use tower_service::Service;

use super::Event;
use crate::classify::BoxError;
use crate::headers::IDEMPOTENCY_KEY;
use crate::idempotency::IdempotencyKey;
use crate::outcome::{fmt_verdict, CallOutcome, Outcome, OutcomeExt as _};
use crate::IntoError;

/// The aggregate the event is about.
const AGGREGATE: HeaderName = HeaderName::from_static("surely-aggregate");
/// The aggregate's version after the change.
const VERSION: HeaderName = HeaderName::from_static("surely-version");
/// What happened.
const KIND: HeaderName = HeaderName::from_static("surely-kind");

/// The content type of an event that does not say its own.
const OCTET_STREAM: HeaderValue = HeaderValue::from_static("application/octet-stream");

/// Header names an event may not carry: the ones the publisher writes, and the ones that frame
/// the HTTP message (hop-by-hop, or the transport's own).
const RESERVED: [HeaderName; 13] = [
    IDEMPOTENCY_KEY,
    AGGREGATE,
    VERSION,
    KIND,
    header::HOST,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
];

/// At most this much of a response body is read (and thrown away) before the connection is let
/// go: a body read to its end lets the transport reuse the connection, and settles the
/// [client stack](mod@crate::client)'s attempt record.
const DRAIN_BYTES: usize = 64 * 1024;

/// At most this long is spent reading a response body: the client's deadline ends at the
/// response's head, so a body that trickles would otherwise hold up the relay's round.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Publishes outbox events to an HTTP endpoint (a webhook), as a `tower::Service<Event>` for a
/// [`Relay`](super::Relay), through any HTTP client service: made for the crate's own
/// [`client::http()`](crate::client::http) stack, so that the call's deadline, retries, circuit
/// breaker and records sit in front of the receiver.
///
/// Each event is one `POST` to the publisher's URI:
///
/// * the body is the event's [payload](Event::payload), as it is;
/// * `Idempotency-Key` is the event's [id](Event::id): the same on every attempt of the call and
///   on every later publish of the event (after a failure, a lost reply, a relay that crashed
///   before marking it). A receiver that honours keys (this crate's
///   [`IdempotencyLayer`][crate::server::idempotency::IdempotencyLayer], or an inbox keyed by
///   it) drops the copies; this is how an at-least-once relay becomes effectively-once at the
///   receiver;
/// * `surely-aggregate`, `surely-version` and `surely-kind` say what the event is about, and the
///   event's own [headers](Event::headers) follow, in order (a repeated name is sent repeated);
/// * `content-type` is the event's own if it has one, else `application/octet-stream`.
///
/// Because the key is the caller's, the client stack treats every publish as
/// [`Keyed`](crate::Semantics::Keyed): an attempt whose reply was lost is retried within the
/// call, with the same key, whether or not the client was told
/// [`server_honours_keys`](crate::client::ClientBuilder::server_honours_keys).
///
/// # Success and failure
///
/// A `2xx` response is a publish: the relay marks the event published (a stored replay,
/// `idempotent-replayed: true`, is one too: the receiver had the event already). The service
/// answers with the response's head (status, headers and extensions, where
/// [`OutcomeExt`](crate::OutcomeExt) reads the call's outcome), and the body is read and thrown
/// away, at most 64 KiB of it for at most one second.
///
/// Anything else is a [`WebhookError`], and the relay publishes the event again after its wait,
/// with the same key, then quarantines it after its limit: any other status (a `3xx` too: the
/// client follows no redirect), a transport error, a `2xx` whose [call
/// outcome](crate::CallOutcome) is nevertheless [`Unknown`](crate::Outcome::Unknown), and an
/// event that cannot be written as an HTTP request (a header the `http` crate refuses, a header
/// the publisher writes itself: nothing is sent). The error says why, and the call's outcome
/// when the client handed one back (`webhook answered 500 Internal Server Error (unknown after 3
/// attempts)`), which is what an operator reads in the quarantined event's last error.
///
/// # Readiness
///
/// `poll_ready` is the inner service's. An event that cannot be written as a request fails
/// without calling the inner service, so the readiness it reserved stays reserved for the next
/// call.
///
/// A relay sends a batch's events **concurrently**: it waits for `poll_ready` and calls `call`
/// for each event of the batch in turn, then awaits all the calls together. So the inner
/// service has several calls in flight at once, as every tower service may, and its
/// `poll_ready` must not wait for one of those calls to finish: behind a concurrency limit
/// smaller than the relay's [batch](super::RelayBuilder::batch) (tower's `ConcurrencyLimit`,
/// also under a `Buffer`), a round would wait forever. The client stack over hyper-util is
/// always ready; bound the number of concurrent requests to the receiver with the batch size
/// instead. Since every call follows its own `poll_ready`, as tower's contract asks, the
/// publisher does not need its inner service to be `Clone`.
///
/// # Transport
///
/// Requests have an [`http_body_util::Full<Bytes>`](http_body_util::Full) body, which is what
/// [`client::http()`](crate::client::http) takes over hyper-util's legacy client built for
/// [`ReplayBody<Full<Bytes>>`](crate::retry::ReplayBody); the inner service's error must convert
/// into the crate's [`Error`](crate::Error) ([`IntoError`]), which the stack's does, as do
/// hyper-util's, `std::io::Error` and tower's boxed error. A receiver that is not yours has no
/// use for the stack's own headers (its retry-owner marker, its deadline header): build the
/// client with [`no_internal_headers`](crate::client::ClientBuilder::no_internal_headers).
///
/// ```no_run
/// # #[cfg(feature = "hyper")]
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use surely::outbox::{MemoryOutbox, Relay, WebhookPublisher};
/// use surely::retry::ReplayBody;
///
/// let transport = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>();
/// let client = surely::client::http()
///     .timeout(Duration::from_secs(5))
///     .per_try_timeout(Duration::from_secs(2))
///     .build(transport)?;
/// let webhook = WebhookPublisher::new(client, "http://127.0.0.1:8080/hooks/orders".parse()?);
///
/// let outbox = MemoryOutbox::new();
/// let relay = Relay::builder(outbox.clone(), webhook)
///     .wake_on(outbox.wakeup())
///     .build()?;
/// relay.run(std::future::pending()).await;
/// # Ok(()) }
/// ```
#[cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::idempotency::IdempotencyLayer",
    )
)]
#[derive(Clone)]
pub struct WebhookPublisher<S> {
    inner: S,
    uri: Uri,
}

impl<S> WebhookPublisher<S> {
    /// Publishes by `POST`ing each event to `uri` through `service`.
    pub fn new(service: S, uri: Uri) -> Self {
        WebhookPublisher {
            inner: service,
            uri,
        }
    }

    /// The URI events are posted to.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    inner_accessors!();
}

impl<S: fmt::Debug> fmt::Debug for WebhookPublisher<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookPublisher")
            .field("inner", &self.inner)
            .field("uri", &self.uri)
            .finish()
    }
}

impl<S, RB> Service<Event> for WebhookPublisher<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: IntoError,
    <S::Error as IntoError>::Transport: std::error::Error + Send + Sync + 'static,
    S::Future: Send + 'static,
    RB: Body + Send + 'static,
{
    type Response = Response<()>;
    type Error = WebhookError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<()>, WebhookError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), WebhookError>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| WebhookError::transport(e.into_error()))
    }

    fn call(&mut self, event: Event) -> Self::Future {
        let req = match request(&self.uri, &event) {
            Ok(req) => req,
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let call = self.inner.call(req);
        Box::pin(async move {
            let res = call
                .await
                .map_err(|e| WebhookError::transport(e.into_error()))?;
            let (mut parts, body) = res.into_parts();
            drain(body).await;
            let status = parts.status;
            if !status.is_success() {
                let call = parts.extensions.remove::<CallOutcome>();
                return Err(WebhookError::of(Kind::Status(status), call));
            }
            let res = Response::from_parts(parts, ());
            match res.call_outcome() {
                Some(call) if call.outcome() == Outcome::Unknown => {
                    Err(WebhookError::of(Kind::Unknown(status), Some(call.clone())))
                }
                _ => Ok(res),
            }
        })
    }
}

/// The request that publishes `event`.
fn request(uri: &Uri, event: &Event) -> Result<Request<Full<Bytes>>, WebhookError> {
    let key = IdempotencyKey::new(event.id().as_str()).map_err(|e| {
        WebhookError::of(
            Kind::Invalid {
                why: "its id is not an idempotency key".to_owned(),
                source: Some(e.into()),
            },
            None,
        )
    })?;
    let mut headers = HeaderMap::with_capacity(event.headers().len().saturating_add(5));
    for (name, value) in event.headers() {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            WebhookError::invalid(format!("its header name `{name}` is not an HTTP one"))
        })?;
        if RESERVED.contains(&name) {
            return Err(WebhookError::invalid(format!(
                "its header `{name}` is one the webhook publisher or the transport writes"
            )));
        }
        let value = HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
            WebhookError::invalid(format!("its header `{name}` has a value HTTP refuses"))
        })?;
        headers.append(name, value);
    }
    if !headers.contains_key(header::CONTENT_TYPE) {
        headers.insert(header::CONTENT_TYPE, OCTET_STREAM);
    }
    headers.insert(IDEMPOTENCY_KEY, key.to_header_value());
    // UTF-8 beyond ASCII is sent as it is (HTTP's obs-text).
    let aggregate = HeaderValue::from_bytes(event.aggregate().as_bytes())
        .map_err(|_| WebhookError::invalid("its aggregate is not a valid header value"))?;
    headers.insert(AGGREGATE, aggregate);
    headers.insert(VERSION, HeaderValue::from(event.version()));
    let kind = HeaderValue::from_str(event.kind())
        .map_err(|_| WebhookError::invalid("its kind is not a valid header value"))?;
    headers.insert(KIND, kind);

    let mut req = Request::new(Full::new(event.payload().clone()));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = uri.clone();
    *req.headers_mut() = headers;
    Ok(req)
}

/// Reads a response body to its end and throws it away: at most [`DRAIN_BYTES`], for at most
/// [`DRAIN_TIME`]; an error ends it too (the status already spoke).
async fn drain<B: Body>(body: B) {
    let mut body = std::pin::pin!(body);
    if body.is_end_stream() {
        return;
    }
    let read = async {
        let mut left = DRAIN_BYTES;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                match left.checked_sub(data.remaining()) {
                    Some(rest) => left = rest,
                    None => return,
                }
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read).await;
}

/// A webhook publish failed: the receiver answered a status other than `2xx`, the call failed
/// or ended with an unknown outcome, or the event could not be written as a request. See
/// [`WebhookPublisher`].
///
/// Its message says which, with the call's outcome when the client handed one back
/// (`webhook answered 400 Bad Request (failed after 1 attempt)`); the call's error, or what
/// refused the event, is its [`source`](std::error::Error::source), once. The
/// [`Relay`](super::Relay) keeps a failed publish's error with its sources
/// (`webhook call failed: unknown after 2 attempts (connection closed, sent): client error
/// (SendRequest): connection closed before message completed`), which is what an operator reads in a quarantined
/// event's last error.
#[derive(Debug)]
pub struct WebhookError {
    kind: Kind,
    call: Option<CallOutcome>,
}

#[derive(Debug)]
enum Kind {
    Status(StatusCode),
    Unknown(StatusCode),
    // The crate's `Error` (the source) says the call's outcome itself.
    Transport(BoxError),
    Invalid {
        why: String,
        source: Option<BoxError>,
    },
}

impl fmt::Display for WebhookError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Status(status) => write!(f, "webhook answered {status}")?,
            Kind::Unknown(status) => write!(
                f,
                "webhook answered {status}, but the client could not vouch for the call"
            )?,
            Kind::Transport(_) => return f.write_str("webhook call failed"),
            Kind::Invalid { why, .. } => write!(f, "event not sent to the webhook: {why}")?,
        }
        if let Some(call) = &self.call {
            f.write_str(" (")?;
            fmt_verdict(f, call.outcome(), call.attempts())?;
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl std::error::Error for WebhookError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Transport(e) => Some(&**e),
            Kind::Invalid {
                source: Some(e), ..
            } => Some(&**e),
            _ => None,
        }
    }
}

impl WebhookError {
    fn of(kind: Kind, call: Option<CallOutcome>) -> Self {
        WebhookError { kind, call }
    }

    fn transport<E>(error: crate::Error<E>) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let call = error.call_outcome().cloned();
        WebhookError::of(Kind::Transport(Box::new(error)), call)
    }

    fn invalid(why: impl Into<String>) -> Self {
        WebhookError::of(
            Kind::Invalid {
                why: why.into(),
                source: None,
            },
            None,
        )
    }

    /// The status the receiver answered, when it answered one that is not a publish (or a `2xx`
    /// whose call outcome is unknown).
    pub fn status(&self) -> Option<StatusCode> {
        match self.kind {
            Kind::Status(status) | Kind::Unknown(status) => Some(status),
            _ => None,
        }
    }

    /// What the call came to, when the client handed its outcome back (the
    /// [client stack](mod@crate::client) always does): its [`Outcome`], why it stopped, how many
    /// attempts went out.
    pub fn call_outcome(&self) -> Option<&CallOutcome> {
        self.call.as_ref()
    }

    /// Whether the call failed without a response: the transport's error, or one of the
    /// client stack's (a deadline, an open circuit breaker...).
    pub fn is_transport(&self) -> bool {
        matches!(self.kind, Kind::Transport(_))
    }

    /// The call's error, when it failed without a response: a [`crate::Error`] of the
    /// transport's error, to downcast.
    pub fn transport_error(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        match &self.kind {
            Kind::Transport(e) => Some(&**e),
            _ => None,
        }
    }

    /// Whether the event could not be written as an HTTP request (a header name or value the
    /// `http` crate refuses, a header the publisher writes itself): nothing was sent, and
    /// publishing it again fails the same way, so the relay quarantines it after its limit.
    pub fn is_invalid_event(&self) -> bool {
        matches!(self.kind, Kind::Invalid { .. })
    }
}
