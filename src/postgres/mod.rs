//! One way of talking to PostgreSQL for everything the crate keeps there
//! ([`docs::architecture`](crate::docs::architecture)): one pool type, one set of versioned
//! migrations run with one call, and one reading of the database's errors.
//!
//! * **The pool** is deadpool-postgres's [`Pool`], re-exported, over tokio-postgres: the
//!   idempotency [store][crate::server::store::PostgresStore] takes one, and a handler
//!   that writes its business rows and completes its record in one transaction takes its
//!   connection from the same pool; so do the [outbox][crate::outbox::PostgresOutbox], the
//!   [inbox][crate::inbox::PostgresInbox] and the [ledger][crate::ledger::PostgresLedger] of
//!   unknown calls. [`connect`] makes one.
//! * **Migrations** are versioned and named, per component and per table, and recorded in the
//!   table `surely_migrations`. [`migrate`] applies every one the crate has that the database
//!   has not seen yet, for every component with its default table, in one transaction under an
//!   advisory lock: running it twice, or from two instances at once, applies each once.
//!   [`Migrations`] chooses other table names.
//!
//!   The record of a migration is kept by component and table (`component`, `target`,
//!   `version`), not by looking at the table: a table dropped by hand keeps its rows in
//!   `surely_migrations`, and [`migrate`] would then not create it again. Drop both together,
//!   with the function the idempotency store's table comes with (`<table>_acquire`):
//!   `DROP TABLE orders_idempotency; DROP FUNCTION orders_idempotency_acquire; DELETE FROM
//!   surely_migrations WHERE target = 'orders_idempotency';`.
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
#![cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "crate::outbox::PostgresOutbox",
        "crate::inbox::PostgresInbox",
        "crate::ledger::PostgresLedger",
    )
)]
#![cfg_attr(
    not(all(feature = "server", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "crate::server::store::PostgresStore",
    )
)]

use crate::storage::Component;
use crate::ConfigError;

pub use crate::storage::{connect, Applied, ConnectError, InTransaction, MigrateError, Pool};

/// Every component the crate has, in the order they are migrated.
fn components() -> Vec<&'static Component> {
    vec![
        #[cfg(feature = "server")]
        &crate::server::store::POSTGRES_COMPONENT,
        #[cfg(feature = "durable")]
        &crate::outbox::POSTGRES_COMPONENT,
        #[cfg(feature = "durable")]
        &crate::inbox::POSTGRES_COMPONENT,
        #[cfg(feature = "durable")]
        &crate::ledger::POSTGRES_COMPONENT,
        #[cfg(feature = "durable")]
        &crate::reconcile::POSTGRES_COMPONENT,
        #[cfg(feature = "admin")]
        &crate::admin::POSTGRES_COMPONENT,
        #[cfg(any(feature = "server", feature = "durable"))]
        &crate::maintenance::POSTGRES_COMPONENT,
    ]
}

/// Which of the crate's tables to migrate, and under which names: by default every component,
/// each with its default table.
///
/// ```no_run
/// # async fn run(pool: surely::postgres::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// use surely::postgres::Migrations;
///
/// let applied = Migrations::new()
///     .idempotency_table("billing.idempotency")?
///     .run(&pool)
///     .await?;
/// # let _ = applied; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Migrations {
    targets: Vec<(&'static str, String)>,
}

impl Default for Migrations {
    fn default() -> Self {
        Self::new()
    }
}

impl Migrations {
    /// Every component the crate keeps in PostgreSQL, with its default table.
    pub fn new() -> Self {
        Migrations {
            targets: components()
                .iter()
                .map(|c| (c.name, c.default_table.to_owned()))
                .collect(),
        }
    }

