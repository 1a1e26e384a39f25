//! A component's store on PostgreSQL: its pool, its table's name, and the statements it made
//! for that table once, when the table was named.

use std::sync::Arc;

use super::{apply, check_table, Component, MigrateError, Pool};
use crate::ConfigError;

/// A component's statements, made for one table.
pub(crate) trait Statements: Send + Sync + 'static {
    /// The component: its default table and its migrations.
    const COMPONENT: &'static Component;
    /// What a table name of the component is called in a [`ConfigError`]: `ledger table name`.
    const TABLE_SETTING: &'static str;

    /// The statements for `table`, a name [`check_table`] accepted.
    fn new(table: &str) -> Self;
}

/// A component's pool and its statements for its table; clones share them.
pub(crate) struct Store<Q> {
    pool: Pool,
    table: Arc<str>,
    sql: Arc<Q>,
}

impl<Q> Clone for Store<Q> {
    fn clone(&self) -> Self {
        Store {
            pool: self.pool.clone(),
            table: Arc::clone(&self.table),
            sql: Arc::clone(&self.sql),
        }
    }
}

impl<Q: Statements> Store<Q> {
    /// The store over `pool`, in the component's default table.
    pub(crate) fn new(pool: Pool) -> Self {
        Self::at(pool, Q::COMPONENT.default_table)
    }

    fn at(pool: Pool, table: &str) -> Self {
        Store {
            pool,
            table: table.into(),
            sql: Arc::new(Q::new(table)),
        }
    }

    /// The same store in `table`.
    ///
    /// # Errors
    ///
    /// The name is not one [`check_table`] accepts; the error names the setting
    /// ([`Statements::TABLE_SETTING`]).
    pub(crate) fn with_table(self, table: &str) -> Result<Self, ConfigError> {
        check_table(Q::TABLE_SETTING, table)?;
        Ok(Self::at(self.pool, table))
    }

    /// The pool.
    #[cfg_attr(not(feature = "durable"), allow(dead_code))]
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The table's name.
    pub(crate) fn table(&self) -> &str {
        &self.table
    }

    /// The statements.
    pub(crate) fn sql(&self) -> &Q {
        &self.sql
    }

    /// Applies the table's migrations that the database has not recorded yet.
    pub(crate) async fn migrate(&self) -> Result<(), MigrateError> {
        apply(&self.pool, &[(Q::COMPONENT, self.table())])
            .await
            .map(drop)
    }

    /// A connection from the pool.
    pub(crate) async fn client(
        &self,
    ) -> Result<deadpool_postgres::Object, deadpool_postgres::PoolError> {
        self.pool.get().await
    }
}
