//! Classification: what one attempt's result means, and what a call's outcome is.
//!
//! A timeout says only that no answer came in time. Whether the attempt may be retried, and
//! whether the call *failed* or has an *unknown* outcome, depends on three things:
//!
//! * **what came back**: a response or an error;
//! * **how far the request got**: the [`DeliveryPhase`] (not sent, sent, response started);
//! * **what the request is**: its [`Semantics`] (safe, idempotent, keyed, non-idempotent).
//!
//! The first two give the [`AttemptClass`]; with the third, the class says whether a retry is
//! allowed ([`AttemptClass::is_retryable`]) and what the attempt means for the call
//! ([`OutcomeTally`]). The full table:
//!
//! | class | examples | retried for |
//! | --- | --- | --- |
//! | [`Success`](AttemptClass::Success) | 2xx, gRPC `OK` | never (done) |
//! | [`Final`](AttemptClass::Final) | 400, 401, 403, 404, 422, `INVALID_ARGUMENT` | never |
//! | [`Conflict`](AttemptClass::Conflict) | 409, `ABORTED` | never: redo the read-modify-write above |
//! | [`Rejected`](AttemptClass::Rejected) | connect refused, 408, 429, 503 + `Retry-After`, circuit open, a keyed request's 409 "in flight" | every request |
//! | [`MaybeCommitted`](AttemptClass::MaybeCommitted) | timeout after send, reset after send, 500, 502, 504 | safe, idempotent and keyed requests only |
//!
//! # One abstraction for every layer
//!
//! Like [`tower-http`'s `classify`][th], a [`MakeClassifier`] looks at the request and makes a
//! per-request classifier, which is consumed by classifying the response or error. Retry, the
//! breaker, hedging and the records all use the same classifier, so they never disagree about what
//! an attempt meant. The per-request step is what lets a classifier see the request's semantics:
//! a 409 with `Retry-After` is "retry later with the same key" for a keyed request and a business
//! conflict for anything else.
//!
//! Built in:
//! * [`HttpClassifier`]: HTTP status codes, `Retry-After`, and gRPC (`grpc-status` in the headers
//!   of a trailers-only response, or in the trailers through [`ClassifyEos`]) for requests whose
//!   content type is `application/grpc`; any other [`Envelope`](crate::Envelope) response (a
//!   `u64`, a type of your own) is a success;
//! * [`ClassifyError`]: `std::io::Error` kinds, the crate's own errors, boxed errors, and with the
//!   `hyper` feature hyper and hyper-util client errors (`is_connect()` means not sent; with the
//!   `http2` feature, a stream the server reset with HTTP/2's `REFUSED_STREAM` is rejected, not
//!   processed);
//! * [`from_fn`]: a closure.
//!
//! ```
//! use surely::classify::{AttemptClass, Classify, Classified, HttpClassifier, MakeClassifier};
//! use surely::{Error, Semantics};
//!
//! let post = http::Request::post("/orders").body(()).unwrap();
//! let classifier = HttpClassifier::new().make_classifier(&post);
//! let reply = http::Response::builder().status(502).body(()).unwrap();
//! let Classified::Ready(c) =
//!     Classify::<_, Error<std::io::Error>>::classify_response(classifier, &reply)
//! else {
//!     unreachable!("HTTP responses are classified from their status")
//! };
//! assert_eq!(c.class(), AttemptClass::MaybeCommitted);
//! // A POST without a key must not be sent again: the outcome is unknown.
//! assert!(!c.is_retryable(Semantics::NonIdempotent));
//! ```
//!
//! [th]: https://docs.rs/tower-http/latest/tower_http/classify/index.html

use std::fmt;
use std::time::Duration;

use crate::{Outcome, Semantics, StopReason};

mod error;
mod func;
mod grpc;
mod http;
#[cfg(feature = "server")]
pub(crate) use self::http::{DEADLINE_REFUSAL, OVERLOAD_REFUSAL};
mod tally;

pub use self::error::{BoxError, ClassifyError};
pub use self::func::{from_fn, Attempted, ClassifyFn, FnClassifier};
pub use self::grpc::{GrpcCode, GrpcEos};
pub use self::http::{HttpClassifier, HttpRequestClassifier};
pub use self::tally::OutcomeTally;

