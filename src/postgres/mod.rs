//! One way of talking to PostgreSQL for everything the crate keeps there
//! ([`docs::architecture`](crate::docs::architecture)): one pool type, one set of versioned
//! migrations run with one call, and one reading of the database's errors.
//!
//! * **The pool** is deadpool-postgres's [`Pool`], re-exported, over tokio-postgres: the
//!   idempotency [store](crate::server::store::PostgresStore) takes one, and a handler
//!   that writes its business rows and completes its record in one transaction takes its
//!   connection from the same pool; so do the [outbox](crate::outbox::PostgresOutbox), the
//!   [inbox](crate::inbox::PostgresInbox) and the [ledger](crate::ledger::PostgresLedger) of
//!   unknown calls. [`connect`] makes one.
//! * **Migrations** are versioned and named, per component and per table, and recorded in the
//!   table `surely_migrations`. [`migrate`] applies every one the crate has that the database
//!   has not seen yet, for every component with its default table, in one transaction under an
//!   advisory lock: running it twice, or from two instances at once, applies each once.
//!   [`Migrations`] chooses other table names.
//! * **Errors**: a statement that fails because of the values a request brought (a data
//!   exception, SQLSTATE class 22; a limit, class 54) is the request's fault, never the
//!   server's: stores built on this module answer it with a 4xx, not a 503 that a client would
//!   retry.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = surely::postgres::connect("postgres://postgres@127.0.0.1:5432/test")?;
//! // At start-up, before serving: creates or upgrades every table the crate uses.
//! for applied in surely::postgres::migrate(&pool).await? {
//!     println!("applied {applied}");
//! }
//! let store = surely::server::store::PostgresStore::new(pool.clone());
//! # let _ = store; Ok(()) }
//! ```

mod migrate;

/// A table's name without its schema: the prefix of its indexes' names, which PostgreSQL takes
/// unqualified (an index lives in its table's schema).
pub(crate) fn bare(table: &str) -> &str {
    table.rsplit_once('.').map_or(table, |(_, t)| t)
}

pub use self::migrate::{migrate, Applied, MigrateError, Migrations};
pub(crate) use self::migrate::{Component, Migration};
pub use deadpool_postgres::Pool;

use deadpool_postgres::Manager;
use tokio_postgres::NoTls;

/// A pool of 16 connections (no TLS) to the database at `url` (`postgres://user@host:port/db`).
///
/// # Errors
///
/// The URL does not parse, or the pool cannot be built. Nothing connects yet: the first
/// connection is made when it is first needed.
pub fn connect(url: &str) -> Result<Pool, ConnectError> {
    let config: tokio_postgres::Config = url.parse().map_err(ConnectError::new)?;
    Pool::builder(Manager::new(config, NoTls))
        .max_size(16)
        .build()
        .map_err(ConnectError::new)
}

/// [`connect`] could not make a pool: the URL does not parse, or the pool's settings were
/// refused.
#[derive(Debug, thiserror::Error)]
#[error("cannot make a PostgreSQL pool: {0}")]
pub struct ConnectError(crate::classify::BoxError);

impl ConnectError {
    fn new(e: impl Into<crate::classify::BoxError>) -> Self {
        ConnectError(e.into())
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
