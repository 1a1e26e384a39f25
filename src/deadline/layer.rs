//! The deadline layer and its builder.

use std::marker::PhantomData;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use tower_layer::Layer;

use super::timer::{AttemptTimers, OwnTimer};
use super::{codec, SetDeadline, DEFAULT_HEADER};
use crate::time::MAX_DURATION;
use crate::ConfigError;

/// The default transit reserve: budget shaved off what is written on the wire.
const DEFAULT_RESERVE: Duration = Duration::from_millis(1);

/// The least budget the millisecond header can carry: less is written as zero.
pub(super) const MIN_WIRE_MILLIS: Duration = Duration::from_millis(1);

/// The shortest timeout the builder accepts with its default reserve and header: the reserve,
/// and a millisecond to write on the wire. [`SetDeadlineLayer::new`] counts a shorter one as
/// this.
const MIN_TIMEOUT: Duration = Duration::from_millis(2);

/// Gives each call a total budget, propagates it, and refuses a call with none left.
///
/// For each call, the deadline is the earliest of: the layer's own timeout (if set), a
/// [`Deadline`](super::Deadline) in the request's extensions, and the
/// [`current`](super::current) deadline inherited from an outer layer or a server handler.
/// (When the clock starts for the layer's own budget is explained in the
/// [module docs](super#when-the-clock-starts-and-who-ends-a-call-at-its-deadline).) Then:
///
/// * if less than the transit reserve is left, the call is refused with
///   [`DeadlineExceeded`](super::DeadlineExceeded) (not sent) and the inner service is not
///   called;
/// * the remaining budget less the reserve is written to the request: `grpc-timeout` for gRPC
///   requests, the configured millisecond header (default `x-request-timeout-ms`) for other HTTP
///   requests; request types without headers are left alone. A budget that would be written as
///   zero (under a millisecond for the millisecond header) is refused here: the server would
///   refuse it anyway, and its refusal would look like a failure after send;
/// * the deadline is the *current* one while the inner service runs;
/// * if the inner future has not answered by the deadline, the call ends with
///   [`DeadlineExceeded`](super::DeadlineExceeded) (in flight, maybe committed). No timer is
///   created for a call that answers on its first poll, nor while an attempt timeout inside
///   ends the attempt by the deadline; the type parameter `T` (`Enforcement`) says where the
///   layer's own timer lives when it needs one.
///
/// See the [module docs](super) for an example.
#[derive(Clone, Debug)]
pub struct SetDeadlineLayer<T = OwnTimer> {
    pub(super) config: Config,
    _timer: PhantomData<T>,
}

#[derive(Clone, Debug)]
pub(super) struct Config {
    pub(super) timeout: Option<Duration>,
    pub(super) reserve: Duration,
    pub(super) header: Option<HeaderName>,
    pub(super) grpc: bool,
    /// The wire values of the layer's own budget (`timeout - reserve`), encoded once: most calls
    /// write exactly these, and cloning a `HeaderValue` does not allocate.
    pub(super) own_wire: Option<Wire>,
}

#[derive(Clone, Debug)]
pub(super) struct Wire {
    pub(super) millis: HeaderValue,
    pub(super) grpc: HeaderValue,
}

/// Builds a [`SetDeadlineLayer`], validating its settings.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct SetDeadlineLayerBuilder<T = OwnTimer> {
    config: Config,
    _timer: PhantomData<T>,
}

