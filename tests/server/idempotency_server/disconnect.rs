//! A caller that goes away does not strand its key. Over real hyper on 127.0.0.1: a client with
//! a 300 ms per-try timeout calls a keyed handler that takes 450 ms.
//!
//! * By default the handler runs to its end on a task of its own: its result is stored, and a
//!   retry of the client gets the replay. The handler ran once.
//! * With `cancel_with_caller()`, the handler is dropped with its caller, and the owner that
//!   stored nothing releases the key at once: the next attempt runs (no 409), and no run that
//!   was dropped committed anything.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::classify::AttemptClass;
use surely::record::InMemoryRecorder;
use surely::retry::ReplayBody;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::IdempotencyStore;
use surely::{Outcome, OutcomeExt};
use tower::{service_fn, Layer, Service, ServiceExt};

use crate::support::serve::serve;

const HANDLER: Duration = Duration::from_millis(450);
const PER_TRY: Duration = Duration::from_millis(300);

/// Handler runs started and finished (the business write is its last step).
#[derive(Clone, Default)]
pub(crate) struct Runs {
    started: Arc<AtomicUsize>,
    committed: Arc<AtomicUsize>,
}

impl Runs {
    fn handler(
        &self,
    ) -> impl Service<
        Request<Full<Bytes>>,
        Response = Response<Full<Bytes>>,
        Error = Infallible,
        Future: Send,
    >
           + Clone
           + Send
           + 'static
           + use<> {
        let runs = self.clone();
        service_fn(move |_req: Request<Full<Bytes>>| {
            let runs = runs.clone();
            runs.started.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(HANDLER).await;
                let n = runs.committed.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from(format!("order {n}"))))
                    .unwrap())
            }
        })
    }
}

async fn server<St: IdempotencyStore + Clone>(layer: IdempotencyLayer<St>, runs: &Runs) -> String {
    let idem = layer.layer(runs.handler());
    let app = service_fn(move |req: Request<Incoming>| idem.clone().oneshot(req));
    format!("http://{}/orders", serve(app).await)
}

type Transport =
    Client<hyper_util::client::legacy::connect::HttpConnector, ReplayBody<Full<Bytes>>>;

fn order(url: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .body(Full::new(Bytes::from_static(b"o-1")))
        .unwrap()
}

/// The default: the handler outlives its first caller, and the client's retry gets the replay.
pub(crate) async fn a_handler_outlives_its_caller<St: IdempotencyStore + Clone>(store: St) {
    let runs = Runs::default();
    let url = server(IdempotencyLayer::builder(store).build().unwrap(), &runs).await;
    let records = InMemoryRecorder::new();
    let transport: Transport = Client::builder(TokioExecutor::new()).build_http();
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(5))
        .per_try_timeout(PER_TRY)
        .server_honours_keys()
        .recorder(records.clone())
        .build(transport)
        .unwrap();
    let res = client
        .ready()
        .await
        .unwrap()
        .call(order(&url))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.outcome(), Outcome::Succeeded);
    let call = res.call_outcome().unwrap().clone();
    assert!(
        call.is_replayed(),
        "the retry was answered by the stored result"
    );
    assert!(
        (2..=3).contains(&call.attempts()),
        "{} attempts",
        call.attempts()
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "order 1");
    assert_eq!(
        runs.started.load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
    assert_eq!(runs.committed.load(Ordering::SeqCst), 1);
    // The first attempt timed out after it was sent; no attempt made it run again.
    let attempts = records.attempts();
    assert_eq!(attempts[0].class(), AttemptClass::MaybeCommitted);
}

