//! Shared helpers: requests, a counting handler, and one call through a service.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use surely::server::idempotency::Ticket;
use tower::{Service, ServiceExt};

pub(crate) type Req = Request<Full<Bytes>>;
pub(crate) type Res = Response<Full<Bytes>>;

/// A POST to `/orders` with `key` (if any) and `body`.
pub(crate) fn post(key: Option<&str>, body: &str) -> Req {
    let mut b = Request::post("/orders");
    if let Some(key) = key {
        b = b.header("idempotency-key", key);
    }
    b.body(Full::new(Bytes::from(body.to_owned()))).unwrap()
}

/// The same, for a tenant (`x-tenant`).
pub(crate) fn post_as(tenant: &str, key: &str, body: &str) -> Req {
    let mut req = post(Some(key), body);
    req.headers_mut()
        .insert("x-tenant", tenant.parse().unwrap());
    req
}

/// What came back.
#[derive(Debug, Clone)]
pub(crate) struct Got {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Got {
    pub(crate) fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub(crate) fn code(&self) -> Option<&str> {
        self.headers
            .get("idempotency-error")
            .and_then(|v| v.to_str().ok())
    }
}

/// One call.
pub(crate) async fn send<S, B>(svc: &mut S, req: Req) -> Got
where
    S: Service<Req, Response = http::Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    let res = svc.ready().await.unwrap().call(req).await.unwrap();
    let (head, body) = res.into_parts();
    Got {
        status: head.status,
        headers: head.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// What a handler saw: how many calls, and the fence of each.
#[derive(Clone, Default, Debug)]
pub(crate) struct Seen {
    calls: Arc<AtomicUsize>,
    fences: Arc<Mutex<Vec<Option<u64>>>>,
}

impl Seen {
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub(crate) fn fences(&self) -> Vec<Option<u64>> {
        self.fences.lock().unwrap().clone()
    }

    /// Counts a call; returns its number (from 1) and its fence.
    pub(crate) fn hit(&self, req: &Req) -> (usize, Option<u64>) {
        let fence = req.extensions().get::<Ticket>().map(|t| t.fence().get());
        self.fences.lock().unwrap().push(fence);
        (self.calls.fetch_add(1, Ordering::SeqCst) + 1, fence)
    }
}

/// A response with `status` and `body`.
pub(crate) fn reply(status: u16, body: impl Into<Bytes>) -> Res {
    Response::builder()
        .status(status)
        .body(Full::new(body.into()))
        .unwrap()
}

/// A handler that counts and answers `status` with "order <n> fence <f>".
pub(crate) fn handler(
    seen: Seen,
    status: u16,
) -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone + Send + 'static {
    tower::service_fn(move |req: Req| {
        let (n, fence) = seen.hit(&req);
        async move {
            Ok::<_, Infallible>(reply(
                status,
                format!("order {n} fence {}", fence.unwrap_or(0)),
            ))
        }
    })
}

/// An error and its causes, as an error-chain printer shows them: each message once, joined by
/// `: `.
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(err), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
