//! The crate's error type.

mod breaker;
mod budget;
mod classify;
mod deadline;
mod fault;
mod journal;
mod outcome;
mod replay;
mod timeout;

pub use self::breaker::{BreakerState, CircuitOpen};
pub use self::budget::BudgetExhausted;
#[cfg(feature = "reqwest")]
pub(crate) use self::classify::cause_in;
pub(crate) use self::classify::classify_dyn as error_chain;

/// An error and its causes in one line, for an operator (a page, the audit log's outcome, a
/// maintenance report): each message along [`source`](std::error::Error::source), joined by
/// `": "`.
#[cfg_attr(not(any(feature = "server", feature = "durable")), allow(dead_code))]
pub(crate) fn said(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
pub use self::deadline::DeadlineExceeded;
pub use self::fault::InjectedFault;
pub use self::journal::JournalError;
pub use self::replay::BodyNotReplayable;
pub use self::timeout::{BodyIdle, Elapsed};

use std::fmt;
use std::task::Poll;
use std::time::Duration;

use crate::classify::{AttemptClass, BoxError, Classification, ClassifyError, DeliveryPhase};
use crate::ids::InvalidKey;
use crate::outcome::{fmt_verdict, CallOutcome, Outcome, StopReason};

/// The error of every surely client layer: the transport's own error `E`, kept as it is, or one
/// of the crate's local errors (a deadline, a timeout, an injected fault, an invalid idempotency key, an open circuit breaker), each carrying what the
/// classifier needs, such as how far the request got.
///
/// The layers stack without nesting: a layer over a service whose error is already
/// `Error<E>` returns `Error<E>` again (see [`IntoError`]).
///
/// ```
/// use surely::Error;
/// use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
///
/// let err: Error<std::io::Error> = Error::transport(std::io::ErrorKind::ConnectionReset.into());
/// assert!(err.is_transport());
/// assert_eq!(err.classify_error(DeliveryPhase::Sent).class(), AttemptClass::MaybeCommitted);
/// ```
pub struct Error<E> {
    repr: Repr<E>,
    // What the call came to, when a layer that folds a call's attempts handed it back here.
    // Boxed: most errors are consumed by a retry layer before any caller sees them, and every
    // `Result` that carries an `Error` is moved between layers on every poll.
    call: Option<Box<Handed>>,
}

/// What a layer that folds a call's attempts handed back with its error: the call's outcome, and
/// what ended its last attempt and how far it got, when the error said.
struct Handed {
    call: CallOutcome,
    last: Option<(crate::classify::Cause, DeliveryPhase)>,
}

impl std::ops::Deref for Handed {
    type Target = CallOutcome;

    fn deref(&self) -> &CallOutcome {
        &self.call
    }
}

impl fmt::Debug for Handed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.call, f)
    }
}

enum Repr<E> {
    Transport(E),
    Deadline(DeadlineExceeded),
    Elapsed(Elapsed),
    Fault(InjectedFault),
    Key(InvalidKey),
    Open(CircuitOpen),
    Journal(JournalError),
}

impl<E> Error<E> {
    #[inline]
    fn of(repr: Repr<E>) -> Self {
        Error { repr, call: None }
    }

