//! What a call came to: the three outcomes, why a call stopped, and the call's outcome handed
//! back with its result (re-exported at the crate's root).

use std::fmt;
use std::time::Duration;

use http::HeaderValue;

use crate::Envelope;

/// The outcome of a call that may have had side effects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The server confirmed the effect.
    Succeeded,
    /// The effect did not happen: every attempt was confirmed not to have taken effect, or the
    /// request had no effect to lose track of.
    Failed,
    /// No confirmation either way: the effect may have happened. Query by the business key,
    /// reconcile, or tell the user it is being confirmed; do not blindly try again.
    Unknown,
}

impl Outcome {
    /// A short lower-case name, for records and logs.
    ///
    /// ```
    /// assert_eq!(surely::Outcome::Unknown.as_str(), "unknown");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Unknown => "unknown",
        }
    }
}

/// Why a call stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// An attempt succeeded.
    Success,
    /// A final answer: retrying would get the same.
    Final,
    /// A business conflict: redo the read-modify-write above, do not replay this step.
    Conflict,
    /// The last attempt may have committed and the request cannot be repeated.
    Unknown,
    /// The last attempt could have been retried (it was rejected, or the request can be
    /// repeated), and nothing retried it.
    NotRetried,
    /// The call's deadline refused or ended it, or left too little for another attempt.
    Deadline,
    /// The last attempt could have been retried, but the attempt limit was reached.
    AttemptsExhausted,
    /// The last attempt could have been retried, but the retry budget refused.
    BudgetExhausted,
    /// The server's pushback stopped the call: it said not to retry (a negative or malformed
    /// `grpc-retry-pushback-ms`), or asked for a wait longer than the retry layer's cap or the
    /// call's deadline allows (it is never shortened).
    PushbackStop,
    /// The last attempt could have been retried, but the request could not be sent again.
    NotReplayable,
    /// The last attempt may have committed, and a retry layer upstream owns retries: this
    /// layer, inside a server handler, leaves them to it.
    UpstreamOwnsRetries,
    /// The call was dropped by its caller before it finished.
    Cancelled,
}

