//! The body idle timeout: a response body that goes quiet for too long is failed with
//! [`BodyIdle`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

use crate::classify::BoxError;
use crate::error::BodyIdle;
use crate::ConfigError;

/// Fails a response body with [`BodyIdle`] when no frame arrives for `idle` while the caller
/// waits for one: the third phase's timeout, after the connect and the response head
/// ([`docs::deadlines`](crate::docs::deadlines#three-phases-three-timeouts)).
///
/// The clock runs only while the caller is waiting for a frame (a `poll_frame` that returned
/// `Pending`) and starts over with every frame, so a long body that keeps coming never times
/// out, and a caller that is slow to read is not the server's fault. The whole body is not
/// bounded: a stream may last as long as it keeps talking. The head is not timed here: that is
/// the [attempt timeout](super::AttemptTimeoutLayer)'s.
///
/// The body's error type becomes [`BoxError`]: the inner body's error, or a [`BodyIdle`],
/// which the classifiers find there ([`ClassifyError`](crate::classify::ClassifyError)).
/// What an idle body means for the outcome: the response had started (its head arrived), so
/// for a success status the server committed and only the rest of the answer is lost. Under a
/// [`WatchTrailersLayer`](crate::record::WatchTrailersLayer) with records settled at the end of
/// the body, such an attempt is recorded *maybe committed* at
/// [`ResponseStarted`](crate::classify::DeliveryPhase::ResponseStarted), and a write's call
/// ends [`Unknown`](crate::Outcome::Unknown). Put this layer inside the watch (right around the
/// transport), so the watch sees the error; [`ClientBuilder::body_idle_timeout`] does that.
///
/// [`ClientBuilder::body_idle_timeout`]: crate::client::ClientBuilder::body_idle_timeout
///
/// # How this differs from tower-http's
///
/// tower-http's `ResponseBodyTimeoutLayer` is the same kind of timer; this one says what
/// timed out in a typed error the crate's classifiers and records read, and refuses a zero
/// duration instead of failing every body.
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, StreamBody};
/// use surely::timeout::{BodyIdle, BodyIdleTimeoutLayer};
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// // A server that sends one frame, then nothing.
/// let server = service_fn(|_: http::Request<()>| async {
///     let first = Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(b"first")));
///     let frames = tokio_stream::StreamExt::chain(
///         tokio_stream::iter([first]),
///         tokio_stream::pending(),
///     );
///     Ok::<_, std::io::Error>(http::Response::new(StreamBody::new(frames)))
/// });
/// let mut client = BodyIdleTimeoutLayer::new(Duration::from_secs(5)).unwrap().layer(server);
/// let res = client.ready().await.unwrap().call(http::Request::new(())).await.unwrap();
/// let mut body = res.into_body();
/// let first = body.frame().await.unwrap().unwrap();
/// assert_eq!(first.into_data().unwrap(), "first");
/// let err = body.frame().await.unwrap().unwrap_err();
/// assert_eq!(err.downcast_ref::<BodyIdle>().unwrap().idle(), Duration::from_secs(5));
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BodyIdleTimeoutLayer {
    idle: Duration,
}

impl BodyIdleTimeoutLayer {
    /// Fails a body that sends no frame for `idle`. `idle` must be greater than zero.
    pub fn new(idle: Duration) -> Result<Self, ConfigError> {
        if idle.is_zero() {
            return Err(ConfigError::new(
                "body idle timeout",
                "must be greater than zero",
            ));
        }
        Ok(BodyIdleTimeoutLayer { idle })
    }

    /// The layer, for a duration the caller has checked (the client builder checks it when it
    /// builds).
    pub(crate) fn unchecked(idle: Duration) -> Self {
        BodyIdleTimeoutLayer { idle }
    }

    /// How long a body may stay quiet.
    pub fn idle(&self) -> Duration {
        self.idle
    }
}

impl<S> Layer<S> for BodyIdleTimeoutLayer {
    type Service = BodyIdleTimeout<S>;

    fn layer(&self, inner: S) -> BodyIdleTimeout<S> {
        BodyIdleTimeout {
            inner,
            idle: self.idle,
        }
    }
}

