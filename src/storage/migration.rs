//! Versioned, named migrations, and the runner that applies them once, under a lock.

use std::fmt;

use super::Pool;
use crate::classify::BoxError;

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

/// The table that records which migrations were applied.
const RECORDS: &str = "surely_migrations";

/// The advisory lock that serialises migrations (an arbitrary constant: `surely` in ASCII).
const LOCK: i64 = 0x0000_7375_7265_6c79;

/// Applies, in one transaction, every migration of `targets` (each component with its table)
/// that the database has not recorded yet, in version order, and records them; returns what it
/// applied. Holds an advisory lock meanwhile, so that instances starting together apply each
/// migration once.
///
/// # Errors
///
/// The database could not be reached, or refused a migration: nothing of this run is applied
/// (the transaction rolls back), and the error names the migration.
pub(crate) async fn apply(
    pool: &Pool,
    targets: &[(&'static Component, &str)],
) -> Result<Vec<Applied>, MigrateError> {
    let mut client = pool
        .get()
        .await
        .map_err(|e| MigrateError::new("connecting", e))?;
    let txn = client
        .transaction()
        .await
        .map_err(|e| MigrateError::new("starting the transaction", e))?;
    // `CREATE ... IF NOT EXISTS` of what exists says so in a NOTICE, which tokio-postgres
    // logs at INFO on every start: the migrations' transaction keeps only warnings and errors.
    txn.batch_execute(&format!(
        "SET LOCAL client_min_messages = warning;
             SELECT pg_advisory_xact_lock({LOCK});
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
    for &(component, table) in targets {
        let name = &component.name;
        let rows = txn
            .query(
                &format!("SELECT version FROM {RECORDS} WHERE component = $1 AND target = $2"),
                &[name, &table],
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
                table: table.to_owned(),
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
                &[name, &table, &version, &m.name],
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

/// A migration that [`Migrations::run`](crate::postgres::Migrations::run) applied.
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

/// A migration run failed; nothing of it was applied. Its message says what the run was doing;
/// PostgreSQL's error is its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL migration failed while {doing}")]
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
