//! `TracingRecorder`: spans and events, captured by a test `tracing` layer.

use std::io;

use http::{Request, Response};
use surely::deadline::SetDeadlineLayer;
use surely::record::{BusinessKey, RecordAttemptLayer, RecordCallLayer, TracingRecorder};
use surely::timeout::AttemptTimeoutLayer;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tracing::Level;

use super::support::{call, ms, post, secs, Capture, Req, Script};

fn traced<T>(
    transport: T,
) -> impl Service<Req, Response = T::Response, Error = surely::Error<io::Error>>
where
    T: Service<Req, Response = Response<String>, Error = io::Error>,
{
    ServiceBuilder::new()
        .layer(RecordCallLayer::new(TracingRecorder::new()))
        .layer(SetDeadlineLayer::new(secs(2)))
        .layer(RecordAttemptLayer::new(TracingRecorder::new()))
        .layer(AttemptTimeoutLayer::new(ms(500)))
        .service(transport)
}

#[tokio::test(start_paused = true)]
async fn an_unknown_call_has_a_call_span_an_attempt_span_and_a_warning() {
    let capture = Capture::default();
    let _guard = capture.install();

    let mut client = traced(Script::new().hang());
    let mut req = post("/orders");
    req.extensions_mut().insert(BusinessKey::new("o-1"));
    call(&mut client, req).await.unwrap_err();

    let got = capture.get();
    let calls = got.spans_named("surely.call");
    let attempts = got.spans_named("surely.attempt");
    assert_eq!((calls.len(), attempts.len()), (1, 1), "{got:#?}");
    let (call_index, call_span) = &calls[0];
    let (attempt_index, attempt_span) = &attempts[0];

    let call_id = call_span.field("surely.call_id").expect("a call id");
    assert!(call_id.parse::<u64>().unwrap() > 0);
    assert_eq!(call_span.field("surely.key"), Some("o-1"));
    assert_eq!(call_span.field("surely.semantics"), Some("NonIdempotent"));
    assert_eq!(call_span.field("surely.attempts"), Some("1"));
    assert_eq!(call_span.field("surely.outcome"), Some("unknown"));
    assert_eq!(call_span.field("surely.stop_reason"), Some("unknown"));

    assert_eq!(attempt_span.parent, Some(*call_index));
    assert_eq!(attempt_span.field("surely.call_id"), Some(call_id));
    assert_eq!(attempt_span.field("surely.attempt"), Some("1"));
    assert_eq!(attempt_span.field("surely.phase"), Some("sent"));
    assert_eq!(attempt_span.field("surely.class"), Some("maybe committed"));
    assert_eq!(attempt_span.field("error.type"), Some("timeout"));
    assert_eq!(attempt_span.field("http.request.resend_count"), None);
    assert_eq!(attempt_span.field("surely.request_id"), None);

    let ended: Vec<_> = got
        .events
        .iter()
        .filter(|e| e.field("message") == Some("attempt ended"))
        .collect();
    assert_eq!(ended.len(), 1);
    let e = ended[0];
    // A failed attempt is seen at INFO; a plain success stays at DEBUG.
    assert_eq!(e.level, Level::INFO);
    assert_eq!(e.field("error.type"), Some("timeout"));
    assert_eq!(e.span, Some(*attempt_index));
    assert_eq!(e.field("surely.deadline_left_ms"), Some("2000"));
    assert_eq!(e.field("surely.duration_ms"), Some("500"));
    assert_eq!(e.field("surely.class"), Some("maybe committed"));

    let warned: Vec<_> = got
        .events
        .iter()
        .filter(|e| e.level == Level::WARN)
        .collect();
    assert_eq!(warned.len(), 1, "{:#?}", got.events);
    let w = warned[0];
    assert_eq!(
        w.field("message"),
        Some("call outcome unknown: the effect may have happened")
    );
    assert_eq!(w.span, Some(*call_index));
    assert_eq!(w.field("surely.outcome"), Some("unknown"));
    assert_eq!(w.field("surely.stop_reason"), Some("unknown"));
    assert_eq!(w.field("surely.attempts"), Some("1"));
    assert_eq!(w.field("surely.duration_ms"), Some("500"));
}

