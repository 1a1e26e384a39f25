//! Replayable request bodies: buffer small bodies once so that every attempt sends the same bytes.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf, Bytes};
use http::{HeaderMap, Request};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::classify::BoxError;
use crate::error::BodyNotReplayable;

/// The default buffering limit: 64 KiB.
pub(crate) const DEFAULT_REPLAY_LIMIT: usize = 64 * 1024;

/// Marks a request whose body could not be buffered (too large, or it failed while being read):
/// it can be sent once. [`RetryLayer`](super::RetryLayer) does not retry such a request, and the
/// call's record says [`NotReplayable`](crate::StopReason::NotReplayable) when a retry
/// was wanted.
///
/// Insert it yourself for a request that must not be sent twice for reasons of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotReplayable;

/// Buffers request bodies up to a limit (default 64 KiB), so that the
/// [`RetryLayer`](super::RetryLayer) inside can send the same bytes on every attempt.
///
/// A retry sends a copy of the request (`Req: Clone`), and a streaming body such as hyper's
/// `Incoming` cannot be copied. This layer turns `Request<B>` into `Request<ReplayBody<B>>`,
/// which is `Clone`:
///
/// * a body that ends within the limit is read once into memory, trailers included, and every
///   copy replays it;
/// * a larger body (by its size hint, or found while reading), or one that fails while being
///   read, is sent as it comes, once: the request is marked [`NotReplayable`] and its copies
///   have no body to give (they fail if polled). The retry layer does not make copies of such a
///   request, so the call is single-attempt, and its record says why.
///
/// The body must be `Unpin` (hyper's `Incoming`, `Full`, `Empty` and boxed bodies are); pin
/// another one with `Box::pin` or `http_body_util::BodyExt::boxed` first.
///
/// Reading happens before the inner service is called, inside the call's deadline when a
/// [`SetDeadlineLayer`](crate::deadline::SetDeadlineLayer) is outside. Place the layer between the
/// idempotency-key layer and the retry layer
/// ([layer order](crate::docs::architecture#layer-order)).
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use surely::retry::{ReplayBody, ReplayBodyLayer, RetryLayer};
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut client = ServiceBuilder::new()
///     .layer(ReplayBodyLayer::new())
///     .layer(RetryLayer::new())
///     .service(service_fn(|req: http::Request<ReplayBody<Full<Bytes>>>| async move {
///         let body = req.into_body().collect().await?.to_bytes();
///         Ok::<_, surely::classify::BoxError>(http::Response::new(body))
///     }));
///
/// let req = http::Request::put("/orders/o-1").body(Full::new(Bytes::from("qty=1"))).unwrap();
/// let res = client.ready().await.unwrap().call(req).await.unwrap();
/// assert_eq!(res.body(), "qty=1");
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ReplayBodyLayer {
    limit: usize,
}

impl ReplayBodyLayer {
    /// Buffers bodies of up to 64 KiB.
    pub fn new() -> Self {
        ReplayBodyLayer {
            limit: DEFAULT_REPLAY_LIMIT,
        }
    }

    /// Buffers bodies of up to `limit` bytes (default 64 KiB: 65,536); larger ones are sent
    /// once. Zero makes every request with a body single-attempt (an empty body is still
    /// replayable).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

impl Default for ReplayBodyLayer {
    fn default() -> Self {
        ReplayBodyLayer::new()
    }
}

impl<S> Layer<S> for ReplayBodyLayer {
    type Service = ReplayBodies<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ReplayBodies {
            inner,
            limit: self.limit,
        }
    }
}

/// The service made by [`ReplayBodyLayer`].
#[derive(Clone, Debug)]
pub struct ReplayBodies<S> {
    inner: S,
    limit: usize,
}

impl<S> ReplayBodies<S> {
    inner_accessors!();
}

impl<S, B> Service<Request<B>> for ReplayBodies<S>
where
    S: Service<Request<ReplayBody<B>>> + Clone,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ReplayFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<B>) -> Self::Future {
        if req.body().is_end_stream() {
            // The usual case of a GET: an empty body (`Empty`, or a `Full` of nothing) has
            // nothing to read ahead and replays as nothing; the request goes on as it is.
            return ReplayFuture {
                state: State::Calling {
                    future: self.inner.call(req.map(ReplayBody::ended)),
                },
            };
        }
        self.read_and_call(req)
    }
}

