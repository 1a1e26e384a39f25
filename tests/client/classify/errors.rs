//! Error classification: `std::io` kinds, boxed errors and their `source()` chains, and
//! surely's own errors.

use std::fmt;
use std::io::{self, ErrorKind};

use surely::classify::AttemptClass::{self, Final, MaybeCommitted, Rejected};
use surely::classify::DeliveryPhase::{self, NotSent, ResponseStarted, Sent};
use surely::classify::{BoxError, Classification, ClassifyError};
use surely::deadline::DeadlineExceeded;
use surely::timeout::Elapsed;
use surely::{IntoError, Semantics};

use super::support::{self, IoError, SEMANTICS};

const PHASES: [DeliveryPhase; 3] = [NotSent, Sent, ResponseStarted];

/// The kind, and its class and phase when a layer passes `NotSent`, `Sent`, `ResponseStarted`.
#[rustfmt::skip]
const IO_KINDS: &[(ErrorKind, [(AttemptClass, DeliveryPhase); 3])] = &[
    // evidence that nothing was sent, wherever the layer thought the request was
    (ErrorKind::ConnectionRefused, [(Rejected, NotSent), (Rejected, NotSent), (Rejected, NotSent)]),
    (ErrorKind::AddrNotAvailable,  [(Rejected, NotSent), (Rejected, NotSent), (Rejected, NotSent)]),
    (ErrorKind::AddrInUse,         [(Rejected, NotSent), (Rejected, NotSent), (Rejected, NotSent)]),
    // the request could not be made: final
    (ErrorKind::InvalidInput,      [(Final, NotSent), (Final, NotSent), (Final, NotSent)]),
    (ErrorKind::PermissionDenied,  [(Final, NotSent), (Final, NotSent), (Final, NotSent)]),
    (ErrorKind::Unsupported,       [(Final, NotSent), (Final, NotSent), (Final, NotSent)]),
    // no evidence: by phase
    (ErrorKind::TimedOut,          [(Rejected, NotSent), (MaybeCommitted, Sent), (MaybeCommitted, ResponseStarted)]),
    (ErrorKind::ConnectionReset,   [(Rejected, NotSent), (MaybeCommitted, Sent), (MaybeCommitted, ResponseStarted)]),
    (ErrorKind::ConnectionAborted, [(Rejected, NotSent), (MaybeCommitted, Sent), (MaybeCommitted, ResponseStarted)]),
    (ErrorKind::BrokenPipe,        [(Rejected, NotSent), (MaybeCommitted, Sent), (MaybeCommitted, ResponseStarted)]),
    (ErrorKind::UnexpectedEof,     [(Rejected, NotSent), (MaybeCommitted, Sent), (MaybeCommitted, ResponseStarted)]),
    (ErrorKind::Interrupted,       [(Rejected, NotSent), (MaybeCommitted, Sent), (MaybeCommitted, ResponseStarted)]),
    (ErrorKind::Other,             [(Rejected, NotSent), (MaybeCommitted, Sent), (MaybeCommitted, ResponseStarted)]),
];

fn class_phase(c: Classification) -> (AttemptClass, DeliveryPhase) {
    (c.class(), c.phase())
}

#[test]
fn io_kinds() {
    for &(kind, expected) in IO_KINDS {
        for (phase, expected) in PHASES.into_iter().zip(expected) {
            let err = io::Error::from(kind);
            assert_eq!(
                class_phase(err.classify_error(phase)),
                expected,
                "{kind:?} at {phase:?}"
            );
            // The same through every wrapper a layer might hand the classifier.
            let custom = io::Error::new(kind, "with a message");
            assert_eq!(
                class_phase(custom.classify_error(phase)),
                expected,
                "{kind:?}"
            );
            let surely = IoError::transport(io::Error::from(kind));
            assert_eq!(
                class_phase(surely.classify_error(phase)),
                expected,
                "{kind:?}"
            );
            let boxed: BoxError = Box::new(io::Error::from(kind));
            assert_eq!(
                class_phase(boxed.classify_error(phase)),
                expected,
                "{kind:?}"
            );
            assert_eq!(
                class_phase(io::Error::from(kind).into_error().classify_error(phase)),
                expected
            );
            // And through the HTTP classifier, for every request.
            for semantics in SEMANTICS {
                let req = support::http_request(semantics);
                let c = support::classify_error(&req, &IoError::transport(kind.into()), phase);
                assert_eq!(class_phase(c), expected, "{kind:?} {semantics:?}");
            }
        }
    }
}

