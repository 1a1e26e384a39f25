//! The order story, on real hyper over 127.0.0.1.
//!
//! A shop's server sits behind surely's server deadline layer and a fault layer; a client calls it
//! through the deadline, retry, attempt-timeout and record layers. Four calls:
//!
//! 1. `GET /orders/o-0` succeeds, and the server sees the client's budget arrive on the wire.
//! 2. `POST /orders` without an idempotency key: the server commits order `o-1`, then the reply is
//!    lost (the connection is reset). The client cannot know: the outcome is **unknown**, and the
//!    retry layer does not send a POST without a key again.
//! 3. `GET /orders/o-1` to a replica that is down: the connection is refused before anything was
//!    sent. Nothing happened, so the retry layer tries again, until its attempt limit.
//! 4. A call whose budget is already spent is refused before sending: the server never sees it.
//!
//! Every attempt and call record is printed as it is made. The demo checks its own invariants and
//! ends with `invariants: ok`, or says what failed and exits non-zero.
//!
//! Run with `cargo run --release --example orders`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use surely::classify::{AttemptClass, Outcome};
use surely::deadline::{Deadline, DeadlineLayer, ServerDeadlineLayer};
use surely::fault::{Fault, FaultLayer};
use surely::record::{InMemoryRecorder, Record, RecordAttemptLayer, RecordCallLayer, StopReason};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::timeout::AttemptTimeoutLayer;
use surely::Envelope;
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

/// The demo asks the server to lose one reply through this header; a real outage needs no asking.
const DEMO_FAULT: &str = "x-demo-fault";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The shop's state, as the server sees it.
#[derive(Default)]
struct Shop {
    orders: Mutex<Vec<String>>,
    requests: AtomicUsize,
}

async fn handle(
    shop: Arc<Shop>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    shop.requests.fetch_add(1, Ordering::SeqCst);
    let budget = surely::deadline::current().map(|d| d.remaining());
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let orders = &shop.orders;
    let (status, reply) = match (parts.method, parts.uri.path()) {
        (Method::POST, "/orders") => {
            let id = String::from_utf8_lossy(&body).into_owned();
            println!(
                "  server   committed order {id} (budget left {})",
                fmt_budget(budget)
            );
            orders.lock().unwrap().push(id.clone());
            (StatusCode::CREATED, id)
        }
        (Method::GET, path) => {
            let id = path.trim_start_matches("/orders/");
            println!("  server   GET {path} (budget left {})", fmt_budget(budget));
            if id == "o-0" || orders.lock().unwrap().iter().any(|o| o == id) {
                (StatusCode::OK, id.to_owned())
            } else {
                (StatusCode::NOT_FOUND, String::new())
            }
        }
        _ => (StatusCode::NOT_FOUND, String::new()),
    };
    let mut res = Response::new(Full::from(reply));
    *res.status_mut() = status;
    Ok(res)
}

fn fmt_budget(budget: Option<Duration>) -> String {
    budget.map_or_else(|| "none".to_owned(), |d| format!("{}ms", d.as_millis()))
}

/// Serves the shop on a fresh port of 127.0.0.1 until the process ends.
async fn serve(shop: Arc<Shop>) -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server_deadlines = ServerDeadlineLayer::builder()
        .max(Duration::from_secs(10))
        .build()
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let shop = shop.clone();
            let svc = ServiceBuilder::new()
                .layer(server_deadlines.clone())
                .layer(FaultLayer::new(|req: &Request<Incoming>| {
                    req.headers()
                        .get(DEMO_FAULT)
                        .is_some_and(|v| v == "reset-after-send")
                        .then_some(Fault::ResetAfterSend)
                }))
                .service_fn(move |req| handle(shop.clone(), req));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc)),
            );
        }
    });
    Ok(addr)
}

/// An error and its sources, on one line.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

