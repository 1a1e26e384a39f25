//! Start here (gRPC): `surely::client::grpc()` around a tonic `Channel`, called through tonic's
//! own `Grpc` client, against a tonic server on 127.0.0.1 (no protoc: raw bytes, our own codec).
//! `cargo run --release --features tonic --example tonic_client`
//!
//! `Get` is marked `Safe`, so its `UNAVAILABLE` is retried. `Create` is not: the server places
//! the order and holds the reply past the attempt timeout, so the call ends `Unknown` and is not
//! sent again. `Cancel` gets `INVALID_ARGUMENT`, final: `Failed` after one attempt. Each
//! outcome is read the same way, reply or `Status`, with `surely::grpc::StatusExt`.

#[path = "support/raw_codec.rs"]
mod raw_codec;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use raw_codec::Raw;
use surely::grpc::{MethodSemanticsLayer, StatusExt};
use surely::{Outcome, Semantics, StopReason};
use tonic::transport::{server::TcpIncoming, Endpoint, Server};
use tonic::Status;
use tower::{service_fn, Layer};

const GET: &str = "/shop.Orders/Get";
const CREATE: &str = "/shop.Orders/Create";
const CANCEL: &str = "/shop.Orders/Cancel";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The server: the first `Get` answers UNAVAILABLE; every `Create` places the order, then
    // holds its reply for a second; `Cancel` is turned down.
    let runs = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let counted = runs.clone();
    let server = service_fn(move |req: http::Request<tonic::body::Body>| {
        let (get, runs) = (req.uri().path() == GET, counted.clone());
        let cancel = req.uri().path() == CANCEL;
        let handler = service_fn(move |_: tonic::Request<Bytes>| {
            let run = if cancel {
                0
            } else {
                runs[usize::from(!get)].fetch_add(1, SeqCst) + 1
            };
            async move {
                if cancel {
                    println!("  server: Cancel -> INVALID_ARGUMENT");
                    return Err(Status::invalid_argument("already shipped"));
                }
                if get && run == 1 {
                    println!("  server: Get #1 -> UNAVAILABLE");
                    return Err(Status::unavailable("warming up"));
                }
                if !get {
                    println!("  server: Create #{run}: order placed; the reply takes a second");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok(tonic::Response::new(Bytes::from_static(b"o-1")))
            }
        });
        async move { Ok::<_, Infallible>(tonic::server::Grpc::new(Raw).unary(handler, req).await) }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(Server::builder().serve_with_incoming(server, TcpIncoming::from(listener)));

    // The client: the stack around a channel, `Get` marked safe to send again, tonic's `Grpc`.
    let channel = Endpoint::from_shared(url)?.connect().await?;
    let stack = surely::client::grpc()
        .timeout(Duration::from_secs(3))
        .per_try_timeout(Duration::from_millis(300))
        .build_channel(channel)?;
    let marks = MethodSemanticsLayer::builder()
        .method(GET, Semantics::Safe)
        .build()?;
    let mut grpc = tonic::client::Grpc::new(marks.layer(stack));

    let mut got = Vec::new();
    for path in [GET, CREATE, CANCEL] {
        grpc.ready().await?;
        let req = tonic::Request::new(Bytes::from_static(b"o-1"));
        let res = grpc.unary(req, PathAndQuery::from_static(path), Raw).await;
        let reply = match &res {
            Ok(r) => format!("{:?}", r.get_ref()),
            Err(s) => format!("{:?}: {}", s.code(), s.message()),
        };
        // The outcome, reply or `Status`: from the reply's extensions, the status's metadata
        // (`surely-outcome`, for an error status from the server), or the stack's own error
        // behind the status.
        let outcome = res.call_outcome();
        let line = outcome
            .as_ref()
            .map_or("none".to_owned(), ToString::to_string);
        println!("{path} -> {reply}\n    outcome: {line}");
        got.push(outcome.map(|o| (o.outcome(), o.attempts(), o.stop_reason())));
    }
    let [gets, creates] = runs.each_ref().map(|r| r.load(SeqCst));
    println!("\nthe server ran Get {gets} times, Create {creates} time(s)");

    let get = (Outcome::Succeeded, 2, StopReason::Success);
    let create = (Outcome::Unknown, 1, StopReason::Unknown);
    let cancel = (Outcome::Failed, 1, StopReason::Final);
    let want = [Some(get), Some(create), Some(cancel)];
    assert_eq!(got, want, "(outcome, attempts, stop)");
    assert_eq!([gets, creates], [2, 1], "server runs of Get, Create");
    println!(
        "tonic_client: ok (the read retried, the write sent once and left unknown, the refusal final)"
    );
    Ok(())
}
