//! Records of responses whose status is in their trailers (gRPC), settled at the end of the
//! stream: the body wrapper, the cell it shares with the record layers, and the layer that
//! puts them around a transport. [`WatchTrailersLayer`] says how the records settle.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::classify::Classification;

/// How a watched body ended.
pub(crate) enum End<'a> {
    /// With these trailers, or with none.
    Trailers(Option<&'a HeaderMap>),
    /// With an error, after the response had started.
    Broken,
    /// Dropped by the caller before its end.
    Dropped,
}

impl End<'_> {
    fn to_owned(&self) -> OwnedEnd {
        match self {
            End::Trailers(t) => OwnedEnd::Trailers(t.cloned()),
            End::Broken => OwnedEnd::Broken,
            End::Dropped => OwnedEnd::Dropped,
        }
    }
}

/// An [`End`] kept for a deferral that comes after it.
enum OwnedEnd {
    Trailers(Option<HeaderMap>),
    Broken,
    Dropped,
}

impl OwnedEnd {
    fn borrow(&self) -> End<'_> {
        match self {
            OwnedEnd::Trailers(t) => End::Trailers(t.as_ref()),
            OwnedEnd::Broken => End::Broken,
            OwnedEnd::Dropped => End::Dropped,
        }
    }
}

/// How a deferred attempt settled: its number, its classification and whether the caller
/// dropped the body before its end.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settled {
    pub(crate) attempt: u32,
    pub(crate) classification: Classification,
    pub(crate) cancelled: bool,
}

type SettleAttempt = Box<dyn FnOnce(End<'_>) -> Settled + Send>;
type SettleCall = Box<dyn FnOnce(Settled) + Send>;

#[derive(Default)]
struct WatchState {
    /// The attempt record waiting for the end, and the call records to make after it.
    attempt: Option<SettleAttempt>,
    calls: Vec<SettleCall>,
    /// How the body ended, if it ended before the attempt deferred to it.
    ended: Option<OwnedEnd>,
    /// How the attempt settled, once it has.
    settled: Option<Settled>,
}

/// What a watched body and the record layers share: put in the response's extensions by the
/// transport, which keeps a clone in the body.
#[derive(Clone, Default)]
pub(crate) struct Watch(Arc<Mutex<WatchState>>);

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

/// Put in a request's extensions by an attempt record layer that would defer to the trailers:
/// the transport watches the response's body only when asked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WantsTrailers;

impl Watch {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Defers an attempt record to the end of the body (at once if it has ended already).
    pub(crate) fn defer_attempt(&self, record: SettleAttempt) {
        let mut state = self.lock();
        match state.ended.take() {
            Some(end) => {
                drop(state);
                self.settle(record, end.borrow());
            }
            None => state.attempt = Some(record),
        }
    }

    /// Makes a call record after the deferred attempt's (at once if that has settled already).
    pub(crate) fn then_call(&self, record: SettleCall) {
        let mut state = self.lock();
        match state.settled {
            Some(settled) => {
                drop(state);
                record(settled);
            }
            None => state.calls.push(record),
        }
    }

    /// The body ended.
    fn end(&self, end: End<'_>) {
        let mut state = self.lock();
        match state.attempt.take() {
            Some(record) => {
                drop(state);
                self.settle(record, end);
            }
            None if state.settled.is_none() && state.ended.is_none() => {
                state.ended = Some(end.to_owned());
            }
            None => {}
        }
    }

    /// Records the attempt, then its calls; the recorders run without the lock held.
    fn settle(&self, record: SettleAttempt, end: End<'_>) {
        let settled = record(end);
        let calls = {
            let mut state = self.lock();
            state.settled = Some(settled);
            std::mem::take(&mut state.calls)
        };
        for call in calls {
            call(settled);
        }
    }
}

pin_project! {
    /// A response body whose end settles the records deferred to it. Made by
    /// [`WatchTrailersLayer`]; the data and trailers pass through unchanged.
    pub struct WatchedBody<B: Body> {
        #[pin]
        inner: B,
        watch: Option<Watch>,
    }

    impl<B: Body> PinnedDrop for WatchedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(watch) = this.watch.take() {
                // A body that had ended without trailers ended so, read or not.
                watch.end(if this.inner.is_end_stream() {
                    End::Trailers(None)
                } else {
                    End::Dropped
                });
            }
        }
    }
}

impl<B: Body> WatchedBody<B> {
    /// A body nobody watches: what a [resolver](crate::retry::Resolve) or a test hands back
    /// where the client's responses are watched bodies.
    pub fn new(inner: B) -> Self {
        WatchedBody { inner, watch: None }
    }

    pub(crate) fn watched(inner: B, watch: Option<Watch>) -> Self {
        WatchedBody { inner, watch }
    }
}

