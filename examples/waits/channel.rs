//! The payment channel: an axum service on 127.0.0.1 that takes one charge a second and
//! answers `429` with `Retry-After` in between, keeping every call it answered; and a plain
//! HTTP client to it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http::{header, HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::{lock, ms, text, BoxError, CHANNEL_GAP, CHANNEL_TIMEOUT};

/// One call the channel answered: for whom, when, and the `Retry-After` of a `429`.
#[derive(Clone, Debug)]
pub(crate) struct ChannelCall {
    pub(crate) order: String,
    pub(crate) at: Instant,
    pub(crate) retry_after: Option<Duration>,
}

/// The channel's side: when it takes a charge again, and every call it answered.
struct ChannelBook {
    busy_until: Instant,
    calls: Vec<ChannelCall>,
    charges: u32,
}

/// `POST /charges` with `order amount`: `201` and a reference, or `429` with `Retry-After` in
/// whole seconds (rounded up: the client that waits as asked finds the channel free).
async fn charge_route(State(book): State<Arc<Mutex<ChannelBook>>>, body: Bytes) -> Response {
    let order = text(&body)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_owned();
    let now = Instant::now();
    let mut book = lock(&book);
    if now < book.busy_until {
        let left = u64::try_from((book.busy_until - now).as_millis()).unwrap_or(u64::MAX);
        let secs = left.div_ceil(1000).max(1);
        book.calls.push(ChannelCall {
            order,
            at: now,
            retry_after: Some(Duration::from_secs(secs)),
        });
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, secs.to_string())],
            "one charge a second",
        )
            .into_response();
    }
    book.busy_until = now + CHANNEL_GAP;
    book.charges += 1;
    let reference = format!("ch-{}", book.charges);
    book.calls.push(ChannelCall {
        order,
        at: now,
        retry_after: None,
    });
    (StatusCode::CREATED, reference).into_response()
}

/// The channel's answer, as the handler reads it.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

/// The payment channel, and a plain HTTP client to it.
#[derive(Clone)]
pub(crate) struct Channel {
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
    book: Arc<Mutex<ChannelBook>>,
}

impl Channel {
    /// Serves the channel on 127.0.0.1; it has just taken another merchant's charge.
    pub(crate) async fn serve() -> Result<Channel, BoxError> {
        let book = Arc::new(Mutex::new(ChannelBook {
            busy_until: Instant::now() + CHANNEL_GAP,
            calls: Vec::new(),
            charges: 0,
        }));
        let app = Router::new()
            .route("/charges", post(charge_route))
            .with_state(book.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("waits: the payment channel stopped: {e}");
            }
        });
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Channel { addr, client, book })
    }

    pub(crate) async fn charge(&self, order: &str, amount: i64) -> Result<Answer, BoxError> {
        let req = Request::post(format!("http://{}/charges", self.addr))
            .body(Full::new(Bytes::from(format!("{order} {amount}"))))?;
        let res = tokio::time::timeout(CHANNEL_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| format!("the channel did not answer within {}", ms(CHANNEL_TIMEOUT)))??;
        let (parts, body) = res.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body: text(&body),
        })
    }

    pub(crate) fn calls(&self) -> Vec<ChannelCall> {
        lock(&self.book).calls.clone()
    }
}
