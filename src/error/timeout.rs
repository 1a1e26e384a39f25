//! Attempt timeout errors.

use std::fmt;
use std::time::Duration;

use crate::classify::DeliveryPhase;

/// An attempt ran out of time: its per-try timeout, or the call's deadline, fired first.
///
/// It records how far the request had got when it fired, which decides its class: *rejected*
/// if the transport reported that nothing was sent, otherwise *maybe committed*.
///
/// ```
/// use surely::classify::DeliveryPhase;
/// use surely::timeout::Elapsed;
///
/// let e = Elapsed::new(DeliveryPhase::Sent, false);
/// assert_eq!(e.to_string(), "attempt timed out after the request was sent");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Word-aligned: as a variant of every `surely::Error`, copied with every poll's output, a
// payload that starts at a word boundary is copied in whole words.
#[repr(align(8))]
pub struct Elapsed {
    phase: DeliveryPhase,
    deadline: bool,
    /// How long the attempt was given, in milliseconds; `u32::MAX` when unknown.
    given_ms: u32,
}

impl Elapsed {
    /// A timeout that fired at `phase`; `deadline` says the call's deadline fired rather than
    /// the per-try timeout.
    pub fn new(phase: DeliveryPhase, deadline: bool) -> Self {
        Elapsed {
            phase,
            deadline,
            given_ms: u32::MAX,
        }
    }

    /// The same timeout, saying how long the attempt was given (kept in whole milliseconds).
    pub fn with_given(mut self, given: Duration) -> Self {
        self.given_ms = u32::try_from(given.as_millis())
            .unwrap_or(u32::MAX - 1)
            .min(u32::MAX - 1);
        self
    }

    /// How long the attempt was given before the timeout fired, to the millisecond, when the
    /// timeout said. An attempt started with little of the call's budget left is given little:
    /// its timeout says little about the server.
    pub fn given(&self) -> Option<Duration> {
        (self.given_ms != u32::MAX).then(|| Duration::from_millis(u64::from(self.given_ms)))
    }

    /// How far the request had got when the timeout fired.
    pub fn phase(&self) -> DeliveryPhase {
        self.phase
    }

    /// Whether the call's deadline, not the per-try timeout, ended the attempt.
    pub fn is_deadline(&self) -> bool {
        self.deadline
    }
}

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = if self.deadline {
            "call deadline reached"
        } else {
            "attempt timed out"
        };
        match self.phase {
            DeliveryPhase::NotSent => write!(f, "{limit} before the request was sent"),
            DeliveryPhase::Sent => write!(f, "{limit} after the request was sent"),
            DeliveryPhase::ResponseStarted => write!(f, "{limit} while reading the response"),
        }
    }
}

impl std::error::Error for Elapsed {}

/// A response body went quiet: no frame arrived for the
/// [body idle timeout](crate::timeout::BodyIdleTimeoutLayer), and the body was failed with this
/// error.
///
/// The response had started: its head had arrived, so the request was sent and the server
/// answered. Whether the work is done is the head's to say; for a success status the server
/// has committed, and what is lost is the rest of the answer. The error classifies as
/// *maybe committed*, at [`ResponseStarted`](DeliveryPhase::ResponseStarted).
///
/// ```
/// use std::time::Duration;
/// use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
/// use surely::timeout::BodyIdle;
///
/// let e = BodyIdle::new(Duration::from_secs(5));
/// assert_eq!(e.idle(), Duration::from_secs(5));
/// assert_eq!(e.to_string(), "no frame of the response body for 5s");
/// let c = e.classify_error(DeliveryPhase::Sent);
/// assert_eq!((c.class(), c.phase()), (AttemptClass::MaybeCommitted, DeliveryPhase::ResponseStarted));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyIdle {
    idle: Duration,
}

impl BodyIdle {
    /// The body was quiet for `idle`.
    pub fn new(idle: Duration) -> Self {
        BodyIdle { idle }
    }

    /// How long the body was quiet: the idle timeout.
    pub fn idle(&self) -> Duration {
        self.idle
    }
}

impl fmt::Display for BodyIdle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no frame of the response body for {:?}", self.idle)
    }
}

impl std::error::Error for BodyIdle {}

impl crate::classify::ClassifyError for BodyIdle {
    fn classify_error(&self, _: DeliveryPhase) -> crate::classify::Classification {
        crate::classify::Classification::failure_at(DeliveryPhase::ResponseStarted)
    }
}