impl<S> ReplayBodies<S> {
    /// The call of a request whose body has not ended yet: read it ahead, up to the limit.
    fn read_and_call<B>(&mut self, req: Request<B>) -> ReplayFuture<S, B>
    where
        S: Service<Request<ReplayBody<B>>> + Clone,
        B: Body + Unpin,
        B::Error: Into<BoxError>,
    {
        let (parts, mut body) = req.into_parts();
        let mut chunks = VecDeque::new();
        let mut read = 0;
        let ahead = if body.size_hint().lower() > self.limit as u64 {
            // Known to be too large: read nothing ahead, send it as it comes.
            Poll::Ready(Read::Once)
        } else {
            // A body that is all there (`Full`, a buffered body) is read now, without waiting:
            // polled with a waker that does nothing, a body that must wait says so, and the
            // future reads it on, with its task's waker.
            let mut cx = Context::from_waker(Waker::noop());
            read_ahead(&mut body, &mut chunks, &mut read, self.limit, &mut cx)
        };
        let state = match ahead {
            // The usual case: the service that was made ready is called at once, and the
            // future is its future.
            Poll::Ready(ahead) => State::Calling {
                future: call_with(&mut self.inner, parts, replay_body(ahead, chunks, body)),
            },
            // The service that was made ready takes the call once the body is read; a fresh
            // clone stays behind, as in tower's `Buffer` and `Steer`.
            Poll::Pending => {
                let clone = self.inner.clone();
                State::Reading {
                    reading: Some(Box::new(Reading {
                        inner: std::mem::replace(&mut self.inner, clone),
                        parts,
                        limit: self.limit,
                        body,
                        chunks,
                        read,
                    })),
                }
            }
        };
        ReplayFuture { state }
    }
}

/// A body being read ahead, and what it takes to make the call once it is: the rare part of
/// a [`ReplayFuture`], boxed so that the future of a body read at once is its inner future's
/// size.
struct Reading<S, B> {
    inner: S,
    parts: http::request::Parts,
    limit: usize,
    body: B,
    chunks: VecDeque<Bytes>,
    read: usize,
}

pin_project! {
    /// The future of [`ReplayBodies`]: reads the body (up to the limit) if it was not all there
    /// when the call was made, then runs the call.
    pub struct ReplayFuture<S, B>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        Reading { reading: Option<Box<Reading<S, B>>> },
        Calling { #[pin] future: S::Future },
    }
}

/// What reading the body ahead found.
enum Read {
    Ended(Option<HeaderMap>),
    /// Over the limit, or an unknown frame: send what was read, then the rest, once.
    Once,
    /// The body failed: send what was read, then the error, once.
    Failed(BoxError),
}

/// Reads `body` into `chunks` until it ends, fails, or passes `limit`.
fn read_ahead<B>(
    body: &mut B,
    chunks: &mut VecDeque<Bytes>,
    read: &mut usize,
    limit: usize,
    cx: &mut Context<'_>,
) -> Poll<Read>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    loop {
        match ready!(Pin::new(&mut *body).poll_frame(cx)) {
            None => return Poll::Ready(Read::Ended(None)),
            // The error is the transport's to report: the inner service reads what came before
            // it, then the error itself, once.
            Some(Err(e)) => return Poll::Ready(Read::Failed(e.into())),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    let bytes = data.copy_to_bytes(data.remaining());
                    *read += bytes.len();
                    if !bytes.is_empty() {
                        chunks.push_back(bytes);
                    }
                    if *read > limit {
                        return Poll::Ready(Read::Once);
                    }
                }
                Err(frame) => {
                    return Poll::Ready(match frame.into_trailers() {
                        Ok(trailers) => Read::Ended(Some(trailers)),
                        // A frame of a kind this crate does not know: it cannot be replayed
                        // faithfully.
                        Err(_) => Read::Once,
                    });
                }
            },
        }
    }
}

/// The body to send, from what reading ahead found.
fn replay_body<B>(read: Read, chunks: VecDeque<Bytes>, body: B) -> ReplayBody<B> {
    match read {
        Read::Ended(trailers) => ReplayBody::buffered(chunks, trailers),
        Read::Once => ReplayBody::once(chunks, Some(body), None),
        Read::Failed(e) => ReplayBody::once(chunks, None, Some(e)),
    }
}

/// Calls `inner` with the request of `parts` and `body`, marked [`NotReplayable`] when the body
/// is sent once.
fn call_with<S, B>(inner: &mut S, mut parts: http::request::Parts, body: ReplayBody<B>) -> S::Future
where
    S: Service<Request<ReplayBody<B>>>,
{
    if body.is_once() {
        parts.extensions.insert(NotReplayable);
    }
    inner.call(Request::from_parts(parts, body))
}

impl<S, B> Future for ReplayFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let future = match state.as_mut().project() {
                StateProj::Calling { future } => return future.poll(cx),
                StateProj::Reading { reading } => {
                    let r = reading
                        .as_mut()
                        .expect("`ReplayFuture` polled after completion");
                    let ahead = ready!(read_ahead(
                        &mut r.body,
                        &mut r.chunks,
                        &mut r.read,
                        r.limit,
                        cx
                    ));
                    let Some(r) = reading.take() else {
                        unreachable!("checked above")
                    };
                    let Reading {
                        mut inner,
                        parts,
                        body,
                        chunks,
                        ..
                    } = *r;
                    call_with(&mut inner, parts, replay_body(ahead, chunks, body))
                }
            };
            state.set(State::Calling { future });
        }
    }
}

