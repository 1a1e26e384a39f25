//! A caller that retries by gRPC's own rules, not surely's: the attempts after its first carry
//! `grpc-previous-rpc-attempts`. Two tonic servers on 127.0.0.1: a middle one behind
//! `ServerDeadlineLayer`, whose handler calls the bottom one through `client::grpc()`; the
//! bottom one refuses every call with `UNAVAILABLE`. The caller makes 3 attempts, as grpcio's
//! retry policy would.
//!
//! Untrusted, the middle ignores the caller's counter and retries every attempt: 3 × 3 calls
//! reach the bottom. Trusting its loopback peers, it leaves the retries of the caller's second
//! and third attempts to the caller: 3 + 1 + 1. The first attempt carries no counter, so the
//! middle retries it; its retry budget is what bounds that case.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::uri::PathAndQuery;
use surely::retry::backoff::Backoff;
use surely::server::deadline::ServerDeadlineLayer;
use surely::Envelope;
use tokio::net::TcpListener;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic::transport::Server;
use tonic::{Code, Status};
use tower::Service;

use super::{channel, serve, unary, Shop, Step, Utf8Codec, CREATE};

/// The middle service's client stack to the bottom one.
type Downstream = tonic::client::Grpc<
    surely::client::GrpcClient<surely::grpc::GrpcTransport<tonic::transport::Channel>>,
>;

/// The middle service: every call is passed on to the bottom one, and its status comes back.
#[derive(Clone)]
struct Middle {
    down: Downstream,
}

impl Service<tonic::Request<String>> for Middle {
    type Response = tonic::Response<String>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Status>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<String>) -> Self::Future {
        let mut down = self.down.clone();
        Box::pin(async move {
            let order = req.into_inner();
            unary(&mut down, tonic::Request::new(order), CREATE)
                .await
                .map(tonic::Response::new)
        })
    }
}

impl Service<http::Request<tonic::body::Body>> for Middle {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let handler = self.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Utf8Codec);
            Ok(grpc.unary(handler, req).await)
        })
    }
}

/// Serves the middle service on 127.0.0.1 behind `deadlines`; its client stack to `bottom`
/// retries 3 times, without backoff.
async fn middle(bottom: String, deadlines: ServerDeadlineLayer) -> String {
    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()))
        .build_channel(channel(bottom).await)
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let middle = Middle {
        down: tonic::client::Grpc::new(stack),
    };
    tokio::spawn(async move {
        Server::builder()
            .layer(deadlines)
            .serve_with_incoming(middle, TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

/// A caller retrying by gRPC's rules: up to 3 attempts on `UNAVAILABLE`, the attempts after
/// the first carrying `grpc-previous-rpc-attempts`, as grpcio's retry policy sends them.
async fn grpc_style_caller(base: String) -> Status {
    let mut grpc = tonic::client::Grpc::new(channel(base).await);
    let mut last = Status::unknown("no attempt");
    for previous in 0..3u32 {
        let mut req = tonic::Request::new("o-1".to_owned());
        if previous > 0 {
            req.metadata_mut()
                .insert("grpc-previous-rpc-attempts", previous.into());
        }
        grpc.ready().await.unwrap();
        match grpc
            .unary(req, PathAndQuery::from_static(CREATE), Utf8Codec)
            .await
        {
            Err(status) if status.code() == Code::Unavailable => last = status,
            Err(status) => return status,
            Ok(_) => return Status::ok(""),
        }
    }
    last
}

/// A bottom service that refuses everything, a middle one behind `deadlines`, and the caller's
/// three attempts: how many calls reached the bottom.
async fn bottom_calls(deadlines: ServerDeadlineLayer) -> usize {
    let bottom = Shop::new(vec![Step::Refuse(Code::Unavailable); 32]);
    let bottom_base = serve(bottom.clone(), ServerDeadlineLayer::new()).await;
    let middle_base = middle(bottom_base, deadlines).await;
    let status = grpc_style_caller(middle_base).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    bottom.seen().len()
}

#[tokio::test(start_paused = true)]
async fn an_untrusted_grpc_retrier_multiplies_with_the_handlers_own_retries() {
    assert_eq!(bottom_calls(ServerDeadlineLayer::new()).await, 9);
}

#[tokio::test(start_paused = true)]
async fn a_trusted_grpc_retriers_retries_are_left_to_it() {
    // Trust the peers on this machine, by the address tonic puts in each request.
    let loopback = ServerDeadlineLayer::builder()
        .trust_retry_signals(|req: &dyn Envelope| {
            req.extensions()
                .and_then(|e| e.get::<TcpConnectInfo>())
                .and_then(TcpConnectInfo::remote_addr)
                .is_some_and(|a| a.ip().is_loopback())
        })
        .build()
        .unwrap();
    assert_eq!(bottom_calls(loopback).await, 3 + 1 + 1);
}

/// A middle handler that returns the bottom call's `Status` as its own passes its metadata on,
/// the `surely-outcome` of the middle's call included. A caller through the stack gets its own
/// call's outcome (the stack removes the middle's); a caller without it sees the middle's.
#[tokio::test(start_paused = true)]
async fn a_status_passed_on_by_a_middle_server_carries_the_outer_calls_outcome() {
    use surely::grpc::StatusExt;
    use surely::{Outcome, StopReason};

    let bottom = Shop::new(vec![Step::Refuse(Code::Unavailable); 32]);
    let bottom_base = serve(bottom.clone(), ServerDeadlineLayer::new()).await;
    let middle_base = middle(bottom_base, ServerDeadlineLayer::new()).await;

    let stack = surely::client::grpc()
        .retry(|r| r.backoff(Backoff::none()).max_attempts(1))
        .build_channel(channel(middle_base.clone()).await)
        .unwrap();
    let mut outer = tonic::client::Grpc::new(stack);
    let status = unary(&mut outer, tonic::Request::new("o-1".to_owned()), CREATE)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let values = status.metadata().get_all("surely-outcome").iter().count();
    assert_eq!(values, 1);
    let call = status.call_outcome().unwrap();
    assert_eq!((call.outcome(), call.attempts()), (Outcome::Failed, 1));
    assert_eq!(bottom.seen().len(), 3, "the middle's three attempts");

    // Without the stack, the caller reads what the middle passed on: its own call's outcome.
    let status = grpc_style_caller(middle_base).await;
    let passed_on = status.metadata().get("surely-outcome").unwrap();
    assert!(passed_on
        .to_str()
        .unwrap()
        .starts_with("failed; attempts=3; stop=attempts-exhausted"));
    assert_eq!(
        status.call_outcome().map(|c| c.stop_reason()),
        Some(StopReason::AttemptsExhausted)
    );
}
