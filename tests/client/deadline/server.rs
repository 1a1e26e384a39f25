//! The `ServerDeadlineLayer` around a `tower::service_fn` handler, under paused time.

use std::convert::Infallible;
use std::time::Duration;

use http::{HeaderValue, Request, Response, StatusCode};
use surely::deadline::Deadline;
use surely::server::deadline::{Malformed, ServerDeadlineLayer};
use surely::server::ResponseBody;
use tokio::time::Instant;
use tower::{service_fn, Layer};

use super::support::{call, handler, ms, secs, Log};

fn http_with(value: &[u8]) -> Request<()> {
    let mut r = Request::get("/").body(()).unwrap();
    r.headers_mut().insert(
        "x-request-timeout-ms",
        HeaderValue::from_bytes(value).unwrap(),
    );
    r
}

fn grpc_with(value: Option<&[u8]>) -> Request<()> {
    let mut r = Request::post("/pkg.Svc/Method")
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    if let Some(value) = value {
        r.headers_mut()
            .insert("grpc-timeout", HeaderValue::from_bytes(value).unwrap());
    }
    r
}

fn layer_max(max: Duration) -> ServerDeadlineLayer {
    ServerDeadlineLayer::builder().max(max).build().unwrap()
}

fn header<'a, B>(res: &'a Response<B>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Calls the layer around a recording handler; returns the response and the log.
async fn serve(
    layer: &ServerDeadlineLayer,
    req: Request<()>,
) -> (Response<ResponseBody<String>>, Log) {
    let log = Log::default();
    let mut svc = layer.layer(handler(log.clone()));
    let res = call(&mut svc, req).await.unwrap();
    (res, log)
}

/// The deadline the handler saw: current while called, current while polled, and the
/// extension, which must all agree.
fn handler_deadline(log: &Log) -> Option<Deadline> {
    let seen = log.only();
    assert_eq!(seen.current_at_call, seen.current_at_poll);
    assert_eq!(seen.current_at_call, seen.extension);
    seen.extension
}

// ---- reading the budget -------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn reads_the_millisecond_header() {
    let start = Instant::now();
    let (res, log) = serve(&layer_max(secs(10)), http_with(b"250")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(handler_deadline(&log), Some(Deadline::at(start + ms(250))));
}

