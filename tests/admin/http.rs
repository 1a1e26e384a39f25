//! The admin's router served on 127.0.0.1 by axum, driven by a hyper client: the pages, the
//! JSON API, every refusal (no authorization, read only, no or a wrong CSRF token, the API
//! without its header) and hostile input (HTML, control characters, a 1 MB body, bad ids).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::admin::{Access, Admin, AuditAction, AuditLog, Authorize};
use surely::classify::{AttemptClass, DeliveryPhase};
use surely::ledger::{
    AttemptEvidence, EntryId, EntryState, Evidence, Ledger, MemoryLedger, SettledBy, Verdict,
};
use surely::outbox::{Event, EventId, MemoryOutbox, OutboxStore, Relay};
use tower::service_fn;

/// Serves `app` on 127.0.0.1 (with the peer's address, for the loopback hook) until the test
/// ends.
pub(crate) async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: String,
}

/// One request; `headers` as pairs.
pub(crate) async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let res = client
        .request(req.body(Full::new(body.into())).unwrap())
        .await
        .unwrap();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn get(addr: SocketAddr, path: &str, who: Option<&str>) -> Answer {
    let headers: Vec<(&str, &str)> = who.map(|w| ("x-operator", w)).into_iter().collect();
    send(addr, Method::GET, path, &headers, Bytes::new()).await
}

