//! The IETF `Idempotency-Key` draft (draft-ietf-httpapi-idempotency-key-header-06), line by
//! line: a test for each of its MUST and SHOULD lines that the idempotency layer implements,
//! named by the draft's section, and the problem details (RFC 9457) of the layer's answers.
//!
//! Lines the layer leaves to others: the client's (a unique key per intent, §2.2 and §2.5:
//! surely's client generates one per call and reuses it on every attempt, tested with the
//! client), and publishing the key's specification and expiry (§2.3, §2.5, §5: the service's
//! documentation, which `problem_base` links each answer to).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use surely::server::idempotency::{ErrorCode, IdempotencyLayer, IdempotencyLayerBuilder};
use surely::server::store::MemoryStore;
use tokio::sync::Semaphore;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

type Req = Request<Full<Bytes>>;
type Res = Response<Full<Bytes>>;

const DOCS: &str = "https://api.example.com/problems/";

/// What came back, with the problem details read.
struct Got {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Got {
    fn problem(&self) -> Value {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "not a problem: {:?}",
            self.headers
        );
        serde_json::from_slice(&self.body).expect("the body is JSON")
    }

    fn code(&self) -> &str {
        self.headers["idempotency-error"].to_str().unwrap()
    }
}

/// A handler that counts its runs and answers 201 (422 for a body of `bad`), each run waiting
/// for a permit of `gate` first.
fn handler(
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
) -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone + Send + 'static {
    gated(runs, gate, Arc::new(AtomicUsize::new(0)))
}

/// [`handler`], counting in `entered` the runs that reached the gate.
fn gated(
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    entered: Arc<AtomicUsize>,
) -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone + Send + 'static {
    service_fn(move |req: Req| {
        let runs = runs.clone();
        let gate = gate.clone();
        let entered = entered.clone();
        async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            entered.fetch_add(1, Ordering::SeqCst);
            let _permit = gate.acquire().await.unwrap();
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let status = if &body[..] == b"bad" { 422 } else { 201 };
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(Full::new(Bytes::from(format!("order {n}"))))
                    .unwrap(),
            )
        }
    })
}

fn layer() -> IdempotencyLayerBuilder<MemoryStore> {
    IdempotencyLayer::builder(MemoryStore::new())
        .require_key_for([http::Method::POST])
        .problem_base(DOCS)
}

fn post(key: Option<&str>, body: &'static str) -> Req {
    let mut b = Request::post("/orders");
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn send<S>(svc: &S, req: Req) -> Got
where
    S: Service<Req, Response = Res> + Clone,
    S::Error: Into<BoxError>,
{
    let res = svc.clone().oneshot(req).await.map_err(Into::into).unwrap();
    let (parts, body) = res.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// The problem details of `got` are RFC 9457's, for `code`, linked to the service's docs.
fn assert_problem(got: &Got, code: ErrorCode) {
    let p = got.problem();
    let name = code.as_str().to_lowercase().replace('_', "-");
    let type_uri = format!("{DOCS}{name}");
    assert_eq!(p["type"], type_uri.as_str(), "{p}");
    assert_eq!(p["title"], code.title(), "{p}");
    assert_eq!(p["status"], got.status.as_u16(), "{p}");
    assert_eq!(got.status, code.status());
    assert!(p["detail"].as_str().is_some_and(|d| !d.is_empty()), "{p}");
    assert_eq!(p["code"], code.as_str(), "{p}");
    assert_eq!(got.code(), code.as_str());
    assert_eq!(
        got.headers["link"],
        format!("<{type_uri}>; rel=\"describedby\"").as_str()
    );
}

fn open() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(Semaphore::MAX_PERMITS))
}

/// The layer `builder` builds around a [`handler`] that never waits, and its count of runs.
fn service(
    builder: IdempotencyLayerBuilder<MemoryStore>,
) -> (
    impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone + Send + 'static,
    Arc<AtomicUsize>,
) {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = builder
        .build()
        .unwrap()
        .layer(handler(runs.clone(), open()));
    (svc, runs)
}

