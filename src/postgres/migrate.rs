//! Versioned, named migrations for everything the crate keeps in PostgreSQL.

use std::fmt;

use super::Pool;
use crate::classify::BoxError;
use crate::ConfigError;

/// One migration of a component's table: applied once, in version order, and recorded.
pub(crate) struct Migration {
    pub(crate) version: u32,
    pub(crate) name: &'static str,
    /// The statements, for the table named.
    pub(crate) sql: fn(&str) -> String,
}

/// A part of the crate that keeps a table, and its migrations in version order.
pub(crate) struct Component {
    pub(crate) name: &'static str,
    pub(crate) default_table: &'static str,
    pub(crate) migrations: &'static [Migration],
}

/// Every component the crate has, in the order they are migrated.
fn components() -> [&'static Component; 4] {
    [
        &crate::server::store::POSTGRES_COMPONENT,
        &crate::outbox::POSTGRES_COMPONENT,
        &crate::inbox::POSTGRES_COMPONENT,
        &crate::ledger::POSTGRES_COMPONENT,
    ]
}

/// The table that records which migrations were applied.
const RECORDS: &str = "surely_migrations";

/// The advisory lock that serialises migrations (an arbitrary constant: `surely` in ASCII).
const LOCK: i64 = 0x0000_7375_7265_6c79;

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

    /// Only `component`'s migrations, for `table`.
    pub(crate) fn only(component: &'static Component, table: &str) -> Self {
        Migrations {
            targets: vec![(component.name, table.to_owned())],
        }
    }

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

    /// The outbox's table (default `surely_outbox`), as given to
    /// [`PostgresOutbox::with_table`](crate::outbox::PostgresOutbox::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`](Self::idempotency_table).
    pub fn outbox_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::outbox::POSTGRES_COMPONENT, table)
    }

    /// The inbox's table (default `surely_inbox`, with `surely_inbox_versions` beside it), as
    /// given to [`PostgresInbox::with_table`](crate::inbox::PostgresInbox::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`](Self::idempotency_table).
    pub fn inbox_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::inbox::POSTGRES_COMPONENT, table)
    }

    /// The UNKNOWN ledger's table (default `surely_ledger`, with `surely_ledger_attempts`
    /// beside it), as given to
    /// [`PostgresLedger::with_table`](crate::ledger::PostgresLedger::with_table).
    ///
    /// # Errors
    ///
    /// As for [`idempotency_table`](Self::idempotency_table).
    pub fn ledger_table(self, table: &str) -> Result<Self, ConfigError> {
        self.table_of(&crate::ledger::POSTGRES_COMPONENT, table)
    }

    fn table_of(mut self, component: &Component, table: &str) -> Result<Self, ConfigError> {
        crate::postgres::check_table("table name", table)?;
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
    ///
    /// # Errors
    ///
    /// The database could not be reached, or refused a migration: nothing of this run is
    /// applied (the transaction rolls back), and the error names the migration.
    pub async fn run(&self, pool: &Pool) -> Result<Vec<Applied>, MigrateError> {
        let mut client = pool
            .get()
            .await
            .map_err(|e| MigrateError::new("connecting", e))?;
        let txn = client
            .transaction()
            .await
            .map_err(|e| MigrateError::new("starting the transaction", e))?;
        txn.batch_execute(&format!(
            "SELECT pg_advisory_xact_lock({LOCK});
             CREATE TABLE IF NOT EXISTS {RECORDS} (
                 component text NOT NULL,
                 target text NOT NULL,
                 version integer NOT NULL,
                 name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (component, target, version)
             );"
        ))
        .await
        .map_err(|e| MigrateError::new("creating the migration records", e))?;
        let mut applied = Vec::new();
        for (name, table) in &self.targets {
            let Some(component) = components().into_iter().find(|c| c.name == *name) else {
                continue;
            };
            let rows = txn
                .query(
                    &format!("SELECT version FROM {RECORDS} WHERE component = $1 AND target = $2"),
                    &[name, table],
                )
                .await
                .map_err(|e| MigrateError::new("reading the migration records", e))?;
            let done: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
            for m in component.migrations {
                let version = i32::try_from(m.version).unwrap_or(i32::MAX);
                if done.contains(&version) {
                    continue;
                }
                let step = Applied {
                    component: component.name,
                    table: table.clone(),
                    version: m.version,
                    name: m.name,
                };
                txn.batch_execute(&(m.sql)(table))
                    .await
                    .map_err(|e| MigrateError::new(format!("applying {step}"), e))?;
                txn.execute(
                    &format!(
                        "INSERT INTO {RECORDS} (component, target, version, name)
                         VALUES ($1, $2, $3, $4)"
                    ),
                    &[name, table, &version, &m.name],
                )
                .await
                .map_err(|e| MigrateError::new(format!("recording {step}"), e))?;
                applied.push(step);
            }
        }
        txn.commit()
            .await
            .map_err(|e| MigrateError::new("committing the migrations", e))?;
        Ok(applied)
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

/// A migration that [`Migrations::run`] applied.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied {
    /// The component: `idempotency`.
    pub component: &'static str,
    /// Its table.
    pub table: String,
    /// The migration's version, from 1.
    pub version: u32,
    /// What it does.
    pub name: &'static str,
}

impl fmt::Display for Applied {
    /// `idempotency surely_idempotency v2 (acquired_at)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} v{} ({})",
            self.component, self.table, self.version, self.name
        )
    }
}

/// A migration run failed; nothing of it was applied.
#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL migration failed while {doing}: {source}")]
pub struct MigrateError {
    doing: String,
    source: BoxError,
}

impl MigrateError {
    fn new(doing: impl Into<String>, source: impl Into<BoxError>) -> Self {
        MigrateError {
            doing: doing.into(),
            source: source.into(),
        }
    }
}