#[test]
fn final_io_errors_are_never_retried_and_fail_the_call() {
    for kind in [ErrorKind::InvalidInput, ErrorKind::PermissionDenied] {
        let c = io::Error::from(kind).classify_error(Sent);
        for semantics in SEMANTICS {
            assert!(!c.is_retryable(semantics));
            assert_eq!(
                support::outcome_of(semantics, &[c.class()]),
                Some(surely::Outcome::Failed)
            );
        }
    }
}

/// A transport error that keeps an `io::Error` as its `source()`, like most client errors.
#[derive(Debug)]
struct Wrapper {
    what: &'static str,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl Wrapper {
    fn new(what: &'static str, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Wrapper {
            what,
            source: Box::new(source),
        }
    }
}

impl fmt::Display for Wrapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)
    }
}

impl std::error::Error for Wrapper {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// An error that says nothing and has no source.
#[derive(Debug)]
struct Opaque;

impl fmt::Display for Opaque {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("opaque")
    }
}

impl std::error::Error for Opaque {}

#[test]
fn boxed_io_error_is_found() {
    let boxed: BoxError = Box::new(io::Error::from(ErrorKind::ConnectionRefused));
    assert_eq!(class_phase(boxed.classify_error(Sent)), (Rejected, NotSent));
    let boxed: BoxError = Box::new(io::Error::from(ErrorKind::ConnectionReset));
    assert_eq!(
        class_phase(boxed.classify_error(Sent)),
        (MaybeCommitted, Sent)
    );
    // `BoxError::from` a string is what `tower::BoxError` users often make: no evidence.
    let boxed: BoxError = "something broke".into();
    assert_eq!(
        class_phase(boxed.classify_error(NotSent)),
        (Rejected, NotSent)
    );
    assert_eq!(
        class_phase(boxed.classify_error(Sent)),
        (MaybeCommitted, Sent)
    );
}

#[test]
fn io_error_along_the_source_chain_is_found() {
    let one: BoxError = Box::new(Wrapper::new(
        "connect",
        io::Error::from(ErrorKind::ConnectionRefused),
    ));
    assert_eq!(class_phase(one.classify_error(Sent)), (Rejected, NotSent));

    let two: BoxError = Box::new(Wrapper::new(
        "client",
        Wrapper::new("connect", io::Error::from(ErrorKind::AddrNotAvailable)),
    ));
    assert_eq!(
        class_phase(two.classify_error(ResponseStarted)),
        (Rejected, NotSent)
    );

    let invalid: BoxError = Box::new(Wrapper::new(
        "request",
        io::Error::from(ErrorKind::InvalidInput),
    ));
    assert_eq!(class_phase(invalid.classify_error(Sent)), (Final, NotSent));

    let reset: BoxError = Box::new(Wrapper::new(
        "read",
        io::Error::from(ErrorKind::ConnectionReset),
    ));
    assert_eq!(
        class_phase(reset.classify_error(Sent)),
        (MaybeCommitted, Sent)
    );

    // Nothing known along the chain: by phase.
    let opaque: BoxError = Box::new(Wrapper::new("client", Opaque));
    assert_eq!(
        class_phase(opaque.classify_error(Sent)),
        (MaybeCommitted, Sent)
    );
    assert_eq!(
        class_phase(opaque.classify_error(NotSent)),
        (Rejected, NotSent)
    );

    // The same boxed error as a surely transport error, through the HTTP classifier.
    let err: surely::Error<BoxError> = surely::Error::transport(Box::new(Wrapper::new(
        "connect",
        io::Error::from(ErrorKind::ConnectionRefused),
    )));
    let req = support::http_request(Semantics::NonIdempotent);
    let c = support::classify_error(&req, &err, Sent);
    assert_eq!(class_phase(c), (Rejected, NotSent));
    assert!(c.is_retryable(Semantics::NonIdempotent));
}