    /// What the error is, to match on: the transport's own error or one of the crate's.
    ///
    /// ```
    /// use surely::{Error, ErrorKind};
    ///
    /// fn advice(err: &Error<std::io::Error>) -> String {
    ///     match err.kind() {
    ///         ErrorKind::CircuitOpen(open) => format!("down; back in {:?}", open.retry_after()),
    ///         ErrorKind::DeadlineExceeded(_) | ErrorKind::Elapsed(_) => "too slow".into(),
    ///         ErrorKind::Transport(io) => format!("network: {io}"),
    ///         _ => err.to_string(),
    ///     }
    /// }
    /// let err = Error::transport(std::io::ErrorKind::ConnectionRefused.into());
    /// assert_eq!(advice(&err), "network: connection refused");
    /// ```
    pub fn kind(&self) -> ErrorKind<'_, E> {
        match &self.repr {
            Repr::Transport(e) => ErrorKind::Transport(e),
            Repr::Deadline(e) => ErrorKind::DeadlineExceeded(e),
            Repr::Elapsed(e) => ErrorKind::Elapsed(e),
            Repr::Fault(e) => ErrorKind::InjectedFault(e),
            Repr::Key(e) => ErrorKind::InvalidKey(e),
            Repr::Open(e) => ErrorKind::CircuitOpen(e),
            Repr::Journal(e) => ErrorKind::JournalFailed(e),
        }
    }

    /// What the call came to, when a layer that folds a call's attempts (the
    /// [client stack](mod@crate::client), a [`RecordCallLayer`](crate::record::RecordCallLayer), a
    /// [`RetryLayer`](crate::retry::RetryLayer)) handed it back with this error. See
    /// [`CallOutcome`](crate::CallOutcome).
    pub fn call_outcome(&self) -> Option<&CallOutcome> {
        self.call.as_deref().map(|h| &h.call)
    }

    /// The call's outcome: the one handed back with this error, else what the error alone
    /// proves: [`Failed`](Outcome::Failed) when nothing was sent (a refusal by the crate's own
    /// layers), [`Unknown`](Outcome::Unknown) otherwise.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::{Outcome, StopReason};
    /// use tower::{service_fn, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// // The order service commits, then the connection is reset before the reply.
    /// let transport = service_fn(|_req: http::Request<String>| async {
    ///     Err::<http::Response<String>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    /// });
    /// let mut client = surely::client().timeout(Duration::from_secs(2)).build(transport).unwrap();
    /// let order = http::Request::post("/orders").body("o-1".to_owned()).unwrap();
    /// let err = client.ready().await.unwrap().call(order).await.unwrap_err();
    ///
    /// assert_eq!(err.outcome(), Outcome::Unknown);
    /// assert_eq!(err.stop_reason(), Some(StopReason::Unknown));
    /// assert_eq!(err.attempts(), 1);
    /// assert_eq!(err.to_string(), "unknown after 1 attempt (sent): connection reset");
    /// assert_eq!(err.cause(), Some(surely::classify::Cause::Reset));
    /// # }
    /// ```
    pub fn outcome(&self) -> Outcome {
        match &self.call {
            Some(call) => call.outcome(),
            None if self.local_phase() == Some(DeliveryPhase::NotSent) => Outcome::Failed,
            None => Outcome::Unknown,
        }
    }

    /// Why the call stopped, when a layer that folds a call's attempts handed its outcome back
    /// with this error.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.call.as_ref().map(|c| c.stop_reason())
    }

    /// How many attempts the call made: as handed back with this error, else 0 for a refusal by
    /// the crate's own layers (a spent deadline, an invalid key, an open circuit breaker) and 1
    /// for any other error.
    pub fn attempts(&self) -> u32 {
        match &self.call {
            Some(call) => call.attempts(),
            None if self.is_refusal() => 0,
            None => 1,
        }
    }

    /// Whether one of the crate's layers refused the call before anything was sent: a spent
    /// deadline, an invalid idempotency key, an open circuit breaker.
    pub(crate) fn is_refusal(&self) -> bool {
        match &self.repr {
            Repr::Deadline(e) => e.is_refused(),
            Repr::Key(_) | Repr::Open(_) | Repr::Journal(_) => true,
            Repr::Transport(_) | Repr::Elapsed(_) | Repr::Fault(_) => false,
        }
    }

    /// What ended the call's last attempt, when its error said: a refused or reset
    /// connection, a timeout (see [`Cause`](crate::classify::Cause)). The error's message names
    /// it too: `failed after 3 attempts (connection refused, not sent): ...`.
    ///
    /// Known once a layer that folds a call's attempts (the client stack, a
    /// [`RetryLayer`](crate::retry::RetryLayer)) handed the outcome back; `None` before that,
    /// and for an error that does not say (an error type of your own names its cause with
    /// [`Classification::with_cause`]).
    pub fn cause(&self) -> Option<crate::classify::Cause> {
        self.call
            .as_ref()
            .and_then(|h| h.last)
            .map(|(cause, _)| cause)
    }

    /// Notes how the last attempt, classified `last`, ended: its cause, if it names one, and
    /// how far it got.
    pub(crate) fn note_last_attempt(&mut self, last: Classification) {
        if let (Some(call), Some(cause)) = (&mut self.call, last.cause()) {
            call.last = Some((cause, last.phase()));
        }
    }

    /// Hands the call's outcome back with this error, replacing any a layer inside gave it.
    pub(crate) fn set_call_outcome(&mut self, outcome: CallOutcome) {
        match &mut self.call {
            Some(handed) => handed.call = outcome,
            None => {
                self.call = Some(Box::new(Handed {
                    call: outcome,
                    last: None,
                }))
            }
        }
    }

    /// Wraps a transport's error.
    pub fn transport(error: E) -> Self {
        Error::of(Repr::Transport(error))
    }

    /// Whether this is the transport's own error.
    pub fn is_transport(&self) -> bool {
        matches!(self.repr, Repr::Transport(_))
    }

    /// The transport's error, if this is one.
    pub fn transport_ref(&self) -> Option<&E> {
        match &self.repr {
            Repr::Transport(e) => Some(e),
            _ => None,
        }
    }

    /// The transport's error, or `self` back if this is a local error.
    pub fn into_transport(self) -> Result<E, Self> {
        match self.repr {
            Repr::Transport(e) => Ok(e),
            repr => Err(Error {
                repr,
                call: self.call,
            }),
        }
    }

    /// The deadline error, if the call's deadline refused or ended it.
    pub fn deadline_exceeded(&self) -> Option<&DeadlineExceeded> {
        match &self.repr {
            Repr::Deadline(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the call's deadline refused or ended it.
    pub fn is_deadline_exceeded(&self) -> bool {
        self.deadline_exceeded().is_some()
    }

    /// The attempt timeout, if one fired.
    pub fn elapsed(&self) -> Option<&Elapsed> {
        match &self.repr {
            Repr::Elapsed(e) => Some(e),
            _ => None,
        }
    }

    /// Whether an attempt timeout fired.
    pub fn is_elapsed(&self) -> bool {
        self.elapsed().is_some()
    }

    /// The injected fault, if the [`fault`](crate::fault) layer made this error.
    pub fn injected(&self) -> Option<&InjectedFault> {
        match &self.repr {
            Repr::Fault(e) => Some(e),
            _ => None,
        }
    }

    /// The caller's invalid idempotency key, if the [`idempotency`](crate::idempotency) layer
    /// refused the call for it.
    pub fn invalid_key(&self) -> Option<&InvalidKey> {
        match &self.repr {
            Repr::Key(e) => Some(e),
            _ => None,
        }
    }

    /// The breaker's refusal, if an open [circuit breaker](crate::breaker) refused the call
    /// without calling the service inside it.
    pub fn circuit_open(&self) -> Option<&CircuitOpen> {
        match &self.repr {
            Repr::Open(e) => Some(e),
            _ => None,
        }
    }

    /// The [intent journal](crate::journal)'s failure, if the call was not sent because its
    /// intent could not be written.
    pub fn journal_failed(&self) -> Option<&JournalError> {
        match &self.repr {
            Repr::Journal(e) => Some(e),
            _ => None,
        }
    }

    /// Whether a [circuit breaker](crate::breaker) refused the call.
    pub fn is_circuit_open(&self) -> bool {
        self.circuit_open().is_some()
    }

    /// How far the request got, for the crate's local errors (`None` for a transport error,
    /// whose classifier decides).
    pub fn local_phase(&self) -> Option<DeliveryPhase> {
        match &self.repr {
            Repr::Transport(_) => None,
            Repr::Deadline(e) => Some(e.phase()),
            Repr::Elapsed(e) => Some(e.phase()),
            Repr::Fault(e) => Some(e.phase()),
            Repr::Key(_) => Some(DeliveryPhase::NotSent),
            Repr::Open(_) => Some(DeliveryPhase::NotSent),
            Repr::Journal(_) => Some(DeliveryPhase::NotSent),
        }
    }

    /// Maps the transport error, keeping local errors.
    pub fn map_transport<F>(self, f: impl FnOnce(E) -> F) -> Error<F> {
        Error {
            call: self.call,
            repr: match self.repr {
                Repr::Transport(e) => Repr::Transport(f(e)),
                Repr::Deadline(e) => Repr::Deadline(e),
                Repr::Elapsed(e) => Repr::Elapsed(e),
                Repr::Fault(e) => Repr::Fault(e),
                Repr::Key(e) => Repr::Key(e),
                Repr::Open(e) => Repr::Open(e),
                Repr::Journal(e) => Repr::Journal(e),
            },
        }
    }
}

impl<E> From<DeadlineExceeded> for Error<E> {
    fn from(e: DeadlineExceeded) -> Self {
        Error::of(Repr::Deadline(e))
    }
}

impl<E> From<Elapsed> for Error<E> {
    fn from(e: Elapsed) -> Self {
        Error::of(Repr::Elapsed(e))
    }
}

impl<E> From<InjectedFault> for Error<E> {
    fn from(e: InjectedFault) -> Self {
        Error::of(Repr::Fault(e))
    }
}

impl<E> From<InvalidKey> for Error<E> {
    fn from(e: InvalidKey) -> Self {
        Error::of(Repr::Key(e))
    }
}

impl<E> From<CircuitOpen> for Error<E> {
    fn from(e: CircuitOpen) -> Self {
        Error::of(Repr::Open(e))
    }
}

impl<E> From<JournalError> for Error<E> {
    fn from(e: JournalError) -> Self {
        Error::of(Repr::Journal(e))
    }
}

impl<E: fmt::Debug> fmt::Debug for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.call {
            None => fmt::Debug::fmt(&self.repr, f),
            Some(call) => f
                .debug_struct("Error")
                .field("error", &self.repr)
                .field("call", call)
                .finish(),
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for Repr<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Repr::Transport(e) => f.debug_tuple("Transport").field(e).finish(),
            Repr::Deadline(e) => fmt::Debug::fmt(e, f),
            Repr::Elapsed(e) => fmt::Debug::fmt(e, f),
            Repr::Fault(e) => fmt::Debug::fmt(e, f),
            Repr::Key(e) => fmt::Debug::fmt(e, f),
            Repr::Open(e) => fmt::Debug::fmt(e, f),
            Repr::Journal(e) => fmt::Debug::fmt(e, f),
        }
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    /// The outcome and the attempts, when a call layer handed them back, with what ended the
    /// last attempt and how far it got when its error said, then the error:
    /// `unknown after 2 attempts: attempt timed out after send`, `unknown after 1 attempt
    /// (sent): connection reset`, `failed after 3 attempts (connection refused, not sent):
    /// error sending request for url (http://...)`. The cause is left out when the error's
    /// own message starts with it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(call) = &self.call {
            fmt_verdict(f, call.outcome(), call.attempts())?;
            if let Some((cause, phase)) = call.last {
                // The cause, unless the error's own message starts with it (an I/O error's
                // does): `failed after 3 attempts (connection refused, not sent): error
                // sending request`, `unknown after 1 attempt (sent): connection reset`.
                let said = match &self.repr {
                    Repr::Transport(e) => e
                        .to_string()
                        .to_ascii_lowercase()
                        .starts_with(cause.as_str()),
                    _ => false,
                };
                match said {
                    true => write!(f, " ({})", phase.as_str())?,
                    false => write!(f, " ({cause}, {})", phase.as_str())?,
                }
            }
            f.write_str(": ")?;
        }
        match &self.repr {
            Repr::Transport(e) => fmt::Display::fmt(e, f),
            Repr::Deadline(e) => fmt::Display::fmt(e, f),
            Repr::Elapsed(e) => fmt::Display::fmt(e, f),
            Repr::Fault(e) => fmt::Display::fmt(e, f),
            Repr::Key(e) => fmt::Display::fmt(e, f),
            Repr::Open(e) => fmt::Display::fmt(e, f),
            Repr::Journal(e) => fmt::Display::fmt(e, f),
        }
    }
}

