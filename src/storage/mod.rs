//! The PostgreSQL base every table of the crate stands on: the pool, versioned migrations and
//! their runner, table names, and one reading of the database's errors. The server half's store
//! and the durable half's outbox, inbox and ledger build on it; `surely::postgres`, at the top,
//! lists them all and re-exports what users name.

// Built only for a half that keeps tables; `postgres` alone has no table of its own.
#![cfg_attr(not(any(feature = "server", feature = "durable")), allow(dead_code))]

mod migration;
#[cfg(any(feature = "server", feature = "durable"))]
mod store;
mod transaction;

/// A table's name without its schema: the prefix of its indexes' names, which PostgreSQL takes
/// unqualified (an index lives in its table's schema).
pub(crate) fn bare(table: &str) -> &str {
    table.rsplit_once('.').map_or(table, |(_, t)| t)
}

/// A duration as the crate's statements take it: microseconds, rounded up (a lease, a wait or a
/// retention is never shortened), and at most [`MAX_DURATION`](crate::MAX_DURATION) counted, so
/// that `now()` moved either way by it stays a timestamp (PostgreSQL refuses a timestamp past the
/// year 294276, and an interval past about 292,000 years, with an error: a duration of
/// `Duration::MAX` would be one).
#[cfg(any(feature = "server", feature = "durable"))]
pub(crate) fn micros(d: std::time::Duration) -> i64 {
    let us = d.min(crate::MAX_DURATION).as_nanos().div_ceil(1000);
    i64::try_from(us).unwrap_or(i64::MAX)
}

#[cfg(any(feature = "server", feature = "durable"))]
pub(crate) use self::migration::Migration;
pub(crate) use self::migration::{apply, Component};
pub use self::migration::{Applied, MigrateError};
#[cfg(any(feature = "server", feature = "durable"))]
pub(crate) use self::store::{Statements, Store};
#[cfg(any(feature = "server", feature = "durable"))]
pub(crate) use self::transaction::sealed as in_transaction;
pub use self::transaction::InTransaction;
/// A pool of PostgreSQL connections: deadpool-postgres's, over tokio-postgres (both in
/// [`surely::deps`](crate::deps), at the versions this crate uses).
pub type Pool = deadpool_postgres::Pool;

use deadpool_postgres::Manager;
use tokio_postgres::NoTls;

/// A pool of 16 connections (no TLS) to the database at `url` (`postgres://user@host:port/db`).
///
/// # Errors
///
/// The URL does not parse, or the pool cannot be built. Nothing connects yet: the first
/// connection is made when it is first needed.
pub fn connect(url: &str) -> Result<Pool, ConnectError> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| ConnectError::new("the URL does not parse", e))?;
    Pool::builder(Manager::new(config, NoTls))
        .max_size(16)
        .build()
        .map_err(|e| ConnectError::new("the pool's settings were refused", e))
}

/// [`connect`] could not make a pool: the URL does not parse, or the pool's settings were
/// refused. Its message says which; the error of tokio-postgres or deadpool that says why is
/// its [`source`](std::error::Error::source).
///
/// ```
/// let err = surely::postgres::connect("postgres://127.0.0.1:port/db").unwrap_err();
/// assert_eq!(err.to_string(), "cannot make a PostgreSQL pool: the URL does not parse");
/// assert!(std::error::Error::source(&err).is_some());
/// ```
#[derive(Debug, thiserror::Error)]
#[error("cannot make a PostgreSQL pool: {failed}")]
pub struct ConnectError {
    failed: &'static str,
    source: crate::classify::BoxError,
}

impl ConnectError {
    fn new(failed: &'static str, source: impl Into<crate::classify::BoxError>) -> Self {
        ConnectError {
            failed,
            source: source.into(),
        }
    }
}

/// Whether a failed statement failed for the values it was given: a data exception (SQLSTATE
/// class 22, such as a value a type refuses) or a program limit (class 54, such as an index
/// entry over the btree's limit). Retrying the same values fails the same way.
pub(crate) fn is_input_error(e: &tokio_postgres::Error) -> bool {
    matches!(e.code().map(|c| &c.code()[..2]), Some("22") | Some("54"))
}

/// `name`, if it is a table name the crate accepts ([`valid_table`]); else the error that says
/// so, naming the setting `what`.
pub(crate) fn check_table(what: &'static str, name: &str) -> Result<(), crate::ConfigError> {
    if valid_table(name) {
        Ok(())
    } else {
        Err(crate::ConfigError::new(
            what,
            "must be a lower-case identifier ([a-z_][a-z0-9_]*, at most 50 bytes), optionally schema-qualified",
        ))
    }
}

/// A table name the crate accepts: a lower-case SQL identifier (at most 50 bytes), optionally
/// schema-qualified (`schema.table`). Names are written into statements, so nothing else is.
pub(crate) fn valid_table(name: &str) -> bool {
    let ident = |s: &str| {
        !s.is_empty()
            && s.len() <= 50
            && s.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    match name.split_once('.') {
        Some((schema, table)) => ident(schema) && ident(table),
        None => ident(name),
    }
}

/// For the components' tests: the machine's PostgreSQL, and the plans of their statements.
#[cfg(all(test, any(feature = "server", feature = "durable")))]
pub(crate) mod testing {
    use super::Pool;

    /// A pool on the test server (`SURELY_TEST_POSTGRES_URL`, or the machine's default).
    pub(crate) fn pool() -> Pool {
        let url = std::env::var("SURELY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        super::connect(&url).unwrap()
    }

    /// The plan of `sql`, with its parameters set to `args` (SQL literals, comma-separated),
    /// as `EXPLAIN` says it with sequential scans discouraged (`enable_seqscan = off`), so that
    /// the planner shows an index that serves the statement even on a small table. The
    /// statement is prepared and explained, never run.
    pub(crate) async fn plan(pool: &Pool, sql: &str, args: &str) -> String {
        let client = pool.get().await.unwrap();
        client
            .batch_execute(&format!(
                "SET enable_seqscan = off; PREPARE surely_plan AS {sql}"
            ))
            .await
            .unwrap();
        let rows = client
            .query(&format!("EXPLAIN EXECUTE surely_plan({args})"), &[])
            .await
            .unwrap();
        client
            .batch_execute("DEALLOCATE surely_plan; RESET enable_seqscan")
            .await
            .unwrap();
        rows.iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n")
    }
}
