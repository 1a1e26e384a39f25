//! A connection inside a transaction its caller holds open.

use std::future::Future;

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

/// A connection inside a transaction that the caller holds open, which a write of the crate's
/// joins so that it commits or rolls back with the caller's own writes (the outbox's
/// [`enqueue`][crate::outbox::PostgresOutbox::enqueue], for one).
///
/// Implemented for tokio-postgres's and deadpool-postgres's transactions; with the `server`
/// feature, for the connection of the transaction in which the idempotency layer claimed a key
/// ([`TransactionClient`][crate::server::store::TransactionClient]); and with the `durable`
/// feature, for the connection of the transaction in which the inbox processes an event
/// ([`InboxTransaction`][crate::inbox::InboxTransaction]). Sealed: a plain client, outside any
/// transaction, is not one.
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "crate::outbox::PostgresOutbox::enqueue",
        "crate::inbox::InboxTransaction",
    )
)]
#[cfg_attr(
    not(all(feature = "server", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "crate::server::store::TransactionClient",
    )
)]
pub trait InTransaction: sealed::Sealed {}

impl InTransaction for tokio_postgres::Transaction<'_> {}
impl InTransaction for deadpool_postgres::Transaction<'_> {}

pub(crate) mod sealed {
    use super::*;

    /// What the crate runs in a caller's transaction; not nameable outside the crate.
    pub trait Sealed: Sync {
        /// One statement that returns one row; prepared once per connection where the
        /// connection keeps a statement cache.
        fn query_one<'a>(
            &'a self,
            sql: &'a str,
            params: &'a [&'a (dyn ToSql + Sync)],
        ) -> impl Future<Output = Result<Row, tokio_postgres::Error>> + Send + 'a;
    }

    impl Sealed for tokio_postgres::Transaction<'_> {
        fn query_one<'a>(
            &'a self,
            sql: &'a str,
            params: &'a [&'a (dyn ToSql + Sync)],
        ) -> impl Future<Output = Result<Row, tokio_postgres::Error>> + Send + 'a {
            tokio_postgres::Transaction::query_one(self, sql, params)
        }
    }

    /// [`Sealed::query_one`] for a pooled connection lent inside a transaction the crate
    /// opened (the idempotency claim's, the inbox's): prepared once per connection.
    #[cfg_attr(not(any(feature = "server", feature = "durable")), allow(dead_code))]
    pub(crate) async fn query_one_cached(
        client: &deadpool_postgres::ClientWrapper,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        let stmt = client.prepare_cached(sql).await?;
        tokio_postgres::Client::query_one(client, &stmt, params).await
    }

    impl Sealed for deadpool_postgres::Transaction<'_> {
        async fn query_one<'a>(
            &'a self,
            sql: &'a str,
            params: &'a [&'a (dyn ToSql + Sync)],
        ) -> Result<Row, tokio_postgres::Error> {
            let stmt = self.prepare_cached(sql).await?;
            tokio_postgres::Transaction::query_one(self, &stmt, params).await
        }
    }
}