/// How far a request got before its attempt ended.
///
/// Ordered: `NotSent < Sent < ResponseStarted`. Only evidence moves a phase down: a transport
/// error that proves nothing was written (a refused connection), or a timeout that fired before
/// the inner service was called. Where a layer cannot tell, it assumes [`Sent`](Self::Sent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeliveryPhase {
    /// No byte of the request left this process: the server cannot have seen it.
    NotSent,
    /// The request was (or may have been) written; no response has started.
    Sent,
    /// The response head arrived.
    ResponseStarted,
}

impl DeliveryPhase {
    /// A short lower-case name, for records and logs.
    ///
    /// ```
    /// assert_eq!(surely::classify::DeliveryPhase::NotSent.as_str(), "not sent");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryPhase::NotSent => "not sent",
            DeliveryPhase::Sent => "sent",
            DeliveryPhase::ResponseStarted => "response started",
        }
    }
}

/// What ended an attempt that failed, when the error said: what an error message names
/// (`failed after 3 attempts (connection refused, not sent): ...`), read with
/// [`Error::cause`](crate::Error::cause).
///
/// It explains; it does not decide: the [`AttemptClass`] and the [`DeliveryPhase`] decide. A
/// refused connection and a refusal by the server are both *rejected*; a reset is *maybe
/// committed* once the request was sent and *rejected* before.
///
/// ```
/// use std::io::{Error, ErrorKind};
/// use surely::classify::{Cause, ClassifyError, DeliveryPhase};
///
/// let reset = Error::from(ErrorKind::ConnectionReset).classify_error(DeliveryPhase::Sent);
/// assert_eq!(reset.cause(), Some(Cause::Reset));
/// assert_eq!(Cause::Reset.to_string(), "connection reset");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// The connection was refused: nothing listened, or a server turned it away.
    Refused,
    /// The connection was reset or aborted, or the pipe broke.
    Reset,
    /// A timeout fired: the transport's own, or the operating system's.
    TimedOut,
    /// The connection closed before the whole response came.
    Closed,
    /// The host or its network could not be reached, or the address was not available.
    Unreachable,
}

