use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::timer::sealed::Timer;
use super::timer::{AttemptTimers, Enforcement, OwnTimer};
use super::{codec, Deadline, WireHeader, DEFAULT_HEADER, GRPC_TIMEOUT};
use crate::context::CallTally;
use crate::context::{CallDeadline, Context, Report};
use crate::error::DeadlineExceeded;
use crate::outcome::{CallOutcome, StopReason};
use crate::{ConfigError, Envelope, Error, IntoError};

/// The default transit reserve: budget shaved off what is written on the wire.
const DEFAULT_RESERVE: Duration = Duration::from_millis(1);

/// The least budget the millisecond header can carry: less is written as zero.
const MIN_WIRE_MILLIS: Duration = Duration::from_millis(1);

/// Gives each call a total budget, propagates it, and refuses a call with none left.
///
/// For each call, the deadline is the earliest of: the layer's own timeout (if set), a
/// [`Deadline`] in the request's extensions, and the [`current`](super::current) deadline
/// inherited from an outer layer or a server handler. (When the clock starts for the layer's own
/// budget is explained in the [module docs](super#when-the-clock-starts-and-who-ends-a-call-at-its-deadline).)
/// Then:
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
///   answers on its first poll, nor while an attempt timeout inside ends the attempt by the
///   deadline; the type parameter `T` (`Enforcement`) says where the layer's own timer lives
///   when it needs one.
///
/// See the [module docs](super) for an example.
#[derive(Clone, Debug)]
pub struct DeadlineLayer<T = OwnTimer> {
    config: Config,
    _timer: PhantomData<T>,
}

#[derive(Clone, Debug)]
struct Config {
    timeout: Option<Duration>,
    reserve: Duration,
    header: Option<HeaderName>,
    grpc: bool,
    /// The wire values of the layer's own budget (`timeout - reserve`), encoded once: most calls
    /// write exactly these, and cloning a `HeaderValue` does not allocate.
    own_wire: Option<Wire>,
}

#[derive(Clone, Debug)]
struct Wire {
    millis: HeaderValue,
    grpc: HeaderValue,
}

/// Builds a [`DeadlineLayer`], validating its settings.
#[derive(Clone, Debug)]
pub struct DeadlineLayerBuilder<T = OwnTimer> {
    config: Config,
    _timer: PhantomData<T>,
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
            _timer: PhantomData,
            config: Config {
                timeout: None,
                reserve: DEFAULT_RESERVE,
                header: Some(DEFAULT_HEADER),
                grpc: true,
                own_wire: None,
            },
        }
    }

    /// A builder, starting from [`inherit`](Self::inherit)'s settings.
    pub fn builder() -> DeadlineLayerBuilder {
        DeadlineLayerBuilder {
            config: Self::inherit().config,
            _timer: PhantomData,
        }
    }
}

impl<T> DeadlineLayerBuilder<T> {
    /// The call's own total budget. Must be greater than zero.
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
    /// [`DEFAULT_HEADER`]); `None` writes none. A retry layer inside lowers the value on each
    /// retry to what is left, whatever the name; a name other than the default costs one
    /// allocation per call (the request's extensions say which header to lower).
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

    /// Count on an [`AttemptTimeoutLayer`](crate::timeout::AttemptTimeoutLayer) inside to end
    /// each attempt by the deadline, keeping no timer in the call's future; see
    /// [`AttemptTimers`].
    pub fn enforce_in_attempts(self) -> DeadlineLayerBuilder<AttemptTimers> {
        DeadlineLayerBuilder {
            config: self.config,
            _timer: PhantomData,
        }
    }

    /// Validates and builds.
    pub fn build(mut self) -> Result<DeadlineLayer<T>, ConfigError> {
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
            let budget = timeout - self.config.reserve;
            if self.config.header.is_some() && budget < MIN_WIRE_MILLIS {
                return Err(ConfigError::new(
                    "deadline reserve",
                    "must leave at least a millisecond of the timeout to write on the wire",
                ));
            }
            self.config.own_wire = Some(Wire {
                millis: codec::encode_millis(budget),
                grpc: codec::encode_grpc_timeout(budget),
            });
        }
        Ok(DeadlineLayer {
            config: self.config,
            _timer: PhantomData,
        })
    }
}

impl<S, T> Layer<S> for DeadlineLayer<T> {
    type Service = WithDeadline<S, T>;

