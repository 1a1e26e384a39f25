//! The server layers' shape (`docs::architecture`, "One shape for every layer"): the defaults
//! that each layer's `new()` assembles without validating are the ones its builder validates,
//! and each service has the constructors and accessors of the layer's.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use surely::server::deadline::{Recheck, RecheckLayer, ServerDeadline, ServerDeadlineLayer};
use surely::server::idempotency::{Idempotency, IdempotencyLayer};
use surely::server::limit::{AdaptiveLimit, AdaptiveLimitLayer};
use surely::server::store::MemoryStore;
use tower::{service_fn, ServiceExt};

/// `new()` builds what `builder().build()` validates: the same settings, and they pass.
#[test]
fn the_defaults_are_valid() {
    let built = ServerDeadlineLayer::builder().build().unwrap();
    assert_eq!(
        format!("{:?}", ServerDeadlineLayer::new()),
        format!("{built:?}")
    );

    let built = AdaptiveLimitLayer::builder().build().unwrap();
    assert_eq!(
        format!("{:?}", AdaptiveLimitLayer::new()),
        format!("{built:?}")
    );

    let store = MemoryStore::new();
    let built = IdempotencyLayer::builder(store.clone()).build().unwrap();
    assert_eq!(
        format!("{:?}", IdempotencyLayer::new(store)),
        format!("{built:?}")
    );
}

fn handler() -> impl tower::Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(String::from("ok"))) })
}

/// `Foo::new(inner, ..)` takes what `FooLayer::new` takes, `Foo::layer(..)` is that layer, and
/// `get_ref`, `get_mut` and `into_inner` reach the inner service.
#[tokio::test]
async fn each_service_has_the_constructors_of_its_layer() {
    let mut svc = ServerDeadline::new(handler());
    let _: &mut _ = svc.get_mut();
    let _: &_ = svc.get_ref();
    assert_eq!(svc.oneshot(Request::new(())).await.unwrap().status(), 200);
    let _: ServerDeadlineLayer = ServerDeadline::<()>::layer();

    let svc = Recheck::new(handler(), Duration::from_millis(5));
    let inner = svc.clone().into_inner();
    assert_eq!(inner.oneshot(Request::new(())).await.unwrap().status(), 200);
    assert_eq!(svc.oneshot(Request::new(())).await.unwrap().status(), 200);
    let _: RecheckLayer = Recheck::<()>::layer(Duration::from_millis(5));

    let svc = AdaptiveLimit::new(handler());
    assert_eq!(svc.oneshot(Request::new(())).await.unwrap().status(), 200);
    let _: AdaptiveLimitLayer = AdaptiveLimit::<()>::layer();

    let keyed = service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("o-1"))))
    });
    let svc = Idempotency::new(keyed, MemoryStore::new());
    let req = Request::post("/orders")
        .header("idempotency-key", "k-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(svc.oneshot(req).await.unwrap().status(), 200);
    let _: IdempotencyLayer<MemoryStore> = Idempotency::<(), _>::layer(MemoryStore::new());
}
