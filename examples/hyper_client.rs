//! Start here: `surely::client::http()` around hyper-util's client, against a small server on
//! 127.0.0.1 that is busy once and slow once.
//!
//! ```sh
//! cargo run --release --example hyper_client
//! ```
//!
//! A `GET` answered `503 Retry-After: 1` is retried after the server's second; a `POST` whose
//! reply comes after the attempt timeout is not sent again: the server may have placed the
//! order, and the caller is told `Unknown`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use surely::record::InMemoryRecorder;
use surely::retry::ReplayBody;
use surely::OutcomeExt;
use tokio::net::TcpListener;
use tower::{Service, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = serve().await?;

    // The transport: hyper-util's client. Its body is `ReplayBody<_>`: the stack keeps the
    // bytes of each request so that a retry sends the same ones.
    let hyper = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>();
    let records = InMemoryRecorder::new();
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(3))
        .per_try_timeout(Duration::from_millis(300))
        .recorder(records.clone())
        .build(hyper)?;

    let stock = Request::get(format!("http://{server}/stock")).body(Full::new(Bytes::new()))?;
    let res = client.ready().await?.call(stock).await;
    println!(
        "GET  /stock  -> {}: {}",
        status(&res),
        res.call_outcome_line()
    );
    // The attempt is recorded when its body ends (a body cut off mid-way is maybe committed).
    if let Ok(res) = res {
        let body = res.into_body().collect().await?.to_bytes();
        println!("     body: {}", String::from_utf8_lossy(&body));
    }

    let order = Request::post(format!("http://{server}/orders"))
        .body(Full::new(Bytes::from_static(b"o-1")))?;
    let res = client.ready().await?.call(order).await;
    println!(
        "POST /orders -> {}: {}",
        status(&res),
        res.call_outcome_line()
    );

    println!("\nThe records:");
    for attempt in records.attempts() {
        println!("  {attempt}");
    }
    for call in records.calls() {
        println!("  {call}");
    }
    Ok(())
}

/// What came back: the status, or the error.
fn status<B, E: std::fmt::Display>(res: &Result<Response<B>, E>) -> String {
    match res {
        Ok(res) => res.status().to_string(),
        Err(e) => format!("error ({e})"),
    }
}

/// The call's outcome, as one line.
trait OutcomeLine {
    fn call_outcome_line(&self) -> String;
}

impl<T: OutcomeExt> OutcomeLine for T {
    fn call_outcome_line(&self) -> String {
        self.call_outcome()
            .map_or_else(|| "no outcome".to_owned(), |o| o.to_string())
    }
}

/// A server on a fresh port: `/stock` answers 503 once, then 200; `/orders` places the order
/// at once and answers after a second.
async fn serve() -> Result<std::net::SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let busy = Arc::new(AtomicU32::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let busy = busy.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let busy = busy.clone();
                async move { Ok::<_, Infallible>(answer(req, &busy).await) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc),
            );
        }
    });
    Ok(addr)
}

async fn answer(req: Request<Incoming>, busy: &AtomicU32) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: &'static str| {
        let mut res = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *res.status_mut() = status;
        res
    };
    match req.uri().path() {
        "/stock" if busy.fetch_add(1, Ordering::SeqCst) == 0 => {
            println!("  server: /stock busy, come back in a second");
            let mut res = reply(StatusCode::SERVICE_UNAVAILABLE, "busy");
            res.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
            res
        }
        "/stock" => reply(StatusCode::OK, "42 in stock"),
        "/orders" => {
            println!("  server: order placed; the reply takes a second");
            tokio::time::sleep(Duration::from_secs(1)).await;
            reply(StatusCode::CREATED, "o-1")
        }
        _ => reply(StatusCode::NOT_FOUND, ""),
    }
}
