//! Shared helpers for the attempt timeout tests.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use tokio::net::TcpListener;
use tower::{service_fn, Service, ServiceExt};

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Calls `svc` once, waiting for readiness first.
pub(crate) async fn call<S, Req>(svc: &mut S, req: Req) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
{
    svc.ready().await?.call(req).await
}

/// A transport that never answers.
pub(crate) fn hanging<B>() -> impl Service<Request<B>, Response = Response<()>, Error = io::Error> {
    service_fn(|_req: Request<B>| async {
        std::future::pending::<()>().await;
        Ok(Response::new(()))
    })
}

/// An address on 127.0.0.1 with nothing listening: bound, then closed.
pub(crate) async fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr
}

pub(crate) use crate::support::serve::serve;