impl SetDeadlineLayer {
    /// A layer with its own total budget of `timeout` and the default settings.
    ///
    /// Never fails: `timeout` is clamped into the range [`builder`](Self::builder) accepts
    /// with the defaults. A timeout under 2 ms (zero included) counts as 2 ms: the default
    /// 1 ms reserve for transit, and a millisecond to write on the wire; one past
    /// [`MAX_DURATION`] (ten years) counts as `MAX_DURATION`. The builder refuses both
    /// instead.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::deadline::SetDeadlineLayer;
    ///
    /// let layer = SetDeadlineLayer::new(Duration::ZERO);
    /// assert_eq!(layer.timeout(), Some(Duration::from_millis(2)));
    /// let layer = SetDeadlineLayer::new(Duration::MAX);
    /// assert_eq!(layer.timeout(), Some(surely::MAX_DURATION));
    /// ```
    pub fn new(timeout: Duration) -> Self {
        let mut builder = Self::builder();
        builder.config.timeout = Some(timeout.clamp(MIN_TIMEOUT, MAX_DURATION));
        builder.assemble()
    }

    /// A layer without a budget of its own: it enforces and propagates an inherited deadline
    /// (from the request or the current context) and does nothing for calls without one.
    pub fn inherit() -> Self {
        SetDeadlineLayer {
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
    pub fn builder() -> SetDeadlineLayerBuilder {
        SetDeadlineLayerBuilder {
            config: Self::inherit().config,
            _timer: PhantomData,
        }
    }
}

impl<T> SetDeadlineLayer<T> {
    /// The layer's own total budget, if it has one.
    pub fn timeout(&self) -> Option<Duration> {
        self.config.timeout
    }
}

impl<T> SetDeadlineLayerBuilder<T> {
    /// The layer's own budget (`None`: only an inherited deadline) and whether the deadline
    /// goes on the wire in its HTTP header, for a [review](crate::review). (A gRPC request
    /// carries `grpc-timeout` either way.)
    pub(crate) fn described(&self) -> (Option<Duration>, bool) {
        (self.config.timeout, self.config.header.is_some())
    }

    /// The call's own total budget. Must be greater than zero and at most
    /// [`MAX_DURATION`] (ten years).
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
    pub fn enforce_in_attempts(self) -> SetDeadlineLayerBuilder<AttemptTimers> {
        SetDeadlineLayerBuilder {
            config: self.config,
            _timer: PhantomData,
        }
    }

    /// Validates and builds.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting: `"deadline timeout"` if the timeout is zero or
    /// past [`MAX_DURATION`]; `"deadline reserve"` if the reserve is not less than the timeout,
    /// or leaves less than a millisecond of it to write in the millisecond header.
    pub fn build(self) -> Result<SetDeadlineLayer<T>, ConfigError> {
        self.validate()?;
        Ok(self.assemble())
    }

    /// Checks the settings, as [`build`](Self::build) does.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(timeout) = self.config.timeout {
            ConfigError::positive_at_most_max("deadline timeout", timeout)?;
            if self.config.reserve >= timeout {
                return Err(ConfigError::new(
                    "deadline reserve",
                    "must be less than the timeout, or every call would be refused",
                ));
            }
            let budget = timeout.saturating_sub(self.config.reserve);
            if self.config.header.is_some() && budget < MIN_WIRE_MILLIS {
                return Err(ConfigError::new(
                    "deadline reserve",
                    "must leave at least a millisecond of the timeout to write on the wire",
                ));
            }
        }
        Ok(())
    }

    /// The layer of these settings, which the caller has checked (or clamped).
    pub(crate) fn assemble(mut self) -> SetDeadlineLayer<T> {
        if let Some(timeout) = self.config.timeout {
            let budget = timeout.saturating_sub(self.config.reserve);
            self.config.own_wire = Some(Wire {
                millis: codec::encode_millis(budget),
                grpc: codec::encode_grpc_timeout(budget),
            });
        }
        SetDeadlineLayer {
            config: self.config,
            _timer: PhantomData,
        }
    }
}

impl<S, T> Layer<S> for SetDeadlineLayer<T> {
    type Service = SetDeadline<S, T>;

    fn layer(&self, inner: S) -> SetDeadline<S, T> {
        SetDeadline {
            inner,
            config: self.config.clone(),
            _timer: PhantomData,
        }
    }
}
