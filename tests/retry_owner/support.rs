//! Shared helpers for the retry-owner tests: a counter, request builders, and a hyper server on
//! 127.0.0.1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use tokio::net::TcpListener;
use tower::Service;

/// A shared counter of calls.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counter(Arc<AtomicUsize>);

impl Counter {
    pub(crate) fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A retry layer with no backoff and no budget: 3 attempts, marking ownership or not.
pub(crate) fn retry(mark_owner: bool) -> RetryLayer {
    RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .mark_owner(mark_owner)
        .build()
        .unwrap()
}

/// Serves `svc` on 127.0.0.1 over HTTP/1 until the test ends.
pub(crate) async fn serve<S>(svc: S) -> SocketAddr
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}
