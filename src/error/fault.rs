//! The fault module's errors.

use std::fmt;

use http::StatusCode;

use crate::classify::DeliveryPhase;

/// The error an [`InjectFault`](crate::fault::InjectFault) returns for an injected failure.
///
/// Its [`phase`](InjectedFault::phase) is what the classifiers read:
/// [`RefuseBeforeSend`](crate::fault::Fault::RefuseBeforeSend) fails
/// [`NotSent`](DeliveryPhase::NotSent) (classified
/// [`Rejected`](crate::classify::AttemptClass::Rejected): any request may be retried), and
/// [`ResetAfterSend`](crate::fault::Fault::ResetAfterSend) fails
/// [`Sent`](DeliveryPhase::Sent) after the inner service completed (classified
/// [`MaybeCommitted`](crate::classify::AttemptClass::MaybeCommitted): only a repeatable request
/// may be retried, and the call's outcome is otherwise unknown).
///
/// The same error stands in for a [`Respond`](crate::fault::Fault::Respond) or
/// [`RespondAfterSend`](crate::fault::Fault::RespondAfterSend) fault whose reply the service's response
/// type cannot carry (see [`NoResponse`](crate::fault::NoResponse)), with the phase of the fault it
/// replaced.
///
/// ```
/// use std::convert::Infallible;
/// use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
/// use surely::fault::{Fault, InjectFaultLayer};
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut svc = ServiceBuilder::new()
///     .layer(InjectFaultLayer::new(|_: &http::Request<()>| Some(Fault::ResetAfterSend)))
///     .service_fn(|_req| async { Ok::<_, Infallible>(http::Response::new(String::new())) });
///
/// let req = http::Request::post("/orders").body(()).unwrap();
/// let err = svc.ready().await.unwrap().call(req).await.unwrap_err();
/// let fault = err.injected().expect("an injected fault");
/// assert_eq!(fault.phase(), DeliveryPhase::Sent);
/// assert_eq!(
///     fault.to_string(),
///     "injected fault: connection reset after the request was processed"
/// );
/// assert_eq!(err.classify_error(DeliveryPhase::Sent).class(), AttemptClass::MaybeCommitted);
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
// Word-aligned: as a variant of every `surely::Error`, copied with every poll's output, a
// payload that starts at a word boundary is copied in whole words.
#[repr(align(8))]
pub struct InjectedFault {
    kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Refused,
    Reset,
    /// A `Respond` fault whose reply the response type cannot carry.
    NoResponse {
        status: StatusCode,
        phase: DeliveryPhase,
    },
}

impl InjectedFault {
    pub(crate) fn refused() -> Self {
        InjectedFault {
            kind: Kind::Refused,
        }
    }

    pub(crate) fn reset() -> Self {
        InjectedFault { kind: Kind::Reset }
    }

    pub(crate) fn no_response(status: StatusCode, phase: DeliveryPhase) -> Self {
        InjectedFault {
            kind: Kind::NoResponse { status, phase },
        }
    }

    /// How far the request got: [`NotSent`](DeliveryPhase::NotSent) when the inner service was
    /// never called, [`Sent`](DeliveryPhase::Sent) when it ran to completion and its answer was
    /// thrown away.
    pub fn phase(&self) -> DeliveryPhase {
        match self.kind {
            Kind::Refused => DeliveryPhase::NotSent,
            Kind::Reset => DeliveryPhase::Sent,
            Kind::NoResponse { phase, .. } => phase,
        }
    }
}

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Refused => f.write_str("injected fault: connection refused before send"),
            Kind::Reset => {
                f.write_str("injected fault: connection reset after the request was processed")
            }
            Kind::NoResponse { status, phase } => write!(
                f,
                "injected fault: the response type cannot carry the injected {status} reply \
                 ({})",
                match phase {
                    DeliveryPhase::NotSent => "refused before send",
                    _ => "reset after the request was processed",
                }
            ),
        }
    }
}

impl std::error::Error for InjectedFault {}
