//! Who runs a chore this round: a named lease, held by one instance at a time.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::BoxFuture;
use crate::classify::BoxError;

/// Named leases that the instances of a service share, so that of the instances running the
/// same [maintenance](super::Maintenance), one runs each [chore](super::Chore) per round.
///
/// [`take`](Self::take) gives the lease to `holder` for `ttl` if nobody holds it, its holder's
/// time is up, or `holder` holds it already (a holder takes its own lease again). A holder that
/// dies loses its lease when its time is up, and another instance takes the chore over then.
/// A lease is a courtesy, not a fence: the chores of the crate are safe when two instances run
/// them at once (each batch is one atomic move that skips rows another holds), and the lease only
/// keeps them from doing the same scan twice.
///
/// [`LocalLeases`] is for one process (the default); `PostgresLeases` (feature `postgres`)
/// shares them through a table.
pub trait Leases: Send + Sync + 'static {
    /// Gives the lease `name` to `holder` for `ttl`, and says whether it did.
    fn take<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, BoxError>>;
}

impl<L: Leases + ?Sized> Leases for Arc<L> {
    fn take<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, BoxError>> {
        (**self).take(name, holder, ttl)
    }
}

/// Leases held in this process: for a service with one instance, and for tests.
///
/// # Memory
///
/// One entry per chore name the process has asked for: the chores of a maintenance task, a
/// handful.
#[derive(Clone, Default)]
pub struct LocalLeases {
    held: Arc<Mutex<HashMap<String, (String, tokio::time::Instant)>>>,
}

impl LocalLeases {
    /// No lease held.
    pub fn new() -> Self {
        Self::default()
    }
}

impl fmt::Debug for LocalLeases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalLeases").finish_non_exhaustive()
    }
}

impl Leases for LocalLeases {
    fn take<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, BoxError>> {
        let now = tokio::time::Instant::now();
        let until = crate::time::later(now, ttl);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let taken = match held.get(name) {
            Some((h, u)) if h != holder && *u > now => false,
            _ => {
                held.insert(name.to_owned(), (holder.to_owned(), until));
                true
            }
        };
        Box::pin(std::future::ready(Ok(taken)))
    }
}

#[cfg(feature = "postgres")]
pub use self::postgres::PostgresLeases;
#[cfg(feature = "postgres")]
pub(crate) use self::postgres::POSTGRES_COMPONENT;

#[cfg(feature = "postgres")]
mod postgres {
    use std::fmt;
    use std::time::Duration;

    use super::{BoxFuture, Leases};
    use crate::classify::BoxError;
    use crate::storage::{micros, Component, Migration, Pool, Statements, Store};
    use crate::ConfigError;

    /// The leases' table, and its migrations in version order.
    pub(crate) static POSTGRES_COMPONENT: Component = Component {
        name: "leases",
        default_table: "surely_leases",
        migrations: &[Migration {
            version: 1,
            name: "leases",
            sql: |t| {
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        name text PRIMARY KEY,
                        holder text NOT NULL,
                        until timestamptz NOT NULL,
                        taken bigint NOT NULL DEFAULT 1
                    );"
                )
            },
        }],
    };

    pub(crate) struct Sql {
        take: String,
    }

    impl Statements for Sql {
        const COMPONENT: &'static Component = &POSTGRES_COMPONENT;
        const TABLE_SETTING: &'static str = "leases table name";

        fn new(t: &str) -> Self {
            Sql {
                // One statement: a new name, a lease whose time is up, or the holder's own
                // is (re)taken; a lease another holder still has is not, and returns no row.
                take: format!(
                    "INSERT INTO {t} AS l (name, holder, until)
                     VALUES ($1, $2, now() + $3::int8 * interval '1 microsecond')
                     ON CONFLICT (name) DO UPDATE
                        SET holder = EXCLUDED.holder, until = EXCLUDED.until, taken = l.taken + 1
                        WHERE l.until <= now() OR l.holder = EXCLUDED.holder
                     RETURNING taken"
                ),
            }
        }
    }

    /// Leases in a PostgreSQL table (default `surely_leases`, made by
    /// [`postgres::migrate`](crate::postgres::migrate)), on the database's clock: the instances
    /// of a service share them.
    ///
    /// ```no_run
    /// # async fn run(pool: surely::postgres::Pool) -> Result<(), surely::ConfigError> {
    /// use std::time::Duration;
    /// use surely::maintenance::{Maintenance, PostgresLeases};
    ///
    /// // Every instance of the service runs the same maintenance; of them, one runs each
    /// // chore per round.
    /// let maintenance = Maintenance::builder()
    ///     .leases(PostgresLeases::new(pool))
    ///     .every(Duration::from_secs(60))
    ///     // .chore(...) for each table
    ///     .build()?
    ///     .spawn();
    /// # let _ = maintenance; Ok(()) }
    /// ```
    #[derive(Clone)]
    pub struct PostgresLeases {
        store: Store<Sql>,
    }

    impl PostgresLeases {
        /// Leases in the table `surely_leases` of `pool`'s database.
        pub fn new(pool: Pool) -> Self {
            PostgresLeases {
                store: Store::new(pool),
            }
        }

        /// The same leases in `table`.
        ///
        /// # Errors
        ///
        /// The name is not a lower-case identifier (letters, digits, `_`, at most 50 bytes),
        /// optionally schema-qualified.
        pub fn with_table(self, table: &str) -> Result<Self, ConfigError> {
            Ok(PostgresLeases {
                store: self.store.with_table(table)?,
            })
        }

        /// Creates or upgrades the table (as [`postgres::migrate`](crate::postgres::migrate)
        /// does for every table of the crate).
        ///
        /// # Errors
        ///
        /// The database could not be reached, or refused the migration.
        pub async fn migrate(&self) -> Result<(), crate::storage::MigrateError> {
            self.store.migrate().await
        }
    }

    impl fmt::Debug for PostgresLeases {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("PostgresLeases")
                .field("table", &self.store.table())
                .finish()
        }
    }

    impl Leases for PostgresLeases {
        fn take<'a>(
            &'a self,
            name: &'a str,
            holder: &'a str,
            ttl: Duration,
        ) -> BoxFuture<'a, Result<bool, BoxError>> {
            Box::pin(async move {
                let client = self.store.client().await?;
                let rows = client
                    .query(&self.store.sql().take, &[&name, &holder, &micros(ttl)])
                    .await?;
                Ok(!rows.is_empty())
            })
        }
    }
}