impl StopReason {
    /// A short lower-case name, for records and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Success => "success",
            StopReason::Final => "final",
            StopReason::Conflict => "conflict",
            StopReason::Unknown => "unknown",
            StopReason::NotRetried => "not retried",
            StopReason::Deadline => "deadline",
            StopReason::AttemptsExhausted => "attempts exhausted",
            StopReason::BudgetExhausted => "budget exhausted",
            StopReason::PushbackStop => "pushback",
            StopReason::NotReplayable => "not replayable",
            StopReason::UpstreamOwnsRetries => "upstream owns retries",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// What a call came to: its [`Outcome`], why it stopped, how many attempts went out, its
/// idempotency key, whether the answer was a replay, and the budget it left, handed back to its
/// caller with the result.
///
/// A response is not a verdict. A `500` on a POST without a key may mean the order was placed
/// and its reply lost; a `409` "key in flight" at the deadline means the first attempt may still
/// be committing. The crate folds a call's attempts into one [`Outcome`] and hands it back on the
/// return path, so that the code that made the call can act on it without reading records:
///
/// * on a response, as a [`CallOutcome`] in its extensions, read with [`OutcomeExt`]
///   (`res.outcome()`); a response type of your own that has no extensions
///   ([`Envelope::extensions_mut`] returns `None`) carries none;
/// * on an error, from the [`Error`](crate::Error) itself: [`outcome`](crate::Error::outcome),
///   [`stop_reason`](crate::Error::stop_reason), [`attempts`](crate::Error::attempts), and its
///   `Display` ("unknown after 2 attempts: ...").
///
/// Every call through the [client stack](mod@crate::client) carries one, as does every call
/// through a [`RecordCallLayer`](crate::record::RecordCallLayer) (whatever its recorder, `()`
/// included) or a [`RetryLayer`](crate::retry::RetryLayer). It says:
///
/// * the [`Outcome`]: `Succeeded`, `Failed`, or `Unknown` (the effect may have happened);
/// * the [`StopReason`]: why no further attempt was made;
/// * how many attempts went out (0 when the call was refused before any: a spent deadline, an
///   invalid key, an open circuit breaker);
/// * the idempotency key the attempts carried, if any;
/// * whether the answer was a stored replay (`idempotent-replayed: true`, set by a server's
///   [idempotency layer](crate::server::idempotency));
/// * how much of the call's deadline was left when it ended.
///
/// It is decided when the call returns. A record settled later, at the end of a response's
/// body, can say more (a body cut off mid-way); the caller learns that from its read.
///
/// # Cost
///
/// One extension insert per call: the boxed outcome, and for a response that had no extensions
/// yet, the extension map and its table (hyper-util's responses have one already). Measured
/// with `cargo bench --bench overhead -- retry_success`: nothing on a response type without
/// extensions; about 45 ns on a response that has extensions, about 105 ns on a bare
/// `http::Response`.
///
/// ```
/// use std::time::Duration;
/// use surely::{Outcome, OutcomeExt};
/// use tower::{service_fn, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// // A payment service that fails after it may have charged the card.
/// let transport = service_fn(|_req: http::Request<String>| async {
///     Ok::<_, std::io::Error>(http::Response::builder().status(500).body(String::new()).unwrap())
/// });
/// let mut client = surely::client().timeout(Duration::from_secs(2)).build(transport).unwrap();
///
/// let pay = http::Request::post("/payments").body("42 EUR".to_owned()).unwrap();
/// let res = client.ready().await.unwrap().call(pay).await.unwrap();
/// let message = match res.outcome() {
///     Outcome::Succeeded => "paid",
///     Outcome::Failed => "not paid: nothing was charged",
///     Outcome::Unknown => "the payment may have gone through: we are confirming it",
/// };
/// assert_eq!(message, "the payment may have gone through: we are confirming it");
/// // The server's 500 is still there for the caller to read.
/// assert_eq!(res.status(), 500);
/// # }
/// ```
///
/// An SDK's tests can make one with [`new`](Self::new) to try their handling of each outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallOutcome {
    pub(crate) outcome: Outcome,
    pub(crate) stop: StopReason,
    pub(crate) attempts: u32,
    pub(crate) replayed: bool,
    pub(crate) key: Option<HeaderValue>,
    pub(crate) budget_left: Option<Duration>,
}

impl CallOutcome {
    /// A call that came to `outcome` after `attempts` attempts, and stopped for `stop`; with no
    /// key, no replay and no deadline until the `with_` methods say otherwise.
    ///
    /// ```
    /// use surely::{CallOutcome, Outcome, StopReason};
    ///
    /// let lost = CallOutcome::new(Outcome::Unknown, StopReason::Unknown, 1);
    /// assert_eq!(lost.to_string(), "unknown after 1 attempt (stop: unknown)");
    /// ```
    pub fn new(outcome: Outcome, stop: StopReason, attempts: u32) -> Self {
        CallOutcome {
            outcome,
            stop,
            attempts,
            replayed: false,
            key: None,
            budget_left: None,
        }
    }

    /// The idempotency key the attempts carried.
    pub fn with_idempotency_key(mut self, key: HeaderValue) -> Self {
        self.key = Some(key);
        self
    }

    /// Whether the answer was a stored replay of an earlier request with the same key.
    pub fn with_replayed(mut self, replayed: bool) -> Self {
        self.replayed = replayed;
        self
    }

    /// The budget the call left.
    pub fn with_budget_left(mut self, left: Duration) -> Self {
        self.budget_left = Some(left);
        self
    }

    /// The call's outcome.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Why no further attempt was made.
    pub fn stop_reason(&self) -> StopReason {
        self.stop
    }

    /// How many attempts went out: 0 when the call was refused before any (its deadline was
    /// spent, its key invalid, or an open circuit breaker refused every try); hedges count.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The idempotency key the attempts carried, if any.
    pub fn idempotency_key(&self) -> Option<&HeaderValue> {
        self.key.as_ref()
    }

