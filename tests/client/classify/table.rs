//! The attempt table (`surely::docs::outcomes`), row by row, for the four request semantics.
//!
//! Each row is one thing that can come back (a response, a gRPC status, an error), the class
//! and delivery phase it must get, then for each semantics (columns: Safe = GET, Idempotent =
//! PUT, Keyed = POST with `Idempotency-Key`, NonIdempotent = POST without) whether the attempt
//! may be retried and what a call with only that attempt ends as.

use std::io::ErrorKind;

use surely::classify::AttemptClass::{self, Conflict, Final, MaybeCommitted, Rejected, Success};
use surely::classify::DeliveryPhase::{self, NotSent, ResponseStarted, Sent};
use surely::classify::{Classification, Classified, ClassifyEos};
use surely::deadline::DeadlineExceeded;
use surely::headers::KEY_IN_FLIGHT;
use surely::timeout::Elapsed;
use surely::Outcome::{self, Failed, Succeeded, Unknown};
use surely::Semantics;

use super::support::{self, IoError, SEMANTICS};

const Y: bool = true;
const N: bool = false;
const S: Outcome = Succeeded;
const F: Outcome = Failed;
const U: Outcome = Unknown;

type Headers = &'static [(&'static str, &'static str)];

/// What came back.
#[derive(Clone, Copy, Debug)]
enum Input {
    /// A plain HTTP response: status and headers.
    Http(u16, Headers),
    /// A gRPC response classified from its head: HTTP status and headers (a trailers-only
    /// response when they hold `grpc-status`).
    GrpcHead(u16, Headers),
    /// A gRPC response whose head (200, no `grpc-status`) defers to these trailers.
    GrpcTrailers(Headers),
    /// A gRPC response whose stream ended without trailers.
    GrpcNoTrailers,
    /// A transport `io::Error` of this kind, seen by a layer that believes the request
    /// reached this phase.
    Io(ErrorKind, DeliveryPhase),
    /// surely's attempt timeout, fired at this phase.
    Timeout(DeliveryPhase),
    /// The call's deadline refused the attempt before sending.
    DeadlineRefused,
    /// The call's deadline ended the attempt in flight.
    DeadlineInFlight,
}

/// The expected class: the same for every semantics, or one for keyed requests and one for
/// the rest.
#[derive(Clone, Copy, Debug)]
enum Class {
    All(AttemptClass),
    KeyedElse(AttemptClass, AttemptClass),
}

use Class::{All, KeyedElse};

impl Class {
    fn for_semantics(self, semantics: Semantics) -> AttemptClass {
        match self {
            All(c) => c,
            KeyedElse(keyed, _) if semantics == Semantics::Keyed => keyed,
            KeyedElse(_, other) => other,
        }
    }
}

struct Row {
    case: &'static str,
    input: Input,
    class: Class,
    phase: DeliveryPhase,
    /// Retryable for Safe, Idempotent, Keyed, NonIdempotent.
    retry: [bool; 4],
    /// The single-attempt outcome for Safe, Idempotent, Keyed, NonIdempotent.
    outcome: [Outcome; 4],
}

const fn row(
    case: &'static str,
    input: Input,
    class: Class,
    phase: DeliveryPhase,
    retry: [bool; 4],
    outcome: [Outcome; 4],
) -> Row {
    Row {
        case,
        input,
        class,
        phase,
        retry,
        outcome,
    }
}

use Input::{
    DeadlineInFlight, DeadlineRefused, GrpcHead, GrpcNoTrailers, GrpcTrailers, Http, Io, Timeout,
};

const RETRY_AFTER: (&str, &str) = ("retry-after", "2");
const IN_FLIGHT: (&str, &str) = ("idempotency-key-in-flight", "1");
const RS: DeliveryPhase = ResponseStarted;

