//! The trust boundary: a server honours a caller's retry signals (this crate's marker, gRPC's and
//! Envoy's attempt counters) only from callers it was told to trust, and takes the marker off
//! anyone else's request.

use http::Request;
use surely::headers::RETRY_OWNER;
use surely::record::InMemoryRecorder;
use surely::server::deadline::ServerDeadlineLayer;
use surely::Envelope;
use surely::StopReason;

use super::support::Counter;
use super::{send, server_behind, Down, Req};

/// Sends `req` to a server behind `layer` whose handler GETs a downstream that answers 500;
/// returns (downstream calls, the downstream call's stop reason, whether the handler saw the
/// marker).
async fn through(layer: ServerDeadlineLayer, req: Req) -> (usize, StopReason, bool) {
    let (handled, calls, recorder) = (
        Counter::default(),
        Counter::default(),
        InMemoryRecorder::new(),
    );
    let mut svc = server_behind(
        layer,
        Down::Status500,
        handled,
        calls.clone(),
        recorder.clone(),
    );
    let res = send(&mut svc, req).await.unwrap();
    (
        calls.get(),
        recorder.calls()[0].stop,
        res.body().handler().is_some_and(|b| b == "marked"),
    )
}

fn request(headers: &[(&str, &str)]) -> Req {
    let mut b = Request::get("/up");
    for (name, value) in headers {
        b = b.header(*name, *value);
    }
    b.body(String::new()).unwrap()
}

/// Trusts callers that come through our gateway, which sets `x-internal: 1`.
fn gateway_trusted() -> ServerDeadlineLayer {
    ServerDeadlineLayer::builder()
        .trust_retry_signals(|req: &dyn Envelope| {
            req.headers()
                .is_some_and(|h| h.get("x-internal").is_some_and(|v| v == "1"))
        })
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn by_default_an_outside_marker_is_stripped_and_the_handler_retries() {
    let marked = request(&[(RETRY_OWNER.as_str(), "1")]);
    let (calls, stop, seen) = through(ServerDeadlineLayer::new(), marked).await;
    assert_eq!(calls, 3, "the handler's own client kept its retries");
    assert_eq!(stop, StopReason::AttemptsExhausted);
    assert!(!seen, "the marker was taken off the request");
}

#[tokio::test(start_paused = true)]
async fn a_trusted_callers_marker_is_honoured_and_an_untrusted_ones_is_not() {
    let trusted = request(&[(RETRY_OWNER.as_str(), "1"), ("x-internal", "1")]);
    let (calls, stop, seen) = through(gateway_trusted(), trusted).await;
    assert_eq!((calls, stop), (1, StopReason::UpstreamOwnsRetries));
    assert!(seen, "a trusted marker reaches the handler");

    let outsider = request(&[(RETRY_OWNER.as_str(), "1"), ("x-internal", "0")]);
    let (calls, stop, seen) = through(gateway_trusted(), outsider).await;
    assert_eq!((calls, stop), (3, StopReason::AttemptsExhausted));
    assert!(!seen);
}

#[tokio::test(start_paused = true)]
async fn a_trusted_foreign_retriers_counter_on_a_retry_leaves_retries_to_it() {
    let cases: &[(&[(&str, &str)], usize)] = &[
        // gRPC sends the count of earlier attempts on retries and hedges only.
        (&[("grpc-previous-rpc-attempts", "1")], 1),
        (&[("grpc-previous-rpc-attempts", "2")], 1),
        (&[("grpc-previous-rpc-attempts", "0")], 3),
        // Envoy numbers attempts from 1.
        (&[("x-envoy-attempt-count", "2")], 1),
        (&[("x-envoy-attempt-count", "1")], 3),
        // A counter that does not parse says nothing.
        (&[("grpc-previous-rpc-attempts", "many")], 3),
        (&[("x-envoy-attempt-count", "-4")], 3),
        // The first attempt carries none: the handler's budget is what bounds it.
        (&[], 3),
    ];
    for (headers, expected) in cases {
        let mut with_trust = headers.to_vec();
        with_trust.push(("x-internal", "1"));
        let (calls, _, _) = through(gateway_trusted(), request(&with_trust)).await;
        assert_eq!(calls, *expected, "trusted {headers:?}");
        // From an untrusted caller, no counter switches the handler's retries off.
        let (calls, _, _) = through(gateway_trusted(), request(headers)).await;
        assert_eq!(calls, 3, "untrusted {headers:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_client_for_a_third_party_api_sends_none_of_the_crates_headers() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let transport = tower::service_fn(move |req: Req| {
        log.lock().unwrap().push(req.headers().clone());
        async {
            Ok::<_, std::io::Error>(
                http::Response::builder()
                    .status(503)
                    .header(http::header::RETRY_AFTER, "0")
                    .body(String::new())
                    .unwrap(),
            )
        }
    });
    let mut client = surely::client()
        .timeout(Duration::from_secs(5))
        .no_internal_headers()
        .retry(|r| r.attempt_header(Some(http::HeaderName::from_static("x-attempt"))))
        .no_internal_headers()
        .build(transport)
        .unwrap();
    let res = send(&mut client, request(&[])).await.unwrap();
    assert_eq!(res.status(), 503);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 3, "retried all the same");
    for headers in seen.iter() {
        assert!(!headers.contains_key(RETRY_OWNER));
        assert!(!headers.contains_key(surely::headers::DEFAULT_HEADER));
        assert!(!headers.contains_key("x-attempt"));
    }
}
