//! The breaker's error.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::classify::{AttemptClass, Classification, DeliveryPhase};
use crate::pushback::Pushback;

/// A call the [`CircuitBreaker`](crate::breaker::CircuitBreaker) refused: the inner service was not
/// called, so nothing was sent.
///
/// It says when to come back, the way governor's `NotUntil` does: an open breaker knows when
/// its break ends ([`retry_after`](Self::retry_after)); a half-open breaker whose probes are all
/// out does not (the probes decide); an isolated breaker stays shut until someone
/// [`reset`](crate::breaker::CircuitBreaker::reset)s it.
///
/// Classified [`Rejected`](AttemptClass::Rejected) at [`NotSent`](DeliveryPhase::NotSent), so
/// that a retry layer outside may try again, a POST without a key included (nothing happened),
/// with the pushback [`Pushback::After`] the remaining break (an open breaker),
/// [`Pushback::Stop`] (an isolated one) or none (half-open: the backoff decides).
///
/// ```
/// use surely::breaker::{BreakerState, CircuitBreaker, BreakerLayer};
/// use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
/// use surely::pushback::Pushback;
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let breaker = CircuitBreaker::new();
/// let mut client = ServiceBuilder::new()
///     .layer(BreakerLayer::new(breaker.clone()))
///     .service(service_fn(|_req: http::Request<()>| async {
///         Ok::<_, std::io::Error>(http::Response::new(()))
///     }));
/// breaker.isolate();
/// let err = client.ready().await.unwrap().call(http::Request::new(())).await.unwrap_err();
/// let open = err.circuit_open().unwrap();
/// assert_eq!(open.state(), BreakerState::Isolated);
/// assert_eq!(err.to_string(), "circuit breaker isolated: calls refused until it is reset");
/// let c = err.classify_error(DeliveryPhase::Sent);
/// assert_eq!((c.class(), c.phase()), (AttemptClass::Rejected, DeliveryPhase::NotSent));
/// assert_eq!(c.pushback(), Some(Pushback::Stop));
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CircuitOpen {
    // Small on purpose (16 bytes): it is a variant of every `surely::Error`, which every layer
    // moves.
    kind: Refusal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// Open until then.
    Open(Instant),
    HalfOpen,
    Isolated,
}

impl CircuitOpen {
    pub(crate) fn open(until: Instant) -> Self {
        CircuitOpen {
            kind: Refusal::Open(until),
        }
    }

    pub(crate) fn half_open() -> Self {
        CircuitOpen {
            kind: Refusal::HalfOpen,
        }
    }

    pub(crate) fn isolated() -> Self {
        CircuitOpen {
            kind: Refusal::Isolated,
        }
    }

    /// The breaker's state when it refused the call: [`Open`](BreakerState::Open),
    /// [`HalfOpen`](BreakerState::HalfOpen) (every probe is out) or
    /// [`Isolated`](BreakerState::Isolated).
    pub fn state(&self) -> BreakerState {
        match self.kind {
            Refusal::Open(_) => BreakerState::Open,
            Refusal::HalfOpen => BreakerState::HalfOpen,
            Refusal::Isolated => BreakerState::Isolated,
        }
    }

    /// How long the break still has to run (open breakers only): from now until
    /// [`retry_at`](Self::retry_at), zero once it is over.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_at()
            .map(|until| until.saturating_duration_since(Instant::now()))
    }

    /// When the break ends and the breaker lets a probe through (open breakers only).
    pub fn retry_at(&self) -> Option<Instant> {
        match self.kind {
            Refusal::Open(until) => Some(until),
            Refusal::HalfOpen | Refusal::Isolated => None,
        }
    }

    /// The classification: rejected, not sent, with the remaining break as pushback.
    pub(crate) fn classification(&self) -> Classification {
        let pushback = match self.state() {
            BreakerState::Isolated => Some(Pushback::Stop),
            _ => self.retry_after().map(Pushback::After),
        };
        Classification::new(AttemptClass::Rejected, DeliveryPhase::NotSent).with_pushback(pushback)
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.state() {
            BreakerState::Isolated => {
                f.write_str("circuit breaker isolated: calls refused until it is reset")
            }
            BreakerState::HalfOpen => {
                f.write_str("circuit breaker half-open: its probes are in flight, call refused")
            }
            _ => match self.retry_after() {
                Some(d) => write!(f, "circuit breaker open: retry after {}ms", d.as_millis()),
                None => f.write_str("circuit breaker open"),
            },
        }
    }
}

impl std::error::Error for CircuitOpen {}

impl crate::classify::ClassifyError for CircuitOpen {
    fn classify_error(&self, _: DeliveryPhase) -> Classification {
        self.classification()
    }
}

/// A breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls pass, and their results are counted.
    Closed,
    /// Calls are refused at once, until the break ends.
    Open,
    /// The break ended: a few probe calls pass; the others are refused until the probes answer.
    HalfOpen,
    /// Shut by hand ([`CircuitBreaker::isolate`](crate::breaker::CircuitBreaker::isolate)): every call
    /// is refused until [`reset`](crate::breaker::CircuitBreaker::reset).
    Isolated,
}

impl BreakerState {
    /// A short lower-case name, for records and logs.
    ///
    /// ```
    /// assert_eq!(surely::breaker::BreakerState::HalfOpen.as_str(), "half-open");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
            BreakerState::Isolated => "isolated",
        }
    }
}

impl fmt::Display for BreakerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
