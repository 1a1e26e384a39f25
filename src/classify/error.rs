use std::io;

use super::{Classification, DeliveryPhase};

/// The boxed error that tower's layers use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How the built-in classifiers read an error.
///
/// `phase` is how far the layer that saw the error knows the request got; an implementation
/// lowers it to [`NotSent`](DeliveryPhase::NotSent) only with evidence (a refused connection),
/// never by default: a timeout or a reset after the request may have been written is
/// [`MaybeCommitted`](super::AttemptClass::MaybeCommitted).
///
/// Implemented for the crate's [`Error`](crate::Error), `std::io::Error` (by kind), [`BoxError`]
/// (it looks for a known error along the `source()` chain), `std::convert::Infallible`,
/// `http::Error` (the request could not be built: final, not sent), with the `hyper` feature
/// `hyper::Error` and hyper-util's client error, and with the `tonic` feature
/// `tonic::transport::Error` (a failed connection is "not sent").
///
/// `std::io::Error` kinds:
///
/// | kind | class |
/// | --- | --- |
/// | `ConnectionRefused`, `AddrNotAvailable`, `AddrInUse` | rejected, not sent |
/// | `InvalidInput`, `PermissionDenied`, `Unsupported` | final, not sent |
/// | anything else (`TimedOut`, `ConnectionReset`, `BrokenPipe`, `NotConnected`, ...) | by phase: rejected if not sent, else maybe committed |
///
/// An `io::Error` that wraps another error (`io::Error::other(e)`) is classified by the wrapped
/// error when the crate knows it, and by its kind otherwise.
///
/// ```
/// use std::io::{Error, ErrorKind};
/// use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
///
/// let reset = Error::from(ErrorKind::ConnectionReset);
/// assert_eq!(reset.classify_error(DeliveryPhase::Sent).class(), AttemptClass::MaybeCommitted);
/// let refused = Error::from(ErrorKind::ConnectionRefused);
/// assert_eq!(refused.classify_error(DeliveryPhase::Sent).class(), AttemptClass::Rejected);
/// ```
pub trait ClassifyError {
    /// Classifies this error for an attempt that reached `phase`.
    fn classify_error(&self, phase: DeliveryPhase) -> Classification;
}

impl ClassifyError for io::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        classify_io_kind(self.kind(), phase)
    }
}

fn classify_io_kind(kind: io::ErrorKind, phase: DeliveryPhase) -> Classification {
    use io::ErrorKind::*;
    match kind {
        ConnectionRefused | AddrNotAvailable | AddrInUse => {
            Classification::failure_at(DeliveryPhase::NotSent)
        }
        InvalidInput | PermissionDenied | Unsupported => {
            Classification::new(super::AttemptClass::Final, DeliveryPhase::NotSent)
        }
        _ => Classification::failure_at(phase),
    }
}

impl ClassifyError for std::convert::Infallible {
    fn classify_error(&self, _: DeliveryPhase) -> Classification {
        match *self {}
    }
}

impl ClassifyError for http::Error {
    fn classify_error(&self, _: DeliveryPhase) -> Classification {
        Classification::new(super::AttemptClass::Final, DeliveryPhase::NotSent)
    }
}

impl ClassifyError for BoxError {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        classify_dyn(&**self, phase)
    }
}

/// Walks the `source()` chain for an error the crate knows.
pub(crate) fn classify_dyn(
    error: &(dyn std::error::Error + 'static),
    phase: DeliveryPhase,
) -> Classification {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(c) = classify_known(e, phase) {
            return c;
        }
        next = e.source();
    }
    Classification::failure_at(phase)
}

