//! An axum handler behind the idempotency layer on PostgreSQL, that stores its own answer in its
//! transaction (`complete_in`): the answer stored is the one axum sends, `content-type` (which
//! axum's `IntoResponse` sets after the handler's code) included, when the handler stores the
//! response it returns (`StoredResponse::buffer`); an answer stored by hand that differs from the
//! one sent is told (a `warn` and a `stored_answer_differs` event), and the request still
//! succeeds. On the PostgreSQL server of `postgres.rs`; the handlers are called through the
//! axum `Router` itself, with no lease or wait to time.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use surely::record::{Record, ServerEventKind};
use surely::server::idempotency::{IdempotencyLayer, IdempotencyLayerBuilder, Ticket};
use surely::server::store::{KeyedTransaction, PostgresStore, StoredResponse};
use tower::{ServiceBuilder, ServiceExt};

use super::in_transaction::Db;
use super::recovery::Captured;
use super::support::Got;

/// The orders table's columns.
const ORDERS: &str = "id bigserial PRIMARY KEY, key text NOT NULL";

/// How the handler stores its answer.
#[derive(Clone, Copy)]
enum Stores {
    /// The response it returns, with `StoredResponse::buffer`.
    Returned,
    /// `StoredResponse::new` with an empty header map, as the docs once showed.
    ByHand,
    /// The response it returns, then its transaction fails (rolled back) and it answers `500`.
    ThenRollsBack,
}

#[derive(Clone)]
struct Shop {
    store: PostgresStore,
    orders: String,
    stores: Stores,
}

/// Writes the order and completes the record in one transaction; answers `201` with the order
/// as text (axum sets `content-type: text/plain; charset=utf-8`).
async fn create(
    State(shop): State<Shop>,
    Extension(ticket): Extension<Ticket>,
    body: Bytes,
) -> Response {
    let mut client = shop.store.pool().get().await.unwrap();
    let txn = client.transaction().await.unwrap();
    let insert = format!("INSERT INTO {} (key) VALUES ($1)", shop.orders);
    txn.execute(&insert, &[&ticket.record_key().key().as_str()])
        .await
        .unwrap();
    let order = format!("order {}", String::from_utf8_lossy(&body));
    let res = (StatusCode::CREATED, order.clone()).into_response();
    let res = match shop.stores {
        Stores::Returned => {
            let (stored, res) = StoredResponse::buffer(res).await.unwrap();
            shop.store
                .complete_in(&txn, &ticket, &stored)
                .await
                .unwrap();
            res.into_response()
        }
        Stores::ByHand => {
            let stored = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), order.into());
            shop.store
                .complete_in(&txn, &ticket, &stored)
                .await
                .unwrap();
            res
        }
        Stores::ThenRollsBack => {
            let (stored, _) = StoredResponse::buffer(res).await.unwrap();
            shop.store
                .complete_in(&txn, &ticket, &stored)
                .await
                .unwrap();
            txn.rollback().await.unwrap();
            return (StatusCode::INTERNAL_SERVER_ERROR, "rolled back").into_response();
        }
    };
    txn.commit().await.unwrap();
    res
}

/// The events the layer reported, by name.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<ServerEventKind>>>);

impl Events {
    fn recording(
        &self,
        builder: IdempotencyLayerBuilder<PostgresStore>,
    ) -> IdempotencyLayer<PostgresStore> {
        let log = self.0.clone();
        builder
            .recorder(move |r: Record<'_>| {
                if let Record::Server(e) = r {
                    log.lock().unwrap().push(e.kind);
                }
            })
            .build()
            .unwrap()
    }

    fn names(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().iter().map(|k| k.as_str()).collect()
    }
}

/// The router: `POST /orders` behind `keyed`, with `between` (any layer) between the two.
fn app<L>(db: &Db, stores: Stores, keyed: IdempotencyLayer<PostgresStore>, between: L) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Full<Bytes>>, Response = Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<Request<Full<Bytes>>>>::Future: Send + 'static,
{
    let shop = Shop {
        store: db.store.clone(),
        orders: db.orders.clone(),
        stores,
    };
    let route = post(create).layer(ServiceBuilder::new().layer(keyed).layer(between));
    Router::new().route("/orders", route).with_state(shop)
}