/// What an [`Error`] is, borrowed from it by [`Error::kind`]: the transport's own error, or
/// one of the crate's local errors.
///
/// Non-exhaustive: a later version may add a local error.
#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind<'a, E> {
    /// The transport's own error.
    Transport(&'a E),
    /// The call's deadline refused it before anything was sent, or ended it in flight.
    DeadlineExceeded(&'a DeadlineExceeded),
    /// An attempt timeout fired (before or after send, at the per-try limit or the deadline).
    Elapsed(&'a Elapsed),
    /// The [fault](crate::fault) layer injected this error.
    InjectedFault(&'a InjectedFault),
    /// The caller's idempotency key was invalid; nothing was sent.
    InvalidKey(&'a InvalidKey),
    /// An open [circuit breaker](crate::breaker) refused the call; nothing was sent.
    CircuitOpen(&'a CircuitOpen),
    /// The call's intent could not be [journaled](crate::journal); nothing was sent.
    JournalFailed(&'a JournalError),
}

impl<E> Clone for ErrorKind<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for ErrorKind<'_, E> {}

impl<E> std::error::Error for Error<E>
where
    E: std::error::Error + 'static,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.repr {
            // Transparent: the transport error's own message is this error's.
            Repr::Transport(e) => e.source(),
            _ => None,
        }
    }
}

impl<E: ClassifyError> ClassifyError for Error<E> {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        match &self.repr {
            Repr::Transport(e) => e.classify_error(phase),
            Repr::Deadline(e) => Classification::failure_at(e.phase()),
            Repr::Elapsed(e) => Classification::failure_at(e.phase()),
            Repr::Fault(e) => Classification::failure_at(e.phase()),
            Repr::Key(_) => Classification::new(AttemptClass::Final, DeliveryPhase::NotSent),
            Repr::Open(e) => e.classification(),
            Repr::Journal(e) => e.classification(),
        }
    }
}

/// Turns a service's error into [`Error`], so that layers stack without nesting: the identity
/// for `Error<E>`, and [`Error::transport`] for the transport errors below. Every surely client
/// layer over a service `S` returns `Error<<S::Error as IntoError>::Transport>`.
///
/// Implemented for `std::io::Error`, [`BoxError`] (tower's usual error, kept as a
/// [`BoxedError`] so that the resulting `Error` is itself a `std::error::Error`),
/// `std::convert::Infallible`, `http::Error`, with the `hyper` feature `hyper::Error` and
/// hyper-util's client error, with the `tonic` feature `tonic::transport::Error`, with the
/// `reqwest` feature `reqwest::Error`, and for every [`TransportError`]: an error type of your
/// own implements that one trait, not this one.
///
/// For a foreign error type, map it first, e.g. with tower's
/// `ServiceBuilder::map_err(surely::Error::transport)`.
#[diagnostic::on_unimplemented(
    message = "surely's layers cannot take the error `{Self}`: it is not a `surely::TransportError`",
    label = "not a `TransportError`",
    note = "for an error type of your own, `impl surely::TransportError for {Self} {{}}` takes it \
            (a failure then counts as sent unless it says otherwise: override `classify` to \
            say which failures prove the request was not sent, and which are a final answer); \
            an error type from another crate needs a wrapper of your own, or a \
            `std::io::Error`"
)]
pub trait IntoError {
    /// The transport error inside.
    type Transport;