/// Opted out: the handler is dropped with its caller, and its key is free at once.
pub(crate) async fn a_handler_cancelled_with_its_caller_frees_its_key<St>(store: St)
where
    St: IdempotencyStore + Clone,
{
    let runs = Runs::default();
    let layer = IdempotencyLayer::builder(store)
        .cancel_with_caller()
        .build()
        .unwrap();
    let url = server(layer, &runs).await;
    let records = InMemoryRecorder::new();
    let transport: Transport = Client::builder(TokioExecutor::new()).build_http();
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(5))
        .per_try_timeout(PER_TRY)
        .server_honours_keys()
        .recorder(records.clone())
        .build(transport)
        .unwrap();
    let err = client
        .ready()
        .await
        .unwrap()
        .call(order(&url))
        .await
        .unwrap_err();
    assert!(err.is_elapsed(), "{err}");
    assert_eq!(err.attempts(), 3);
    // Every attempt found the key free: each ran the handler, none was told "in flight".
    let attempts = records.attempts();
    assert_eq!(attempts.len(), 3);
    assert!(
        attempts
            .iter()
            .all(|a| a.class() == AttemptClass::MaybeCommitted),
        "{:?}",
        attempts.iter().map(|a| a.class()).collect::<Vec<_>>()
    );
    assert_eq!(runs.started.load(Ordering::SeqCst), 3);
    // No run was allowed to finish: nothing was committed, let alone twice.
    assert_eq!(runs.committed.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn memory_a_handler_outlives_its_caller() {
    a_handler_outlives_its_caller(surely::server::store::MemoryStore::new()).await;
}

#[tokio::test(start_paused = true)]
async fn memory_a_handler_cancelled_with_its_caller_frees_its_key() {
    a_handler_cancelled_with_its_caller_frees_its_key(surely::server::store::MemoryStore::new())
        .await;
}

/// The runtime shuts down while a keyed handler runs on its own task: nothing releases the
/// key, the record waits out its lease, and the next request after it takes over (fence 2).
/// Runs its own runtimes, each with the store `store` makes (a pool's connections belong to
/// the runtime they were made on); with `paused`, time is moved past the lease, otherwise the
/// store's clock is real and the test waits the lease out.
pub(crate) fn a_shutdown_mid_handler_leaves_the_key_to_its_lease<St>(
    store: impl Fn() -> St,
    lease: Duration,
    paused: bool,
) where
    St: IdempotencyStore + Clone,
{
    use surely::server::idempotency::Ticket;

    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = fences.clone();
    let handler = service_fn(move |req: Request<Full<Bytes>>| {
        let fence = req.extensions().get::<Ticket>().map(|t| t.fence().get());
        seen.lock().unwrap().push(fence);
        async move {
            if fence == Some(1) {
                // The first owner is still working when the server stops.
                std::future::pending::<()>().await;
            }
            Ok::<_, Infallible>(
                Response::builder()
                    .status(201)
                    .body(Full::<Bytes>::default())
                    .unwrap(),
            )
        }
    });
    let layer = |store| {
        IdempotencyLayer::builder(store)
            .lease(lease)
            .build()
            .unwrap()
    };
    let post = || {
        Request::post("/orders")
            .header("idempotency-key", "k-shutdown")
            .body(Full::new(Bytes::from_static(b"o-1")))
            .unwrap()
    };
    let runtime = |paused: bool| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(paused)
            .build()
            .unwrap()
    };

    let first = runtime(paused);
    first.block_on(async {
        let svc = layer(store()).layer(handler.clone());
        tokio::spawn(svc.oneshot(post()));
        while fences.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    });
    // The server stops, its tasks with it.
    drop(first);

    runtime(paused).block_on(async {
        let svc = layer(store()).layer(handler);
        let res = svc.clone().oneshot(post()).await.unwrap();
        assert_eq!(
            res.status(),
            StatusCode::CONFLICT,
            "still the first owner's"
        );
        if paused {
            tokio::time::advance(lease + Duration::from_secs(1)).await;
        } else {
            tokio::time::sleep(lease + Duration::from_millis(200)).await;
        }
        let res = svc.oneshot(post()).await.unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
    });
    assert_eq!(*fences.lock().unwrap(), vec![Some(1), Some(2)]);
}

#[test]
fn memory_a_shutdown_mid_handler_leaves_the_key_to_its_lease() {
    let store = surely::server::store::MemoryStore::new();
    a_shutdown_mid_handler_leaves_the_key_to_its_lease(
        || store.clone(),
        Duration::from_secs(30),
        true,
    );
}
