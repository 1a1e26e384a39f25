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
///   [idempotency layer][crate::server::idempotency]);
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
#[cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::idempotency",
    )
)]
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
#[diagnostic::on_unimplemented(
    message = "`{Self}` carries no call outcome to read",
    label = "no `OutcomeExt` here",
    note = "call with `client.send(req)`: the `surely::Reply` it hands back carries the outcome \
            and the attempts of any answer, and `OutcomeExt` reads them on the whole `Result`; \
            an error alone has them too (`err.outcome()`, `err.attempts()`)"
)]
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

    /// How many attempts the call made ([`CallOutcome::attempts`]); 0 when no surely layer
    /// handed an outcome back. On an error, what [`Error::attempts`](crate::Error::attempts)
    /// says.
    fn attempts(&self) -> u32 {
        self.call_outcome().map_or(0, CallOutcome::attempts)
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

thread_local! {
    /// While a `send` polls its call: the outcome handed back in that poll on an answer
    /// without extensions (`Some(None)` until one is). `None` outside any `send`. Set and
    /// restored around each poll only, like the call context.
    static HANDED: std::cell::RefCell<Option<Option<CallOutcome>>> =
        const { std::cell::RefCell::new(None) };
    /// Whether a `send` is polling its call on this thread, so that [`HANDED`] has a slot: read
    /// on every answer without extensions, and with nothing to drop, its read is one load
    /// (`HANDED`'s, whose value has a destructor, first checks that it was registered).
    static SENDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a `send` polls the call on this thread, to take an outcome [handed](hand_to_send)
/// to it.
#[inline]
pub(crate) fn sending() -> bool {
    SENDING.with(std::cell::Cell::get)
}

/// Hands a call's outcome to the `send` polling it, if one is: for an answer that cannot carry
/// it. `call` is asked only then.
#[inline]
pub(crate) fn hand_to_send(call: impl FnOnce() -> CallOutcome) {
    if !sending() {
        return;
    }
    HANDED.with(|h| {
        if let Some(slot) = h.borrow_mut().as_mut() {
            *slot = Some(call());
        }
    });
}

/// Runs `poll` (one poll of a call `send` made), and catches the outcome handed back in it on
/// an answer without extensions.
#[inline]
pub(crate) fn catch_handed<R>(poll: impl FnOnce() -> R) -> (R, Option<CallOutcome>) {
    let outer = HANDED.with(|h| h.replace(Some(None)));
    let was_sending = SENDING.with(|s| s.replace(true));
    let out = poll();
    SENDING.with(|s| s.set(was_sending));
    let handed = HANDED.with(|h| h.replace(outer)).flatten();
    (out, handed)
}

/// Whether a response is a server's stored result (`idempotent-replayed: true`).
pub(crate) fn is_replay<Res: Envelope + ?Sized>(res: &Res) -> bool {
    res.headers().is_some_and(|h| {
        h.get(crate::headers::IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    })
}

/// The mark a transport puts on a response to ask that the call's outcome be written into the
/// response's headers too ([`headers::OUTCOME`](crate::headers::OUTCOME)), where tonic keeps it
/// for an error `Status`. The gRPC transport sets it, having removed any such header the
/// server sent.
#[cfg(feature = "tonic")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutcomeInHeaders;

/// The [`headers::OUTCOME`](crate::headers::OUTCOME) value of a call's outcome, and its reading.
///
/// `<outcome>; attempts=<n>; stop=<reason>[; replayed][; left-ms=<ms>][; key=<key>]`: the key,
/// which may itself hold `;`, comes last, and is written only when it is 1 to 255 bytes of
/// visible ASCII (as the crate's own keys are); the budget left is rounded down to the
/// millisecond.
#[cfg(feature = "tonic")]
pub(crate) mod metadata {
    use std::fmt::Write as _;
    use std::time::Duration;

    use http::HeaderValue;

    use super::{CallOutcome, Outcome, StopReason};

    const KEY: &str = "; key=";
    /// Longer than any value the crate writes (a 255-byte key and every part).
    const MAX_LEN: usize = 512;

    /// The header value of `call`.
    pub(crate) fn encode(call: &CallOutcome) -> HeaderValue {
        let mut s = String::with_capacity(48);
        let _ = write!(
            s,
            "{}; attempts={}; stop={}",
            call.outcome.as_str(),
            call.attempts,
            stop_token(call.stop)
        );
        if call.replayed {
            s.push_str("; replayed");
        }
        if let Some(left) = call.budget_left {
            let _ = write!(s, "; left-ms={}", left.as_millis());
        }
        if let Some(key) = call.key.as_ref().and_then(|k| k.to_str().ok())
            && visible_key(key)
        {
            s.push_str(KEY);
            s.push_str(key);
        }
        // Visible ASCII and spaces only: always a valid header value.
        HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
    }

    /// Reads a value [`encode`] wrote; `None` for anything else, whatever its bytes.
    pub(crate) fn decode(value: &[u8]) -> Option<CallOutcome> {
        if value.len() > MAX_LEN {
            return None;
        }
        let value = std::str::from_utf8(value).ok()?;
        let (head, key) = match value.split_once(KEY) {
            Some((head, key)) => {
                if !visible_key(key) {
                    return None;
                }
                (head, Some(HeaderValue::from_str(key).ok()?))
            }
            None => (value, None),
        };
        let mut parts = head.split(';').map(str::trim);
        let outcome = match parts.next()? {
            "succeeded" => Outcome::Succeeded,
            "failed" => Outcome::Failed,
            "unknown" => Outcome::Unknown,
            _ => return None,
        };
        let (mut attempts, mut stop, mut replayed, mut left) = (None, None, false, None);
        for part in parts {
            match part.split_once('=') {
                Some(("attempts", n)) if attempts.is_none() => attempts = Some(number(n)?),
                Some(("stop", t)) if stop.is_none() => stop = Some(parse_stop(t)?),
                Some(("left-ms", n)) if left.is_none() => {
                    left = Some(Duration::from_millis(number(n)?));
                }
                None if part == "replayed" && !replayed => replayed = true,
                _ => return None,
            }
        }
        let attempts = u32::try_from(attempts?).ok()?;
        Some(CallOutcome {
            outcome,
            stop: stop?,
            attempts,
            replayed,
            key,
            budget_left: left,
        })
    }

    /// Decimal digits only (no sign, no spaces), within a `u64`.
    fn number(s: &str) -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    }

    fn visible_key(key: &str) -> bool {
        (1..=255).contains(&key.len()) && key.bytes().all(|b| (0x21..=0x7e).contains(&b))
    }

    /// [`StopReason::as_str`] with dashes for spaces, one token in the header.
    fn stop_token(stop: StopReason) -> &'static str {
        match stop {
            StopReason::Success => "success",
            StopReason::Final => "final",
            StopReason::Conflict => "conflict",
            StopReason::Unknown => "unknown",
            StopReason::NotRetried => "not-retried",
            StopReason::Deadline => "deadline",
            StopReason::AttemptsExhausted => "attempts-exhausted",
            StopReason::BudgetExhausted => "budget-exhausted",
            StopReason::PushbackStop => "pushback",
            StopReason::NotReplayable => "not-replayable",
            StopReason::UpstreamOwnsRetries => "upstream-owns-retries",
            StopReason::Cancelled => "cancelled",
        }
    }

    /// The reason [`stop_token`] wrote; a test checks that every reason reads back.
    fn parse_stop(token: &str) -> Option<StopReason> {
        Some(match token {
            "success" => StopReason::Success,
            "final" => StopReason::Final,
            "conflict" => StopReason::Conflict,
            "unknown" => StopReason::Unknown,
            "not-retried" => StopReason::NotRetried,
            "deadline" => StopReason::Deadline,
            "attempts-exhausted" => StopReason::AttemptsExhausted,
            "budget-exhausted" => StopReason::BudgetExhausted,
            "pushback" => StopReason::PushbackStop,
            "not-replayable" => StopReason::NotReplayable,
            "upstream-owns-retries" => StopReason::UpstreamOwnsRetries,
            "cancelled" => StopReason::Cancelled,
            _ => return None,
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const STOPS: [StopReason; 12] = [
            StopReason::Success,
            StopReason::Final,
            StopReason::Conflict,
            StopReason::Unknown,
            StopReason::NotRetried,
            StopReason::Deadline,
            StopReason::AttemptsExhausted,
            StopReason::BudgetExhausted,
            StopReason::PushbackStop,
            StopReason::NotReplayable,
            StopReason::UpstreamOwnsRetries,
            StopReason::Cancelled,
        ];

        #[test]
        fn every_outcome_reads_back() {
            for stop in STOPS {
                assert_eq!(parse_stop(stop_token(stop)), Some(stop));
                for outcome in [Outcome::Succeeded, Outcome::Failed, Outcome::Unknown] {
                    let call = CallOutcome::new(outcome, stop, 3)
                        .with_replayed(true)
                        .with_budget_left(Duration::from_millis(1500))
                        .with_idempotency_key(HeaderValue::from_static("k;1;key=x=;"));
                    let value = encode(&call);
                    assert_eq!(decode(value.as_bytes()), Some(call), "{value:?}");
                    let plain = CallOutcome::new(outcome, stop, 0);
                    assert_eq!(decode(encode(&plain).as_bytes()), Some(plain));
                }
            }
        }

        #[test]
        fn the_format_is_as_documented() {
            let call = CallOutcome::new(Outcome::Unknown, StopReason::NotRetried, 2)
                .with_budget_left(Duration::from_micros(2_999_999));
            assert_eq!(
                encode(&call),
                "unknown; attempts=2; stop=not-retried; left-ms=2999"
            );
        }

        #[test]
        fn a_key_that_is_not_visible_ascii_is_left_out() {
            let call = CallOutcome::new(Outcome::Failed, StopReason::Final, 1)
                .with_idempotency_key(HeaderValue::from_static("a key"));
            assert_eq!(encode(&call), "failed; attempts=1; stop=final");
        }

        #[test]
        fn anything_else_reads_as_none() {
            for bad in [
                "",
                "unknown",
                "unknown; attempts=1",
                "unknown; stop=unknown",
                "maybe; attempts=1; stop=unknown",
                "unknown; attempts=1; stop=unknown; attempts=2",
                "unknown; attempts=+1; stop=unknown",
                "unknown; attempts=-1; stop=unknown",
                "unknown; attempts=4294967296; stop=unknown",
                "unknown; attempts=99999999999999999999999; stop=unknown",
                "unknown; attempts=1; stop=later",
                "unknown; attempts=1; stop=unknown; replayed; replayed",
                "unknown; attempts=1; stop=unknown; extra",
                "unknown; attempts=1; stop=unknown; left-ms=",
                "unknown; attempts=1; stop=unknown; key=",
                "unknown; attempts=1; stop=unknown; key=a b",
                "unknown;; attempts=1; stop=unknown",
            ] {
                assert_eq!(decode(bad.as_bytes()), None, "{bad:?}");
            }
            assert_eq!(decode(&[0xff, 0xfe]), None);
            assert_eq!(
                decode("failed; attempts=1; stop=final; key=".repeat(20).as_bytes()),
                None
            );
            assert_eq!(decode(&vec![b'a'; 10_000]), None);
        }
    }
}