    /// Converts.
    fn into_error(self) -> Error<Self::Transport>;
}

impl<E> IntoError for Error<E> {
    type Transport = E;

    fn into_error(self) -> Error<E> {
        self
    }
}

/// An error type of your own, taken by the client stack in one trait: it is then an
/// [`IntoError`] and a [`ClassifyError`], and needs neither written.
///
/// What the stack needs to know of a failure is how far the request got, since that decides
/// whether it may be sent again and whether the call ends `Failed` or `Unknown`. The default,
/// `impl TransportError for MyError {}`, knows nothing: a failure counts as far as the layer
/// that saw it knows the request got (`phase`), so one after the request went out is *maybe
/// committed*. For a service of your own (a `service_fn`), every failure is then *sent*: the
/// service was called, and only the error can prove it did not reach the other side. Override [`classify`](Self::classify) to say more:
///
/// | the failure | return | so |
/// | --- | --- | --- |
/// | a business "no" (out of stock, card declined): the server answered | `Classification::new(AttemptClass::Final, DeliveryPhase::ResponseStarted)` | `Failed`, not retried |
/// | a conflict (a version that moved on) | `Classification::new(AttemptClass::Conflict, DeliveryPhase::ResponseStarted)` | `Failed`, not retried |
/// | proof it was never sent (no connection) | `Classification::failure_at(DeliveryPhase::NotSent)` | retried for any request |
/// | a refusal before processing (overloaded, shutting down) | `Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted)` | retried for any request |
/// | a timeout, a lost connection, anything else | `Classification::failure_at(phase)` | retried only if the request may be repeated; else `Unknown` |
///
/// ```
/// use surely::classify::{AttemptClass, Classification, DeliveryPhase};
/// use surely::{Envelope, Outcome, OutcomeExt, TransportError};
/// use tower::service_fn;
///
/// #[derive(Clone)]
/// struct PlaceOrder(u32);
/// impl Envelope for PlaceOrder {}
///
/// #[derive(Debug)]
/// struct Placed(u32);
/// impl Envelope for Placed {}
///
/// #[derive(Debug)]
/// enum ShopError {
///     OutOfStock,
///     Unreachable,
/// }
///
/// impl TransportError for ShopError {
///     fn classify(&self, phase: DeliveryPhase) -> Classification {
///         match self {
///             // The shop answered "no": the order was not placed, and will not be.
///             ShopError::OutOfStock => {
///                 Classification::new(AttemptClass::Final, DeliveryPhase::ResponseStarted)
///             }
///             // No connection: the shop never saw the order.
///             ShopError::Unreachable => Classification::failure_at(DeliveryPhase::NotSent),
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let shop = service_fn(|req: PlaceOrder| async move {
///     match req.0 {
///         0 => Err(ShopError::OutOfStock),
///         n => Ok(Placed(n)),
///     }
/// });
/// let mut client = surely::client().build(shop).unwrap();
///
/// let res = client.send(PlaceOrder(0)).await;
/// assert_eq!((res.outcome(), res.attempts()), (Outcome::Failed, 1));
/// assert!(matches!(res.unwrap_err().transport_ref(), Some(ShopError::OutOfStock)));
///
/// let res = client.send(PlaceOrder(3)).await;
/// assert_eq!(res.outcome(), Outcome::Succeeded);
/// assert_eq!(res.unwrap().0, 3);
/// # }
/// ```
///
/// A type that implements this trait cannot also implement [`IntoError`] or [`ClassifyError`]
/// itself: this trait gives both.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a `surely::TransportError`",
    label = "not a `TransportError`",
    note = "`impl surely::TransportError for {Self} {{}}` takes it; override `classify` to say \
            which failures prove the request was not sent, and which are a final answer"
)]
pub trait TransportError {
    /// What this failure says about an attempt that reached `phase`: see the table above. The
    /// default is [`Classification::failure_at`]`(phase)`: a failure proves nothing.
    fn classify(&self, phase: DeliveryPhase) -> Classification {
        Classification::failure_at(phase)
    }
}

