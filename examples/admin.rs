//! The operator's surface (`surely::admin`) over what the recovery chain leaves for a person:
//! order calls whose replies were lost (unknown, in the ledger's manual queue once the
//! reconciler could not ask), a warehouse event the broker kept refusing (quarantined), and a
//! payment the server could not say it made (an `UNKNOWN` idempotency record).
//!
//! ```sh
//! cargo run --release --features admin --example admin
//! # then open the URL it prints; Ctrl-C to stop
//!
//! # or, as CI does: serve, fetch the overview and the manual queue over HTTP, check, exit
//! cargo run --features admin --example admin -- --check
//! ```
//!
//! **Development only**: it lets in every request from 127.0.0.1
//! (`Authorize::dev_allow_all_from_loopback`), as `dev@127.0.0.1`. A real service gives the
//! admin its own authorization hook ([`surely::docs::operators`]).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::admin::{Admin, Authorize};
use surely::fault::{Fault, InjectFaultLayer, Schedule};
use surely::idempotency::IdempotencyKey;
use surely::ledger::{Ledger, LedgerRecorder, MemoryLedger, Reconciler};
use surely::outbox::{Event, EventId, MemoryOutbox, Relay};
use surely::record::BusinessKey;
use surely::retry::NoResolver;
use surely::server::store::{Acquire, IdempotencyStore, MemoryStore, RecordKey, RequestDigest};
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Two orders whose replies are lost after the order service committed them: unknown, and
/// (no resolver can ask this order service) in the manual queue.
async fn lost_replies(ledger: &MemoryLedger) -> Result<(), BoxError> {
    let recorder = LedgerRecorder::new(ledger.clone());
    let mut client = surely::client().recorder(recorder.clone()).build(
        ServiceBuilder::new()
            .layer(InjectFaultLayer::new(
                Schedule::new()
                    .at(0, Fault::ResetAfterSend)
                    .at(1, Fault::ResetAfterSend),
            ))
            .service(service_fn(|_req: http::Request<String>| async {
                Ok::<_, std::io::Error>(http::Response::new(String::from("placed")))
            })),
    )?;
    for order in ["o-1", "o-2"] {
        let mut req = http::Request::post("/orders").body(order.to_owned())?;
        req.extensions_mut().insert(BusinessKey::new(order));
        let err = client.ready().await?.call(req).await.err();
        assert!(err.is_some(), "the reply to {order} is lost");
    }
    recorder.flush().await;
    let mut reconciler: Reconciler<_, _, String> =
        Reconciler::builder(ledger.clone(), NoResolver::default()).build()?;
    reconciler.run_once().await?;
    Ok(())
}

/// An `InventoryReserved` event the broker refuses until the relay quarantines it.
async fn refused_event(outbox: &MemoryOutbox) -> Result<(), BoxError> {
    outbox.enqueue(Event::new(
        EventId::derive("order o-1", "InventoryReserved"),
        "order o-1",
        1,
        "InventoryReserved",
        r#"{"order":"o-1","sku":"sku-42"}"#,
    )?);
    let broker = service_fn(|_: Event| async {
        Err::<(), _>(std::io::Error::other("broker: stream ORDERS not found"))
    });
    let mut relay = Relay::builder(outbox.clone(), broker)
        .quarantine_after(1)
        .build()?;
    relay.run_once().await?;
    Ok(())
}

/// A payment whose handler lost track after calling the bank: an `UNKNOWN` record.
async fn unknown_payment(store: &MemoryStore) -> Result<(), BoxError> {
    let key = RecordKey::new("acme", "POST /payments", IdempotencyKey::new("pay-7")?);
    let fence = match store
        .acquire(&key, &RequestDigest::of(b"7"), Duration::from_secs(30))
        .await?
    {
        Acquire::Owner(fence) => fence,
        other => return Err(format!("a new key, acquired: {other:?}").into()),
    };
    store
        .mark_unknown(
            &key,
            fence,
            "the bank's reply timed out after the charge was sent",
        )
        .await?;
    Ok(())
}

async fn fetch(addr: SocketAddr, path: &str) -> Result<(http::StatusCode, String), BoxError> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let res = client.get(format!("http://{addr}{path}").parse()?).await?;
    let status = res.status();
    let body = res.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Fetches the overview and the manual queue, and checks what they show.
async fn check(addr: SocketAddr, ledger: &MemoryLedger) -> Result<(), BoxError> {
    let (status, index) = fetch(addr, "/admin").await?;
    if status != http::StatusCode::OK || !index.contains("id=\"count-manual\">2<") {
        return Err(format!("the overview answered {status}: {index}").into());
    }
    let (status, queue) = fetch(addr, "/admin/ledger?state=manual").await?;
    let entries = ledger.stats().await?.manual;
    if status != http::StatusCode::OK || entries != 2 || !queue.contains("o-2") {
        return Err(format!("the manual queue answered {status}: {queue}").into());
    }
    let (status, _) = fetch(addr, "/admin/outbox").await?;
    if status != http::StatusCode::OK {
        return Err(format!("the quarantine answered {status}").into());
    }
    println!("checked: the overview shows 2 entries in the manual queue, and the queue lists them");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let check_only = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => return Err(format!("unknown argument {other:?} (expected --check)").into()),
    };
    let (ledger, outbox, store) = (MemoryLedger::new(), MemoryOutbox::new(), MemoryStore::new());
    lost_replies(&ledger).await?;
    refused_event(&outbox).await?;
    unknown_payment(&store).await?;

    let admin = Admin::builder()
        .ledger(ledger.clone())
        .outbox(outbox)
        .idempotency(store)
        // Development only: every request from 127.0.0.1 may act.
        .authorize(Authorize::dev_allow_all_from_loopback())
        .build();
    let app = Router::new().nest("/admin", admin.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    println!("surely admin (development authorization: loopback only) at http://{addr}/admin");
    if check_only {
        let checked = check(addr, &ledger).await;
        server.abort();
        return checked;
    }
    println!("Ctrl-C to stop");
    tokio::signal::ctrl_c().await?;
    Ok(())
}
