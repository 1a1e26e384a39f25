//! A broker's delivery through the PostgreSQL inbox, written once for every broker: the
//! handler and the inbox's record commit, and only then is the delivery answered. Each broker
//! says how it answers ([`Answer`]); the order is the same for all.

use super::postgres::{Handler, InboxTransaction};
use super::{InboxError, PostgresInbox, Processed, Versions};
use crate::outbox::Event;

/// How a broker answers a delivery, once the inbox's transaction ended.
pub(super) trait Answer {
    /// Committed (applied, stale, a duplicate): acknowledged. A lost acknowledgement brings a
    /// redelivery that the inbox finds recorded.
    async fn settled(&self, event: &Event);
    /// Parked (a version gap): handed back to come again after the missing event.
    async fn parked(&self);
    /// The handler or the store failed and nothing committed: handed back at once.
    async fn failed(&self);
}

impl PostgresInbox {
    /// Runs `handler` for `event` through the inbox and commits, then answers the delivery
    /// through `answer`.
    pub(super) async fn process_and_answer<F, E>(
        &self,
        answer: &impl Answer,
        event: &Event,
        consumer: &str,
        versions: Versions,
        handler: F,
    ) -> Result<Processed, InboxError<E>>
    where
        F: for<'t> FnOnce(&'t InboxTransaction) -> Handler<'t, E>,
    {
        let out = self
            .process_and_commit(consumer, event, versions, handler)
            .await;
        match &out {
            Ok(processed) if processed.is_settled() => answer.settled(event).await,
            Ok(_) => answer.parked().await,
            Err(_) => answer.failed().await,
        }
        out
    }
}
