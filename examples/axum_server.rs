//! Start here (server side): an axum router behind surely's server half, called through
//! `surely::client::http()`.
//!
//! ```sh
//! cargo run --release --example axum_server
//! ```
//!
//! `ServerDeadlineLayer` wraps the whole router: it reads the budget each caller sends and
//! refuses a spent one before any handler runs. `IdempotencyLayer` sits on the write route only
//! (`POST /orders`): the same key twice runs the handler once and replays its answer; a `POST`
//! without a key is refused. The read route `GET /orders/{id}` takes no key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::headers::IDEMPOTENCY_KEY;
use surely::headers::IDEMPOTENT_REPLAYED;
use surely::headers::NOT_PROCESSED;
use surely::retry::ReplayBody;
use surely::server::deadline::ServerDeadlineLayer;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::MemoryStore;
use surely::OutcomeExt;
use tokio::net::TcpListener;
use tower::{Service, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The shop: its orders, and how many times the write handler ran.
#[derive(Clone, Default)]
struct Shop {
    orders: Arc<Mutex<Vec<String>>>,
    runs: Arc<AtomicUsize>,
}

async fn create(State(shop): State<Shop>, body: Bytes) -> (StatusCode, String) {
    let id = String::from_utf8_lossy(&body).into_owned();
    let run = shop.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let left = surely::deadline::current().map_or(0, |d| d.remaining().as_millis());
    println!("  server: handler placed order {id} (run {run}, budget left {left} ms)");
    if let Ok(mut orders) = shop.orders.lock() {
        orders.push(id.clone());
    }
    (StatusCode::CREATED, id)
}

async fn show(State(shop): State<Shop>, Path(id): Path<String>) -> (StatusCode, String) {
    match shop.orders.lock().is_ok_and(|o| o.contains(&id)) {
        true => (StatusCode::OK, id),
        false => (StatusCode::NOT_FOUND, id),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let shop = Shop::default();
    // The write route's layer. It reads the body to hash it and hands the handler a
    // `Full<Bytes>` body, which an axum route takes as it takes its own `Body`.
    let keys = IdempotencyLayer::builder(MemoryStore::new())
        .require_key_for([Method::POST])
        .build()?;
    let deadlines = ServerDeadlineLayer::builder()
        .max(Duration::from_secs(10))
        .min(Duration::from_millis(50))
        .build()?;
    let app = Router::new()
        .route("/orders", post(create).layer(keys))
        .route("/orders/{id}", get(show))
        .layer(deadlines)
        .with_state(shop.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let hyper = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>();
    let stack = |budget| surely::client::http().timeout(Duration::from_millis(budget));
    let mut client = stack(2000).server_honours_keys().build(hyper.clone())?;
    let mut unkeyed = stack(2000).no_idempotency_keys().build(hyper.clone())?;
    let mut hurried = stack(20).server_honours_keys().build(hyper)?;
    let order = |id: &'static str, key: Option<&str>| {
        let mut req = Request::post(format!("{base}/orders"));
        if let Some(key) = key {
            req = req.header(IDEMPOTENCY_KEY, key);
        }
        req.body(Full::new(Bytes::from_static(id.as_bytes())))
    };
    // Prints the step, makes the call, prints what came back.
    macro_rules! step {
        ($title:literal, $client:ident, $req:expr) => {
            println!($title);
            let res = $client.ready().await?.call($req?).await;
            let (outcome, replayed) =
                (res.call_outcome().map(|o| o.to_string()), res.is_replayed());
            match res {
                Ok(res) => {
                    let (parts, body) = res.into_parts();
                    let body = body.collect().await?.to_bytes();
                    println!(
                        "   -> {} {:?}",
                        parts.status,
                        String::from_utf8_lossy(&body)
                    );
                    for name in [IDEMPOTENT_REPLAYED, NOT_PROCESSED] {
                        if let Some(value) = parts.headers.get(&name) {
                            println!("      {name}: {value:?}");
                        }
                    }
                }
                Err(e) => println!("   -> error: {e}"),
            }
            let runs = shop.runs.load(Ordering::SeqCst);
            println!("   outcome: {}", outcome.as_deref().unwrap_or("none"));
            println!("   is_replayed(): {replayed}; handler runs so far: {runs}\n");
        };
    }
    step!("1. POST o-1, key k-1", client, order("o-1", Some("k-1")));
    step!(
        "2. POST o-1, key k-1 again",
        client,
        order("o-1", Some("k-1"))
    );
    step!("3. POST o-2 without a key", unkeyed, order("o-2", None));
    let title = "4. POST o-3, key k-3, 20 ms budget (the server wants at least 50 ms)";
    step!("{title}", hurried, order("o-3", Some("k-3")));
    let get = Request::get(format!("{base}/orders/o-1")).body(Full::default());
    step!("5. GET /orders/o-1 (the read route: no key)", client, get);
    let held = shop.orders.lock().map(|o| o.join(", ")).unwrap_or_default();
    println!("The server holds: {held}; four POSTs, one handler run.");
    Ok(())
}
