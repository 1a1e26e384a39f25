//! A `reqwest::Client` inside surely's client stack: a tiny order service on 127.0.0.1 loses
//! some replies after committing, and the stack retries only what may be sent again.
//!
//! Run with `cargo run --features reqwest --example reqwest_client`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use surely::fault::{Fault, InjectFaultLayer, Schedule};
use surely::OutcomeExt;
use tokio::net::TcpListener;
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The server: it commits every write it reads; its 2nd and 4th requests lose their reply.
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
        .at(3, Fault::ResetAfterSend);
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

    // The client: reqwest inside the stack, in one call.
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .build()?;
    let client = surely::client::http()
        .timeout(Duration::from_secs(3))
        .per_try_timeout(Duration::from_secs(1))
        .build(surely::reqwest::transport(http))?;

    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    // Each call, and what it must end as: the example checks itself.
    let calls = [
        ("GET", base.clone(), "a read", "succeeded", 1),
        (
            "PUT",
            base.clone(),
            "reply lost: idempotent, sent again",
            "succeeded",
            2,
        ),
        (
            "POST",
            base.clone(),
            "reply lost: no key, not sent again",
            "unknown",
            1,
        ),
        (
            "POST",
            format!("http://{nowhere}"),
            "nothing listening: never sent",
            "failed",
            3,
        ),
    ];
    let mut wrong = Vec::new();
    for (method, base, what, want, want_attempts) in calls {
        let body = if method == "GET" { "" } else { "qty=2" };
        let path = if method == "POST" {
            "/orders"
        } else {
            "/orders/o-1"
        };
        let req = Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .body(Full::new(Bytes::from(body)))?;
        let started = tokio::time::Instant::now();
        let (outcome, attempts, detail) = match client.clone().oneshot(req).await {
            Ok(res) => {
                let (outcome, attempts) = (res.outcome(), res.attempts());
                // Read the body as reqwest would.
                let res = reqwest::Response::from(res.map(reqwest::Body::wrap));
                let detail = format!("HTTP {}, {:?}", res.status(), res.text().await?);
                (outcome, attempts, detail)
            }
            // The message names what ended the last attempt and how far it got.
            Err(err) => (err.outcome(), err.attempts(), err.to_string()),
        };
        println!(
            "{method:<4} {what:<36} {:<9} after {attempts} attempt(s) in {:.0?} ({detail})",
            outcome.as_str(),
            started.elapsed(),
        );
        if (outcome.as_str(), attempts) != (want, want_attempts) {
            wrong.push(format!(
                "{method} {what}: {} after {attempts}, expected {want} after {want_attempts}",
                outcome.as_str()
            ));
        }
    }

    println!("\nthe server committed:");
    let committed = log.lock().unwrap().clone();
    for line in &committed {
        println!("  {line}");
    }
    // The read once, the PUT twice (its first reply was lost), the POST once: never again.
    let expected = [
        "GET /orders/o-1 b\"\"",
        "PUT /orders/o-1 b\"qty=2\"",
        "PUT /orders/o-1 b\"qty=2\"",
        "POST /orders b\"qty=2\"",
    ];
    if committed != expected {
        wrong.push(format!(
            "the server committed {committed:?}, expected {expected:?}"
        ));
    }
    if !wrong.is_empty() {
        return Err(format!("the example's checks failed:\n  {}", wrong.join("\n  ")).into());
    }
    println!("\nok: every outcome and every commit as expected");
    Ok(())
}