impl<S, B> fmt::Debug for ReplayFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Calling { .. } => "calling",
            State::Reading { .. } => "reading",
        };
        f.debug_struct("ReplayFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

/// A request body that can be sent again: the body of a request that went through a
/// [`ReplayBodyLayer`].
///
/// A buffered body is replayed by every copy of the request (cloning it copies no bytes). A body
/// that could not be buffered is sent as it comes by the original request; its copies have
/// nothing to send and fail with an error if polled (the request carries [`NotReplayable`], so
/// the retry layer makes no copies).
pub struct ReplayBody<B> {
    kind: Kind<B>,
}

// Small (48 bytes over an `Empty` body, against 128 with the trailers and the rare variant
// inline): every copy of the request carries it, and every layer moves the request.
enum Kind<B> {
    /// Nothing to send (a GET's body): copied and dropped without touching any bytes.
    Empty,
    Buffered {
        data: Bytes,
        trailers: Option<Box<HeaderMap>>,
    },
    Once(Box<Once<B>>),
    Gone,
}

/// What [`ReplayBody::buffered_bytes`] lends for an empty body.
static NO_BYTES: Bytes = Bytes::new();

/// A body sent as it comes, once.
struct Once<B> {
    prefix: VecDeque<Bytes>,
    /// The rest of the body; `None` once it failed.
    rest: Option<B>,
    /// The error the body failed with while it was read ahead, to be given after `prefix`.
    error: Option<BoxError>,
}

impl<B> ReplayBody<B> {
    fn buffered(mut chunks: VecDeque<Bytes>, trailers: Option<HeaderMap>) -> Self {
        let data = match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.pop_front().unwrap_or_default(),
            _ => {
                let len = chunks.iter().map(Bytes::len).sum();
                let mut all = Vec::with_capacity(len);
                for chunk in chunks {
                    all.extend_from_slice(&chunk);
                }
                Bytes::from(all)
            }
        };
        ReplayBody {
            kind: Kind::Buffered {
                data,
                trailers: trailers.map(Box::new),
            },
        }
    }

    pub(crate) fn once(prefix: VecDeque<Bytes>, rest: Option<B>, error: Option<BoxError>) -> Self {
        ReplayBody {
            kind: Kind::Once(Box::new(Once {
                prefix,
                rest,
                error,
            })),
        }
    }

    /// The replay of a body that had ended before anything was read from it: nothing.
    fn ended(_: B) -> Self {
        ReplayBody { kind: Kind::Empty }
    }

    /// A body of these bytes, replayable.
    pub fn from_bytes(data: impl Into<Bytes>) -> Self {
        ReplayBody {
            kind: Kind::Buffered {
                data: data.into(),
                trailers: None,
            },
        }
    }

    /// Whether the body was buffered, so that copies of it send the same bytes.
    pub fn is_replayable(&self) -> bool {
        matches!(self.kind, Kind::Buffered { .. } | Kind::Empty)
    }

    /// The buffered bytes, for a replayable body.
    pub fn buffered_bytes(&self) -> Option<&Bytes> {
        match &self.kind {
            Kind::Buffered { data, .. } => Some(data),
            Kind::Empty => Some(&NO_BYTES),
            _ => None,
        }
    }

    fn is_once(&self) -> bool {
        matches!(self.kind, Kind::Once(_))
    }
}

impl<B> Clone for ReplayBody<B> {
    fn clone(&self) -> Self {
        let kind = match &self.kind {
            Kind::Empty => Kind::Empty,
            Kind::Buffered { data, trailers } => Kind::Buffered {
                data: data.clone(),
                trailers: trailers.clone(),
            },
            Kind::Once(_) | Kind::Gone => Kind::Gone,
        };
        ReplayBody { kind }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Empty => f.debug_struct("ReplayBody").field("buffered", &0).finish(),
            Kind::Buffered { data, .. } => f
                .debug_struct("ReplayBody")
                .field("buffered", &data.len())
                .finish(),
            Kind::Once(_) => f.debug_struct("ReplayBody").field("once", &true).finish(),
            Kind::Gone => f.debug_struct("ReplayBody").field("gone", &true).finish(),
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Buffered { data, trailers } => {
                if !data.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(std::mem::take(data)))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(*t))))
            }
            Kind::Once(once) => {
                let Once {
                    prefix,
                    rest,
                    error,
                } = &mut **once;
                if let Some(chunk) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                if let Some(e) = error.take() {
                    return Poll::Ready(Some(Err(e)));
                }
                let Some(rest) = rest else {
                    return Poll::Ready(None);
                };
                let frame = ready!(Pin::new(rest).poll_frame(cx));
                Poll::Ready(frame.map(|r| {
                    r.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                        .map_err(Into::into)
                }))
            }
            Kind::Gone => Poll::Ready(Some(Err(BodyNotReplayable.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Buffered { data, trailers } => data.is_empty() && trailers.is_none(),
            Kind::Once(once) => {
                once.prefix.is_empty()
                    && once.error.is_none()
                    && once.rest.as_ref().is_none_or(B::is_end_stream)
            }
            Kind::Gone => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Buffered { data, .. } => SizeHint::with_exact(data.len() as u64),
            Kind::Once(once) => {
                let read: u64 = once.prefix.iter().map(|c| c.len() as u64).sum();
                let rest = once.rest.as_ref().map(B::size_hint).unwrap_or_default();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
            Kind::Gone => SizeHint::default(),
        }
    }
}
