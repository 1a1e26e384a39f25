use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context as TaskContext, Poll};
use std::time::Duration;

use http::HeaderName;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

use super::error::DeadlineExceeded;
use super::{codec, Deadline, DEFAULT_HEADER, GRPC_TIMEOUT};
use crate::context::Context;
use crate::record::CallTally;
use crate::{ConfigError, Envelope, Error, IntoError};

/// The default transit reserve: budget shaved off what is written on the wire.
const DEFAULT_RESERVE: Duration = Duration::from_millis(1);

/// Gives each call a total budget, propagates it, and refuses a call with none left.
///
/// For each call, the deadline is the earliest of: now + the layer's own timeout (if set), a
/// [`Deadline`] in the request's extensions, and the [`current`](super::current) deadline
/// inherited from an outer layer or a server handler. Then:
///
/// * if less than the transit reserve is left, the call is refused with
///   [`DeadlineExceeded`] (not sent) and the inner service is not called;
/// * the remaining budget less the reserve is written to the request: `grpc-timeout` for gRPC
///   requests, the configured millisecond header (default `x-request-timeout-ms`) for other HTTP
///   requests; request types without headers are left alone. A budget that would be written as
///   zero (under a millisecond for the millisecond header) is refused here: the server would
///   refuse it anyway, and its refusal would look like a failure after send;
/// * the deadline is the *current* one while the inner service runs;
/// * if the inner future has not answered by the deadline, the call ends with
///   [`DeadlineExceeded`] (in flight, maybe committed). No timer is created for a call that
///   answers on its first poll.
///
/// See the [module docs](super) for an example.
#[derive(Clone, Debug)]
pub struct DeadlineLayer {
    config: Config,
}

#[derive(Clone, Debug)]
struct Config {
    timeout: Option<Duration>,
    reserve: Duration,
    header: Option<HeaderName>,
    grpc: bool,
}

/// Builds a [`DeadlineLayer`], validating its settings.
#[derive(Clone, Debug)]
pub struct DeadlineLayerBuilder {
    config: Config,
}

impl DeadlineLayer {
    /// A layer with its own total budget and the default settings.
    pub fn new(timeout: Duration) -> Result<Self, ConfigError> {
        Self::builder().timeout(timeout).build()
    }

    /// A layer without a budget of its own: it enforces and propagates an inherited deadline
    /// (from the request or the current context) and does nothing for calls without one.
    pub fn inherit() -> Self {
        DeadlineLayer {
            config: Config {
                timeout: None,
                reserve: DEFAULT_RESERVE,
                header: Some(DEFAULT_HEADER),
                grpc: true,
            },
        }
    }

    /// A builder, starting from [`inherit`](Self::inherit)'s settings.
    pub fn builder() -> DeadlineLayerBuilder {
        DeadlineLayerBuilder {
            config: Self::inherit().config,
        }
    }
}