#[rustfmt::skip]
const TABLE: &[Row] = &[
    //   case                                   input                                                  class                        phase    retry         outcome
    //                                                                                                                                       S  I  K  N      S  I  K  N
    // success: stop
    row("200 OK",                               Http(200, &[]),                                        All(Success),                RS,      [N, N, N, N], [S, S, S, S]),
    row("201 Created",                          Http(201, &[]),                                        All(Success),                RS,      [N, N, N, N], [S, S, S, S]),
    row("204 No Content",                       Http(204, &[]),                                        All(Success),                RS,      [N, N, N, N], [S, S, S, S]),
    row("200 with Retry-After",                 Http(200, &[RETRY_AFTER]),                             All(Success),                RS,      [N, N, N, N], [S, S, S, S]),
    // final: stop, Failed
    row("400 Bad Request",                      Http(400, &[]),                                        All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("401 Unauthorized",                     Http(401, &[]),                                        All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("403 Forbidden",                        Http(403, &[]),                                        All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("404 Not Found",                        Http(404, &[]),                                        All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("422 (key reused, other payload)",      Http(422, &[]),                                        All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("422 with Retry-After",                 Http(422, &[RETRY_AFTER]),                             All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    // conflict: never replay the last step
    row("409 plain",                            Http(409, &[]),                                        All(Conflict),               RS,      [N, N, N, N], [F, F, F, F]),
    // ... except a keyed request whose key is still in flight: retry later with the same key
    row("409 + Retry-After",                    Http(409, &[RETRY_AFTER]),                             KeyedElse(Rejected, Conflict), RS,    [N, N, Y, N], [F, F, F, F]),
    row("409 + key-in-flight marker",           Http(409, &[IN_FLIGHT]),                               KeyedElse(Rejected, Conflict), RS,    [N, N, Y, N], [F, F, F, F]),
    row("409 + both",                           Http(409, &[IN_FLIGHT, RETRY_AFTER]),                  KeyedElse(Rejected, Conflict), RS,    [N, N, Y, N], [F, F, F, F]),
    // rejected, not processed: retryable for every request
    row("408 Request Timeout",                  Http(408, &[]),                                        All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    row("425 Too Early",                        Http(425, &[]),                                        All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    row("429 Too Many Requests",                Http(429, &[]),                                        All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    row("429 + Retry-After",                    Http(429, &[RETRY_AFTER]),                             All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    row("503 + Retry-After",                    Http(503, &[RETRY_AFTER]),                             All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    // maybe committed: retryable only if repeatable; Unknown unless safe
    row("503 without Retry-After",              Http(503, &[]),                                        All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("500 Internal Server Error",            Http(500, &[]),                                        All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("500 + Retry-After",                    Http(500, &[RETRY_AFTER]),                             All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("501 Not Implemented (other 5xx)",      Http(501, &[]),                                        All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("502 Bad Gateway",                      Http(502, &[]),                                        All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("504 Gateway Timeout",                  Http(504, &[]),                                        All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    // transport and local errors
    row("connect refused",                      Io(ErrorKind::ConnectionRefused, Sent),                All(Rejected),               NotSent, [Y, Y, Y, Y], [F, F, F, F]),
    row("connect refused, layer saw not sent",  Io(ErrorKind::ConnectionRefused, NotSent),             All(Rejected),               NotSent, [Y, Y, Y, Y], [F, F, F, F]),
    row("reset after send",                     Io(ErrorKind::ConnectionReset, Sent),                  All(MaybeCommitted),         Sent,    [Y, Y, Y, N], [F, U, U, U]),
    row("reset before send",                    Io(ErrorKind::ConnectionReset, NotSent),               All(Rejected),               NotSent, [Y, Y, Y, Y], [F, F, F, F]),
    row("reset while reading the response",     Io(ErrorKind::ConnectionReset, RS),                    All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("timeout after send",                   Timeout(Sent),                                         All(MaybeCommitted),         Sent,    [Y, Y, Y, N], [F, U, U, U]),
    row("timeout before send",                  Timeout(NotSent),                                      All(Rejected),               NotSent, [Y, Y, Y, Y], [F, F, F, F]),
    row("timeout while reading the response",   Timeout(RS),                                           All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("deadline refused",                     DeadlineRefused,                                       All(Rejected),               NotSent, [Y, Y, Y, Y], [F, F, F, F]),
    row("deadline passed in flight",            DeadlineInFlight,                                      All(MaybeCommitted),         Sent,    [Y, Y, Y, N], [F, U, U, U]),
    // gRPC, trailers-only (grpc-status in the response headers)
    row("gRPC OK",                              GrpcHead(200, &[("grpc-status", "0")]),                All(Success),                RS,      [N, N, N, N], [S, S, S, S]),
    row("gRPC INVALID_ARGUMENT",                GrpcHead(200, &[("grpc-status", "3")]),                All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC NOT_FOUND",                       GrpcHead(200, &[("grpc-status", "5")]),                All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC ALREADY_EXISTS",                  GrpcHead(200, &[("grpc-status", "6")]),                All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC PERMISSION_DENIED",               GrpcHead(200, &[("grpc-status", "7")]),                All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC FAILED_PRECONDITION",             GrpcHead(200, &[("grpc-status", "9")]),                All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC UNAUTHENTICATED",                 GrpcHead(200, &[("grpc-status", "16")]),               All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC ABORTED",                         GrpcHead(200, &[("grpc-status", "10")]),               All(Conflict),               RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC RESOURCE_EXHAUSTED",              GrpcHead(200, &[("grpc-status", "8")]),                All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    row("gRPC UNAVAILABLE, trailers-only",      GrpcHead(200, &[("grpc-status", "14")]),               All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("gRPC UNAVAILABLE, trailers-only, pushback", GrpcHead(200, &[("grpc-status", "14"), ("grpc-retry-pushback-ms", "10")]), All(Rejected), RS, [Y, Y, Y, Y], [F, F, F, F]),
    row("gRPC DEADLINE_EXCEEDED, trailers-only", GrpcHead(200, &[("grpc-status", "4")]),               All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("gRPC INTERNAL, trailers-only",         GrpcHead(200, &[("grpc-status", "13")]),               All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("gRPC UNKNOWN, trailers-only",          GrpcHead(200, &[("grpc-status", "2")]),                All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("gRPC malformed grpc-status",           GrpcHead(200, &[("grpc-status", "fourteen")]),         All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    // gRPC, status in the trailers after the response headers
    row("gRPC OK in trailers",                  GrpcTrailers(&[("grpc-status", "0")]),                 All(Success),                RS,      [N, N, N, N], [S, S, S, S]),
    row("gRPC INVALID_ARGUMENT in trailers",    GrpcTrailers(&[("grpc-status", "3")]),                 All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC FAILED_PRECONDITION in trailers", GrpcTrailers(&[("grpc-status", "9")]),                 All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC PERMISSION_DENIED in trailers",   GrpcTrailers(&[("grpc-status", "7")]),                 All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC ABORTED in trailers",             GrpcTrailers(&[("grpc-status", "10")]),                All(Conflict),               RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC RESOURCE_EXHAUSTED in trailers",  GrpcTrailers(&[("grpc-status", "8")]),                 All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    row("gRPC UNAVAILABLE after headers",       GrpcTrailers(&[("grpc-status", "14")]),                All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("gRPC DEADLINE_EXCEEDED in trailers",   GrpcTrailers(&[("grpc-status", "4")]),                 All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("gRPC INTERNAL in trailers",            GrpcTrailers(&[("grpc-status", "13")]),                All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("gRPC trailers without grpc-status",    GrpcTrailers(&[("grpc-message", "oops")]),             All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    row("gRPC stream ended without trailers",   GrpcNoTrailers,                                        All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
    // gRPC, non-200 HTTP status (gRPC's HTTP-to-gRPC status mapping)
    row("gRPC over HTTP 401 (UNAUTHENTICATED)", GrpcHead(401, &[]),                                    All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC over HTTP 403 (PERMISSION_DENIED)", GrpcHead(403, &[]),                                  All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC over HTTP 404 (UNIMPLEMENTED)",   GrpcHead(404, &[]),                                    All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC over HTTP 429 (UNAVAILABLE)",     GrpcHead(429, &[]),                                    All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    row("gRPC over HTTP 503 + Retry-After",     GrpcHead(503, &[RETRY_AFTER]),                         All(Rejected),               RS,      [Y, Y, Y, Y], [F, F, F, F]),
    row("gRPC over HTTP 400 (proxy: HTTP table)", GrpcHead(400, &[]),                                    All(Final),                  RS,      [N, N, N, N], [F, F, F, F]),
    row("gRPC over HTTP 500 (UNKNOWN)",         GrpcHead(500, &[]),                                    All(MaybeCommitted),         RS,      [Y, Y, Y, N], [F, U, U, U]),
];

/// Classifies `input` for a request with `semantics`.
fn classify(input: Input, semantics: Semantics) -> Classification {
    let error = |e: IoError, phase| {
        let req = support::http_request(semantics);
        support::classify_error(&req, &e, phase)
    };
    match input {
        Http(status, pairs) => {
            let req = support::http_request(semantics);
            support::classify_head(&req, &support::response(status, pairs))
        }
        GrpcHead(status, pairs) => {
            let req = support::grpc_request(semantics);
            support::classify_head(&req, &support::response(status, pairs))
        }
        GrpcTrailers(pairs) => {
            let req = support::grpc_request(semantics);
            let res = support::response(200, &[]);
            let trailers = support::headers(pairs);
            // Both ways of finishing a deferred classification agree.
            let via_resolve = support::classify_response(&req, &res).resolve(Some(&trailers));
            let Classified::RequiresEos(eos) = support::classify_response(&req, &res) else {
                panic!("a gRPC head without grpc-status must defer to the trailers");
            };
            let via_eos = eos.classify_eos(Some(&trailers));
            assert_eq!(via_eos, via_resolve);
            via_eos
        }
        GrpcNoTrailers => {
            let req = support::grpc_request(semantics);
            let res = support::response(200, &[]);
            let Classified::RequiresEos(eos) = support::classify_response(&req, &res) else {
                panic!("a gRPC head without grpc-status must defer to the trailers");
            };
            eos.classify_eos(None)
        }
        Io(kind, phase) => error(surely::Error::transport(kind.into()), phase),
        // The layer that saw a local error passes `Sent` (it cannot know better); the error's
        // own phase must win.
        Timeout(phase) => error(Elapsed::new(phase, false).into(), Sent),
        DeadlineRefused => error(DeadlineExceeded::refused().into(), Sent),
        DeadlineInFlight => error(DeadlineExceeded::in_flight().into(), Sent),
    }
}

#[test]
fn design_table_for_every_semantics() {
    let mut mismatches = Vec::new();
    for row in TABLE {
        for (i, semantics) in SEMANTICS.into_iter().enumerate() {
            let c = classify(row.input, semantics);
            let expected = (
                row.class.for_semantics(semantics),
                row.phase,
                row.retry[i],
                Some(row.outcome[i]),
            );
            let actual = (
                c.class(),
                c.phase(),
                c.is_retryable(semantics),
                support::outcome_of(semantics, &[c.class()]),
            );
            if expected != actual {
                mismatches.push(format!(
                    "{:<40} {semantics:?}: expected (class, phase, retryable, outcome) {expected:?}, got {actual:?}",
                    row.case
                ));
            }
            // Without a server's "stop", the classification's verdict is the class's.
            if c.pushback() != Some(surely::pushback::Pushback::Stop) {
                assert_eq!(
                    c.is_retryable(semantics),
                    c.class().is_retryable(semantics),
                    "{}",
                    row.case
                );
            }
            // A success never carries pushback.
            if c.class() == Success {
                assert_eq!(c.pushback(), None, "{}", row.case);
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches with the attempt table:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

/// The table's own consistency: the retry and outcome columns follow from the class column
/// exactly as `surely::docs::outcomes` says (the table, and the paragraph under it), so a typo
/// in one column cannot hide a wrong classification.
#[test]
fn table_columns_agree_with_design_rules() {
    for row in TABLE {
        for (i, semantics) in SEMANTICS.into_iter().enumerate() {
            let class = row.class.for_semantics(semantics);
            let retry = match class {
                Success | Final | Conflict => false,
                Rejected => true,
                MaybeCommitted => semantics != Semantics::NonIdempotent,
                other => panic!("no design rule for the class {other:?}"),
            };
            let outcome = match class {
                Success => Succeeded,
                Final | Conflict | Rejected => Failed,
                MaybeCommitted if semantics == Semantics::Safe => Failed,
                MaybeCommitted => Unknown,
                other => panic!("no design rule for the class {other:?}"),
            };
            assert_eq!(row.retry[i], retry, "{} {semantics:?}", row.case);
            assert_eq!(row.outcome[i], outcome, "{} {semantics:?}", row.case);
        }
    }
}

// The assertions the issue names, spelled out.

#[test]
fn post_without_key_timed_out_after_send_is_unknown_and_not_retried() {
    let post = support::http_request(Semantics::NonIdempotent);
    let err: IoError = Elapsed::new(Sent, false).into();
    let c = support::classify_error(&post, &err, Sent);
    assert_eq!(c.class(), MaybeCommitted);
    assert!(!c.is_retryable(Semantics::NonIdempotent));
    assert_eq!(
        support::outcome_of(Semantics::NonIdempotent, &[c.class()]),
        Some(Unknown)
    );
}

#[test]
fn post_with_key_timed_out_after_send_is_retried() {
    let post = support::http_request(Semantics::Keyed);
    let err: IoError = Elapsed::new(Sent, false).into();
    let c = support::classify_error(&post, &err, Sent);
    assert_eq!(c.class(), MaybeCommitted);
    assert!(c.is_retryable(Semantics::Keyed));
}

#[test]
fn connect_refusal_is_retryable_for_all_four() {
    for semantics in SEMANTICS {
        let req = support::http_request(semantics);
        let err = IoError::transport(ErrorKind::ConnectionRefused.into());
        for phase in [NotSent, Sent, ResponseStarted] {
            let c = support::classify_error(&req, &err, phase);
            assert_eq!((c.class(), c.phase()), (Rejected, NotSent), "{semantics:?}");
            assert!(c.is_retryable(semantics), "{semantics:?}");
        }
    }
}

#[test]
fn conflict_is_never_retried_except_a_keyed_key_in_flight() {
    let plain = support::response(409, &[]);
    for semantics in SEMANTICS {
        let c = support::classify_head(&support::http_request(semantics), &plain);
        assert_eq!(c.class(), Conflict, "{semantics:?}");
        assert!(!c.is_retryable(semantics), "{semantics:?}");
        assert_eq!(support::outcome_of(semantics, &[c.class()]), Some(Failed));
    }
    for marker in [
        support::response(409, &[RETRY_AFTER]),
        support::response(409, &[IN_FLIGHT]),
    ] {
        for semantics in SEMANTICS {
            let c = support::classify_head(&support::http_request(semantics), &marker);
            if semantics == Semantics::Keyed {
                assert_eq!(c.class(), Rejected);
                assert!(c.is_retryable(semantics));
            } else {
                assert_eq!(c.class(), Conflict, "{semantics:?}");
                assert!(!c.is_retryable(semantics), "{semantics:?}");
            }
        }
    }
    assert_eq!(KEY_IN_FLIGHT.as_str(), IN_FLIGHT.0);
}

#[test]
fn a_deferred_grpc_head_reads_as_a_started_success() {
    let req = support::grpc_request(Semantics::NonIdempotent);
    let c = support::classify_response(&req, &support::response(200, &[])).at_head();
    assert_eq!((c.class(), c.phase()), (Success, ResponseStarted));
}

#[test]
fn a_broken_grpc_stream_is_maybe_committed() {
    let req = support::grpc_request(Semantics::Keyed);
    let Classified::RequiresEos(eos) =
        support::classify_response(&req, &support::response(200, &[]))
    else {
        panic!("expected a deferred classification");
    };
    let c = eos.classify_body_error();
    assert_eq!((c.class(), c.phase()), (MaybeCommitted, ResponseStarted));
    assert!(c.is_retryable(Semantics::Keyed));
    assert!(!c.is_retryable(Semantics::NonIdempotent));
}

/// A gRPC request is classified by gRPC status, never by the HTTP table: a 200 whose
/// trailers-only `grpc-status` is INTERNAL is not a success.
#[test]
fn grpc_requests_use_grpc_status_and_http_requests_ignore_it() {
    let res = support::response(200, &[("grpc-status", "13")]);
    let grpc = support::classify_head(&support::grpc_request(Semantics::Idempotent), &res);
    assert_eq!(grpc.class(), MaybeCommitted);
    let http = support::classify_head(&support::http_request(Semantics::Idempotent), &res);
    assert_eq!(http.class(), Success);
}

/// A gRPC request answered with a non-200 HTTP status is classified by the HTTP rows
/// (`surely::docs::outcomes`, the attempt table): 502 and 504 maybe committed, 503 rejected
/// only with `Retry-After`. They are not turned into the `UNAVAILABLE` a gRPC library would
/// report: that would hide that a gateway may have forwarded the request, and a keyless gRPC
/// POST that a gateway timed out after forwarding must not be sent again.
#[test]
fn grpc_over_gateway_5xx_is_maybe_committed() {
    for status in [502, 503, 504] {
        for semantics in SEMANTICS {
            let req = support::grpc_request(semantics);
            let c = support::classify_head(&req, &support::response(status, &[]));
            assert_eq!(c.class(), MaybeCommitted, "HTTP {status} {semantics:?}");
        }
        let req = support::grpc_request(Semantics::NonIdempotent);
        let c = support::classify_head(&req, &support::response(status, &[]));
        assert!(!c.is_retryable(Semantics::NonIdempotent), "HTTP {status}");
    }
}
