//! A user classifier from a closure, and a `MakeClassifier` from a closure.

use std::io::{self, ErrorKind};

use surely::classify::{
    self, AttemptClass, Attempted, Classification, Classified, Classify, ClassifyError,
    DeliveryPhase, HttpRequestClassifier, MakeClassifier,
};
use surely::{Envelope, Semantics};

use super::support::{self, SEMANTICS};

/// A non-HTTP service's request and reply.
struct Transfer {
    semantics: Semantics,
}

impl Envelope for Transfer {
    fn semantics(&self) -> Semantics {
        self.semantics
    }
}

#[derive(Debug)]
enum Reply {
    Done,
    InsufficientFunds,
    Busy,
    Stale,
}

/// A ledger's statuses, and the crate's `io` rules for errors.
fn ledger(attempt: Attempted<'_, Reply, io::Error>, _: Semantics) -> Classification {
    let at_head = |class| Classification::new(class, DeliveryPhase::ResponseStarted);
    match attempt {
        Attempted::Response(Reply::Done) => Classification::success(),
        Attempted::Response(Reply::InsufficientFunds) => at_head(AttemptClass::Final),
        Attempted::Response(Reply::Busy) => at_head(AttemptClass::Rejected),
        Attempted::Response(Reply::Stale) => at_head(AttemptClass::Conflict),
        Attempted::Error(e, phase) => e.classify_error(phase),
    }
}

#[test]
fn closure_classifies_responses_and_errors() {
    let make = classify::from_fn(ledger);
    for semantics in SEMANTICS {
        let req = Transfer { semantics };
        for (reply, class) in [
            (Reply::Done, AttemptClass::Success),
            (Reply::InsufficientFunds, AttemptClass::Final),
            (Reply::Busy, AttemptClass::Rejected),
            (Reply::Stale, AttemptClass::Conflict),
        ] {
            let Classified::Ready(c) =
                Classify::<Reply, io::Error>::classify_response(make.make_classifier(&req), &reply);
            assert_eq!(c.class(), class, "{reply:?}");
        }
        let c = Classify::<Reply, io::Error>::classify_error(
            make.make_classifier(&req),
            &ErrorKind::TimedOut.into(),
            DeliveryPhase::Sent,
        );
        assert_eq!(c.class(), AttemptClass::MaybeCommitted);
        assert_eq!(
            c.is_retryable(semantics),
            semantics != Semantics::NonIdempotent
        );
        let c = Classify::<Reply, io::Error>::classify_error(
            make.make_classifier(&req),
            &ErrorKind::ConnectionRefused.into(),
            DeliveryPhase::Sent,
        );
        assert_eq!(c.class(), AttemptClass::Rejected);
    }
}

#[test]
fn closure_sees_the_request_semantics() {
    // A service whose "busy" means "rejected" only for requests it could not have started:
    // this closure just reports what it was given.
    let make = classify::from_fn(|_: Attempted<'_, (), io::Error>, semantics: Semantics| {
        let class = match semantics {
            Semantics::Safe => AttemptClass::Success,
            Semantics::Idempotent => AttemptClass::Final,
            Semantics::Keyed => AttemptClass::Rejected,
            Semantics::NonIdempotent => AttemptClass::MaybeCommitted,
        };
        Classification::new(class, DeliveryPhase::ResponseStarted)
    });
    let expected = [
        AttemptClass::Success,
        AttemptClass::Final,
        AttemptClass::Rejected,
        AttemptClass::MaybeCommitted,
    ];
    for (semantics, class) in SEMANTICS.into_iter().zip(expected) {
        // From an `http::Request`, the semantics come from the method and headers ...
        let req = support::http_request(semantics);
        let c = Classify::<(), io::Error>::classify_response(make.make_classifier(&req), &())
            .resolve(None);
        assert_eq!(c.class(), class, "{semantics:?}");
        // ... and from a custom request, from its `Envelope` impl.
        let c = Classify::<(), io::Error>::classify_response(
            make.make_classifier(&Transfer { semantics }),
            &(),
        )
        .at_head();
        assert_eq!(c.class(), class, "{semantics:?}");
    }
    // The per-request classifier shows its semantics, not the closure.
    let debug = format!(
        "{:?}",
        make.make_classifier(&Transfer {
            semantics: Semantics::Keyed
        })
    );
    assert!(debug.contains("Keyed"), "{debug}");
    assert!(format!("{make:?}").starts_with("ClassifyFn"));
}

#[test]
fn a_plain_closure_is_a_make_classifier() {
    // Treat every request as keyed: a service that always sends a key the transport adds.
    let make = |_: &http::Request<()>| HttpRequestClassifier::new(Semantics::Keyed, false);
    let req = support::http_request(Semantics::NonIdempotent);
    let c = Classify::<http::Response<()>, io::Error>::classify_response(
        make.make_classifier(&req),
        &support::response(409, &[("retry-after", "1")]),
    )
    .resolve(None);
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert!(c.is_retryable(Semantics::NonIdempotent));
}

#[test]
fn request_classifier_by_hand() {
    let headers = support::headers(&[("idempotency-key-in-flight", "1")]);
    let keyed = HttpRequestClassifier::new(Semantics::Keyed, false);
    let plain = HttpRequestClassifier::new(Semantics::Idempotent, false);
    let conflict = http::StatusCode::CONFLICT;
    assert_eq!(
        keyed.classify_status(conflict, &headers).class(),
        AttemptClass::Rejected
    );
    assert_eq!(
        plain.classify_status(conflict, &headers).class(),
        AttemptClass::Conflict
    );
    // A gRPC classifier made by hand classifies by grpc-status.
    let grpc = HttpRequestClassifier::new(Semantics::Idempotent, true);
    let res = support::response(200, &[("grpc-status", "10")]);
    let c = Classify::<http::Response<()>, io::Error>::classify_response(grpc, &res).resolve(None);
    assert_eq!(c.class(), AttemptClass::Conflict);
}