impl Cause {
    /// A short lower-case name, for messages and records.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Refused => "connection refused",
            Cause::Reset => "connection reset",
            Cause::TimedOut => "timed out",
            Cause::Closed => "connection closed",
            Cause::Unreachable => "unreachable",
        }
    }

    /// The cause an I/O error's kind names, if it names one.
    pub(crate) fn of_io_kind(kind: std::io::ErrorKind) -> Option<Cause> {
        use std::io::ErrorKind::*;
        Some(match kind {
            ConnectionRefused => Cause::Refused,
            ConnectionReset | ConnectionAborted | BrokenPipe => Cause::Reset,
            TimedOut => Cause::TimedOut,
            UnexpectedEof | NotConnected => Cause::Closed,
            AddrNotAvailable | HostUnreachable | NetworkUnreachable => Cause::Unreachable,
            _ => return None,
        })
    }

    fn pack(cause: Option<Cause>) -> u16 {
        (match cause {
            None => 0,
            Some(Cause::Refused) => 1,
            Some(Cause::Reset) => 2,
            Some(Cause::TimedOut) => 3,
            Some(Cause::Closed) => 4,
            Some(Cause::Unreachable) => 5,
        }) << CAUSE_SHIFT
    }

    fn unpack(head: u16) -> Option<Cause> {
        match (head & CAUSE_MASK) >> CAUSE_SHIFT {
            1 => Some(Cause::Refused),
            2 => Some(Cause::Reset),
            3 => Some(Cause::TimedOut),
            4 => Some(Cause::Closed),
            5 => Some(Cause::Unreachable),
            _ => None,
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one attempt's result means. See the [module docs](self) for the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptClass {
    /// The server confirmed the effect (2xx, gRPC `OK`).
    Success,
    /// The server confirmed the effect did not and will not happen for this input.
    Final,
    /// A business conflict (409, gRPC `ABORTED`, a failed compare-and-set): the effect did not
    /// happen, and replaying this one step would not help; the whole read-modify-write above
    /// it must be redone.
    Conflict,
    /// The request was provably not processed (never sent, or refused before processing):
    /// retryable for every request.
    Rejected,
    /// The request may have been committed and its reply lost: retryable only for requests
    /// that can be repeated.
    MaybeCommitted,
}

impl AttemptClass {
    /// Whether an attempt of this class may be retried for a request with these semantics.
    ///
    /// ```
    /// use surely::classify::AttemptClass;
    /// use surely::Semantics;
    ///
    /// assert!(AttemptClass::Rejected.is_retryable(Semantics::NonIdempotent));
    /// assert!(AttemptClass::MaybeCommitted.is_retryable(Semantics::Keyed));
    /// assert!(!AttemptClass::MaybeCommitted.is_retryable(Semantics::NonIdempotent));
    /// assert!(!AttemptClass::Conflict.is_retryable(Semantics::Safe));
    /// ```
    pub fn is_retryable(self, semantics: Semantics) -> bool {
        match self {
            AttemptClass::Success | AttemptClass::Final | AttemptClass::Conflict => false,
            AttemptClass::Rejected => true,
            AttemptClass::MaybeCommitted => semantics.is_repeatable(),
        }
    }

    /// Whether the attempt says something about the server's health: rejections and
    /// maybe-committed failures do, final answers and conflicts do not. Retry budgets and the
    /// circuit breaker count only these.
    ///
    /// ```
    /// use surely::classify::AttemptClass;
    /// assert!(AttemptClass::MaybeCommitted.is_health_failure());
    /// assert!(!AttemptClass::Final.is_health_failure());
    /// ```
    pub fn is_health_failure(self) -> bool {
        matches!(self, AttemptClass::Rejected | AttemptClass::MaybeCommitted)
    }

    /// A short lower-case name, for records and logs.
    ///
    /// ```
    /// assert_eq!(surely::classify::AttemptClass::MaybeCommitted.as_str(), "maybe committed");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptClass::Success => "success",
            AttemptClass::Final => "final",
            AttemptClass::Conflict => "conflict",
            AttemptClass::Rejected => "rejected",
            AttemptClass::MaybeCommitted => "maybe committed",
        }
    }
}

use crate::pushback::Pushback;

/// The classification of one attempt: its [`AttemptClass`], the [`DeliveryPhase`] it reached,
/// and the server's [`Pushback`], if any.
///
/// ```
/// use std::time::Duration;
/// use surely::classify::{AttemptClass, Classification, DeliveryPhase};
/// use surely::pushback::Pushback;
///
/// let c = Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted)
///     .with_pushback(Some(Pushback::After(Duration::from_secs(2))));
/// assert_eq!(c.pushback(), Some(Pushback::After(Duration::from_secs(2))));
/// ```
///
/// A pushback is kept to the nanosecond up to about 584 years; a longer one reads back as that
/// (no retry layer waits for either).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Classification {
    // Two scalars, so that a classifier returns a classification in two registers: a larger
    // one went through memory, written field by field and read back whole, which stalled the
    // caller on every attempt. The pushback: `NO_PUSHBACK`, `PUSHBACK_STOP`, or the wait in
    // nanoseconds.
    pushback: u64,
    // The class (bits 0–3), the phase (bits 4–5), whether it is a refusal for a spent
    // deadline (bit 8) or by the server's admission control (bit 9), and the cause (bits
    // 10–12).
    head: u16,
}

/// [`Classification::pushback`]'s word for no pushback.
const NO_PUSHBACK: u64 = u64::MAX;
/// [`Classification::pushback`]'s word for [`Pushback::Stop`].
const PUSHBACK_STOP: u64 = u64::MAX - 1;
/// The longest wait the word holds, in nanoseconds.
const PUSHBACK_MAX_NANOS: u64 = u64::MAX - 2;
const PHASE_SHIFT: u16 = 4;
const SPENT_DEADLINE_BIT: u16 = 1 << 8;
const OVERLOAD_BIT: u16 = 1 << 9;
const CAUSE_SHIFT: u16 = 10;
const CAUSE_MASK: u16 = 0b111 << CAUSE_SHIFT;