impl DeadlineLayerBuilder {
    /// The call's own total budget, from the moment it is made. Must be greater than zero.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = Some(timeout);
        self
    }

    /// Budget shaved off the value written on the wire, for transit (default 1 ms). A call with
    /// no more than this left is refused. Must be less than the timeout.
    pub fn reserve(mut self, reserve: Duration) -> Self {
        self.config.reserve = reserve;
        self
    }

    /// The HTTP header that carries the remaining milliseconds (default
    /// [`DEFAULT_HEADER`]); `None` writes none.
    pub fn http_header(mut self, header: Option<HeaderName>) -> Self {
        self.config.header = header;
        self
    }

    /// Whether to write `grpc-timeout` on gRPC requests (default true). When false, nothing is
    /// written on gRPC requests: the millisecond header means nothing to a gRPC server.
    pub fn grpc_timeout(mut self, enabled: bool) -> Self {
        self.config.grpc = enabled;
        self
    }

    /// Validates and builds.
    pub fn build(self) -> Result<DeadlineLayer, ConfigError> {
        if let Some(timeout) = self.config.timeout {
            if timeout.is_zero() {
                return Err(ConfigError::new(
                    "deadline timeout",
                    "must be greater than zero",
                ));
            }
            if self.config.reserve >= timeout {
                return Err(ConfigError::new(
                    "deadline reserve",
                    "must be less than the timeout, or every call would be refused",
                ));
            }
        }
        Ok(DeadlineLayer {
            config: self.config,
        })
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = WithDeadline<S>;

    fn layer(&self, inner: S) -> WithDeadline<S> {
        WithDeadline {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service made by [`DeadlineLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's. A refused call does not call the inner service, so the
/// readiness it reserved stays reserved for the next call, as with tower's `Filter`.
#[derive(Clone, Debug)]
pub struct WithDeadline<S> {
    inner: S,
    config: Config,
}

impl<S> WithDeadline<S> {
    /// Wraps `inner` with the layer's settings.
    pub fn new(inner: S, layer: &DeadlineLayer) -> Self {
        layer.layer(inner)
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the layer, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Req> Service<Req> for WithDeadline<S>
where
    S: Service<Req>,
    S::Error: IntoError,
    Req: Envelope,
{
    type Response = S::Response;
    type Error = Error<<S::Error as IntoError>::Transport>;
    type Future = ResponseFuture<S::Future, Self::Error>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let mut ctx = Context::current();
        let inherited = Deadline::earliest(req.deadline(), ctx.deadline);
        if self.config.timeout.is_some() || inherited.is_some() {
            let now = Instant::now();
            let own = self.config.timeout.map(|t| Deadline::after_from(now, t));
            let deadline = Deadline::earliest(own, inherited);
            if let Some(deadline) = deadline {
                let remaining = deadline.remaining_at(now);
                if remaining <= self.config.reserve
                    || !self.write_budget(&mut req, remaining - self.config.reserve)
                {
                    return ResponseFuture::refused();
                }
                // Tell a record layer outside what the call's deadline is.
                CallTally::update(|t| t.deadline = Some(deadline));
            }
            ctx.deadline = deadline;
        }
        let inner = ctx.scope(|| self.inner.call(req));
        ResponseFuture {
            state: State::Running {
                inner,
                sleep: None,
                ctx,
            },
            _error: PhantomData,
        }
    }
}

impl<S> WithDeadline<S> {
    /// Writes the budget on the wire; false if it would be written as zero (under a millisecond
    /// for the millisecond header), which the server would take as spent.
    fn write_budget<Req: Envelope>(&self, req: &mut Req, budget: Duration) -> bool {
        let grpc = req.is_grpc();
        let Some(headers) = req.headers_mut() else {
            return true;
        };
        if grpc {
            if self.config.grpc {
                headers.insert(GRPC_TIMEOUT, codec::encode_grpc_timeout(budget));
            }
        } else if let Some(name) = &self.config.header {
            if budget < Duration::from_millis(1) {
                return false;
            }
            headers.insert(name.clone(), codec::encode_millis(budget));
        }
        true
    }
}

pin_project! {
    /// The future of [`WithDeadline`].
    pub struct ResponseFuture<F, E> {
        #[pin]
        state: State<F>,
        _error: PhantomData<fn() -> E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Refused,
        Running {
            #[pin]
            inner: F,
            #[pin]
            sleep: Option<Sleep>,
            ctx: Context,
        },
    }
}

impl<F, E> ResponseFuture<F, E> {
    fn refused() -> Self {
        ResponseFuture {
            state: State::Refused,
            _error: PhantomData,
        }
    }
}

impl<F, T, E0> Future for ResponseFuture<F, Error<E0::Transport>>
where
    F: Future<Output = Result<T, E0>>,
    E0: IntoError,
{
    type Output = Result<T, Error<E0::Transport>>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        match state.as_mut().project() {
            StateProj::Refused => Poll::Ready(Err(DeadlineExceeded::refused().into())),
            StateProj::Running {
                inner,
                mut sleep,
                ctx,
            } => {
                if let Poll::Ready(out) = ctx.scope(|| inner.poll(cx)) {
                    return Poll::Ready(out.map_err(IntoError::into_error));
                }
                let Some(deadline) = ctx.deadline else {
                    return Poll::Pending;
                };
                if sleep.is_none() {
                    sleep.set(Some(tokio::time::sleep_until(deadline.instant())));
                }
                if let Some(sleep) = sleep.as_pin_mut() {
                    ready!(sleep.poll(cx));
                }
                // Let the attempt go now, so that it is cancelled (and recorded) before the call
                // ends, not whenever the caller drops this future.
                state.set(State::Refused);
                Poll::Ready(Err(DeadlineExceeded::in_flight().into()))
            }
        }
    }
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
