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

/// How much a request matters when a server must refuse some: under overload the least critical
/// is refused first.
///
/// The levels are those of Google's SRE practice, from most to least critical. A server's
/// [adaptive limit][crate::server::limit] lets each level fill a share of its concurrency
/// limit (by default 110 %, 100 %, 90 % and 80 %), so that as the limit nears, sheddable work
/// is refused while critical work still gets in.
///
/// A request carries its criticality in a `Criticality` extension (set by the host, which it
/// trusts) or in the [`CRITICALITY`](crate::headers::CRITICALITY) header. A value that does not
/// parse is an [`InvalidCriticality`] error; the server layers treat it as absent.
///
/// ```
/// use surely::Criticality;
///
/// assert_eq!("sheddable".parse::<Criticality>(), Ok(Criticality::Sheddable));
/// assert_eq!(Criticality::default(), Criticality::Critical);
/// assert!(Criticality::CriticalPlus > Criticality::Sheddable);
/// assert!("urgent!".parse::<Criticality>().is_err());
/// ```
#[cfg_attr(not(feature = "server"), doc = crate::docs::links::to_features!("crate::server::limit"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Criticality {
    /// May be refused first: prefetches, batch work, anything a user does not wait for.
    Sheddable,
    /// Refused after [`Sheddable`](Criticality::Sheddable): work a user would miss, but
    /// retried later without harm.
    SheddablePlus,
    /// The default: what serves a user now.
    #[default]
    Critical,
    /// Refused last: the requests the service exists for (checkout, payments), health checks
    /// the orchestrator acts on.
    CriticalPlus,
}

impl Criticality {
    /// Every level, least critical first.
    pub const ALL: [Criticality; 4] = [
        Criticality::Sheddable,
        Criticality::SheddablePlus,
        Criticality::Critical,
        Criticality::CriticalPlus,
    ];

    /// The wire name: `sheddable`, `sheddable-plus`, `critical`, `critical-plus`.
    pub fn as_str(self) -> &'static str {
        match self {
            Criticality::Sheddable => "sheddable",
            Criticality::SheddablePlus => "sheddable-plus",
            Criticality::Critical => "critical",
            Criticality::CriticalPlus => "critical-plus",
        }
    }

    /// Reads a wire name, ignoring ASCII case, with `_` accepted for `-` (gRPC's enum style,
    /// `CRITICAL_PLUS`).
    pub fn from_bytes(value: &[u8]) -> Result<Criticality, InvalidCriticality> {
        Criticality::ALL
            .into_iter()
            .find(|c| {
                let name = c.as_str().as_bytes();
                name.len() == value.len()
                    && name.iter().zip(value).all(|(&n, &v)| {
                        let v = v.to_ascii_lowercase();
                        v == n || (n == b'-' && v == b'_')
                    })
            })
            .ok_or(InvalidCriticality(()))
    }

    /// The position, least critical first: 0 to 3.
    #[cfg(feature = "server")]
    pub(crate) fn rank(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Criticality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Criticality {
    type Err = InvalidCriticality;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Criticality::from_bytes(s.as_bytes())
    }
}

/// A criticality that is none of `sheddable`, `sheddable-plus`, `critical`, `critical-plus`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid criticality: expected sheddable, sheddable-plus, critical or critical-plus")]
pub struct InvalidCriticality(());