fn pack_pushback(pushback: Option<Pushback>) -> u64 {
    match pushback {
        None => NO_PUSHBACK,
        Some(Pushback::Stop) => PUSHBACK_STOP,
        Some(Pushback::After(wait)) => {
            u64::try_from(wait.as_nanos()).map_or(PUSHBACK_MAX_NANOS, |n| n.min(PUSHBACK_MAX_NANOS))
        }
    }
}

fn unpack_pushback(word: u64) -> Option<Pushback> {
    match word {
        NO_PUSHBACK => None,
        PUSHBACK_STOP => Some(Pushback::Stop),
        nanos => Some(Pushback::After(Duration::from_nanos(nanos))),
    }
}

fn pack_head(class: AttemptClass, phase: DeliveryPhase) -> u16 {
    let class = match class {
        AttemptClass::Success => 0,
        AttemptClass::Final => 1,
        AttemptClass::Conflict => 2,
        AttemptClass::Rejected => 3,
        AttemptClass::MaybeCommitted => 4,
    };
    let phase = match phase {
        DeliveryPhase::NotSent => 0,
        DeliveryPhase::Sent => 1,
        DeliveryPhase::ResponseStarted => 2,
    };
    class | phase << PHASE_SHIFT
}

impl fmt::Debug for Classification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classification")
            .field("class", &self.class())
            .field("phase", &self.phase())
            .field("pushback", &self.pushback())
            .field("deadline_refusal", &self.is_deadline_refusal())
            .field("overload_refusal", &self.is_overload_refusal())
            .field("cause", &self.cause())
            .finish()
    }
}

impl Classification {
    /// A classification without pushback.
    pub fn new(class: AttemptClass, phase: DeliveryPhase) -> Self {
        Classification {
            pushback: NO_PUSHBACK,
            head: pack_head(class, phase),
        }
    }

    /// A successful attempt: the response started.
    ///
    /// ```
    /// # use surely::classify::*;
    /// assert_eq!(Classification::success().class(), AttemptClass::Success);
    /// ```
    pub fn success() -> Self {
        Self::new(AttemptClass::Success, DeliveryPhase::ResponseStarted)
    }

    /// A failed attempt whose class follows from how far it got, with no other evidence:
    /// [`Rejected`](AttemptClass::Rejected) if it was not sent, otherwise
    /// [`MaybeCommitted`](AttemptClass::MaybeCommitted).
    ///
    /// ```
    /// # use surely::classify::*;
    /// assert_eq!(Classification::failure_at(DeliveryPhase::NotSent).class(), AttemptClass::Rejected);
    /// assert_eq!(Classification::failure_at(DeliveryPhase::Sent).class(), AttemptClass::MaybeCommitted);
    /// ```
    pub fn failure_at(phase: DeliveryPhase) -> Self {
        let class = match phase {
            DeliveryPhase::NotSent => AttemptClass::Rejected,
            DeliveryPhase::Sent | DeliveryPhase::ResponseStarted => AttemptClass::MaybeCommitted,
        };
        Self::new(class, phase)
    }

    /// This classification with the given pushback.
    pub fn with_pushback(mut self, pushback: Option<Pushback>) -> Self {
        self.pushback = pack_pushback(pushback);
        self
    }

    /// The attempt's class.
    pub fn class(&self) -> AttemptClass {
        // Only `pack_head` writes the bits.
        match self.head & 0xf {
            0 => AttemptClass::Success,
            1 => AttemptClass::Final,
            2 => AttemptClass::Conflict,
            3 => AttemptClass::Rejected,
            _ => AttemptClass::MaybeCommitted,
        }
    }

    /// How far the request got.
    pub fn phase(&self) -> DeliveryPhase {
        match (self.head >> PHASE_SHIFT) & 0x3 {
            0 => DeliveryPhase::NotSent,
            1 => DeliveryPhase::Sent,
            _ => DeliveryPhase::ResponseStarted,
        }
    }

    /// What the server asked about retrying, if anything.
    pub fn pushback(&self) -> Option<Pushback> {
        unpack_pushback(self.pushback)
    }