impl<E: TransportError> IntoError for E {
    type Transport = E;

    fn into_error(self) -> Error<E> {
        Error::transport(self)
    }
}

impl<E: TransportError> ClassifyError for E {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        self.classify(phase)
    }
}

/// `out.map_err(IntoError::into_error)`, written so that a success is passed on by itself.
///
/// With an `into_error` that changes nothing (an inner surely layer's error), `map_err` is
/// compiled into one copy of the whole `Result`, the error's room included. For a large
/// transport error that copy is most of the bytes a layer moves, and since the bytes were
/// stored piecewise, the wide loads that copy them wait for those stores to land. Taken apart,
/// a success moves only itself.
///
/// Where the answer comes out of a poll, match the poll whole (or use [`lift_poll`]): binding
/// the `Result` out of `Poll::Ready` first can bring the whole copy back (measured on the
/// deadline stack over a 65-byte error: 9.5 against 16.5 ns).
#[inline(always)]
pub(crate) fn lift<T, E: IntoError>(out: Result<T, E>) -> Result<T, Error<E::Transport>> {
    match out {
        Ok(res) => Ok(res),
        Err(e) => Err(e.into_error()),
    }
}

/// [`lift`] on a poll's answer.
#[inline(always)]
pub(crate) fn lift_poll<T, E: IntoError>(
    out: Poll<Result<T, E>>,
) -> Poll<Result<T, Error<E::Transport>>> {
    match out {
        Poll::Ready(Ok(res)) => Poll::Ready(Ok(res)),
        Poll::Ready(Err(e)) => Poll::Ready(Err(e.into_error())),
        Poll::Pending => Poll::Pending,
    }
}