/// §2.1 Syntax: "Clients MUST NOT include more than one `Idempotency-Key` header field in the
/// same request." The layer refuses such a request before the handler.
#[tokio::test]
async fn s2_1_a_request_with_two_keys_is_refused() {
    let (svc, runs) = service(layer());
    let mut req = post(Some("k-1"), "o-1");
    req.headers_mut()
        .append("idempotency-key", "k-2".parse().unwrap());
    let got = send(&svc, req).await;
    assert_problem(&got, ErrorCode::KeyInvalid);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// §2.1 Syntax: the value is a String (`sf-string`): a quoted key is a key like any other,
/// compared as sent.
#[tokio::test]
async fn s2_1_a_quoted_key_is_a_key() {
    let (svc, runs) = service(layer());
    let key = "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"";
    let first = send(&svc, post(Some(key), "o-1")).await;
    let again = send(&svc, post(Some(key), "o-1")).await;
    assert_eq!(
        (first.status, again.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert_eq!(first.body, again.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// §2.3 Validity and Expiry: "The resource MAY enforce time based idempotency keys": a key
/// past its retention is answered `410` with its problem, not run again.
#[tokio::test(start_paused = true)]
async fn s2_3_a_key_past_its_retention_is_refused_with_its_problem() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = layer()
        .retention(Duration::from_secs(60))
        .build()
        .unwrap()
        .layer(handler(runs.clone(), open()));
    assert_eq!(
        send(&svc, post(Some("k-1"), "o-1")).await.status,
        StatusCode::CREATED
    );
    tokio::time::advance(Duration::from_secs(61)).await;
    let got = send(&svc, post(Some("k-1"), "o-1")).await;
    assert_problem(&got, ErrorCode::KeyExpired);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// §2.6 Enforcement, first time request: "The resource server SHOULD process the request
/// normally and respond with an appropriate response and status code."
#[tokio::test]
async fn s2_6_a_first_request_is_processed_normally() {
    let (svc, runs) = service(layer());
    let got = send(&svc, post(Some("k-1"), "o-1")).await;
    assert_eq!(got.status, StatusCode::CREATED);
    assert_eq!(&got.body[..], b"order 1");
    assert!(got.headers.get("idempotent-replayed").is_none());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// §2.6 Enforcement, retry: "The resource server SHOULD respond with the result of the
/// previously completed operation, success or an error."
#[tokio::test]
async fn s2_6_a_retry_after_completion_gets_the_first_result_success_or_error() {
    let (svc, runs) = service(layer());
    for (key, body, status) in [("k-ok", "o-1", 201), ("k-no", "bad", 422)] {
        let first = send(&svc, post(Some(key), body)).await;
        let again = send(&svc, post(Some(key), body)).await;
        assert_eq!(first.status.as_u16(), status);
        assert_eq!((again.status, &again.body), (first.status, &first.body));
        assert_eq!(again.headers["idempotent-replayed"], "true");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// §2.6 Enforcement, concurrent request: "The resource server MUST respond with a resource
/// conflict error." §2.7: "SHOULD reply with an HTTP `409` status code with body containing
/// problem description."
#[tokio::test]
async fn s2_6_and_s2_7_a_retry_while_the_first_runs_is_409_with_its_problem() {
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let svc = layer()
        .build()
        .unwrap()
        .layer(gated(runs.clone(), gate.clone(), entered.clone()));
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { send(&svc, post(Some("k-1"), "o-1")).await }
    });
    // The first request holds the key while its handler waits at the gate.
    for _ in 0..10_000 {
        if entered.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        entered.load(Ordering::SeqCst),
        1,
        "the first request reached its handler"
    );
    let got = send(&svc, post(Some("k-1"), "o-1")).await;
    assert_problem(&got, ErrorCode::KeyInFlight);
    assert!(got.headers.contains_key("retry-after"));
    gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// §2.7 Error Scenarios: "If the `Idempotency-Key` request header is missing for a documented
/// idempotent operation requiring this header, the resource server SHOULD reply with an HTTP
/// `400` status code with body containing a link pointing to relevant documentation."
#[tokio::test]
async fn s2_7_a_missing_key_is_400_with_a_link_to_the_docs() {
    let (svc, runs) = service(layer());
    let got = send(&svc, post(None, "o-1")).await;
    assert_problem(&got, ErrorCode::KeyMissing);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// §2.7 Error Scenarios: "If there is an attempt to reuse an idempotency key with a different
/// request payload, the resource server SHOULD reply with a HTTP `422` status code with body
/// containing a link pointing to relevant documentation." (§2.2: the key "MUST NOT be reused
/// with another request with a different request payload"; §2.4: the fingerprint is the
/// body's digest.)
#[tokio::test]
async fn s2_7_a_key_reused_with_another_payload_is_422_with_a_link_to_the_docs() {
    let (svc, runs) = service(layer());
    assert_eq!(
        send(&svc, post(Some("k-1"), "o-1")).await.status,
        StatusCode::CREATED
    );
    let got = send(&svc, post(Some("k-1"), "o-2")).await;
    assert_problem(&got, ErrorCode::KeyMismatch);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// §2.7: "Clients MUST correct the requests (with the exception of 409 where no correction is
/// required) before performing a retry operation, or the resource server MUST fail the
/// request and return one of the above errors." An uncorrected retry fails the same way; a
/// corrected one goes through.
#[tokio::test]
async fn s2_7_an_uncorrected_retry_fails_again_and_a_corrected_one_passes() {
    let (svc, runs) = service(layer());
    for _ in 0..2 {
        assert_problem(&send(&svc, post(None, "o-1")).await, ErrorCode::KeyMissing);
    }
    assert_eq!(
        send(&svc, post(Some("k-1"), "o-1")).await.status,
        StatusCode::CREATED
    );
    for _ in 0..2 {
        let got = send(&svc, post(Some("k-1"), "o-2")).await;
        assert_problem(&got, ErrorCode::KeyMismatch);
    }
    assert_eq!(
        send(&svc, post(Some("k-2"), "o-2")).await.status,
        StatusCode::CREATED
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// §5 Security: "Always validate the key as per its published specification before
/// processing any request." A key that is not visible ASCII, or too long, is refused before the
/// handler, and the detail does not repeat it.
#[tokio::test]
async fn s5_a_key_is_validated_before_any_processing_and_not_repeated() {
    let (svc, runs) = service(layer());
    let long = "secret".repeat(50);
    for key in [long.as_str(), "sec ret"] {
        let got = send(&svc, post(Some(key), "o-1")).await;
        assert_problem(&got, ErrorCode::KeyInvalid);
        let body = String::from_utf8_lossy(&got.body);
        assert!(
            !body.contains("secret") && !body.contains("sec ret"),
            "{body}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// §5 Security: "implement a unique composite key as the idempotent cache lookup key": one key
/// from two tenants is two records.
#[tokio::test]
async fn s5_one_key_from_two_tenants_is_two_records() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = layer()
        .tenant(|parts: &http::request::Parts| {
            parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .build()
        .unwrap()
        .layer(handler(runs.clone(), open()));
    for tenant in ["a", "b"] {
        let mut req = post(Some("k-1"), "o-1");
        req.headers_mut()
            .insert("x-tenant", tenant.parse().unwrap());
        assert_eq!(send(&svc, req).await.status, StatusCode::CREATED);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

// ---- RFC 9457 ----------------------------------------------------------------------------

/// Every code the layer answers with is a problem with its title and status; without a base
/// of the service's own, its type is a heading of the crate's docs and no `Link` is sent.
#[tokio::test]
async fn without_a_base_the_types_point_at_the_crates_docs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let svc = IdempotencyLayer::builder(MemoryStore::new())
        .require_key_for([http::Method::POST])
        .build()
        .unwrap()
        .layer(handler(runs, open()));
    let got = send(&svc, post(None, "o-1")).await;
    let p = got.problem();
    assert_eq!(
        p["type"],
        "https://docs.rs/surely/latest/surely/server/problem/index.html#idempotency-key-missing"
    );
    assert!(got.headers.get("link").is_none());
    // Every code's heading is on that page.
    let page = include_str!("../../src/server/problem.rs");
    for code in ErrorCode::all() {
        let name = code.as_str().to_lowercase().replace('_', "-");
        assert!(
            page.contains(&format!("//! ### {name}\n")),
            "no heading for {name}"
        );
    }
}

/// A base that is not an absolute URI is refused when the layer is built, from code and from
/// the configuration.
#[test]
fn a_base_that_is_not_an_absolute_uri_is_a_configuration_error() {
    for bad in [
        "",
        "problems/",
        "/problems",
        "https://exa mple.com/",
        "https://x.com/<a>",
    ] {
        let err = layer().problem_base(bad).build().unwrap_err();
        assert_eq!(err.setting(), "idempotency problem base", "{bad}");
    }
    let config: surely::server::config::IdempotencyConfig =
        toml::from_str("problem_base = \"not a uri\"").unwrap();
    let err = config.layer(MemoryStore::new()).unwrap_err();
    assert_eq!(err.setting(), "idempotency.problem_base");
    let config: surely::server::config::IdempotencyConfig =
        toml::from_str("problem_base = \"https://api.example.com/p/\"").unwrap();
    assert!(config.layer(MemoryStore::new()).is_ok());
}

/// surely's classifier reads the "outcome unknown" answer from its header, or, when a gateway
/// kept only the problem details' `Link`, from the problem type it links: maybe committed, do
/// not retry. Any other problem, or a `Link` of another relation, is a plain `202`.
#[test]
fn the_classifier_reads_the_header_or_the_linked_problem_type() {
    use surely::classify::{AttemptClass, HttpRequestClassifier};
    use surely::pushback::Pushback;

    let classify = |pairs: &[(&str, &str)]| {
        let mut headers = http::HeaderMap::new();
        for (n, v) in pairs {
            headers.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        HttpRequestClassifier::new(surely::Semantics::Keyed, false)
            .classify_status(StatusCode::ACCEPTED, &headers)
    };
    let unknown = |c: &surely::classify::Classification| {
        c.class() == AttemptClass::MaybeCommitted && c.pushback() == Some(Pushback::Stop)
    };
    assert!(unknown(&classify(&[(
        "idempotency-error",
        "IDEMPOTENCY_OUTCOME_UNKNOWN"
    )])));
    let link =
        "<https://api.example.com/problems/idempotency-outcome-unknown>; rel=\"describedby\"";
    assert!(unknown(&classify(&[
        ("content-type", "application/problem+json"),
        ("link", link),
    ])));
    for other in [
        vec![("content-type", "application/json"), ("link", link)],
        vec![
            ("content-type", "application/problem+json"),
            (
                "link",
                "<https://api.example.com/problems/idempotency-outcome-unknown>; rel=\"next\"",
            ),
        ],
        vec![
            ("content-type", "application/problem+json"),
            (
                "link",
                "<https://api.example.com/problems/other>; rel=\"describedby\"",
            ),
        ],
        vec![
            ("idempotency-error", "IDEMPOTENCY_KEY_IN_FLIGHT"),
            ("link", link),
        ],
    ] {
        assert_eq!(classify(&other).class(), AttemptClass::Success, "{other:?}");
    }
}