    /// Whether the answer was a stored replay: the server had already done this intent, and
    /// answered this attempt with the first one's result (`idempotent-replayed: true`).
    pub fn is_replayed(&self) -> bool {
        self.replayed
    }

    /// How much of the call's deadline was left when it ended; `None` without a deadline.
    ///
    /// A call that never waited (it answered on its first poll) has spent none of it: the
    /// crate reads the clock for a deadline only once a call waits.
    pub fn budget_left(&self) -> Option<Duration> {
        self.budget_left
    }

    /// A call refused for `stop` before any attempt, with `left` of its budget: nothing went
    /// out, so it failed.
    pub(crate) fn refused(stop: StopReason, left: Option<Duration>) -> Self {
        CallOutcome {
            budget_left: left,
            ..CallOutcome::new(Outcome::Failed, stop, 0)
        }
    }

    /// The same outcome, stopped for `stop` with `left` of the budget.
    pub(crate) fn stopped(mut self, stop: StopReason, left: Duration) -> Self {
        self.stop = stop;
        self.budget_left = Some(left);
        self
    }
}

impl fmt::Display for CallOutcome {
    /// `unknown after 2 attempts (stop: deadline)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_verdict(f, self.outcome, self.attempts)?;
        write!(f, " (stop: {})", self.stop.as_str())?;
        if self.replayed {
            f.write_str(" replayed")?;
        }
        Ok(())
    }
}

/// `unknown after 2 attempts`, `failed before any attempt`.
pub(crate) fn fmt_verdict(f: &mut fmt::Formatter<'_>, outcome: Outcome, n: u32) -> fmt::Result {
    match n {
        0 => write!(f, "{} before any attempt", outcome.as_str()),
        1 => write!(f, "{} after 1 attempt", outcome.as_str()),
        n => write!(f, "{} after {n} attempts", outcome.as_str()),
    }
}

/// Reads the [`CallOutcome`] a surely client handed back with a response.
///
/// Implemented for `http::Response<B>`, and for `Result<http::Response<B>, Error<E>>` so that a
/// call's result can be matched as a whole.
///
/// ```
/// use surely::{Error, Outcome, OutcomeExt};
///
/// fn tell_user<B>(result: &Result<http::Response<B>, Error<std::io::Error>>) -> &'static str {
///     match result.outcome() {
///         Outcome::Succeeded => "done",
///         Outcome::Failed => "it did not happen; you may try again",
///         Outcome::Unknown => "it may have happened; we are checking",
///     }
/// }
/// # let refused: Result<http::Response<()>, _> =
/// #     Err(Error::<std::io::Error>::from(surely::deadline::DeadlineExceeded::refused()));
/// # assert_eq!(tell_user(&refused), "it did not happen; you may try again");
/// ```
pub trait OutcomeExt: sealed::Sealed {
    /// The outcome a surely call layer handed back, if one did.
    fn call_outcome(&self) -> Option<&CallOutcome>;

    /// The call's outcome. A response that no surely call layer vouched for has none to give,
    /// and says [`Unknown`](Outcome::Unknown); an error without one says what the error alone
    /// proves ([`Error::outcome`](crate::Error::outcome)).
    fn outcome(&self) -> Outcome;

    /// Whether the answer was a stored replay of an earlier request with the same key.
    fn is_replayed(&self) -> bool {
        self.call_outcome().is_some_and(CallOutcome::is_replayed)
    }
}

impl<B> OutcomeExt for http::Response<B> {
    fn call_outcome(&self) -> Option<&CallOutcome> {
        self.extensions().get::<CallOutcome>()
    }

    fn outcome(&self) -> Outcome {
        self.call_outcome()
            .map_or(Outcome::Unknown, CallOutcome::outcome)
    }
}

pub(crate) mod sealed {
    pub trait Sealed {}
    impl<B> Sealed for http::Response<B> {}
}

/// Whether a response is a server's stored result (`idempotent-replayed: true`).
pub(crate) fn is_replay<Res: Envelope + ?Sized>(res: &Res) -> bool {
    res.headers().is_some_and(|h| {
        h.get(crate::headers::IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    })
}
