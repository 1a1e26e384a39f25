//! The body idle timeout layer and its builder.

use std::time::Duration;

use tower_layer::Layer;

use super::BodyIdleTimeout;
use crate::time::MAX_DURATION;
use crate::ConfigError;

/// The shortest idle timeout the builder accepts: a nanosecond, in effect the clock's next
/// tick. [`BodyIdleTimeoutLayer::new`] counts zero as this.
const MIN_IDLE: Duration = Duration::from_nanos(1);

/// Fails a response body with [`BodyIdle`](crate::timeout::BodyIdle) when no frame arrives for `idle` while the caller
/// waits for one: the third phase's timeout, after the connect and the response head
/// ([`docs::deadlines`](crate::docs::deadlines#three-phases-three-timeouts)).
///
/// The clock runs only while the caller is waiting for a frame (a `poll_frame` that returned
/// `Pending`) and starts over with every frame, so a long body that keeps coming never times
/// out, and a caller that is slow to read is not the server's fault. The whole body is not
/// bounded: a stream may last as long as it keeps talking. The head is not timed here: that is
/// the [attempt timeout](crate::timeout::AttemptTimeoutLayer)'s.
///
/// The body's error type becomes [`BoxError`](crate::classify::BoxError): the inner body's error, or a [`BodyIdle`](crate::timeout::BodyIdle),
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
/// let mut client = BodyIdleTimeoutLayer::new(Duration::from_secs(5)).layer(server);
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

/// Builds a [`BodyIdleTimeoutLayer`], validating its idle timeout.
///
/// ```
/// use std::time::Duration;
/// use surely::timeout::BodyIdleTimeoutLayer;
///
/// let layer = BodyIdleTimeoutLayer::builder().idle(Duration::from_secs(5)).build()?;
/// assert_eq!(layer.idle(), Duration::from_secs(5));
/// let err = BodyIdleTimeoutLayer::builder().idle(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.setting(), "body idle timeout");
/// # Ok::<(), surely::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct BodyIdleTimeoutLayerBuilder {
    idle: Option<Duration>,
}

impl BodyIdleTimeoutLayer {
    /// Fails a body that sends no frame for `idle`.
    ///
    /// Never fails: `idle` is clamped into the range [`builder`](Self::builder) accepts. Zero
    /// counts as a nanosecond (a body that makes its caller wait fails at the clock's next
    /// tick); a duration past [`MAX_DURATION`] (ten years) counts as `MAX_DURATION`. The
    /// builder refuses both instead.
    pub fn new(idle: Duration) -> Self {
        BodyIdleTimeoutLayer {
            idle: idle.clamp(MIN_IDLE, MAX_DURATION),
        }
    }

    /// A builder, with no idle timeout yet: [`idle`](BodyIdleTimeoutLayerBuilder::idle) is
    /// needed.
    pub fn builder() -> BodyIdleTimeoutLayerBuilder {
        BodyIdleTimeoutLayerBuilder { idle: None }
    }

    /// How long a body may stay quiet.
    pub fn idle(&self) -> Duration {
        self.idle
    }
}

impl BodyIdleTimeoutLayerBuilder {
    /// Fails a body that sends no frame for `idle`. Must be greater than zero and at most
    /// [`MAX_DURATION`] (ten years).
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = Some(idle);
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for the setting `"body idle timeout"` if the idle timeout was not
    /// given, is zero, or is past [`MAX_DURATION`].
    pub fn build(self) -> Result<BodyIdleTimeoutLayer, ConfigError> {
        let Some(idle) = self.idle else {
            return Err(ConfigError::new("body idle timeout", "must be given"));
        };
        let idle = ConfigError::positive_at_most_max("body idle timeout", idle)?;
        Ok(BodyIdleTimeoutLayer { idle })
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