#[test]
fn surely_errors_boxed_are_found() {
    let cases: [(BoxError, (AttemptClass, DeliveryPhase)); 5] = [
        (Box::new(Elapsed::new(NotSent, false)), (Rejected, NotSent)),
        (Box::new(Elapsed::new(Sent, true)), (MaybeCommitted, Sent)),
        (Box::new(DeadlineExceeded::refused()), (Rejected, NotSent)),
        (
            Box::new(DeadlineExceeded::in_flight()),
            (MaybeCommitted, Sent),
        ),
        (
            Box::new(Wrapper::new("layer", Elapsed::new(NotSent, false))),
            (Rejected, NotSent),
        ),
    ];
    for (err, expected) in cases {
        // The layer passes `Sent`; the error's own phase wins.
        assert_eq!(class_phase(err.classify_error(Sent)), expected, "{err}");
    }
}

/// tower's `Buffer`, `BoxService` and friends box their inner service's error. Boxing a
/// surely error must keep its evidence: a timeout that fired before send, a deadline refusal,
/// a refused connection. `surely::Error<E>` is transparent (its `source()` is the transport
/// error's own `source()`, and none for local errors), and the chain walk in
/// `src/classify/error.rs` (`classify_known`) cannot downcast the generic `Error<E>`, so the
/// evidence is lost and the layer's `Sent` wins: all three read as maybe committed.
#[test]
fn boxed_surely_error_keeps_its_phase() {
    let boxed: BoxError = Box::new(IoError::transport(ErrorKind::ConnectionRefused.into()));
    assert_eq!(class_phase(boxed.classify_error(Sent)), (Rejected, NotSent));
    let boxed: BoxError = Box::new(IoError::from(Elapsed::new(NotSent, false)));
    assert_eq!(class_phase(boxed.classify_error(Sent)), (Rejected, NotSent));
    let boxed: BoxError = Box::new(IoError::from(DeadlineExceeded::refused()));
    assert_eq!(class_phase(boxed.classify_error(Sent)), (Rejected, NotSent));
}

#[test]
fn surely_local_errors() {
    let cases: [(IoError, (AttemptClass, DeliveryPhase)); 6] = [
        (Elapsed::new(NotSent, false).into(), (Rejected, NotSent)),
        (Elapsed::new(Sent, false).into(), (MaybeCommitted, Sent)),
        (
            Elapsed::new(ResponseStarted, true).into(),
            (MaybeCommitted, ResponseStarted),
        ),
        (DeadlineExceeded::refused().into(), (Rejected, NotSent)),
        (DeadlineExceeded::in_flight().into(), (MaybeCommitted, Sent)),
        (
            IoError::transport(ErrorKind::TimedOut.into()),
            (MaybeCommitted, Sent),
        ),
    ];
    for (err, expected) in cases {
        for phase in PHASES {
            let c = err.classify_error(phase);
            if err.is_transport() {
                assert_eq!(err.local_phase(), None);
                continue;
            }
            // A local error knows its phase; what the layer passes does not matter.
            assert_eq!(class_phase(c), expected, "{err:?} at {phase:?}");
            assert_eq!(err.local_phase(), Some(expected.1), "{err:?}");
        }
        assert_eq!(class_phase(err.classify_error(Sent)), expected, "{err:?}");
    }

    let refused: IoError = DeadlineExceeded::refused().into();
    assert!(refused.is_deadline_exceeded());
    assert!(refused.deadline_exceeded().unwrap().is_refused());
    assert!(!refused.is_elapsed() && !refused.is_transport());

    let elapsed: IoError = Elapsed::new(Sent, true).into();
    assert!(elapsed.is_elapsed());
    assert!(elapsed.elapsed().unwrap().is_deadline());
    assert!(elapsed.transport_ref().is_none());
    // Mapping the transport keeps the local error and its classification.
    let mapped = elapsed.map_transport(|e: io::Error| Box::new(e) as BoxError);
    assert_eq!(
        class_phase(mapped.classify_error(NotSent)),
        (MaybeCommitted, Sent)
    );
}

#[test]
fn an_unbuildable_request_is_final_and_not_sent() {
    let err = http::Request::builder()
        .header("bad header name", "x")
        .body(())
        .unwrap_err();
    assert_eq!(class_phase(err.classify_error(Sent)), (Final, NotSent));
    let err: surely::Error<http::Error> = err.into_error();
    assert_eq!(class_phase(err.classify_error(Sent)), (Final, NotSent));
}
