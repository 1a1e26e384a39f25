//! The problem details (RFC 9457) of the deadline layers' and the adaptive limit's refusals:
//! their bodies, their links, their bases refused when not absolute, the headers that stay, and
//! what the classifier believes of them.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use serde_json::Value;
use surely::classify::{AttemptClass, HttpRequestClassifier};
use surely::deadline::Deadline;
use surely::server::config::ServerConfig;
use surely::server::deadline::{RecheckLayer, ServerDeadlineLayer};
use surely::server::limit::AdaptiveLimitLayer;
use surely::server::problem::DEFAULT_BASE;
use surely::server::ResponseBody;
use surely::Semantics;
use tokio::sync::Semaphore;
use tower::{service_fn, Layer, Service, ServiceExt};

const DOCS: &str = "https://api.example.com/problems/";

/// A handler whose body type has no `Default`: the layers never make one of the handler's.
type Stream =
    StreamBody<tokio_stream::Iter<std::vec::IntoIter<Result<http_body::Frame<Bytes>, Infallible>>>>;

fn stream(text: &'static str) -> Stream {
    StreamBody::new(tokio_stream::iter(vec![Ok(http_body::Frame::data(
        Bytes::from_static(text.as_bytes()),
    ))]))
}

fn handler() -> impl Service<Request<()>, Response = Response<Stream>, Error = Infallible> + Clone {
    service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(stream("done"))) })
}

/// The answer's head, and its body read whole.
async fn read<B>(res: Response<ResponseBody<B>>) -> (http::response::Parts, bool, Bytes)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let (head, body) = res.into_parts();
    let refusal = body.is_refusal();
    (head, refusal, body.collect().await.unwrap().to_bytes())
}

fn problem(head: &http::response::Parts, body: &Bytes) -> Value {
    assert_eq!(head.headers["content-type"], "application/problem+json");
    serde_json::from_slice(body).expect("the body is JSON")
}