    /// This classification, for a server's refusal to start on a request whose deadline it
    /// found spent or too short (`surely-not-processed: deadline`, as
    /// [`ServerDeadlineLayer`][crate::server::deadline::ServerDeadlineLayer] answers): the caller's
    /// budget, not the server's health, ended the attempt.
    ///
    /// ```
    /// # use surely::classify::*;
    /// let c = Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted)
    ///     .for_spent_deadline();
    /// assert!(c.is_deadline_refusal());
    /// assert!(!c.is_health_failure());
    /// ```
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::deadline::ServerDeadlineLayer",
        )
    )]
    pub fn for_spent_deadline(mut self) -> Self {
        self.head |= SPENT_DEADLINE_BIT;
        self
    }

    /// Whether the server refused the attempt for its spent deadline.
    pub fn is_deadline_refusal(&self) -> bool {
        self.head & SPENT_DEADLINE_BIT != 0
    }

    /// This classification, for a server's refusal by its admission control
    /// (`surely-not-processed: overload`, as a server's
    /// [adaptive limit][crate::server::limit] answers): the server is serving all it can and
    /// shedding the rest, which its `Retry-After` and the retry budget pace.
    ///
    /// ```
    /// # use surely::classify::*;
    /// let c = Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted)
    ///     .for_overload();
    /// assert!(c.is_overload_refusal());
    /// assert!(!c.is_health_failure());
    /// ```
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::limit",
        )
    )]
    pub fn for_overload(mut self) -> Self {
        self.head |= OVERLOAD_BIT;
        self
    }

    /// Whether the server refused the attempt by its admission control, before processing.
    pub fn is_overload_refusal(&self) -> bool {
        self.head & OVERLOAD_BIT != 0
    }

    /// This classification, saying what ended the attempt (`None`: nothing known). An error
    /// type of your own may name its cause; the crate's classifiers name it from I/O errors,
    /// hyper's and reqwest's.
    ///
    /// ```
    /// use surely::classify::{Cause, Classification, DeliveryPhase};
    ///
    /// let c = Classification::failure_at(DeliveryPhase::NotSent).with_cause(Some(Cause::Refused));
    /// assert_eq!(c.cause(), Some(Cause::Refused));
    /// ```
    pub fn with_cause(mut self, cause: Option<Cause>) -> Self {
        self.head = (self.head & !CAUSE_MASK) | Cause::pack(cause);
        self
    }

    /// What ended the attempt, when its error said.
    pub fn cause(&self) -> Option<Cause> {
        Cause::unpack(self.head)
    }

    /// Whether the attempt says something about the server's health: its class is a
    /// [health failure](AttemptClass::is_health_failure), and it is neither a refusal for the
    /// caller's spent deadline nor a refusal by the server's admission control. The circuit
    /// breaker counts these.
    ///
    /// A server that sheds part of its load is well: it serves what it can. A breaker that
    /// counted its refusals would open at a refusal rate of half, and then refuse *every*
    /// call for its break, wasting the capacity the server kept; the server's pushback and the
    /// retry budget bound what the refusals cost instead.
    pub fn is_health_failure(&self) -> bool {
        self.class().is_health_failure()
            && !self.is_deadline_refusal()
            && !self.is_overload_refusal()
    }

    /// Whether this attempt may be retried for a request with these semantics. A server's
    /// [`Pushback::Stop`] forbids it too.
    pub fn is_retryable(&self, semantics: Semantics) -> bool {
        self.class().is_retryable(semantics) && self.pushback != PUSHBACK_STOP
    }
}

/// Makes a per-request classifier. Implemented by [`HttpClassifier`], by [`ClassifyFn`], and by
/// closures `Fn(&Req) -> C`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot make a classifier for a `{Req}` request",
    label = "no classifier for `{Req}`",
    note = "`HttpClassifier` (the default) and `surely::classify::from_fn` read the request \
            through `surely::Envelope`: implement it for `{Req}`"
)]
pub trait MakeClassifier<Req> {
    /// The per-request classifier.
    type Classifier;

    /// Looks at the request (its semantics, its protocol) and makes its classifier.
    fn make_classifier(&self, req: &Req) -> Self::Classifier;
}

impl<F, Req, C> MakeClassifier<Req> for F
where
    F: Fn(&Req) -> C,
{
    type Classifier = C;

    fn make_classifier(&self, req: &Req) -> C {
        self(req)
    }
}