/// One `POST /orders` with `key` and `body`, through the router.
async fn send(app: &Router, key: &str, body: &str) -> Got {
    let req = Request::post("/orders")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let (head, body) = res.into_parts();
    Got {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// The headers of an answer, without the replay's mark.
fn unmarked(got: &Got) -> HeaderMap {
    let mut headers = got.headers.clone();
    headers.remove("idempotent-replayed");
    headers
}

/// The handler stores the response it returns: the first answer and its replay are the same,
/// `content-type` included, and nothing is told.
#[tokio::test]
async fn pg_axum_answer_stored_as_returned_replays_with_its_content_type() {
    let db = Db::new(
        "pg_axum_answer_stored_as_returned_replays_with_its_content_type",
        ORDERS,
    )
    .await;
    let events = Events::default();
    let keyed = events.recording(IdempotencyLayer::builder(db.store.clone()));
    let app = app(
        &db,
        Stores::Returned,
        keyed,
        tower::layer::util::Identity::new(),
    );

    let first = send(&app, "k-1", "o-1").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.headers["content-type"], "text/plain; charset=utf-8");
    assert!(!first.replayed());
    let again = send(&app, "k-1", "o-1").await;
    assert!(again.replayed());
    assert_eq!(again.status, first.status);
    assert_eq!(unmarked(&again), unmarked(&first));
    assert_eq!(again.body, first.body);
    assert_eq!(again.body, "order o-1");

    assert_eq!(db.orders().await, 1);
    assert_eq!(events.names(), ["replayed"]);
    db.drop_tables().await;
}

/// The handler stores an answer with an empty header map and returns axum's, which has a
/// `content-type`: the client gets its answer, the layer warns once naming the header and
/// reports the event, and the replay is the stored answer (without it).
#[tokio::test(flavor = "current_thread")]
async fn pg_axum_answer_stored_without_its_content_type_is_told() {
    let out = Captured::default();
    let _guard = tracing::subscriber::set_default(out.subscriber());

    let db = Db::new(
        "pg_axum_answer_stored_without_its_content_type_is_told",
        ORDERS,
    )
    .await;
    let events = Events::default();
    let keyed = events.recording(IdempotencyLayer::builder(db.store.clone()));
    let app = app(
        &db,
        Stores::ByHand,
        keyed,
        tower::layer::util::Identity::new(),
    );

    let first = send(&app, "k-2", "o-2").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(first.body, "order o-2");
    let again = send(&app, "k-2", "o-2").await;
    assert!(again.replayed());
    assert_eq!(again.body, "order o-2");
    assert!(!again.headers.contains_key("content-type"), "{again:?}");
    assert_eq!(db.orders().await, 1);

    let told = events.0.lock().unwrap().clone();
    assert_eq!(events.names(), ["stored_answer_differs", "replayed"]);
    match told[0] {
        ServerEventKind::StoredAnswerDiffers {
            fence,
            status,
            headers,
            body,
        } => {
            assert_eq!(fence.get(), 1);
            assert_eq!((status, headers, body), (false, 1, false));
        }
        other => panic!("{other:?}"),
    }
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("is not the one the handler stored"))
        .collect();
    assert_eq!(warned.len(), 1, "{text}");
    for field in [
        "WARN",
        "k-2",
        "headers=content-type",
        "body=false",
        "sent_status=201",
    ] {
        assert!(warned[0].contains(field), "{field} in {}", warned[0]);
    }
    db.drop_tables().await;
}

/// A layer between the idempotency layer and the handler adds a header after the handler
/// stored what it returned: told, with the header's name; the client gets the header, the
/// replay does not.
#[tokio::test(flavor = "current_thread")]
async fn pg_a_header_added_below_the_layer_after_the_handler_stored_is_told() {
    let out = Captured::default();
    let _guard = tracing::subscriber::set_default(out.subscriber());

    let db = Db::new(
        "pg_a_header_added_below_the_layer_after_the_handler_stored_is_told",
        ORDERS,
    )
    .await;
    let events = Events::default();
    let keyed = events.recording(IdempotencyLayer::builder(db.store.clone()));
    let served_by = tower::util::MapResponseLayer::new(|mut res: Response| {
        res.headers_mut()
            .insert("x-served-by", HeaderValue::from_static("eu-1"));
        res
    });
    let app = app(&db, Stores::Returned, keyed, served_by);

    let first = send(&app, "k-3", "o-3").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.headers["x-served-by"], "eu-1");
    let again = send(&app, "k-3", "o-3").await;
    assert!(again.replayed());
    assert_eq!(again.headers["content-type"], "text/plain; charset=utf-8");
    assert!(!again.headers.contains_key("x-served-by"));
    assert_eq!(events.names(), ["stored_answer_differs", "replayed"]);

    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("is not the one the handler stored"))
        .collect();
    assert_eq!(warned.len(), 1, "{text}");
    assert!(warned[0].contains("headers=x-served-by"), "{}", warned[0]);
    db.drop_tables().await;
}