/// The service made by [`BodyIdleTimeoutLayer`]: its responses' bodies are
/// [`IdleTimeoutBody`]s.
///
/// # Readiness
///
/// `poll_ready` is the inner service's.
#[derive(Clone, Debug)]
pub struct BodyIdleTimeout<S> {
    inner: S,
    idle: Duration,
}

impl<S> BodyIdleTimeout<S> {
    /// Wraps `inner` with the layer's settings.
    pub fn new(inner: S, layer: BodyIdleTimeoutLayer) -> Self {
        layer.layer(inner)
    }

    inner_accessors!();
}

impl<S, Req, B> Service<Req> for BodyIdleTimeout<S>
where
    S: Service<Req, Response = http::Response<B>>,
    B: Body,
{
    type Response = http::Response<IdleTimeoutBody<B>>;
    type Error = S::Error;
    type Future = future::BodyFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        future::BodyFuture {
            inner: self.inner.call(req),
            idle: self.idle,
        }
    }
}

/// The future, public in a private module: named by the service's `Future` type only.
mod future {
    use super::*;

    pin_project! {
        /// The future of [`BodyIdleTimeout`].
        pub struct BodyFuture<F> {
            #[pin]
            pub(super) inner: F,
            pub(super) idle: Duration,
        }
    }

    impl<F> fmt::Debug for BodyFuture<F> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("BodyFuture")
                .field("idle", &self.idle)
                .finish_non_exhaustive()
        }
    }

    impl<F, B, E> Future for BodyFuture<F>
    where
        F: Future<Output = Result<http::Response<B>, E>>,
        B: Body,
    {
        type Output = Result<http::Response<IdleTimeoutBody<B>>, E>;

        fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
            let this = self.project();
            let res = std::task::ready!(this.inner.poll(cx))?;
            let idle = *this.idle;
            Poll::Ready(Ok(res.map(|inner| IdleTimeoutBody {
                inner,
                sleep: None,
                idle,
                waiting: false,
                timed_out: false,
            })))
        }
    }
}

pin_project! {
    /// A response body failed with [`BodyIdle`] when no frame arrives for its idle timeout
    /// while the caller waits. Made by [`BodyIdleTimeoutLayer`]; frames pass through unchanged,
    /// and the inner body's errors are boxed.
    pub struct IdleTimeoutBody<B> {
        #[pin]
        inner: B,
        // Made on the first wait, and reset for each later one. Boxed, so that the body is
        // `Unpin` when the inner body is (as hyper's is), and `frame()` works on it.
        sleep: Option<Pin<Box<Sleep>>>,
        idle: Duration,
        // Whether the timer counts the current wait.
        waiting: bool,
        // Whether the body was failed for being idle: it ends there.
        timed_out: bool,
    }
}

impl<B> IdleTimeoutBody<B> {
    /// How long the body may stay quiet.
    pub fn idle(&self) -> Duration {
        self.idle
    }

    /// The wrapped body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: fmt::Debug> fmt::Debug for IdleTimeoutBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleTimeoutBody")
            .field("inner", &self.inner)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl<B> Body for IdleTimeoutBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, BoxError>>> {
        let this = self.project();
        if *this.timed_out {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            *this.waiting = false;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if !*this.waiting {
            // A new wait: the clock starts now. A duration too long for the clock never ends.
            let Some(at) = Instant::now().checked_add(*this.idle) else {
                return Poll::Pending;
            };
            match this.sleep.as_mut() {
                Some(sleep) => sleep.as_mut().reset(at),
                None => *this.sleep = Some(Box::pin(tokio::time::sleep_until(at))),
            }
            *this.waiting = true;
        }
        let fired = this
            .sleep
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready());
        if !fired {
            return Poll::Pending;
        }
        *this.timed_out = true;
        *this.waiting = false;
        Poll::Ready(Some(Err(Box::new(BodyIdle::new(*this.idle)))))
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.timed_out {
            return SizeHint::with_exact(0);
        }
        self.inner.size_hint()
    }
}