/// A form POST as `who`.
async fn post_form(addr: SocketAddr, path: &str, who: &str, form: &str) -> Answer {
    send(
        addr,
        Method::POST,
        path,
        &[
            ("x-operator", who),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
        form.to_owned(),
    )
    .await
}

/// A JSON POST as `who`, with the API's header.
async fn post_json(addr: SocketAddr, path: &str, who: &str, json: &str) -> Answer {
    send(
        addr,
        Method::POST,
        path,
        &[
            ("x-operator", who),
            ("content-type", "application/json"),
            ("x-surely-admin", "1"),
        ],
        json.to_owned(),
    )
    .await
}

/// The hook of the tests: `x-operator: name` acts, `x-operator: ro:name` reads.
fn by_header() -> Authorize {
    Authorize::new(|parts: &http::request::Parts| {
        match parts
            .headers
            .get("x-operator")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        {
            // A hook that hands on what it should not: a name with an escape sequence.
            Some(who) if who == "evil" => Access::act("ev\u{1b}[2Jil"),
            Some(who) => match who.strip_prefix("ro:") {
                Some(name) => Access::read(name),
                None => Access::act(who),
            },
            None => Access::Denied,
        }
    })
}

/// The CSRF token in a page's form.
pub(crate) fn token(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("the page has a form with a token");
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// A manual entry with two attempts; its key as given.
pub(crate) async fn manual_entry(ledger: &MemoryLedger, id: &str, key: &str) -> EntryId {
    let t0 = std::time::SystemTime::now() - Duration::from_secs(90);
    let evidence = Evidence::new(key, "POST /orders")
        .with_id(EntryId::new(id).unwrap())
        .with_attempt(
            AttemptEvidence::new(
                1,
                t0,
                Duration::from_millis(1500),
                AttemptClass::MaybeCommitted,
                DeliveryPhase::Sent,
            )
            .with_downstream_id("req-a1"),
        )
        .with_attempt(AttemptEvidence::new(
            2,
            t0 + Duration::from_secs(2),
            Duration::from_millis(2000),
            AttemptClass::MaybeCommitted,
            DeliveryPhase::Sent,
        ));
    ledger.record(&evidence).await.unwrap();
    let claim = ledger
        .claim(1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    ledger
        .to_manual(&claim, "the order service cannot be queried")
        .await
        .unwrap();
    evidence.id
}

/// An outbox with one quarantined event per id.
pub(crate) async fn quarantined(ids: &[&str]) -> MemoryOutbox {
    let outbox = MemoryOutbox::new();
    for id in ids {
        outbox.enqueue(
            Event::new(
                EventId::new(*id).unwrap(),
                "order o-1",
                1,
                "OrderCreated",
                "{\"o\":1}",
            )
            .unwrap(),
        );
    }
    let refuse =
        service_fn(|_: Event| async { Err::<(), _>(std::io::Error::other("broker down")) });
    let mut relay = Relay::builder(outbox.clone(), refuse)
        .quarantine_after(1)
        .build()
        .unwrap();
    relay.run_once().await.unwrap();
    outbox
}

struct Fixture {
    addr: SocketAddr,
    ledger: MemoryLedger,
    outbox: MemoryOutbox,
    audit: AuditLog,
}

async fn fixture() -> Fixture {
    let ledger = MemoryLedger::new();
    let outbox = quarantined(&["evt-a", "evt-b"]).await;
    let audit = AuditLog::memory();
    let admin = Admin::builder()
        .ledger(ledger.clone())
        .outbox(outbox.clone())
        .idempotency(surely::server::store::MemoryStore::new())
        .audit(audit.clone())
        .authorize(by_header())
        .build();
    let addr = serve(Router::new().nest("/admin", admin.router())).await;
    Fixture {
        addr,
        ledger,
        outbox,
        audit,
    }
}

#[tokio::test]
async fn without_an_authorization_hook_everything_is_refused() {
    let admin = Admin::builder().ledger(MemoryLedger::new()).build();
    let addr = serve(admin.router()).await;
    for path in ["/", "/ledger", "/audit", "/api/counts", "/nothing"] {
        let a = get(addr, path, Some("ana")).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let a = get(addr, "/api/ledger", None).await;
    assert!(a.body.contains("\"error\""), "{}", a.body);
    let a = post_json(
        addr,
        "/api/ledger/unk-1/settle",
        "ana",
        r#"{"verdict":"failed","why":"x"}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    // The hook's own refusal too.
    let f = fixture().await;
    assert_eq!(
        get(f.addr, "/admin", None).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn an_operator_lists_opens_and_settles_an_entry() {
    let f = fixture().await;
    let id = manual_entry(&f.ledger, "unk-1", "o-1").await;
    let index = get(f.addr, "/admin", Some("ana")).await;
    assert_eq!(index.status, StatusCode::OK);
    assert!(
        index.body.contains("id=\"count-manual\">1<"),
        "{}",
        index.body
    );
    assert_eq!(index.headers["x-frame-options"], "DENY");
    assert!(index.headers["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));

    let queue = get(f.addr, "/admin/ledger?state=manual", Some("ana")).await;
    assert!(
        queue.body.contains("href=\"/admin/ledger/unk-1\""),
        "{}",
        queue.body
    );
    let page = get(f.addr, "/admin/ledger/unk-1", Some("ana")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("req-a1"), "every attempt's evidence");
    assert!(page.body.contains("the order service cannot be queried"));
    let csrf = token(&page.body);

    let done = post_form(
        f.addr,
        "/admin/ledger/unk-1/settle",
        "ana",
        &format!("csrf={csrf}&verdict=succeeded&why=found+in+the+order+table"),
    )
    .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(done.headers["location"], "/admin/ledger/unk-1");
    let entry = f.ledger.get(&id).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Settled);
    let s = entry.settlement.unwrap();
    assert_eq!(
        (s.verdict, s.by),
        (Verdict::Succeeded, SettledBy::Manual { who: "ana".into() })
    );
    assert_eq!(s.evidence, "found in the order table");
    let queue = get(f.addr, "/admin/ledger?state=manual", Some("ana")).await;
    assert!(!queue.body.contains("unk-1"), "left the queue");

    let audit = f.audit.list(10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (
            audit[0].who.as_str(),
            audit[0].action,
            audit[0].target.as_str(),
            audit[0].outcome.as_deref()
        ),
        ("ana", AuditAction::Settle, "unk-1", Some("done"))
    );
    let page = get(f.addr, "/admin/audit", Some("ro:bo")).await;
    assert!(page.body.contains("found in the order table") && page.body.contains("ledger.settle"));
    let json = get(f.addr, "/admin/api/audit", Some("ro:bo")).await;
    assert!(json.body.contains("\"who\":\"ana\""), "{}", json.body);

    // Settled twice: a conflict, audited as refused.
    let again = post_form(
        f.addr,
        "/admin/ledger/unk-1/settle",
        "ana",
        &format!("csrf={csrf}&verdict=failed&why=again"),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert!(f.audit.list(1).await.unwrap()[0]
        .outcome
        .as_deref()
        .unwrap()
        .starts_with("refused (conflict): ledger entry unk-1 was already settled"));
}

#[tokio::test]
async fn actions_need_act_access_and_their_csrf_token() {
    let f = fixture().await;
    let id = manual_entry(&f.ledger, "unk-2", "o-2").await;
    let page = get(f.addr, "/admin/ledger/unk-2", Some("ana")).await;
    let csrf = token(&page.body);
    let form = |t: &str| format!("csrf={t}&verdict=failed&why=not+there");
    // Read only: no form, and the action refused.
    let ro = get(f.addr, "/admin/ledger/unk-2", Some("ro:bo")).await;
    assert!(!ro.body.contains("name=\"csrf\""));
    let a = post_form(f.addr, "/admin/ledger/unk-2/settle", "ro:bo", &form(&csrf)).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    // No token, a wrong one, another operator's.
    let bo = token(&get(f.addr, "/admin/ledger/unk-2", Some("bo")).await.body);
    for t in ["", "00", &"0".repeat(64), &bo] {
        let a = post_form(f.addr, "/admin/ledger/unk-2/settle", "ana", &form(t)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "token {t:?}");
        assert!(a.body.contains("CSRF"), "{}", a.body);
    }
    // The API: its header and JSON, or 403.
    let body = r#"{"verdict":"failed","why":"not there"}"#;
    let path = "/admin/api/ledger/unk-2/settle";
    let no_header = send(
        f.addr,
        Method::POST,
        path,
        &[("x-operator", "ana"), ("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!(no_header.status, StatusCode::FORBIDDEN);
    let as_form = send(
        f.addr,
        Method::POST,
        path,
        &[
            ("x-operator", "ana"),
            ("x-surely-admin", "1"),
            ("content-type", "text/plain"),
        ],
        body,
    )
    .await;
    assert_eq!(as_form.status, StatusCode::FORBIDDEN);
    assert_eq!(
        f.ledger.get(&id).await.unwrap().unwrap().state,
        EntryState::Manual
    );
    assert!(
        f.audit.list(10).await.unwrap().is_empty(),
        "nothing refused is acted on"
    );
    // A GET never acts.
    assert_eq!(
        get(f.addr, "/admin/ledger/unk-2/settle", Some("ana"))
            .await
            .status,
        StatusCode::METHOD_NOT_ALLOWED
    );

    let ok = post_json(f.addr, path, "ana", body).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(
        f.ledger.get(&id).await.unwrap().unwrap().state,
        EntryState::Settled
    );
}

#[tokio::test]
async fn hostile_input_is_refused_or_inert() {
    let f = fixture().await;
    manual_entry(&f.ledger, "unk-3", "<script>alert('key')</script>").await;
    let page = get(f.addr, "/admin/ledger/unk-3", Some("ana")).await;
    assert!(
        page.body.contains("&#60;script&#62;alert(&#39;key&#39;)"),
        "escaped"
    );
    assert!(!page.body.contains("<script>"), "inert");
    let csrf = token(&page.body);
    let path = "/admin/ledger/unk-3/settle";
    // A reason with a control character; one too long; a 1 MB body.
    let a = post_form(
        f.addr,
        path,
        "ana",
        &format!("csrf={csrf}&verdict=failed&why=a%1B%5B2Jb"),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert!(
        a.body.contains("why holds a control character"),
        "{}",
        a.body
    );
    let long = "y".repeat(16 * 1024 + 1);
    let a = post_form(
        f.addr,
        path,
        "ana",
        &format!("csrf={csrf}&verdict=failed&why={long}"),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    let huge = "z".repeat(1024 * 1024);
    let a = post_form(
        f.addr,
        path,
        "ana",
        &format!("csrf={csrf}&verdict=failed&why={huge}"),
    )
    .await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    let a = post_json(
        f.addr,
        "/admin/api/ledger/unk-3/settle",
        "ana",
        &format!(r#"{{"verdict":"failed","why":"{huge}"}}"#),
    )
    .await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    // HTML in a reason: kept as text, shown inert.
    let a = post_form(
        f.addr,
        path,
        "ana",
        &format!("csrf={csrf}&verdict=failed&why=%3Cimg+src%3Dx+onerror%3Dalert(1)%3E"),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    let audit = get(f.addr, "/admin/audit", Some("ana")).await;
    assert!(audit.body.contains("&#60;img src=x onerror=alert(1)&#62;"));
    assert!(!audit.body.contains("<img"));
    // A bad verdict, a bad id, an unknown id, malformed JSON.
    let a = post_form(
        f.addr,
        "/admin/ledger/unk-9/settle",
        "ana",
        &format!("csrf={csrf}&verdict=maybe&why=x"),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        get(f.addr, "/admin/ledger/bad%20id!", Some("ana"))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get(f.addr, "/admin/ledger/unk-none", Some("ana"))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(f.addr, "/admin/api/outbox/evt-none", Some("ana"))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(f.addr, "/admin/ledger?state=nope", Some("ana"))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    let a = post_json(f.addr, "/admin/api/ledger/unk-3/retry", "ana", "{not json").await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST);
    // An operator's name the log cannot keep.
    let a = get(f.addr, "/admin", Some("evil")).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
}

/// `docs::operators`' limits, at their edges: a body of 64 KiB is read and one byte more is
/// `413`; a why of 16 KiB is taken (one byte more is `400`, above); an operator's name of 256
/// bytes is kept and one of 257 is `403`.
#[tokio::test]
async fn the_limits_are_where_the_chapter_puts_them() {
    let f = fixture().await;
    manual_entry(&f.ledger, "unk-4", "o-4").await;
    let csrf = token(&get(f.addr, "/admin/ledger/unk-4", Some("ana")).await.body);
    let path = "/admin/ledger/unk-4/settle";
    let form = |len: usize| {
        let head = format!("csrf={csrf}&verdict=failed&why=");
        format!("{head}{}", "y".repeat(len - head.len()))
    };
    // Read, and refused for its why, too long; not read.
    let a = post_form(f.addr, path, "ana", &form(64 * 1024)).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    let a = post_form(f.addr, path, "ana", &form(64 * 1024 + 1)).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    let why = "y".repeat(16 * 1024);
    let a = post_form(
        f.addr,
        path,
        "ana",
        &format!("csrf={csrf}&verdict=failed&why={why}"),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);

    let name = "o".repeat(256);
    assert_eq!(
        get(f.addr, "/admin", Some(&name)).await.status,
        StatusCode::OK
    );
    let name = "o".repeat(257);
    assert_eq!(
        get(f.addr, "/admin", Some(&name)).await.status,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn the_quarantine_is_inspected_requeued_and_discarded() {
    let f = fixture().await;
    let list = get(f.addr, "/admin/outbox", Some("ana")).await;
    assert!(
        list.body.contains("evt-a") && list.body.contains("broker down"),
        "{}",
        list.body
    );
    let json = get(f.addr, "/admin/api/outbox", Some("ro:bo")).await;
    assert!(json.body.contains("\"failures\":1"), "{}", json.body);
    let page = get(f.addr, "/admin/outbox/evt-b", Some("ana")).await;
    assert!(page.body.contains("{&#34;o&#34;:1}"), "{}", page.body);
    let csrf = token(&page.body);

    let a = post_json(
        f.addr,
        "/admin/api/outbox/evt-a/requeue",
        "ana",
        r#"{"why":"the broker is back"}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let a = post_form(
        f.addr,
        "/admin/outbox/evt-b/discard",
        "ana",
        &format!("csrf={csrf}&why=a+test+event"),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    assert!(f.outbox.quarantined_now(10).is_empty());
    assert_eq!(f.outbox.stats().await.unwrap().backlog, 1);
    let a = post_form(
        f.addr,
        "/admin/outbox/evt-b/discard",
        "ana",
        &format!("csrf={csrf}&why=again"),
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let lines = f.audit.list(10).await.unwrap();
    let seen: Vec<_> = lines
        .iter()
        .map(|l| (l.action, l.target.as_str(), l.outcome.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                AuditAction::Discard,
                "evt-b",
                Some("refused (not found): no quarantined outbox event evt-b")
            ),
            (AuditAction::Discard, "evt-b", Some("done")),
            (AuditAction::Requeue, "evt-a", Some("done")),
        ]
    );
    let counts = get(f.addr, "/admin/api/counts", Some("ana")).await;
    assert!(counts.body.contains("\"quarantined\":0"), "{}", counts.body);
    assert_eq!(
        get(f.addr, "/admin/idempotency", Some("ana")).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn retry_now_sends_an_entry_back_and_the_dev_hook_wants_loopback() {
    let ledger = MemoryLedger::new();
    let id = manual_entry(&ledger, "unk-4", "o-4").await;
    let admin = Admin::builder()
        .ledger(ledger.clone())
        .authorize(Authorize::dev_allow_all_from_loopback())
        .build();
    let addr = serve(admin.router()).await;
    let page = get(addr, "/ledger/unk-4", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("dev@127.0.0.1"));
    let csrf = token(&page.body);
    let a = post_form(
        addr,
        "/ledger/unk-4/retry",
        "",
        &format!("csrf={csrf}&why=the+service+is+back"),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER, "{}", a.body);
    assert_eq!(a.headers["location"], "/ledger/unk-4");
    let entry = ledger.get(&id).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Open);
    assert_eq!(
        entry.note.as_deref(),
        Some("sent back by dev@127.0.0.1: the service is back")
    );
    // A page whose name was made to resolve to 127.0.0.1 (DNS rebinding) names its own host:
    // refused, so that it cannot read the pages or their tokens.
    for host in [
        "evil.example",
        "evil.example:80",
        "127.0.0.1.evil.example",
        "bad host",
    ] {
        let page = send(
            addr,
            Method::GET,
            "/ledger/unk-4",
            &[("host", host)],
            Bytes::new(),
        )
        .await;
        assert_eq!(page.status, StatusCode::UNAUTHORIZED, "host {host}");
    }
    for host in ["localhost", "LOCALHOST:8080", "127.0.0.1", "[::1]:9"] {
        let page = send(
            addr,
            Method::GET,
            "/ledger/unk-4",
            &[("host", host)],
            Bytes::new(),
        )
        .await;
        assert_eq!(page.status, StatusCode::OK, "host {host}");
    }
    // Without the peer's address (served without connect info): refused.
    let admin = Admin::builder()
        .ledger(ledger)
        .authorize(Authorize::dev_allow_all_from_loopback())
        .build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, admin.router()).await.unwrap() });
    assert_eq!(get(plain, "/", None).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_reconciliation_difference_is_inspected_and_resolved() {
    use surely::reconcile::{
        Difference, DifferenceStore, ItemState, MemoryDifferences, Seen, SeenFact,
    };
    let differences = MemoryDifferences::new();
    let now = std::time::SystemTime::now();
    let diff = Difference::new(
        "payment_without_order",
        "<b>o-9</b>",
        vec![
            Seen::new("payments", Some(SeenFact::new("captured 42.00", 3, now))),
            Seen::new("orders", None),
        ],
        None,
    );
    differences.record(&diff).await.unwrap();
    let audit = AuditLog::memory();
    let admin = Admin::builder()
        .differences(differences.clone())
        .audit(audit.clone())
        .authorize(by_header())
        .build();
    let addr = serve(admin.router()).await;
    let index = get(addr, "/", Some("ana")).await;
    assert!(index
        .body
        .contains("reconciliation differences in the manual queue"));
    let list = get(addr, "/differences", Some("ana")).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert!(list.body.contains(diff.id.as_str()));
    let page = get(addr, &format!("/differences/{}", diff.id), Some("ana")).await;
    assert!(page.body.contains("captured 42.00") && page.body.contains("(nothing)"));
    assert!(!page.body.contains("<b>o-9"), "the key is shown inert");
    let json = get(addr, "/api/differences?state=all", Some("ro:bo")).await;
    assert!(
        json.body.contains("\"rule\":\"payment_without_order\""),
        "{}",
        json.body
    );
    assert_eq!(
        get(addr, "/differences/not-an-id", Some("ana"))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );

    let path = format!("/api/differences/{}/resolve", diff.id);
    let a = post_json(
        addr,
        &path,
        "ana",
        r#"{"why":"refunded by hand, ticket 311"}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let item = differences.get(&diff.id).await.unwrap().unwrap();
    assert_eq!(item.state, ItemState::Resolved);
    assert_eq!(item.who.as_deref(), Some("ana"));
    let again = post_json(addr, &path, "ana", r#"{"why":"again"}"#).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let lines = audit.list(10).await.unwrap();
    assert_eq!(lines[1].action, AuditAction::Resolve);
    assert_eq!(lines[1].outcome.as_deref(), Some("done"));
}

/// A stuck age past `MAX_DURATION` is taken as ten years: the PostgreSQL store can look that
/// far back, where `Duration::MAX` made its query fail ("timestamp out of range") and the
/// idempotency page answer 503.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_stuck_age_past_ten_years_is_clamped_and_the_store_answers() {
    use crate::support::names::unique;
    use crate::support::postgres::{self, did_not_answer};
    use surely::server::store::PostgresStore;

    let test = "a_stuck_age_past_ten_years_is_clamped_and_the_store_answers";
    let table = unique("surely_admin_stuck");
    let pool = postgres::pool();
    let store = PostgresStore::new(pool.clone()).with_table(&table).unwrap();
    store
        .migrate()
        .await
        .unwrap_or_else(|e| did_not_answer(test, e));
    let admin = Admin::builder()
        .idempotency(store)
        .stuck_after(Duration::MAX)
        .authorize(by_header())
        .build();
    let addr = serve(Router::new().nest("/admin", admin.router())).await;
    let answer = get(addr, "/admin/api/idempotency", Some("ro:bo")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let ten_years = surely::MAX_DURATION.as_secs();
    assert!(
        answer
            .body
            .contains(&format!("\"stuck_after_secs\":{ten_years}")),
        "{}",
        answer.body
    );
    postgres::forget(&pool, &[&table], &[&table]).await;
}

/// The idempotency page tells an abandoned record (processing, its owner's lease passed) from
/// one whose owner still holds it, and the overview counts the abandoned ones.
#[tokio::test]
async fn the_idempotency_page_shows_which_stuck_records_are_abandoned() {
    use surely::idempotency::IdempotencyKey;
    use surely::server::store::{IdempotencyStore, MemoryStore, RecordKey, RequestDigest};

    let store = MemoryStore::new();
    let digest = RequestDigest::of(b"o-1");
    let record = |k: &str| RecordKey::new("", "POST /orders", IdempotencyKey::new(k).unwrap());
    // A lease of zero has passed as soon as it is taken: the owner is as good as dead.
    store
        .acquire(&record("k-dead"), &digest, Duration::ZERO)
        .await
        .unwrap();
    store
        .acquire(&record("k-live"), &digest, Duration::from_secs(3600))
        .await
        .unwrap();
    let admin = Admin::builder()
        .idempotency(store)
        .stuck_after(Duration::ZERO)
        .authorize(by_header())
        .build();
    let addr = serve(Router::new().nest("/admin", admin.router())).await;
    let answer = get(addr, "/admin/api/idempotency", Some("ro:bo")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let view: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    let mut leases: Vec<(String, String)> = view["stuck"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["lease"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    leases.sort();
    assert_eq!(leases[0], ("k-dead".to_owned(), "passed".to_owned()));
    assert_eq!(leases[1].0, "k-live");
    assert!(leases[1].1.ends_with(" left"), "{leases:?}");
    let counts = get(addr, "/admin/api/counts", Some("ro:bo")).await;
    assert!(
        counts.body.contains("\"stuck\":2,\"abandoned\":1"),
        "{}",
        counts.body
    );
    let page = get(addr, "/admin/idempotency", Some("ro:bo")).await;
    assert!(page.body.contains("<td>passed</td>"), "{}", page.body);
}

/// An inbox with two tasks in the manual queue (refused by a rule) and one waiting.
async fn tasks_inbox() -> surely::inbox::MemoryInbox {
    use surely::inbox::{Consumer, MemoryInbox, Wait};
    let inbox = MemoryInbox::new();
    let payments = Consumer::builder("payments").build().unwrap();
    for (id, wait) in [
        ("charge-1", Wait::person("limit rule", "<b>12 000 EUR</b>")),
        ("charge-2", Wait::person("limit rule", "11 000 EUR")),
        ("charge-3", Wait::business("the card is not verified yet")),
    ] {
        let event = Event::new(EventId::new(id).unwrap(), "order o-9", 1, "Charge", "{}").unwrap();
        inbox
            .process_task(&payments, &event, || async { Err(wait) })
            .await
            .unwrap();
    }
    inbox
}

#[tokio::test]
async fn tasks_in_the_manual_queue_are_read_retried_and_discarded() {
    let inbox = tasks_inbox().await;
    let audit = AuditLog::memory();
    let admin = Admin::builder()
        .ledger(MemoryLedger::new())
        .tasks(inbox.clone())
        .audit(audit.clone())
        .authorize(by_header())
        .build();
    let addr = serve(Router::new().nest("/admin", admin.router())).await;

    // Counted by state and reason; shown in the manual queue beside the ledger's entries.
    let counts = get(addr, "/admin/api/counts", Some("ro:bo")).await;
    assert!(
        counts.body.contains("\"manual\":2") && counts.body.contains("\"waiting\":1"),
        "{}",
        counts.body
    );
    assert!(
        counts.body.contains("\"reason\":\"person\""),
        "{}",
        counts.body
    );
    let manual = get(addr, "/admin/ledger?state=manual", Some("ana")).await;
    assert!(
        manual.body.contains("id=\"manual-tasks\"") && manual.body.contains("charge-1"),
        "{}",
        manual.body
    );
    let list = get(addr, "/admin/tasks?state=waiting", Some("ana")).await;
    assert!(
        list.body.contains("charge-3") && !list.body.contains("charge-1"),
        "{}",
        list.body
    );
    assert_eq!(
        get(addr, "/admin/tasks?state=odd", Some("ana"))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );

    // A task's evidence: each attempt's reason; what a handler wrote is escaped.
    let page = get(addr, "/admin/tasks/payments/charge-1", Some("ana")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("&#60;b&#62;12 000 EUR&#60;/b&#62;") && !page.body.contains("<b>12"),
        "{}",
        page.body
    );
    assert!(
        page.body.contains("id=\"steps\"") && page.body.contains("person"),
        "{}",
        page.body
    );
    let json = get(addr, "/admin/api/tasks/payments/charge-1", Some("ro:bo")).await;
    assert!(
        json.body.contains("\"steps\":[{\"attempt\":1"),
        "{}",
        json.body
    );
    assert_eq!(
        get(addr, "/admin/api/tasks/payments/nope", Some("ana"))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(addr, "/admin/api/tasks/pay%07ments/charge-1", Some("ana"))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );

    // Retry by the API, discard by the form (with its token); read-only access cannot act.
    let ro = post_json(
        addr,
        "/admin/api/tasks/payments/charge-1/retry",
        "ro:bo",
        r#"{"why":"x"}"#,
    )
    .await;
    assert_eq!(ro.status, StatusCode::FORBIDDEN);
    let a = post_json(
        addr,
        "/admin/api/tasks/payments/charge-1/retry",
        "ana",
        r#"{"why":"the customer confirmed"}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(
        inbox
            .take_retried("payments", 10, Duration::from_secs(30))
            .len(),
        1,
        "handed to its consumer"
    );
    let page = get(addr, "/admin/tasks/payments/charge-2", Some("ana")).await;
    let csrf = token(&page.body);
    let a = post_form(
        addr,
        "/admin/tasks/payments/charge-2/discard",
        "ana",
        &format!("csrf={csrf}&why=paid+by+transfer"),
    )
    .await;
    assert_eq!(a.status, StatusCode::SEE_OTHER);
    let a = post_form(
        addr,
        "/admin/tasks/payments/charge-2/discard",
        "ana",
        &format!("csrf={csrf}&why=again"),
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND, "{}", a.body);
    let a = post_json(
        addr,
        "/admin/api/tasks/payments/charge-3/explode",
        "ana",
        r#"{"why":"x"}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
    let a = post_json(
        addr,
        "/admin/api/tasks/payments/charge-3/retry",
        "ana",
        r#"{"why":"x"}"#,
    )
    .await;
    assert_eq!(
        a.status,
        StatusCode::NOT_FOUND,
        "a waiting task is not in the manual queue: {}",
        a.body
    );

    let seen: Vec<_> = audit
        .list(10)
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.action, l.target, l.outcome.unwrap_or_default()))
        .collect();
    assert_eq!(
        seen[3],
        (
            AuditAction::RetryTask,
            "payments charge-1".to_owned(),
            "done".to_owned()
        )
    );
    assert_eq!(
        seen[2],
        (
            AuditAction::DiscardTask,
            "payments charge-2".to_owned(),
            "done".to_owned()
        )
    );
    assert!(
        seen[1].2.starts_with("refused (not found)"),
        "{:?}",
        seen[1]
    );
    assert!(
        seen[0].2.starts_with("refused (not found)"),
        "{:?}",
        seen[0]
    );
    let counts = get(addr, "/admin/api/counts", Some("ana")).await;
    assert!(counts.body.contains("\"manual\":0"), "{}", counts.body);
}
