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
/// `tonic::transport::Error` (a failed connection is "not sent"), and for every
/// [`TransportError`](crate::TransportError): an error type of your own implements that trait,
/// which gives this one.
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
#[diagnostic::on_unimplemented(
    message = "surely cannot classify the error `{Self}`: it does not implement `ClassifyError`",
    label = "not a `ClassifyError`",
    note = "for an error type of your own, `impl surely::TransportError for {Self} {{}}` makes it \
            one (override `classify` to say which failures prove the request was not sent); \
            or turn it into a `std::io::Error`, or give the client a classifier of your own \
            with `surely::classify::from_fn`"
)]
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
    let class = match kind {
        ConnectionRefused | AddrNotAvailable | AddrInUse => {
            Classification::failure_at(DeliveryPhase::NotSent)
        }
        InvalidInput | PermissionDenied | Unsupported => {
            Classification::new(super::AttemptClass::Final, DeliveryPhase::NotSent)
        }
        _ => Classification::failure_at(phase),
    };
    class.with_cause(super::Cause::of_io_kind(kind))
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