/// A body over the layer's stored-size limit, stored from the response returned: the first
/// answer is whole; the replay has its status and `content-type`, no body, and says so.
#[tokio::test]
async fn pg_axum_answer_over_the_stored_size_limit_replays_without_its_body() {
    let db = Db::new(
        "pg_axum_answer_over_the_stored_size_limit_replays_without_its_body",
        ORDERS,
    )
    .await;
    let events = Events::default();
    let keyed = events.recording(IdempotencyLayer::builder(db.store.clone()).max_stored_bytes(16));
    let app = app(
        &db,
        Stores::Returned,
        keyed,
        tower::layer::util::Identity::new(),
    );

    let big = "o-4".repeat(20);
    let first = send(&app, "k-4", &big).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.body, format!("order {big}"));
    let again = send(&app, "k-4", &big).await;
    assert!(again.replayed());
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(again.headers["idempotent-replay-body-omitted"], "true");
    assert!(again.body.is_empty());
    // The stored answer is the one sent, its body left out as the limit says: nothing to tell.
    assert_eq!(events.names(), ["replayed"]);
    db.drop_tables().await;
}

/// In the handler's transaction (`in_transaction()`), an axum handler stores nothing itself:
/// the layer stores the answer that leaves it, `content-type` included.
#[tokio::test]
async fn pg_axum_answer_claimed_in_the_handlers_transaction_replays_with_its_content_type() {
    let db = Db::new("pg_axum_answer_in_transaction", ORDERS).await;
    let keyed = IdempotencyLayer::builder(db.store.clone())
        .in_transaction()
        .build()
        .unwrap();
    let orders = db.orders.clone();
    let create = move |Extension(txn): Extension<KeyedTransaction>, body: Bytes| {
        let orders = orders.clone();
        async move {
            let client = txn.client().await.unwrap();
            let insert = format!("INSERT INTO {orders} (key) VALUES ($1)");
            client.execute(&insert, &[&"o-5"]).await.unwrap();
            (
                StatusCode::CREATED,
                format!("order {}", String::from_utf8_lossy(&body)),
            )
        }
    };
    let app = Router::new().route("/orders", post(create).layer(keyed));

    let first = send(&app, "k-5", "o-5").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.headers["content-type"], "text/plain; charset=utf-8");
    let again = send(&app, "k-5", "o-5").await;
    assert!(again.replayed());
    assert_eq!(unmarked(&again), unmarked(&first));
    assert_eq!(again.body, first.body);
    assert_eq!(db.orders().await, 1);
    db.drop_tables().await;
}

/// The handler stored its answer, then its transaction rolled back and it answered `500`: the
/// answer sent differs from the one it stored, but that one never committed, so the layer
/// stores the `500` (stored by default) and tells nothing.
#[tokio::test]
async fn pg_an_answer_stored_then_rolled_back_is_not_told() {
    let db = Db::new("pg_an_answer_stored_then_rolled_back_is_not_told", ORDERS).await;
    let events = Events::default();
    let keyed = events.recording(IdempotencyLayer::builder(db.store.clone()));
    let app = app(
        &db,
        Stores::ThenRollsBack,
        keyed,
        tower::layer::util::Identity::new(),
    );

    let first = send(&app, "k-6", "o-6").await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    let again = send(&app, "k-6", "o-6").await;
    assert!(again.replayed());
    assert_eq!(again.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(unmarked(&again), unmarked(&first));
    assert_eq!(again.body, "rolled back");
    assert_eq!(db.orders().await, 0);
    assert_eq!(events.names(), ["replayed"]);
    db.drop_tables().await;
}
