//! What a request is: the property that decides whether a lost reply may be retried.

use http::Method;

/// The retry semantics of a request, from most to least retry-friendly.
///
/// The semantics, together with the attempt's [`AttemptClass`], decide whether an attempt may be
/// retried ([`AttemptClass::is_retryable`]) and what a call's [`Outcome`] is.
///
/// For an [`http::Request`] they are derived by [`Envelope::semantics`]: a `Semantics` value in the
/// request's extensions wins; otherwise the method decides (RFC 9110 §9.2), and a non-idempotent
/// method with an `Idempotency-Key` header is [`Keyed`](Semantics::Keyed).
///
/// ```
/// use surely::{Envelope, Semantics};
///
/// let get = http::Request::get("/orders/o-1").body(()).unwrap();
/// assert_eq!(get.semantics(), Semantics::Safe);
///
/// let post = http::Request::post("/orders")
///     .header("idempotency-key", "order-o-1")
///     .body(())
///     .unwrap();
/// assert_eq!(post.semantics(), Semantics::Keyed);
///
/// // An override: this POST is a search, it has no side effects.
/// let mut search = http::Request::post("/search").body(()).unwrap();
/// search.extensions_mut().insert(Semantics::Safe);
/// assert_eq!(search.semantics(), Semantics::Safe);
/// ```
///
/// [`AttemptClass`]: crate::classify::AttemptClass
/// [`AttemptClass::is_retryable`]: crate::classify::AttemptClass::is_retryable
/// [`Outcome`]: crate::Outcome
/// [`Envelope::semantics`]: crate::Envelope::semantics
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// No side effects (GET, HEAD, OPTIONS, TRACE): may be retried and hedged.
    Safe,
    /// Repeating it has the same effect as doing it once (PUT, DELETE): may be retried.
    Idempotent,
    /// Not idempotent by itself, but carries an idempotency key the server honours: may be retried
    /// with the same key.
    Keyed,
    /// Not idempotent and without a key (POST, PATCH): only attempts that were provably not
    /// processed are retried.
    NonIdempotent,
}

impl Semantics {
    /// The semantics RFC 9110 gives a method, without looking at any header.
    ///
    /// ```
    /// use surely::Semantics;
    /// assert_eq!(Semantics::from_method(&http::Method::PUT), Semantics::Idempotent);
    /// assert_eq!(Semantics::from_method(&http::Method::PATCH), Semantics::NonIdempotent);
    /// ```
    pub fn from_method(method: &Method) -> Self {
        match *method {
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE => Semantics::Safe,
            Method::PUT | Method::DELETE => Semantics::Idempotent,
            _ => Semantics::NonIdempotent,
        }
    }

    /// Whether repeating the request can never create a second side effect: true for
    /// everything but [`NonIdempotent`](Semantics::NonIdempotent).
    ///
    /// ```
    /// use surely::Semantics;
    /// assert!(Semantics::Keyed.is_repeatable());
    /// assert!(!Semantics::NonIdempotent.is_repeatable());
    /// ```
    pub fn is_repeatable(self) -> bool {
        !matches!(self, Semantics::NonIdempotent)
    }

    /// Whether the request has no side effects at all, so that a lost reply loses nothing.
    ///
    /// ```
    /// use surely::Semantics;
    /// assert!(Semantics::Safe.is_safe());
    /// assert!(!Semantics::Idempotent.is_safe());
    /// ```
    pub fn is_safe(self) -> bool {
        matches!(self, Semantics::Safe)
    }
}
