//! The soak's roles: the crash harness's, each with its maintenance started first, and the
//! order service with the adaptive limit and the short retention.

use surely::server::limit::AdaptiveLimitLayer;

use crate::chores::{self, Settings};
use crate::order::Extras;
use crate::world::World;
use crate::{order as order_service, pipeline, reconcile, BoxError};

/// How many failed publishes quarantine an event: none in a broker's outage of minutes (the
/// relay tries again every 200 ms).
const QUARANTINE_AFTER: u32 = 10_000;

pub(crate) async fn order() -> Result<(), BoxError> {
    let (world, s) = (World::from_env()?, Settings::from_env()?);
    let _maintenance = chores::start(&world, &s, chores::order(&world, &s)?)?;
    order_service::serve(Extras {
        limit: Some(AdaptiveLimitLayer::builder().build()?),
        retention: Some(s.retention),
    })
    .await
}

pub(crate) async fn relay() -> Result<(), BoxError> {
    let (world, s) = (World::from_env()?, Settings::from_env()?);
    let _maintenance = chores::start(&world, &s, chores::relay(&world, &s)?)?;
    pipeline::relay(Some(QUARANTINE_AFTER), Some(s.retention)).await
}

pub(crate) async fn consumer() -> Result<(), BoxError> {
    let (world, s) = (World::from_env()?, Settings::from_env()?);
    let _maintenance = chores::start(&world, &s, chores::consumer(&world, &s)?)?;
    pipeline::run_consumer().await
}

pub(crate) async fn reconciler() -> Result<(), BoxError> {
    let (world, s) = (World::from_env()?, Settings::from_env()?);
    let _maintenance = chores::start(&world, &s, chores::reconciler(&world, &s)?)?;
    reconcile::run().await
}
