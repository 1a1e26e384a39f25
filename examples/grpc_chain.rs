//! Retries that do not multiply across a retrier that is not surely: the reference gRPC client
//! (Python `grpcio`, its retry policy on, 3 attempts on `UNAVAILABLE`) calls a tonic service
//! behind `ServerDeadlineLayer`, whose handler calls a bottom service through
//! `surely::client::grpc()` (3 attempts); the bottom service refuses everything with
//! `UNAVAILABLE`. How many calls reach the bottom, with the middle service untrusting (the
//! default) and trusting its loopback peers' retry signals?
//!
//! Needs `python3` with `grpcio` (`pip install grpcio`); real time, on 127.0.0.1.
//!
//! Run with `cargo run --release --features tonic --example grpc_chain`.

#[path = "support/raw_codec.rs"]
mod raw_codec;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::PathAndQuery;
use raw_codec::Raw;
use surely::retry::backoff::Backoff;
use surely::server::deadline::ServerDeadlineLayer;
use surely::Envelope;
use tokio::net::TcpListener;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic::transport::{Endpoint, Server};
use tonic::Status;
use tower::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

const METHOD: &str = "/shop.Stock/Get";

/// The grpcio client: one call with gRPC's retry policy (3 attempts on `UNAVAILABLE`).
const CLIENT: &str = r#"
import json, sys
import grpc
config = {"methodConfig": [{
    "name": [{"service": "shop.Stock"}],
    "retryPolicy": {
        "maxAttempts": 3,
        "initialBackoff": "0.01s",
        "maxBackoff": "0.05s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    },
}]}
channel = grpc.insecure_channel(sys.argv[1], options=[
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(config)),
])
get = channel.unary_unary("/shop.Stock/Get",
    request_serializer=lambda b: b, response_deserializer=lambda b: b)
try:
    get(b"sku-42", timeout=5)
    print("OK")
except grpc.RpcError as e:
    print(e.code().name)
"#;

/// A unary gRPC service made of `handle`, served through tonic's `Grpc` with the raw codec.
#[derive(Clone)]
struct Unary<H>(H);

impl<H> Service<http::Request<tonic::body::Body>> for Unary<H>
where
    H: Service<tonic::Request<Bytes>, Response = tonic::Response<Bytes>, Error = Status>
        + Clone
        + Send
        + 'static,
    H::Future: Send,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let handler = self.0.clone();
        Box::pin(async move { Ok(tonic::server::Grpc::new(Raw).unary(handler, req).await) })
    }
}

async fn serve<S>(svc: S, deadlines: ServerDeadlineLayer) -> Result<SocketAddr, BoxError>
where
    S: Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = Server::builder()
            .layer(deadlines)
            .serve_with_incoming(svc, TcpIncoming::from(listener))
            .await;
    });
    Ok(addr)
}

/// One chain; returns the calls that reached the bottom, and what the caller got.
async fn chain(deadlines: ServerDeadlineLayer) -> Result<(usize, String), BoxError> {
    let bottom_calls = Arc::new(AtomicUsize::new(0));
    let counted = bottom_calls.clone();
    let bottom = Unary(tower::service_fn(move |_req: tonic::Request<Bytes>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Err::<tonic::Response<Bytes>, _>(Status::unavailable("down")) }
    }));
    let bottom_addr = serve(bottom, ServerDeadlineLayer::new()).await?;
    let channel = Endpoint::from_shared(format!("http://{bottom_addr}"))?
        .connect()
        .await?;
    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .build_channel(channel)?;
    let down = tonic::client::Grpc::new(stack);
    let middle = Unary(tower::service_fn(move |req: tonic::Request<Bytes>| {
        let mut down = down.clone();
        async move {
            // A read, so that the middle's client may retry what may have reached the bottom.
            let mut call = tonic::Request::new(req.into_inner());
            call.extensions_mut().insert(surely::Semantics::Safe);
            down.ready()
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            down.unary(call, PathAndQuery::from_static(METHOD), Raw)
                .await
        }
    }));
    let middle_addr = serve(middle, deadlines).await?;
    let out = Command::new("python3")
        .arg("-c")
        .arg(CLIENT)
        .arg(middle_addr.to_string())
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "the grpcio client failed (is grpcio installed? pip install grpcio): {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let got = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok((bottom_calls.load(Ordering::SeqCst), got))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let version = Command::new("python3")
        .args(["-c", "import grpc; print(grpc.__version__)"])
        .output()?;
    println!(
        "grpcio {} (3 attempts on UNAVAILABLE) -> middle (surely::client::grpc(), 3 attempts) \
         -> bottom (always UNAVAILABLE)",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    let untrusted = chain(ServerDeadlineLayer::new()).await?;
    println!(
        "middle trusts no caller's retry signals (default): bottom saw {} calls, caller got {}",
        untrusted.0, untrusted.1
    );
    let loopback = ServerDeadlineLayer::builder()
        .trust_retry_signals(|req: &dyn Envelope| {
            req.extensions()
                .and_then(|e| e.get::<TcpConnectInfo>())
                .and_then(TcpConnectInfo::remote_addr)
                .is_some_and(|a| a.ip().is_loopback())
        })
        .build()?;
    let trusted = chain(loopback).await?;
    println!(
        "middle trusts its loopback peers: bottom saw {} calls, caller got {}",
        trusted.0, trusted.1
    );
    Ok(())
}