macro_rules! transport_errors {
    ($($(#[$m:meta])* $t:ty),* $(,)?) => {$(
        $(#[$m])*
        impl IntoError for $t {
            type Transport = $t;

            fn into_error(self) -> Error<$t> {
                Error::transport(self)
            }
        }
    )*};
}

transport_errors!(
    std::io::Error,
    BoxedError,
    std::convert::Infallible,
    http::Error,
    #[cfg(feature = "hyper")]
    hyper::Error,
    #[cfg(feature = "hyper")]
    hyper_util::client::legacy::Error,
    #[cfg(feature = "tonic")]
    tonic::transport::Error,
);

/// A layer's configuration was rejected: a zero or out-of-range duration, a reserve larger than
/// the budget, a probability that is not a number. Built by every `build()` that validates.
///
/// ```
/// use std::time::Duration;
/// use surely::deadline::SetDeadlineLayer;
///
/// let err = SetDeadlineLayer::builder().timeout(Duration::ZERO).build().unwrap_err();
/// assert_eq!(err.to_string(), "invalid deadline timeout: must be greater than zero");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {why}")]
pub struct ConfigError {
    what: &'static str,
    why: std::borrow::Cow<'static, str>,
}

impl ConfigError {
    /// A configuration error: `what` was wrong, and `why` (a fixed text, or one that names the
    /// values: `"1h is shorter than the safety window (2h)"`).
    pub fn new(what: &'static str, why: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        ConfigError {
            what,
            why: why.into(),
        }
    }

    /// The setting that was rejected.
    pub fn setting(&self) -> &'static str {
        self.what
    }

    /// Why it was rejected.
    pub fn reason(&self) -> &str {
        &self.why
    }

    /// `duration`, if it is at most [`MAX_DURATION`](crate::MAX_DURATION); else the error that
    /// names `setting` and the bound.
    pub(crate) fn at_most_max(
        setting: &'static str,
        duration: Duration,
    ) -> Result<Duration, ConfigError> {
        if duration > crate::time::MAX_DURATION {
            return Err(ConfigError::new(setting, "must be at most ten years"));
        }
        Ok(duration)
    }

    /// `duration`, if it is greater than zero and at most [`MAX_DURATION`](crate::MAX_DURATION);
    /// else the error that names `setting` and the bound it broke.
    pub(crate) fn positive_at_most_max(
        setting: &'static str,
        duration: Duration,
    ) -> Result<Duration, ConfigError> {
        if duration.is_zero() {
            return Err(ConfigError::new(setting, "must be greater than zero"));
        }
        Self::at_most_max(setting, duration)
    }

    /// The same reason, said of `setting`: a configuration file's field path instead of the
    /// builder's name for it.
    #[cfg(feature = "serde")]
    pub(crate) fn of_setting(self, setting: &'static str) -> Self {
        ConfigError {
            what: setting,
            why: self.why,
        }
    }
}