#[tokio::test(start_paused = true)]
async fn reads_grpc_timeout() {
    let cases: [(&[u8], Duration); 5] = [
        (b"3S", secs(3)),
        (b"500m", ms(500)),
        (b"1000000u", secs(1)),
        (b"2M", secs(120)),
        (b"7000000n", ms(7)),
    ];
    for (value, budget) in cases {
        let start = Instant::now();
        let (res, log) = serve(&ServerDeadlineLayer::new(), grpc_with(Some(value))).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "grpc-status"), None);
        assert_eq!(
            handler_deadline(&log),
            Some(Deadline::at(start + budget)),
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn grpc_requests_ignore_the_millisecond_header() {
    let start = Instant::now();
    let mut r = grpc_with(None);
    r.headers_mut()
        .insert("x-request-timeout-ms", HeaderValue::from_static("100"));
    let (_, log) = serve(&layer_max(secs(10)), r).await;
    assert_eq!(handler_deadline(&log), Some(Deadline::at(start + secs(10))));
}

#[tokio::test(start_paused = true)]
async fn a_custom_header_is_read() {
    let layer = ServerDeadlineLayer::builder()
        .http_header(http::HeaderName::from_static("x-budget-ms"))
        .build()
        .unwrap();
    let start = Instant::now();
    let mut r = Request::get("/")
        .header("x-budget-ms", "420")
        .body(())
        .unwrap();
    // The default header is not read any more.
    r.headers_mut()
        .insert("x-request-timeout-ms", HeaderValue::from_static("10"));
    let (_, log) = serve(&layer, r).await;
    assert_eq!(handler_deadline(&log), Some(Deadline::at(start + ms(420))));
}

#[tokio::test(start_paused = true)]
async fn the_header_is_capped_by_max() {
    let start = Instant::now();
    let (_, log) = serve(&layer_max(secs(10)), http_with(b"60000")).await;
    assert_eq!(handler_deadline(&log), Some(Deadline::at(start + secs(10))));

    let (_, log) = serve(&layer_max(ms(400)), grpc_with(Some(b"1S"))).await;
    assert_eq!(handler_deadline(&log), Some(Deadline::at(start + ms(400))));
}

#[tokio::test(start_paused = true)]
async fn an_absurd_header_is_capped_without_max_too() {
    // 18 nines of milliseconds: far beyond any real caller, and must not overflow an Instant.
    let start = Instant::now();
    let (res, log) = serve(
        &ServerDeadlineLayer::new(),
        http_with(b"999999999999999999"),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    let d = handler_deadline(&log).unwrap();
    assert!(d.instant() > start + secs(365 * 24 * 3600));
    let (res, _) = serve(&ServerDeadlineLayer::new(), grpc_with(Some(b"99999999H"))).await;
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn no_header_means_max() {
    let start = Instant::now();
    let (_, log) = serve(&layer_max(secs(10)), Request::new(())).await;
    assert_eq!(handler_deadline(&log), Some(Deadline::at(start + secs(10))));

    let (_, log) = serve(&layer_max(secs(7)), grpc_with(None)).await;
    assert_eq!(handler_deadline(&log), Some(Deadline::at(start + secs(7))));
}

#[tokio::test(start_paused = true)]
async fn no_header_and_no_max_means_no_deadline() {
    let (res, log) = serve(&ServerDeadlineLayer::new(), Request::new(())).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(handler_deadline(&log), None);
}

// ---- refusing spent budgets ---------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_zero_budget_gets_504_without_calling_the_handler() {
    for value in [&b"0"[..], b"000"] {
        let (res, log) = serve(&layer_max(secs(10)), http_with(value)).await;
        assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(res.body().is_refusal());
        assert_eq!(
            header(&res, "content-type"),
            Some("application/problem+json")
        );
        assert_eq!(log.count(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_zero_grpc_budget_gets_deadline_exceeded_without_calling_the_handler() {
    for value in [&b"0m"[..], b"0n", b"0H"] {
        let (res, log) = serve(&ServerDeadlineLayer::new(), grpc_with(Some(value))).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(header(&res, "grpc-status"), Some("4"));
        assert_eq!(header(&res, "content-type"), Some("application/grpc"));
        assert_eq!(
            header(&res, "grpc-message"),
            Some("deadline exceeded before the handler started")
        );
        // Trailers-only: the refusal is all in the head.
        assert_eq!(http_body::Body::size_hint(res.body()).exact(), Some(0));
        assert_eq!(log.count(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_budget_below_min_is_refused() {
    let layer = ServerDeadlineLayer::builder()
        .min(ms(100))
        .max(secs(10))
        .build()
        .unwrap();
    let (res, log) = serve(&layer, http_with(b"99")).await;
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(log.count(), 0);

    let (res, log) = serve(&layer, grpc_with(Some(b"99999u"))).await;
    assert_eq!(header(&res, "grpc-status"), Some("4"));
    assert_eq!(log.count(), 0);

    // Exactly the minimum is enough.
    let start = Instant::now();
    let (res, log) = serve(&layer, http_with(b"100")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(handler_deadline(&log), Some(Deadline::at(start + ms(100))));
}

#[tokio::test(start_paused = true)]
async fn the_handler_is_not_cancelled_at_the_deadline() {
    let layer = layer_max(secs(10));
    let handler = service_fn(|_req: Request<()>| async {
        tokio::time::sleep(secs(1)).await;
        Ok::<_, Infallible>(Response::new("done".to_owned()))
    });
    let mut svc = layer.layer(handler);
    let start = Instant::now();
    let res = call(&mut svc, http_with(b"100")).await.unwrap();
    assert_eq!(res.body().handler().unwrap(), "done");
    assert_eq!(Instant::now() - start, secs(1));
}

// ---- malformed headers --------------------------------------------------------------------

const BAD_MILLIS: [&[u8]; 7] = [
    b"",
    b"-5",
    b"1.5",
    b"\xff\xfe",
    b"12a",
    b"1000000000000000000", // 19 digits
    b"+5",
];

const BAD_GRPC: [(&[u8], &str); 7] = [
    (b"123456789m", "invalid grpc-timeout: more than 8 digits"),
    (b"5x", "invalid grpc-timeout: unknown unit"),
    (b"", "invalid grpc-timeout: empty value"),
    (b"-5S", "invalid grpc-timeout: not an ascii digit"),
    (b"1.5S", "invalid grpc-timeout: not an ascii digit"),
    (b"\xe2\x80\xa2S", "invalid grpc-timeout: not an ascii digit"),
    (b"500", "invalid grpc-timeout: missing unit"),
];

#[tokio::test(start_paused = true)]
async fn malformed_millis_are_rejected_with_400() {
    let layer = layer_max(secs(10));
    for value in BAD_MILLIS {
        let (res, log) = serve(&layer, http_with(value)).await;
        assert_eq!(
            res.status(),
            StatusCode::BAD_REQUEST,
            "{:?}",
            String::from_utf8_lossy(value)
        );
        assert_eq!(log.count(), 0, "{:?}", String::from_utf8_lossy(value));
    }
}

#[tokio::test(start_paused = true)]
async fn malformed_grpc_timeouts_are_rejected_with_invalid_argument() {
    let layer = ServerDeadlineLayer::builder()
        .on_malformed(Malformed::Reject)
        .build()
        .unwrap();
    for (value, message) in BAD_GRPC {
        let (res, log) = serve(&layer, grpc_with(Some(value))).await;
        let shown = String::from_utf8_lossy(value);
        assert_eq!(res.status(), StatusCode::OK, "{shown:?}");
        assert_eq!(header(&res, "grpc-status"), Some("3"), "{shown:?}");
        assert_eq!(header(&res, "grpc-message"), Some(message), "{shown:?}");
        assert_eq!(log.count(), 0, "{shown:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn malformed_headers_are_ignored_when_asked() {
    let layer = ServerDeadlineLayer::builder()
        .max(secs(10))
        .on_malformed(Malformed::Ignore)
        .build()
        .unwrap();
    let start = Instant::now();
    for value in BAD_MILLIS {
        let (res, log) = serve(&layer, http_with(value)).await;
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(handler_deadline(&log), Some(Deadline::at(start + secs(10))));
    }
    for (value, _) in BAD_GRPC {
        let (res, log) = serve(&layer, grpc_with(Some(value))).await;
        assert_eq!(header(&res, "grpc-status"), None);
        assert_eq!(handler_deadline(&log), Some(Deadline::at(start + secs(10))));
    }

    // Without a maximum, an ignored header leaves the handler without a deadline.
    let layer = ServerDeadlineLayer::builder()
        .on_malformed(Malformed::Ignore)
        .build()
        .unwrap();
    let (res, log) = serve(&layer, http_with(b"-5")).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(handler_deadline(&log), None);
    let (_, log) = serve(&layer, grpc_with(Some(b"123456789m"))).await;
    assert_eq!(handler_deadline(&log), None);
}

#[test]
fn reject_is_the_default() {
    assert_eq!(Malformed::default(), Malformed::Reject);
}

// ---- configuration ------------------------------------------------------------------------

#[test]
fn zero_max_is_a_config_error() {
    let err = ServerDeadlineLayer::builder()
        .max(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "server deadline maximum");
    assert_eq!(
        err.to_string(),
        "invalid server deadline maximum: must be greater than zero"
    );
}

#[test]
fn min_not_below_max_is_a_config_error() {
    for min in [secs(1), secs(2)] {
        let err = ServerDeadlineLayer::builder()
            .max(secs(1))
            .min(min)
            .build()
            .unwrap_err();
        assert_eq!(err.setting(), "server deadline minimum");
        assert_eq!(
            err.to_string(),
            "invalid server deadline minimum: must be less than the maximum, or every request would be refused"
        );
    }
    assert!(ServerDeadlineLayer::builder()
        .max(secs(1))
        .min(ms(999))
        .build()
        .is_ok());
}

// ---- refusals say the handler never ran, in-process budgets --------------------------------

#[tokio::test(start_paused = true)]
async fn refusals_carry_the_not_processed_marker_and_classify_as_rejected() {
    use surely::classify::{AttemptClass, Classify, HttpClassifier, MakeClassifier};
    use surely::headers::NOT_PROCESSED;

    let log = Log::default();
    let mut svc = ServerDeadlineLayer::new().layer(handler(log.clone()));
    for req in [http_with(b"0"), grpc_with(Some(b"0n"))] {
        let classifier = HttpClassifier::new().make_classifier(&req);
        let res = call(&mut svc, req).await.unwrap();
        assert_eq!(res.headers()[NOT_PROCESSED], "deadline");
        let c = Classify::<_, surely::Error<std::io::Error>>::classify_response(classifier, &res)
            .at_head();
        // Without the marker a 504 (or DEADLINE_EXCEEDED) would read as maybe committed.
        assert_eq!(c.class(), AttemptClass::Rejected);
    }
    assert_eq!(log.count(), 0);
}

#[tokio::test(start_paused = true)]
async fn in_process_the_callers_deadline_caps_the_handlers() {
    let log = Log::default();
    let mut svc = ServerDeadlineLayer::builder()
        .max(secs(10))
        .build()
        .unwrap()
        .layer(handler(log.clone()));
    let outer = Deadline::after(ms(300));
    // The inbound header asks for 5 s, the caller on this task has 300 ms left.
    let res = surely::deadline::scope(outer, call(&mut svc, http_with(b"5000")))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(log.all()[0].current_at_poll, Some(outer));
}