    fn layer(&self, inner: S) -> WithDeadline<S, T> {
        WithDeadline {
            inner,
            config: self.config.clone(),
            _timer: PhantomData,
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
pub struct WithDeadline<S, T = OwnTimer> {
    inner: S,
    config: Config,
    _timer: PhantomData<T>,
}

impl<S, T> WithDeadline<S, T> {
    /// Wraps `inner` with the layer's settings.
    pub fn new(inner: S, layer: &DeadlineLayer<T>) -> Self {
        layer.layer(inner)
    }

    inner_accessors!();
}

impl<S, T, Req> Service<Req> for WithDeadline<S, T>
where
    S: Service<Req>,
    S::Error: IntoError,
    Req: Envelope,
    T: Enforcement,
{
    type Response = S::Response;
    type Error = Error<<S::Error as IntoError>::Transport>;
    type Future = ResponseFuture<S::Future, Self::Error, T>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    #[inline]
    fn call(&mut self, mut req: Req) -> Self::Future {
        let mut ctx = Context::current();
        let Some(deadline) = self.resolve(&mut req, ctx.deadline()) else {
            return ResponseFuture::refused();
        };
        if deadline.is_some() && ctx.call.is_some() {
            // Tell the record layer outside (the one that set the call id) the call's deadline.
            CallTally::update(|t| t.deadline = deadline);
        }
        ctx.set_deadline(deadline);
        let inner = ctx.scope(|| self.inner.call(req));
        ResponseFuture {
            state: State::Running {
                inner,
                timer: Default::default(),
                ctx,
            },
            _error: PhantomData,
        }
    }
}

impl<S, T> WithDeadline<S, T> {
    /// The call's deadline, with its budget written on the wire; `None` if the call must be
    /// refused.
    ///
    /// The clock is read only for a deadline that is already an instant (from the request or
    /// an outer layer that anchored it); a budget of the layer's own, or an outer layer's not
    /// yet anchored, is passed on as a budget.
    #[inline]
    fn resolve<Req: Envelope>(
        &self,
        req: &mut Req,
        current: Option<CallDeadline>,
    ) -> Option<Option<CallDeadline>> {
        if let (Some(own), None) = (self.config.timeout, current) {
            if req.deadline().is_none() {
                // The common case: no deadline from outside and none on the request, so the
                // call has this layer's own budget (checked against the reserve when built).
                return self
                    .write_budget(req, own - self.config.reserve, true)
                    .then_some(Some(CallDeadline::Budget(own)));
            }
        }
        let fixed = Deadline::earliest(req.deadline(), current.and_then(CallDeadline::fixed));
        let unanchored = match current {
            Some(CallDeadline::Budget(b)) => Some(b),
            _ => None,
        };
        let budget = match (self.config.timeout, unanchored) {
            (Some(own), Some(outer)) => Some(own.min(outer)),
            (own, outer) => own.or(outer),
        };
        let (deadline, remaining) = match (fixed, budget) {
            (None, None) => return Some(None),
            (None, Some(b)) => (CallDeadline::Budget(b), b),
            (Some(fixed), budget) => {
                let now = Instant::now();
                let d =
                    Deadline::earliest(Some(fixed), budget.map(|b| Deadline::after_from(now, b)))
                        .unwrap_or(fixed);
                (CallDeadline::At(d), d.remaining_at(now))
            }
        };
        if remaining <= self.config.reserve {
            return None;
        }
        let own = matches!(deadline, CallDeadline::Budget(b) if Some(b) == self.config.timeout);
        self.write_budget(req, remaining - self.config.reserve, own)
            .then_some(Some(deadline))
    }

    /// Writes the budget on the wire; false if it would be written as zero (under a millisecond
    /// for the millisecond header), which the server would take as spent. `own` says the budget
    /// is the layer's own, whose encoding is kept.
    fn write_budget<Req: Envelope>(&self, req: &mut Req, budget: Duration, own: bool) -> bool {
        let grpc = req.is_grpc();
        let Some(headers) = req.headers_mut() else {
            return true;
        };
        let own_wire = self.config.own_wire.as_ref().filter(|_| own);
        if grpc {
            if self.config.grpc {
                let value =
                    own_wire.map_or_else(|| codec::encode_grpc_timeout(budget), |w| w.grpc.clone());
                headers.insert(GRPC_TIMEOUT, value);
            }
        } else if let Some(name) = &self.config.header {
            if budget < MIN_WIRE_MILLIS {
                return false;
            }
            let value = own_wire.map_or_else(|| codec::encode_millis(budget), |w| w.millis.clone());
            headers.insert(name.clone(), value);
            if *name != DEFAULT_HEADER {
                // Say where, so that retries inside lower it (one allocation for the request's
                // extensions; the default name needs none).
                if let Some(extensions) = req.extensions_mut() {
                    extensions.insert(WireHeader(name.clone()));
                }
            }
        }
        true
    }
}

pin_project! {
    /// The future of [`WithDeadline`].
    pub struct ResponseFuture<F, E, T: Enforcement = OwnTimer> {
        #[pin]
        state: State<F, T>,
        _error: PhantomData<fn() -> E>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, T: Enforcement> {
        Refused,
        Running {
            #[pin]
            inner: F,
            #[pin]
            timer: <T as Timer>::Slot,
            ctx: Context,
        },
    }
}

impl<F, E, T: Enforcement> ResponseFuture<F, E, T> {
    fn refused() -> Self {
        ResponseFuture {
            state: State::Refused,
            _error: PhantomData,
        }
    }
}

impl<F, R, E0, T> Future for ResponseFuture<F, Error<E0::Transport>, T>
where
    F: Future<Output = Result<R, E0>>,
    E0: IntoError,
    T: Enforcement,
{
    type Output = Result<R, Error<E0::Transport>>;

    // Inlined, and kept to what a call that answers on its first poll runs, so that the
    // inner future's answer is not returned through memory once more; the rest is out of line.
    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let StateProj::Running { inner, ctx, .. } = state.as_mut().project() else {
            // Refused before any attempt: nothing went out.
            return Poll::Ready(Err(refused()));
        };
        let (out, inside) = ctx.scope_collect(|| inner.poll(cx));
        // Matched whole: binding the answer first would copy it with its error's room (see
        // `lift`).
        match out {
            Poll::Ready(Ok(res)) => return Poll::Ready(Ok(res)),
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into_error())),
            Poll::Pending => {}
        }
        if !ctx.has_deadline() {
            return Poll::Pending;
        }
        wait::<F, T, R, E0::Transport>(state, cx, inside)
    }
}

/// The error of a call its deadline refused before any attempt.
#[cold]
#[inline(never)]
fn refused<E>() -> Error<E> {
    let mut err: Error<E> = DeadlineExceeded::refused().into();
    err.set_call_outcome(CallOutcome::refused(
        StopReason::Deadline,
        Some(Duration::ZERO),
    ));
    err
}

/// The rest of a poll of [`ResponseFuture`] whose call has a deadline and waits: one timer for
/// the call, unless a layer inside (`inside` says what it reported) ends it by the deadline.
#[inline(never)]
fn wait<F, T, R, E>(
    mut state: Pin<&mut State<F, T>>,
    cx: &mut TaskContext<'_>,
    inside: Report,
) -> Poll<Result<R, Error<E>>>
where
    T: Enforcement,
{
    let StateProj::Running { mut timer, ctx, .. } = state.as_mut().project() else {
        // Only a running call is handed here (`poll` returns for a refused one).
        return Poll::Pending;
    };
    let armed = T::is_armed(&timer);
    if !armed {
        if let Some((now, ends_by)) = inside.packed() {
            // The common case, in packed time: anchor the deadline at the clock reading of the
            // layer inside, and if that layer ends the call by the deadline, one timer is
            // enough.
            if ctx.anchor_packed(now).is_some_and(|d| ends_by <= d) {
                return Poll::Pending;
            }
        }
    }
    let Some(deadline) = ctx.deadline() else {
        return Poll::Pending;
    };
    // The call waits: from now on its deadline is an instant.
    let (deadline, now) = match deadline {
        CallDeadline::At(d) => (d, inside.now()),
        CallDeadline::Budget(b) => {
            let now = inside.now().unwrap_or_else(Instant::now);
            let d = Deadline::after_from(now, b);
            ctx.set_deadline(Some(CallDeadline::At(d)));
            (d, Some(now))
        }
    };
    let inside_ends_by = inside.ends_by();
    if !armed && inside_ends_by.is_some_and(|e| e <= deadline.instant()) {
        // A layer inside (an attempt timeout) will end the call by the deadline: one timer is
        // enough.
        Report::publish(Report::new(now, inside_ends_by));
        return Poll::Pending;
    }
    if !armed {
        T::arm(timer.as_mut(), deadline.instant());
    }
    if T::poll(timer, cx).is_pending() {
        let ends_by = inside_ends_by.map_or(deadline.instant(), |e| e.min(deadline.instant()));
        Report::publish(Report::new(now, Some(ends_by)));
        return Poll::Pending;
    }
    // Let the attempt go now, so that it is cancelled (and recorded) before the call ends, not
    // whenever the caller drops this future. A retry layer inside leaves what its attempts came
    // to, to hand back with the deadline's error.
    crate::context::take_left_behind();
    state.set(State::Refused);
    let mut err: Error<E> = DeadlineExceeded::in_flight().into();
    if let Some(call) = crate::context::take_left_behind() {
        err.set_call_outcome(call.stopped(StopReason::Deadline, Duration::ZERO));
    }
    Poll::Ready(Err(err))
}

impl<F, E, T: Enforcement> fmt::Debug for ResponseFuture<F, E, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