impl IntoError for BoxError {
    type Transport = BoxedError;

    fn into_error(self) -> Error<BoxedError> {
        Error::transport(BoxedError(self))
    }
}

/// A transport's boxed error ([`BoxError`], tower's usual error type), as the transport error
/// inside an [`Error`].
///
/// `Box<dyn Error + Send + Sync>` does not itself implement `std::error::Error`, so an
/// `Error<BoxError>` could not be boxed again (under `tower::buffer`, or with `?`). This wrapper
/// does, transparently: its message and sources are the boxed error's.
///
/// ```
/// use surely::{BoxedError, Error, IntoError};
///
/// let boxed: surely::classify::BoxError = "connection reset by peer".into();
/// let err: Error<BoxedError> = boxed.into_error();
/// assert_eq!(err.to_string(), "connection reset by peer");
/// // And back into a box, as tower wants it.
/// let again: surely::classify::BoxError = Box::new(err);
/// # let _ = again;
/// ```
pub struct BoxedError(BoxError);

impl BoxedError {
    /// Wraps a boxed error.
    pub fn new(error: BoxError) -> Self {
        BoxedError(error)
    }

    /// The boxed error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// Unwraps the boxed error.
    pub fn into_inner(self) -> BoxError {
        self.0
    }
}

impl fmt::Debug for BoxedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for BoxedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for BoxedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl ClassifyError for BoxedError {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        crate::error::error_chain(&*self.0, phase)
    }
}
