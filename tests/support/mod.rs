//! Helpers shared by the test binaries (`#[path = "../support/mod.rs"] mod support;`): a
//! binary that uses only some of them allows the rest to go unused.

pub(crate) mod gated;
pub(crate) mod names;
#[cfg(feature = "nats")]
pub(crate) mod nats;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod proxy;
#[cfg(feature = "rabbitmq")]
pub(crate) mod rabbitmq;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod serve;
pub(crate) mod time;

use tower::{Service, ServiceExt};

/// Calls `svc` once, waiting for readiness first.
pub(crate) async fn call<S, Req>(svc: &mut S, req: Req) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
{
    svc.ready().await?.call(req).await
}