    #[cfg(feature = "server")]
    /// The idempotency store's table (default `surely_idempotency`), as given to
    /// [`PostgresStore::with_table`](crate::server::store::PostgresStore::with_table).
    ///
    /// # Errors
    ///
    /// The name is not a lower-case identifier (letters, digits, `_`, at most 50 bytes),
    /// optionally schema-qualified.
    pub fn idempotency_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::server::store::POSTGRES_COMPONENT, table)
    }

    #[cfg(feature = "durable")]
    /// The outbox's table (default `surely_outbox`), as given to
    /// [`PostgresOutbox::with_table`](crate::outbox::PostgresOutbox::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`][Self::idempotency_table].
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!("Self::idempotency_table")
    )]
    pub fn outbox_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::outbox::POSTGRES_COMPONENT, table)
    }

    #[cfg(feature = "durable")]
    /// The inbox's table (default `surely_inbox`, with `surely_inbox_versions` beside it), as
    /// given to [`PostgresInbox::with_table`](crate::inbox::PostgresInbox::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`][Self::idempotency_table].
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!("Self::idempotency_table")
    )]
    pub fn inbox_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::inbox::POSTGRES_COMPONENT, table)
    }

    #[cfg(feature = "durable")]
    /// The UNKNOWN ledger's table (default `surely_ledger`, with `surely_ledger_attempts`
    /// beside it), as given to
    /// [`PostgresLedger::with_table`](crate::ledger::PostgresLedger::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`][Self::idempotency_table].
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!("Self::idempotency_table")
    )]
    pub fn ledger_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::ledger::POSTGRES_COMPONENT, table)
    }

    #[cfg(feature = "durable")]
    /// The reconciliation differences' table (default `surely_reconcile`), as given to
    /// [`PostgresDifferences::with_table`](crate::reconcile::PostgresDifferences::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`][Self::idempotency_table].
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!("Self::idempotency_table")
    )]
    pub fn reconcile_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::reconcile::POSTGRES_COMPONENT, table)
    }

    #[cfg(feature = "admin")]
    /// The admin's audit log's table (default `surely_admin_audit`), as given to
    /// [`AuditLog::with_table`](crate::admin::AuditLog::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`][Self::idempotency_table].
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!("Self::idempotency_table")
    )]
    pub fn audit_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::admin::POSTGRES_COMPONENT, table)
    }

    #[cfg(any(feature = "server", feature = "durable"))]
    /// The maintenance's leases' table (default `surely_leases`), as given to
    /// [`PostgresLeases::with_table`](crate::maintenance::PostgresLeases::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`][Self::idempotency_table].
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!("Self::idempotency_table")
    )]
    pub fn leases_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::maintenance::POSTGRES_COMPONENT, table)
    }

    #[cfg_attr(not(any(feature = "server", feature = "durable")), allow(dead_code))]
    fn table_of(mut self, component: &Component, table: &str) -> Result<Self, ConfigError> {
        crate::storage::check_table("table name", table)?;
        for target in &mut self.targets {
            if target.0 == component.name {
                target.1 = table.to_owned();
            }
        }
        Ok(self)
    }

    /// Applies, in one transaction, every migration of the chosen tables that the database has
    /// not recorded yet, in version order, and records them; returns what it applied. Holds an
    /// advisory lock meanwhile, so that instances starting together apply each migration once.
    /// The record is the table `surely_migrations` (one row per table and version), shared by
    /// every component and made on the first run; with nothing to apply, a run logs nothing at
    /// `INFO`.
    ///
    /// # Errors
    ///
    /// The database could not be reached, or refused a migration: nothing of this run is
    /// applied (the transaction rolls back), and the error names the migration.
    pub async fn run(&self, pool: &Pool) -> Result<Vec<Applied>, MigrateError> {
        let targets: Vec<(&'static Component, &str)> = self
            .targets
            .iter()
            .filter_map(|(name, table)| {
                components()
                    .into_iter()
                    .find(|c| c.name == *name)
                    .map(|c| (c, table.as_str()))
            })
            .collect();
        crate::storage::apply(pool, &targets).await
    }
}

/// Applies every migration of every component the crate keeps in PostgreSQL, with the default
/// table names, that the database has not recorded yet; see [`Migrations::run`].
///
/// # Errors
///
/// As for [`Migrations::run`].
pub async fn migrate(pool: &Pool) -> Result<Vec<Applied>, MigrateError> {
    Migrations::new().run(pool).await
}