#[tokio::test(start_paused = true)]
async fn a_successful_call_is_info_and_carries_the_request_id() {
    let capture = Capture::default();
    let _guard = capture.install();

    let mut client = traced(Script::new().answer(200, &[("x-request-id", "req-42")], ms(0)));
    call(&mut client, post("/orders")).await.unwrap();

    let got = capture.get();
    let (call_index, call_span) = got.spans_named("surely.call").remove(0);
    let (_, attempt_span) = got.spans_named("surely.attempt").remove(0);
    assert_eq!(call_span.field("surely.key"), None);
    assert_eq!(call_span.field("surely.outcome"), Some("succeeded"));
    assert_eq!(call_span.field("surely.stop_reason"), Some("success"));
    assert_eq!(attempt_span.field("surely.class"), Some("success"));
    assert_eq!(attempt_span.field("surely.phase"), Some("response started"));
    assert_eq!(attempt_span.field("surely.request_id"), Some("req-42"));
    assert_eq!(attempt_span.field("error.type"), None);

    assert!(got.events.iter().all(|e| e.level != Level::WARN));
    let info: Vec<_> = got
        .events
        .iter()
        .filter(|e| e.level == Level::INFO)
        .collect();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].field("message"), Some("call ended"));
    assert_eq!(info[0].span, Some(call_index));
    assert_eq!(info[0].field("surely.outcome"), Some("succeeded"));
}

#[tokio::test(start_paused = true)]
async fn a_second_attempt_carries_the_resend_count() {
    let capture = Capture::default();
    let _guard = capture.install();

    let transport = Script::new().answer(503, &[], ms(0));
    let attempt_layer = RecordAttemptLayer::new(TracingRecorder::new()).layer(transport);
    let retry = service_fn(move |req: Req| {
        let mut attempts = attempt_layer.clone();
        async move {
            let again = Request::put(req.uri().clone()).body(String::new()).unwrap();
            attempts.ready().await?.call(req).await?;
            attempts.ready().await?.call(again).await
        }
    });
    let mut client = RecordCallLayer::new(TracingRecorder::new()).layer(retry);
    let req = Request::put("/orders/o-1").body(String::new()).unwrap();
    call(&mut client, req).await.unwrap();

    let got = capture.get();
    let (call_index, call_span) = got.spans_named("surely.call").remove(0);
    let attempts = got.spans_named("surely.attempt");
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].1.field("surely.attempt"), Some("1"));
    assert_eq!(attempts[0].1.field("http.request.resend_count"), None);
    assert_eq!(attempts[1].1.field("surely.attempt"), Some("2"));
    assert_eq!(attempts[1].1.field("http.request.resend_count"), Some("1"));
    assert!(attempts.iter().all(|(_, a)| a.parent == Some(call_index)));
    assert_eq!(call_span.field("surely.attempts"), Some("2"));
    assert_eq!(call_span.field("surely.semantics"), Some("Idempotent"));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_attempt_says_so() {
    let capture = Capture::default();
    let _guard = capture.install();

    let mut client = traced(Script::new().hang());
    let out = tokio::time::timeout(ms(100), call(&mut client, post("/orders"))).await;
    assert!(out.is_err());

    let got = capture.get();
    let (_, call_span) = got.spans_named("surely.call").remove(0);
    let (_, attempt_span) = got.spans_named("surely.attempt").remove(0);
    assert_eq!(attempt_span.field("error.type"), Some("cancelled"));
    assert_eq!(call_span.field("surely.stop_reason"), Some("cancelled"));
    assert_eq!(call_span.field("surely.outcome"), Some("unknown"));
}

/// The call span carries the OpenTelemetry HTTP client fields (no query, no credentials in the
/// URL) and the semantics the call was treated as; a plain successful attempt stays at DEBUG.
#[tokio::test(start_paused = true)]
async fn the_call_span_has_the_http_fields_and_the_semantics_used() {
    let capture = Capture::default();
    let _guard = capture.install();

    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(TracingRecorder::new()))
        .layer(surely::idempotency::SetIdempotencyKeyLayer::new().server_honours_keys())
        .layer(RecordAttemptLayer::new(TracingRecorder::new()))
        .service(Script::new().answer(201, &[], ms(0)));
    let req = Request::post("https://ann:s3cret@orders.example.com:8443/orders?token=abc")
        .body(String::new())
        .unwrap();
    call(&mut client, req).await.unwrap();

    let got = capture.get();
    let (_, call_span) = got.spans_named("surely.call").remove(0);
    assert_eq!(call_span.field("http.request.method"), Some("POST"));
    assert_eq!(
        call_span.field("url.full"),
        Some("https://orders.example.com:8443/orders")
    );
    assert_eq!(
        call_span.field("server.address"),
        Some("orders.example.com")
    );
    assert_eq!(call_span.field("server.port"), Some("8443"));
    assert_eq!(call_span.field("surely.semantics"), Some("Keyed"));
    let ended: Vec<_> = got
        .events
        .iter()
        .filter(|e| e.field("message") == Some("attempt ended"))
        .collect();
    assert_eq!(ended[0].level, Level::DEBUG);
    assert_eq!(ended[0].field("error.type"), None);
}