impl<B: Body + fmt::Debug> fmt::Debug for WatchedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchedBody")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for WatchedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(watch) = this.watch.as_ref() {
            let end = match &frame {
                Some(Ok(frame)) => frame.trailers_ref().map(|t| End::Trailers(Some(t))),
                Some(Err(_)) => Some(End::Broken),
                None => Some(End::Trailers(None)),
            };
            if let Some(end) = end {
                watch.end(end);
                *this.watch = None;
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Watches a response's body for its end when the request asked for it, and says so in the
/// response's extensions. `None` when not asked.
#[inline]
pub(crate) fn watch_response<B>(asked: bool, res: &mut Response<B>) -> Option<Watch> {
    if !asked {
        return None;
    }
    let watch = Watch::default();
    res.extensions_mut().insert(watch.clone());
    Some(watch)
}

/// Lets the record layers above settle gRPC attempts from their trailers, over a transport of
/// `http` messages. [`GrpcTransport`](crate::grpc::GrpcTransport) does the same for tonic
/// channels, without this layer.
///
/// Put it right around the transport, inside every record layer. A response gets a
/// [`WatchedBody`] always; the body is watched (at the cost of one small allocation) only for
/// requests an enabled [`RecordAttemptLayer`](super::RecordAttemptLayer) above marked, which
/// it does for gRPC requests.
///
/// An attempt whose classifier defers to the end of the stream is then recorded when the body
/// ends, and its call right after it; until then neither is. The body ends in one of three
/// ways:
///
/// * with its trailers, or with none: the classifier reads them (no `grpc-status` at all is a
///   failure after the response started);
/// * with an error: the stream broke after the response started (*maybe committed*);
/// * dropped before its end: the caller stopped reading. The attempt keeps what the head said
///   and is marked `cancelled`, and the call stops as
///   [`StopReason::Cancelled`](crate::StopReason::Cancelled).
///
/// Without a watched body, the records classify at the head, as the retry layer always does
/// (a stream that has reached the caller cannot be retried anyway).
///
/// ```
/// use surely::record::{InMemoryRecorder, RecordAttemptLayer, WatchTrailersLayer};
/// use surely::classify::AttemptClass;
/// use http_body_util::{BodyExt, Full};
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A gRPC server that answers 200, then `UNAVAILABLE` in the trailers.
/// let server = service_fn(|_req: http::Request<Full<bytes::Bytes>>| async {
///     let mut trailers = http::HeaderMap::new();
///     trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
///     let body = Full::new(bytes::Bytes::from_static(b"update"))
///         .with_trailers(async { Some(Ok(trailers)) });
///     Ok::<_, std::io::Error>(http::Response::new(body))
/// });
/// let recorder = InMemoryRecorder::new();
/// let mut client = ServiceBuilder::new()
///     .layer(RecordAttemptLayer::new(recorder.clone()))
///     .layer(WatchTrailersLayer::new())
///     .service(server);
/// let req = http::Request::post("http://shop/shop.Orders/Watch")
///     .header("content-type", "application/grpc")
///     .body(Full::default())
///     .unwrap();
/// let res = client.ready().await.unwrap().call(req).await.unwrap();
/// // Nothing is recorded until the body ends...
/// assert!(recorder.attempts().is_empty());
/// res.into_body().collect().await.unwrap();
/// // ...and then from the trailers.
/// assert_eq!(recorder.attempts()[0].class(), AttemptClass::MaybeCommitted);
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct WatchTrailersLayer {
    _priv: (),
}

impl WatchTrailersLayer {
    /// The layer.
    pub fn new() -> Self {
        WatchTrailersLayer::default()
    }
}

impl<S> Layer<S> for WatchTrailersLayer {
    type Service = WatchTrailers<S>;

    fn layer(&self, inner: S) -> WatchTrailers<S> {
        WatchTrailers { inner }
    }
}

/// The service made by [`WatchTrailersLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct WatchTrailers<S> {
    inner: S,
}

impl<S> WatchTrailers<S> {
    inner_accessors!();
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for WatchTrailers<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: Body,
{
    type Response = Response<WatchedBody<ResB>>;
    type Error = S::Error;
    type Future = WatchFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let asked = req.extensions().get::<WantsTrailers>().is_some();
        WatchFuture {
            inner: self.inner.call(req),
            asked,
        }
    }
}

pin_project! {
    /// The future of [`WatchTrailers`].
    pub struct WatchFuture<F> {
        #[pin]
        inner: F,
        asked: bool,
    }
}

impl<F> fmt::Debug for WatchFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for WatchFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Body,
{
    type Output = Result<Response<WatchedBody<B>>, E>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = std::task::ready!(this.inner.poll(cx))?;
        let watch = watch_response(*this.asked, &mut res);
        Poll::Ready(Ok(res.map(|body| WatchedBody::watched(body, watch))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::AttemptClass;

    fn settled(attempt: u32, classification: Classification) -> Settled {
        Settled {
            attempt,
            classification,
            cancelled: false,
        }
    }

    #[test]
    fn an_end_before_the_deferral_settles_it_at_once() {
        let watch = Watch::default();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("5"));
        watch.end(End::Trailers(Some(&trailers)));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        watch.defer_attempt(Box::new(move |end| {
            let status = match end {
                End::Trailers(Some(t)) => t["grpc-status"].to_str().unwrap().to_owned(),
                _ => "none".to_owned(),
            };
            s.lock().unwrap().push(status);
            settled(1, Classification::success())
        }));
        let s = seen.clone();
        watch.then_call(Box::new(move |settled| {
            s.lock()
                .unwrap()
                .push(format!("call after {}", settled.attempt));
        }));
        assert_eq!(*seen.lock().unwrap(), ["5", "call after 1"]);
    }

    #[test]
    fn the_first_end_counts_and_calls_follow_their_attempt() {
        let watch = Watch::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        watch.defer_attempt(Box::new(move |end| {
            o.lock().unwrap().push("attempt");
            assert!(matches!(end, End::Broken));
            settled(
                2,
                Classification::failure_at(crate::classify::DeliveryPhase::Sent),
            )
        }));
        let o = order.clone();
        watch.then_call(Box::new(move |settled| {
            assert_eq!(settled.classification.class(), AttemptClass::MaybeCommitted);
            o.lock().unwrap().push("call");
        }));
        watch.end(End::Broken);
        watch.end(End::Dropped);
        assert_eq!(*order.lock().unwrap(), ["attempt", "call"]);
    }
}