fn classify_known(
    e: &(dyn std::error::Error + 'static),
    phase: DeliveryPhase,
) -> Option<Classification> {
    if let Some(e) = e.downcast_ref::<io::Error>() {
        // `io::Error::source` skips the error it wraps; look at it first.
        let wrapped = e.get_ref().and_then(|inner| classify_known(inner, phase));
        return Some(wrapped.unwrap_or_else(|| e.classify_error(phase)));
    }
    if let Some(c) = classify_surely_error(e, phase) {
        return Some(c);
    }
    if let Some(e) = e.downcast_ref::<crate::deadline::error::DeadlineExceeded>() {
        return Some(Classification::failure_at(e.phase()));
    }
    if let Some(e) = e.downcast_ref::<crate::timeout::error::Elapsed>() {
        return Some(Classification::failure_at(e.phase()));
    }
    if let Some(e) = e.downcast_ref::<crate::fault::InjectedFault>() {
        return Some(Classification::failure_at(e.phase()));
    }
    if let Some(e) = e.downcast_ref::<crate::breaker::CircuitOpen>() {
        return Some(e.classification());
    }
    if e.is::<crate::idempotency::error::InvalidKey>() {
        return Some(Classification::new(
            super::AttemptClass::Final,
            DeliveryPhase::NotSent,
        ));
    }
    #[cfg(feature = "tonic")]
    {
        if e.is::<tonic::ConnectError>() {
            return Some(Classification::failure_at(DeliveryPhase::NotSent));
        }
        if let Some(e) = e.downcast_ref::<tonic::transport::Error>() {
            return Some(e.classify_error(phase));
        }
    }
    #[cfg(feature = "http2")]
    {
        // RFC 9113 §8.7: a stream reset with REFUSED_STREAM was not processed, and "can be
        // safely retried"; any other HTTP/2 error says nothing about the work.
        if let Some(e) = e.downcast_ref::<h2::Error>() {
            if e.reason() == Some(h2::Reason::REFUSED_STREAM) {
                return Some(Classification::new(
                    super::AttemptClass::Rejected,
                    DeliveryPhase::Sent,
                ));
            }
        }
    }
    #[cfg(feature = "reqwest")]
    if let Some(e) = e.downcast_ref::<::reqwest::Error>() {
        return Some(e.classify_error(phase));
    }
    #[cfg(feature = "hyper")]
    {
        if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            return Some(e.classify_error(phase));
        }
        if let Some(e) = e.downcast_ref::<hyper::Error>() {
            return Some(e.classify_error(phase));
        }
    }
    None
}

/// A boxed [`crate::Error`] of one of the known transports: its local errors carry the phase.
fn classify_surely_error(
    e: &(dyn std::error::Error + 'static),
    phase: DeliveryPhase,
) -> Option<Classification> {
    macro_rules! try_transports {
        ($($(#[$m:meta])* $t:ty),* $(,)?) => {$(
            $(#[$m])*
            if let Some(e) = e.downcast_ref::<crate::Error<$t>>() {
                return Some(e.classify_error(phase));
            }
        )*};
    }
    try_transports!(
        io::Error,
        crate::error::BoxedError,
        http::Error,
        #[cfg(feature = "hyper")]
        hyper::Error,
        #[cfg(feature = "hyper")]
        hyper_util::client::legacy::Error,
        #[cfg(feature = "tonic")]
        tonic::transport::Error,
        #[cfg(feature = "reqwest")]
        ::reqwest::Error,
    );
    None
}

/// hyper-util's client error: `is_connect()` is evidence that nothing was sent.
#[cfg(feature = "hyper")]
impl ClassifyError for hyper_util::client::legacy::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        if self.is_connect() {
            return Classification::failure_at(DeliveryPhase::NotSent);
        }
        match std::error::Error::source(self) {
            Some(source) => classify_dyn(source, phase),
            None => Classification::failure_at(phase),
        }
    }
}

/// tonic's transport error (a `Channel`'s): classified by what it wraps. A failed connection
/// (tonic's `ConnectError`, anywhere along the `source()` chain) is evidence that nothing was
/// sent, whatever the cause (refused, unreachable, timed out while connecting); an error of hyper
/// or of I/O inside is classified as such; anything else by phase.
#[cfg(feature = "tonic")]
impl ClassifyError for tonic::transport::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        match std::error::Error::source(self) {
            Some(source) => classify_dyn(source, phase),
            None => Classification::failure_at(phase),
        }
    }
}

/// hyper's error: a request hyper reports as canceled was never written (the connection closed
/// first); an I/O error inside is classified by kind; anything else by phase.
#[cfg(feature = "hyper")]
impl ClassifyError for hyper::Error {
    fn classify_error(&self, phase: DeliveryPhase) -> Classification {
        if self.is_canceled() {
            return Classification::failure_at(DeliveryPhase::NotSent);
        }
        match std::error::Error::source(self) {
            Some(source) => classify_dyn(source, phase),
            None => Classification::failure_at(phase),
        }
    }
}