/// The closed address of a replica that is down.
async fn down_replica() -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    listener.local_addr()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let shop = Arc::new(Shop::default());
    let addr = serve(shop.clone()).await?;
    let down = down_replica().await?;

    let records = InMemoryRecorder::new();
    let printed = records.clone();
    // Print every record as it is made, and keep it for the invariants.
    let recorder = move |record: Record<'_>| {
        match record {
            Record::Attempt(a) => println!("  attempt  {a}"),
            Record::Call(c) => println!("  call     {c}"),
        }
        match record {
            Record::Attempt(a) => surely::record::Recorder::record_attempt(&printed, a),
            Record::Call(c) => surely::record::Recorder::record_call(&printed, c),
        }
    };
    let transport = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut client = ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(
            DeadlineLayer::builder()
                .timeout(Duration::from_secs(2))
                .reserve(Duration::from_millis(5))
                .build()?,
        )
        .layer(
            RetryLayer::builder()
                .backoff(Backoff::constant(Duration::from_millis(20)))
                .build()?,
        )
        .layer(RecordAttemptLayer::new(recorder))
        .layer(AttemptTimeoutLayer::new(Duration::from_millis(500))?)
        .service(transport);

    let mut failures = Vec::new();
    let mut check = |ok: bool, what: &str| {
        if !ok {
            failures.push(what.to_owned());
        }
    };

    println!("1. GET /orders/o-0: the budget travels with the request");
    let get = Request::get(format!("http://{addr}/orders/o-0")).body(Full::default())?;
    let res = client.ready().await?.call(get).await?;
    let call = records.calls().last().cloned().expect("a call record");
    println!(
        "  client   {}: outcome {}",
        res.status(),
        call.outcome.as_str()
    );
    check(call.outcome == Outcome::Succeeded, "the plain GET succeeds");

    println!("\n2. POST /orders o-1 without a key; the server commits, the reply is lost");
    let post = Request::post(format!("http://{addr}/orders"))
        .header(DEMO_FAULT, "reset-after-send")
        .body(Full::from("o-1"))?;
    let semantics = post.semantics();
    let err = client
        .ready()
        .await?
        .call(post)
        .await
        .expect_err("the reply was lost");
    let call = records.calls().last().cloned().expect("a call record");
    println!("  client   error: {}", chain(&err));
    println!(
        "  client   outcome {}: the order may exist; a {semantics:?} request is not sent again blindly",
        call.outcome.as_str()
    );
    check(
        call.outcome == Outcome::Unknown,
        "the POST without a key whose reply was lost is unknown",
    );
    check(
        call.last.is_some_and(|c| {
            c.class() == AttemptClass::MaybeCommitted && !c.is_retryable(semantics)
        }),
        "the lost reply is maybe committed and not retryable for a POST without a key",
    );

    println!("\n3. GET /orders/o-1 from a replica that is down: refused before send, retried");
    let get = Request::get(format!("http://{down}/orders/o-1")).body(Full::default())?;
    let semantics = get.semantics();
    let err = client
        .ready()
        .await?
        .call(get)
        .await
        .expect_err("the replica is down");
    let call = records.calls().last().cloned().expect("a call record");
    let last = call.last.expect("one attempt");
    println!("  client   error: {}", chain(&err));
    println!(
        "  client   class {}, phase {}: retryable = {}",
        last.class().as_str(),
        last.phase().as_str(),
        last.is_retryable(semantics)
    );
    check(
        last.class() == AttemptClass::Rejected && last.is_retryable(semantics),
        "the refused GET is rejected and retryable",
    );
    check(
        call.outcome == Outcome::Failed,
        "the refused GET failed cleanly",
    );
    check(
        call.attempts == 3 && call.stop == StopReason::AttemptsExhausted,
        "the refused GET was tried three times",
    );

    println!("\n4. A call whose budget is already spent");
    let seen_before = shop.requests.load(Ordering::SeqCst);
    let mut late = Request::post(format!("http://{addr}/orders")).body(Full::from("o-2"))?;
    late.extensions_mut()
        .insert(Deadline::after(Duration::ZERO));
    let err = client
        .ready()
        .await?
        .call(late)
        .await
        .expect_err("no budget");
    println!("  client   error: {}", chain(&err));
    check(
        err.deadline_exceeded().is_some_and(|d| d.is_refused()),
        "the spent call is refused before send",
    );
    check(
        shop.requests.load(Ordering::SeqCst) == seen_before,
        "the server never saw the refused call",
    );

    println!("\nThe server holds: {:?}", shop.orders.lock().unwrap());
    check(
        *shop.orders.lock().unwrap() == ["o-1"],
        "exactly one order, o-1, exists",
    );
    check(records.calls().len() == 4, "one call record per call");
    // Two of the four calls reached the shop (the POST once, never retried), the GET to the down
    // replica was tried three times, the spent call never left.
    check(
        records.attempts().len() == 5,
        "one attempt record per transport call",
    );
    check(
        shop.requests.load(Ordering::SeqCst) == 2,
        "the server saw exactly two requests",
    );

    if failures.is_empty() {
        println!("invariants: ok");
        Ok(())
    } else {
        for f in &failures {
            println!("invariant failed: {f}");
        }
        std::process::exit(1);
    }
}
