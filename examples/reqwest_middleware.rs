//! surely's client stack as one middleware of a `reqwest_middleware::ClientWithMiddleware`: a
//! tiny order service on 127.0.0.1 loses some replies after committing, the middleware retries
//! only what may be sent again, and every call says what it came to. It checks what it printed
//! and fails if that changed.
//!
//! Run with `cargo run --features reqwest-middleware --example reqwest_middleware`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Extensions, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use reqwest_middleware::{ClientBuilder, Middleware, Next};
use surely::fault::{Fault, InjectFaultLayer, Schedule};
use surely::reqwest::middleware::{surely_error, SurelyMiddleware};
use surely::{Outcome, OutcomeExt};
use tokio::net::TcpListener;
use tower::{service_fn, ServiceBuilder};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A middleware after surely's: it runs once per attempt, and counts them.
struct CountAttempts(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl Middleware for CountAttempts {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.fetch_add(1, Ordering::SeqCst);
        next.run(req, extensions).await
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    // The server: it commits every write it reads; its 2nd, 4th and 5th requests lose their
    // reply after committing.
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let committed = log.clone();
    let handler = service_fn(move |req: Request<Incoming>| {
        let committed = committed.clone();
        async move {
            let line = format!("{} {}", req.method(), req.uri().path());
            let body = req.into_body().collect().await?.to_bytes();
            committed.lock().unwrap().push(format!("{line} {body:?}"));
            Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from("ok"))))
        }
    });
    let faults = Schedule::new()
        .at(1, Fault::ResetAfterSend)
        .at(3, Fault::ResetAfterSend)
        .at(4, Fault::ResetAfterSend);
    let server = ServiceBuilder::new()
        .layer(InjectFaultLayer::new(faults))
        .service(handler);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = TowerToHyperService::new(server.clone());
            tokio::spawn(async move {
                let conn = hyper::server::conn::http1::Builder::new();
                let _ = conn.serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });

    // The client: surely's middleware first, so that the ones after it run on every attempt.
    let attempts = Arc::new(AtomicUsize::new(0));
    let surely = SurelyMiddleware::configure(|stack| {
        stack
            .timeout(Duration::from_secs(3))
            .per_try_timeout(Duration::from_secs(1))
    })?;
    let client = ClientBuilder::new(reqwest::Client::builder().no_proxy().build()?)
        .with(surely)
        .with(CountAttempts(attempts.clone()))
        .build();

    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let order = format!("{base}/orders/o-1");
    let calls = [
        ("a read", client.get(&order)),
        (
            "reply lost: idempotent, sent again",
            client.put(&order).body("qty=2"),
        ),
        (
            "reply lost: no key, not sent again",
            client.post(format!("{base}/orders")).body("qty=2"),
        ),
        (
            "reply lost: a stream, sent once",
            client
                .put(&order)
                .body(reqwest::Body::wrap(Full::new(Bytes::from("qty=3")))),
        ),
        (
            "nothing listening: never sent",
            client
                .post(format!("http://{nowhere}/orders"))
                .body("qty=2"),
        ),
    ];
    let mut printed = Vec::new();
    for (what, call) in calls {
        let before = attempts.load(Ordering::SeqCst);
        let result = call.send().await;
        let (outcome, n) = (result.outcome(), result.attempts());
        let detail = match result {
            Ok(res) => format!("HTTP {}, {:?}", res.status(), res.text().await?),
            // The message names the cause and how far the last attempt got.
            Err(err) => surely_error(&err).map_or_else(|| err.to_string(), |e| e.to_string()),
        };
        let below = attempts.load(Ordering::SeqCst) - before;
        let line = format!("{what:<36} {:<9} after {n} attempt(s)", outcome.as_str());
        println!("{line} ({detail}); {below} down the chain");
        printed.push((line, n as usize == below));
    }

    println!("\nthe server committed:");
    let committed = log.lock().unwrap().clone();
    for line in &committed {
        println!("  {line}");
    }

    // What this example must print, whatever the ports.
    let want = [
        ("a read", Outcome::Succeeded, 1),
        ("reply lost: idempotent, sent again", Outcome::Succeeded, 2),
        ("reply lost: no key, not sent again", Outcome::Unknown, 1),
        ("reply lost: a stream, sent once", Outcome::Unknown, 1),
        ("nothing listening: never sent", Outcome::Failed, 3),
    ];
    let want_committed = [
        "GET /orders/o-1 b\"\"",
        "PUT /orders/o-1 b\"qty=2\"",
        "PUT /orders/o-1 b\"qty=2\"",
        "POST /orders b\"qty=2\"",
        "PUT /orders/o-1 b\"qty=3\"",
    ];
    for ((line, counted), (what, outcome, n)) in printed.iter().zip(want) {
        let expected = format!("{what:<36} {:<9} after {n} attempt(s)", outcome.as_str());
        if *line != expected || !counted {
            return Err(format!("expected `{expected}`, printed `{line}`").into());
        }
    }
    if committed != want_committed {
        return Err(format!("the server committed {committed:?}, not {want_committed:?}").into());
    }
    Ok(())
}