/// Classifies one attempt's result; consumed by doing so.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify an attempt that ends in `Result<{Res}, {E}>`",
    label = "cannot classify `{Res}` or `{E}`",
    note = "`HttpClassifier` (the default) classifies responses that implement `surely::Envelope` \
            and errors that implement `surely::classify::ClassifyError`",
    note = "for other results give the client a classifier of your own: \
            `.classifier(surely::classify::from_fn(|attempt: Attempted<'_, {Res}, {E}>, semantics| ...))`"
)]
pub trait Classify<Res, E>: Sized {
    /// Classifies at the end of the response stream, for protocols that put the status in
    /// trailers (gRPC).
    type ClassifyEos: ClassifyEos;

    /// Classifies a response, or defers to the end of its stream.
    fn classify_response(self, res: &Res) -> Classified<Self::ClassifyEos>;

    /// Classifies an error. `phase` is how far the layer that saw the error knows the request
    /// got; a classifier may lower it only with evidence from the error itself.
    fn classify_error(self, error: &E, phase: DeliveryPhase) -> Classification;
}

/// The result of [`Classify::classify_response`].
#[derive(Debug)]
pub enum Classified<Eos> {
    /// Classified from the response head.
    Ready(Classification),
    /// The answer is in the trailers: classify at the end of the stream.
    RequiresEos(Eos),
}

/// Classifies at the end of a response stream.
pub trait ClassifyEos: Sized {
    /// Classifies from the trailers (`None` when the stream ended without any).
    fn classify_eos(self, trailers: Option<&::http::HeaderMap>) -> Classification;

    /// Classifies a stream that broke before its end: the response had started, so the
    /// default is [`MaybeCommitted`](AttemptClass::MaybeCommitted).
    fn classify_body_error(self) -> Classification {
        Classification::failure_at(DeliveryPhase::ResponseStarted)
    }
}

/// A [`ClassifyEos`] for classifiers that always classify from the head.
#[derive(Debug, Clone, Copy)]
pub enum NeverEos {}

impl ClassifyEos for NeverEos {
    fn classify_eos(self, _: Option<&::http::HeaderMap>) -> Classification {
        match self {}
    }
}

impl<Eos: ClassifyEos> Classified<Eos> {
    /// Resolves the classification, classifying the end of stream with `trailers` if needed.
    ///
    /// ```
    /// use surely::classify::{AttemptClass, Classified, ClassifyEos, GrpcEos};
    ///
    /// let mut trailers = http::HeaderMap::new();
    /// trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
    /// let deferred: Classified<GrpcEos> = Classified::RequiresEos(GrpcEos::default());
    /// assert_eq!(deferred.resolve(Some(&trailers)).class(), AttemptClass::MaybeCommitted);
    /// ```
    pub fn resolve(self, trailers: Option<&::http::HeaderMap>) -> Classification {
        match self {
            Classified::Ready(c) => c,
            Classified::RequiresEos(eos) => eos.classify_eos(trailers),
        }
    }
}

impl<Eos> Classified<Eos> {
    /// The classification as far as the head tells: a deferred one (the status is in trailers
    /// the caller cannot see) reads as a success whose response started.
    ///
    /// ```
    /// use surely::classify::{AttemptClass, Classified, GrpcEos};
    /// let deferred: Classified<GrpcEos> = Classified::RequiresEos(GrpcEos::default());
    /// assert_eq!(deferred.at_head().class(), AttemptClass::Success);
    /// ```
    pub fn at_head(self) -> Classification {
        match self {
            Classified::Ready(c) => c,
            Classified::RequiresEos(_) => Classification::success(),
        }
    }
}

impl AttemptClass {
    /// The reason a call stopped after an attempt of this class, when nothing else stopped it.
    pub(crate) fn stop_reason(self, semantics: Semantics) -> StopReason {
        match self {
            AttemptClass::Success => StopReason::Success,
            AttemptClass::Final => StopReason::Final,
            AttemptClass::Conflict => StopReason::Conflict,
            AttemptClass::MaybeCommitted if !semantics.is_repeatable() => StopReason::Unknown,
            AttemptClass::Rejected | AttemptClass::MaybeCommitted => StopReason::NotRetried,
        }
    }
}