fn with_timeout(ms: &str) -> Request<()> {
    Request::get("/orders")
        .header("x-request-timeout-ms", ms)
        .body(())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_spent_deadline_is_a_problem_with_the_default_type_and_no_link() {
    let svc = ServerDeadlineLayer::new().layer(handler());
    let (head, refusal, body) = read(svc.oneshot(with_timeout("0")).await.unwrap()).await;
    assert!(refusal);
    assert_eq!(head.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(head.headers["surely-not-processed"], "deadline");
    assert!(!head.headers.contains_key("link"));
    let p = problem(&head, &body);
    assert_eq!(p["type"], format!("{DEFAULT_BASE}deadline-exceeded"));
    assert_eq!(p["title"], "Deadline exceeded before processing");
    assert_eq!(p["status"], 504);
    assert_eq!(p["code"], "DEADLINE_EXCEEDED");
    assert!(p["detail"].as_str().unwrap().contains("did not run"));
}

#[tokio::test(start_paused = true)]
async fn a_service_base_types_and_links_the_deadline_problems() {
    let layer = ServerDeadlineLayer::builder()
        .problem_base(DOCS)
        .build()
        .unwrap();
    let svc = layer.layer(handler());
    let (head, _, body) = read(svc.clone().oneshot(with_timeout("0")).await.unwrap()).await;
    let p = problem(&head, &body);
    assert_eq!(p["type"], format!("{DOCS}deadline-exceeded"));
    assert_eq!(
        head.headers["link"],
        format!("<{DOCS}deadline-exceeded>; rel=\"describedby\"")
    );

    // A timeout that does not parse: a 400 whose detail names the fault, never the value.
    let hostile = "12<script>\"alert\"";
    let (head, refusal, body) =
        read(svc.clone().oneshot(with_timeout(hostile)).await.unwrap()).await;
    assert!(refusal);
    assert_eq!(head.status, StatusCode::BAD_REQUEST);
    let p = problem(&head, &body);
    assert_eq!(p["type"], format!("{DOCS}deadline-invalid"));
    assert_eq!(p["code"], "DEADLINE_INVALID");
    assert_eq!(p["status"], 400);
    let text = std::str::from_utf8(&body).unwrap();
    assert!(
        !text.contains("script") && !text.contains("alert"),
        "{text}"
    );

    // The handler's own answer passes through, body and all.
    let (head, refusal, body) = read(svc.oneshot(with_timeout("5000")).await.unwrap()).await;
    assert!(!refusal);
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(body, "done");
}

#[tokio::test(start_paused = true)]
async fn a_recheck_refusal_is_the_same_problem() {
    let layer = RecheckLayer::new(Duration::from_millis(100))
        .problem_base(DOCS)
        .unwrap();
    let svc = layer.layer(handler());
    let mut late = Request::new(());
    late.extensions_mut()
        .insert(Deadline::after(Duration::from_millis(30)));
    let (head, refusal, body) = read(svc.oneshot(late).await.unwrap()).await;
    assert!(refusal);
    assert_eq!(head.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(head.headers["surely-not-processed"], "deadline");
    let p = problem(&head, &body);
    assert_eq!(p["type"], format!("{DOCS}deadline-exceeded"));
    assert_eq!(p["code"], "DEADLINE_EXCEEDED");
}

#[tokio::test]
async fn the_limits_refusal_is_a_problem_with_its_wait() {
    let limit = AdaptiveLimitLayer::builder()
        .initial(1)
        .max(1)
        .retry_after(Duration::from_millis(1500))
        .problem_base(DOCS)
        .build()
        .unwrap();
    let gate = std::sync::Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let svc = limit.layer(service_fn(move |_req: Request<()>| {
        let g = g.clone();
        async move {
            let _permit = g.acquire().await.unwrap();
            Ok::<_, Infallible>(Response::new(stream("done")))
        }
    }));
    let first = tokio::spawn(svc.clone().oneshot(Request::new(())));
    while limit.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let (head, refusal, body) = read(svc.oneshot(Request::new(())).await.unwrap()).await;
    assert!(refusal);
    assert_eq!(head.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(head.headers["retry-after"], "2");
    assert_eq!(head.headers["surely-not-processed"], "overload");
    assert_eq!(
        head.headers["link"],
        format!("<{DOCS}overloaded>; rel=\"describedby\"")
    );
    let p = problem(&head, &body);
    assert_eq!(p["type"], format!("{DOCS}overloaded"));
    assert_eq!(p["title"], "Overloaded");
    assert_eq!(p["status"], 503);
    assert_eq!(p["code"], "OVERLOADED");
    gate.add_permits(1);
    let (_, refusal, body) = read(first.await.unwrap().unwrap()).await;
    assert!(!refusal);
    assert_eq!(body, "done");
}

#[tokio::test(start_paused = true)]
async fn grpc_refusals_stay_trailers_only() {
    let svc = ServerDeadlineLayer::new().layer(handler());
    let req = Request::post("/shop.Shop/Order")
        .header("content-type", "application/grpc")
        .header("grpc-timeout", "0m")
        .body(())
        .unwrap();
    let (head, refusal, body) = read(svc.oneshot(req).await.unwrap()).await;
    assert!(refusal);
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.headers["grpc-status"], "4");
    assert_eq!(head.headers["content-type"], "application/grpc");
    assert!(body.is_empty());
}

#[test]
fn a_base_that_is_not_an_absolute_uri_is_refused_at_build_time() {
    for bad in [
        "",
        "/problems/",
        "problems",
        "https://exa mple.com/",
        "https://e.com/<x>",
    ] {
        let e = ServerDeadlineLayer::builder()
            .problem_base(bad)
            .build()
            .unwrap_err();
        assert_eq!(e.setting(), "server deadline problem base", "{bad:?}");
        let e = AdaptiveLimitLayer::builder()
            .problem_base(bad)
            .build()
            .unwrap_err();
        assert_eq!(e.setting(), "limit problem base", "{bad:?}");
        let e = RecheckLayer::new(Duration::from_secs(1))
            .problem_base(bad)
            .unwrap_err();
        assert_eq!(e.setting(), "recheck problem base", "{bad:?}");
    }
    // From a file, refused by the field's path.
    let config: ServerConfig = toml::from_str(
        "[deadline]\nproblem_base = \"/problems/\"\n[limit]\nproblem_base = \"nope\"\n",
    )
    .unwrap();
    assert_eq!(
        config.deadline.layer().unwrap_err().setting(),
        "deadline.problem_base"
    );
    assert_eq!(
        config.limit.layer().unwrap_err().setting(),
        "limit.problem_base"
    );
    let config: ServerConfig = toml::from_str(&format!(
        "[deadline]\nproblem_base = \"{DOCS}\"\n[limit]\nproblem_base = \"{DOCS}\"\n"
    ))
    .unwrap();
    assert!(config.deadline.layer().is_ok());
    assert!(config.limit.layer().is_ok());
}

/// The classifier believes "not processed" from its header only: a problem's name in a `Link`
/// never makes a `504` safe to send again.
#[test]
fn not_processed_is_read_from_its_header_not_from_a_problem_link() {
    let classifier = HttpRequestClassifier::new(Semantics::NonIdempotent, false);
    let mut headers = http::HeaderMap::new();
    headers.insert("content-type", "application/problem+json".parse().unwrap());
    headers.insert(
        "link",
        format!("<{DOCS}deadline-exceeded>; rel=\"describedby\"")
            .parse()
            .unwrap(),
    );
    let c = classifier.classify_status(StatusCode::GATEWAY_TIMEOUT, &headers);
    assert_eq!(c.class(), AttemptClass::MaybeCommitted);
    headers.insert("surely-not-processed", "deadline".parse().unwrap());
    let c = classifier.classify_status(StatusCode::GATEWAY_TIMEOUT, &headers);
    assert_eq!(c.class(), AttemptClass::Rejected);
}
