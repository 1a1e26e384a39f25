//! The audit log: every operator action, who took it, when, on what, why, and how it ended.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use crate::classify::BoxError;
use crate::ledger::{check_text, MAX_TEXT, MAX_WHO};
use crate::maintenance::{self, Batch, BoxFuture, Chore};
use crate::ConfigError;

/// What an operator did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuditAction {
    /// Settled a ledger entry by hand ([`Ledger::settle_manually`](crate::ledger::Ledger::settle_manually)).
    Settle,
    /// Sent a ledger entry back to the reconcilers ([`Ledger::retry_now`](crate::ledger::Ledger::retry_now)).
    RetryNow,
    /// Requeued a quarantined outbox event ([`OutboxStore::requeue`](crate::outbox::OutboxStore::requeue)).
    Requeue,
    /// Discarded a quarantined outbox event ([`OutboxStore::discard`](crate::outbox::OutboxStore::discard)).
    Discard,
    /// Resolved a reconciliation difference by hand ([`DifferenceStore::resolve_manually`](crate::reconcile::DifferenceStore::resolve_manually)).
    Resolve,
    /// Sent a task in the manual queue back to its handler ([`TaskStore::retry`](crate::inbox::TaskStore::retry)).
    RetryTask,
    /// Discarded a task in the manual queue ([`TaskStore::discard`](crate::inbox::TaskStore::discard)).
    DiscardTask,
}

impl AuditAction {
    /// `ledger.settle`, `ledger.retry_now`, `outbox.requeue`, `outbox.discard`,
    /// `reconcile.resolve`, `inbox.retry_task`, `inbox.discard_task`: as the log keeps it.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::Settle => "ledger.settle",
            AuditAction::RetryNow => "ledger.retry_now",
            AuditAction::Requeue => "outbox.requeue",
            AuditAction::Discard => "outbox.discard",
            AuditAction::Resolve => "reconcile.resolve",
            AuditAction::RetryTask => "inbox.retry_task",
            AuditAction::DiscardTask => "inbox.discard_task",
        }
    }

    /// The action named `name` ([`as_str`](Self::as_str)).
    pub fn parse(name: &str) -> Option<Self> {
        [
            AuditAction::Settle,
            AuditAction::RetryNow,
            AuditAction::Requeue,
            AuditAction::Discard,
            AuditAction::Resolve,
            AuditAction::RetryTask,
            AuditAction::DiscardTask,
        ]
        .into_iter()
        .find(|a| a.as_str() == name)
    }
}

impl fmt::Display for AuditAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditRecord {
    /// Its number: increasing, in the order actions began.
    pub id: u64,
    /// When the action began (the log's clock).
    pub at: SystemTime,
    /// The operator, as the authorization said (never as a form said).
    pub who: String,
    /// The action.
    pub action: AuditAction,
    /// What it acted on: a ledger entry's id, an outbox event's id.
    pub target: String,
    /// Why, as the operator wrote it.
    pub why: String,
    /// How it ended: `done`, or why not; `None` while the action runs, or if the process
    /// stopped before it could say (the action may or may not have happened: look at the
    /// target).
    pub outcome: Option<String>,
}

/// An audit log operation failed: a value was refused, or the backend failed.
///
/// The backend's own error (PostgreSQL's) is its [`source`](std::error::Error::source), not
/// part of its message.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct AuditError {
    kind: AuditErrorKind,
}

#[derive(Debug, thiserror::Error)]
enum AuditErrorKind {
    #[error("refused by the audit log: {0}")]
    Invalid(String),
    #[error("audit log failed: its backend failed")]
    Backend(#[source] BoxError),
}

impl AuditError {
    pub(crate) fn invalid(why: impl Into<String>) -> Self {
        AuditError {
            kind: AuditErrorKind::Invalid(why.into()),
        }
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn backend(e: impl Into<BoxError>) -> Self {
        AuditError {
            kind: AuditErrorKind::Backend(e.into()),
        }
    }

    /// Whether a value (who, why, target) was refused.
    pub fn is_invalid(&self) -> bool {
        matches!(self.kind, AuditErrorKind::Invalid(_))
    }
}

/// Where the admin writes every action: in memory (one process, tests, the example), or in
/// a PostgreSQL table (`surely_admin_audit` by default, created by
/// [`surely::postgres::migrate`][crate::postgres::migrate]).
///
/// An action is written **before** it is taken ([`begin`](Self::begin), with who, what and
/// why, and no outcome), and its outcome after ([`finish`](Self::finish)). A log that cannot
/// be written stops the action: nothing is done that the log does not show. A process that
/// stops between the action and its outcome leaves a line without one, which says what it
/// is: an action that may have happened ([`docs::operators`](crate::docs::operators)).
///
/// ```
/// use surely::admin::{AuditAction, AuditLog};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let log = AuditLog::memory();
/// let id = log.begin("ana", AuditAction::Settle, "unk-1", "the order is in the table").await.unwrap();
/// log.finish(id, "done").await.unwrap();
/// let lines = log.list(10).await.unwrap();
/// assert_eq!(lines[0].outcome.as_deref(), Some("done"));
/// // Control characters are refused, not written.
/// assert!(log.begin("ana\u{1b}[2J", AuditAction::Settle, "unk-1", "why").await.unwrap_err().is_invalid());
/// # }
/// ```
#[cfg_attr(
    not(feature = "postgres"),
    doc = crate::docs::links::to_features!(
        "crate::postgres::migrate",
    )
)]
#[derive(Clone)]
pub struct AuditLog {
    inner: Backend,
}

#[derive(Clone)]
enum Backend {
    Memory(Arc<Mutex<Lines>>),
    #[cfg(feature = "postgres")]
    Postgres(postgres::PostgresAudit),
}

/// The memory log's lines: the newest `capacity`, oldest first, each with when it began on
/// tokio's clock (for the sweep, which tests run on paused time).
struct Lines {
    lines: VecDeque<(tokio::time::Instant, AuditRecord)>,
    /// The id of the next line: ids go on counting past the lines dropped or swept.
    next: u64,
    capacity: usize,
}

impl Lines {
    /// Deletes at most `limit` of the finished lines begun `retention` ago or more, the oldest
    /// first; an unfinished line stays, whatever its age.
    fn sweep(&mut self, retention: Duration, limit: usize) -> u64 {
        let now = tokio::time::Instant::now();
        let retention = retention.min(crate::MAX_DURATION);
        let mut done = 0usize;
        self.lines.retain(|(began, line)| {
            let gone = done < limit
                && line.outcome.is_some()
                && now.saturating_duration_since(*began) >= retention;
            if gone {
                done += 1;
            }
            !gone
        });
        done as u64
    }
}

impl AuditLog {
    /// The lines a memory log keeps unless [`memory_with_capacity`](Self::memory_with_capacity)
    /// says otherwise.
    pub const DEFAULT_MEMORY_CAPACITY: usize = 10_000;

    /// A log in memory: for one process, tests and examples. Its lines do not outlive the
    /// process.
    ///
    /// # Memory
    ///
    /// It keeps the newest [`DEFAULT_MEMORY_CAPACITY`](Self::DEFAULT_MEMORY_CAPACITY) lines
    /// (10 000), each at most about 16.5 KiB (`who` and `target` 256 bytes, `why` and the
    /// outcome 16 KiB): a line past them drops the oldest one, so that writing never fails for
    /// room and an action is never stopped by it. Ids go on counting; the outcome of a line
    /// already dropped is not kept. A log whose every line must stay is
    /// [`postgres`][Self::postgres].
    #[cfg_attr(
        not(all(feature = "admin", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "Self::postgres",
        )
    )]
    pub fn memory() -> Self {
        Self::memory_with_capacity(Self::DEFAULT_MEMORY_CAPACITY)
    }

    /// A log in memory keeping the newest `lines` lines (at least 1): see
    /// [`memory`](Self::memory).
    ///
    /// ```
    /// use surely::admin::{AuditAction, AuditLog};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let log = AuditLog::memory_with_capacity(2);
    /// for target in ["unk-1", "unk-2", "unk-3"] {
    ///     log.begin("ana", AuditAction::Settle, target, "checked by hand").await.unwrap();
    /// }
    /// let lines = log.list(10).await.unwrap();
    /// assert_eq!(lines.iter().map(|l| l.id).collect::<Vec<_>>(), [3, 2]);
    /// # }
    /// ```
    pub fn memory_with_capacity(lines: usize) -> Self {
        AuditLog {
            inner: Backend::Memory(Arc::new(Mutex::new(Lines {
                lines: VecDeque::new(),
                next: 1,
                capacity: lines.max(1),
            }))),
        }
    }

    fn lines(lines: &Mutex<Lines>) -> MutexGuard<'_, Lines> {
        // Every critical section leaves the lines whole before anything that could panic.
        lines.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the line of an action about to be taken, without its outcome; returns its id.
    ///
    /// # Errors
    ///
    /// [`AuditError::is_invalid`] if `who` is empty, over 256 bytes or holds a control
    /// character, `why` is empty, over 16 KiB (16,384 bytes) or holds a control character
    /// other than a newline or a tab, or `target` is empty or over 256 bytes; else the
    /// backend failed.
    pub async fn begin(
        &self,
        who: &str,
        action: AuditAction,
        target: &str,
        why: &str,
    ) -> Result<u64, AuditError> {
        check_text("who", who, MAX_WHO, false).map_err(AuditError::invalid)?;
        check_text("why", why, MAX_TEXT, true).map_err(AuditError::invalid)?;
        check_text("target", target, MAX_WHO, false).map_err(AuditError::invalid)?;
        match &self.inner {
            Backend::Memory(lines) => {
                let mut lines = Self::lines(lines);
                let id = lines.next;
                lines.next += 1;
                if lines.lines.len() >= lines.capacity {
                    lines.lines.pop_front();
                }
                let line = AuditRecord {
                    id,
                    at: SystemTime::now(),
                    who: who.to_owned(),
                    action,
                    target: target.to_owned(),
                    why: why.to_owned(),
                    outcome: None,
                };
                lines.lines.push_back((tokio::time::Instant::now(), line));
                Ok(id)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(pg) => pg.begin(who, action, target, why).await,
        }
    }

    /// Writes how the action of line `id` ended (`done`, or why not: cut to 16 KiB).
    ///
    /// # Errors
    ///
    /// The backend failed.
    pub async fn finish(&self, id: u64, outcome: &str) -> Result<(), AuditError> {
        let outcome = crate::ledger::truncate(outcome, MAX_TEXT);
        match &self.inner {
            Backend::Memory(lines) => {
                let mut lines = Self::lines(lines);
                if let Some((_, line)) = lines.lines.iter_mut().rev().find(|(_, l)| l.id == id) {
                    line.outcome = Some(outcome.to_owned());
                }
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(pg) => pg.finish(id, outcome).await,
        }
    }

    /// The last `limit` lines, newest first.
    ///
    /// # Errors
    ///
    /// The backend failed.
    pub async fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, AuditError> {
        match &self.inner {
            Backend::Memory(lines) => Ok(Self::lines(lines)
                .lines
                .iter()
                .rev()
                .take(limit)
                .map(|(_, line)| line.clone())
                .collect()),
            #[cfg(feature = "postgres")]
            Backend::Postgres(pg) => pg.list(limit).await,
        }
    }
}

impl AuditLog {
    /// Deletes at most `limit` of the lines whose action finished (they have an outcome) and
    /// began `retention` ago or more, the oldest first; returns how many. What an
    /// [`AuditSweeper`] runs.
    async fn sweep_batch(&self, retention: Duration, limit: usize) -> Result<u64, AuditError> {
        match &self.inner {
            Backend::Memory(lines) => Ok(Self::lines(lines).sweep(retention, limit)),
            #[cfg(feature = "postgres")]
            Backend::Postgres(pg) => pg.sweep_batch(retention, limit).await,
        }
    }

    /// The [chore](Chore) that deletes the lines of actions that finished and began
    /// `retention` ago or more ([`AuditSweeper`]), named `audit <table>` on PostgreSQL (the
    /// instances that share the table share its lease) and `audit memory <this process>` in
    /// memory. Without it, the log keeps every line: the default.
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::admin::AuditLog;
    /// use surely::maintenance::Maintenance;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), surely::ConfigError> {
    /// let log = AuditLog::memory();
    /// let maintenance = Maintenance::builder()
    ///     .chore(log.sweeper(Duration::from_secs(400 * 24 * 3600))?) // about 13 months
    ///     .build()?
    ///     .spawn();
    /// # maintenance.shutdown().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `audit retention` and both values: `retention` shorter than
    /// [`MIN_RETENTION`](maintenance::MIN_RETENTION), or longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn sweeper(&self, retention: Duration) -> Result<AuditSweeper, ConfigError> {
        let retention = maintenance::check_retention("audit retention", retention)?;
        let name = match &self.inner {
            Backend::Memory(_) => maintenance::memory_chore_name("audit"),
            #[cfg(feature = "postgres")]
            Backend::Postgres(pg) => format!("audit {}", pg.table()),
        };
        Ok(AuditSweeper {
            log: self.clone(),
            name,
            retention,
        })
    }
}

/// The [chore](Chore) that keeps the audit log bounded, when a retention is set
/// ([`AuditLog::sweeper`]): each batch deletes at most its limit of the lines whose action
/// finished (they have an outcome) and began [`retention`](Self::retention) ago or more, the
/// oldest first, on PostgreSQL through an index on `at` over the finished lines. A line
/// without an outcome (an action that may have happened, its process stopped before it could
/// say) is never deleted: someone must look at its target first. The retention is at least
/// [`MIN_RETENTION`](maintenance::MIN_RETENTION); an audit kept for a compliance period
/// wants that period, often a year or more.
pub struct AuditSweeper {
    log: AuditLog,
    name: String,
    retention: Duration,
}

impl AuditSweeper {
    /// How long a finished line is kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }
}

impl Chore for AuditSweeper {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, BoxError>> {
        Box::pin(async move {
            let done = self.log.sweep_batch(self.retention, limit).await?;
            Ok(maintenance::swept(done, limit))
        })
    }
}

impl fmt::Debug for AuditSweeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditSweeper")
            .field("name", &self.name)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Backend::Memory(lines) => f
                .debug_struct("AuditLog")
                .field("lines", &Self::lines(lines).lines.len())
                .finish(),
            #[cfg(feature = "postgres")]
            Backend::Postgres(pg) => f
                .debug_struct("AuditLog")
                .field("table", &pg.table())
                .finish(),
        }
    }
}

#[cfg(feature = "postgres")]
pub(crate) use self::postgres::POSTGRES_COMPONENT;

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;
    use std::time::SystemTime;

    use super::{AuditAction, AuditError, AuditLog, AuditRecord, Backend};
    use crate::storage::{Component, Migration, Pool};
    use crate::ConfigError;

    /// The audit log's table, and its migrations in version order.
    pub(crate) static POSTGRES_COMPONENT: Component = Component {
        name: "admin_audit",
        default_table: "surely_admin_audit",
        migrations: &[
            Migration {
                version: 1,
                name: "audit",
                sql: |t| {
                    format!(
                        "CREATE TABLE IF NOT EXISTS {t} (
                        id bigserial PRIMARY KEY,
                        at timestamptz NOT NULL DEFAULT now(),
                        who text NOT NULL,
                        action text NOT NULL,
                        target text NOT NULL,
                        why text NOT NULL,
                        outcome text
                    );"
                    )
                },
            },
            Migration {
                version: 2,
                name: "finished at index",
                // The sweep reads the finished lines by when they began, the oldest first.
                sql: |t| {
                    let n = crate::storage::bare(t);
                    format!(
                        "CREATE INDEX IF NOT EXISTS {n}_finished ON {t} (at)
                            WHERE outcome IS NOT NULL;"
                    )
                },
            },
        ],
    };

    /// At most `$2` lines whose action finished and began `$1` microseconds ago or more, the
    /// oldest first, through the index on `at` over the finished lines; lines another batch
    /// holds are skipped.
    pub(super) fn sweep_sql(t: &str) -> String {
        format!(
            "DELETE FROM {t}
             WHERE id = ANY(ARRAY(
                 SELECT id FROM {t}
                 WHERE outcome IS NOT NULL
                     AND at <= now() - $1::int8 * interval '1 microsecond'
                 ORDER BY at
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED
             ))"
        )
    }

    #[derive(Clone)]
    pub(super) struct PostgresAudit {
        pool: Pool,
        table: Arc<str>,
    }

    impl PostgresAudit {
        pub(super) fn table(&self) -> &str {
            &self.table
        }

        pub(super) async fn begin(
            &self,
            who: &str,
            action: AuditAction,
            target: &str,
            why: &str,
        ) -> Result<u64, AuditError> {
            let client = self.pool.get().await.map_err(AuditError::backend)?;
            let row = client
                .query_one(
                    &format!(
                        "INSERT INTO {} (who, action, target, why) VALUES ($1, $2, $3, $4)
                         RETURNING id",
                        self.table
                    ),
                    &[&who, &action.as_str(), &target, &why],
                )
                .await
                .map_err(AuditError::backend)?;
            let id: i64 = row.try_get(0).map_err(AuditError::backend)?;
            Ok(id.max(0) as u64)
        }

        pub(super) async fn finish(&self, id: u64, outcome: &str) -> Result<(), AuditError> {
            let client = self.pool.get().await.map_err(AuditError::backend)?;
            let id = i64::try_from(id).unwrap_or(i64::MAX);
            client
                .execute(
                    &format!("UPDATE {} SET outcome = $2 WHERE id = $1", self.table),
                    &[&id, &outcome],
                )
                .await
                .map_err(AuditError::backend)
                .map(drop)
        }

        pub(super) async fn sweep_batch(
            &self,
            retention: std::time::Duration,
            limit: usize,
        ) -> Result<u64, AuditError> {
            let client = self.pool.get().await.map_err(AuditError::backend)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            client
                .execute(
                    &sweep_sql(&self.table),
                    &[&crate::storage::micros(retention), &limit],
                )
                .await
                .map_err(AuditError::backend)
        }

        pub(super) async fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, AuditError> {
            let client = self.pool.get().await.map_err(AuditError::backend)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = client
                .query(
                    &format!(
                        "SELECT id, at, who, action, target, why, outcome FROM {}
                         ORDER BY id DESC LIMIT $1",
                        self.table
                    ),
                    &[&limit],
                )
                .await
                .map_err(AuditError::backend)?;
            rows.iter()
                .map(|row| {
                    let e = AuditError::backend;
                    let id: i64 = row.try_get(0).map_err(e)?;
                    let action: String = row.try_get(3).map_err(e)?;
                    Ok(AuditRecord {
                        id: id.max(0) as u64,
                        at: row.try_get::<_, SystemTime>(1).map_err(e)?,
                        who: row.try_get(2).map_err(e)?,
                        action: AuditAction::parse(&action).ok_or_else(|| {
                            AuditError::backend(format!("unknown audit action {action:?}"))
                        })?,
                        target: row.try_get(4).map_err(e)?,
                        why: row.try_get(5).map_err(e)?,
                        outcome: row.try_get(6).map_err(e)?,
                    })
                })
                .collect()
        }
    }

    impl AuditLog {
        /// A log in PostgreSQL, in the table `surely_admin_audit`: create it with
        /// [`surely::postgres::migrate`](crate::postgres::migrate) or [`migrate`](Self::migrate).
        pub fn postgres(pool: Pool) -> Self {
            AuditLog {
                inner: Backend::Postgres(PostgresAudit {
                    pool,
                    table: POSTGRES_COMPONENT.default_table.into(),
                }),
            }
        }

        /// The same log in another table, such as `ops.audit`; a memory log is returned as
        /// it is.
        ///
        /// # Errors
        ///
        /// The name is not a lower-case identifier (letters, digits, `_`, at most 50 bytes),
        /// optionally schema-qualified.
        pub fn with_table(self, table: &str) -> Result<Self, ConfigError> {
            crate::storage::check_table("audit table name", table)?;
            Ok(match self.inner {
                Backend::Postgres(pg) => AuditLog {
                    inner: Backend::Postgres(PostgresAudit {
                        pool: pg.pool,
                        table: table.into(),
                    }),
                },
                memory => AuditLog { inner: memory },
            })
        }

        /// Applies this log's table's migrations that the database has not recorded yet
        /// (nothing for a memory log).
        ///
        /// # Errors
        ///
        /// The database refused, or could not be reached.
        pub async fn migrate(&self) -> Result<(), AuditError> {
            match &self.inner {
                Backend::Postgres(pg) => {
                    crate::storage::apply(&pg.pool, &[(&POSTGRES_COMPONENT, pg.table())])
                        .await
                        .map(drop)
                        .map_err(AuditError::backend)
                }
                Backend::Memory(_) => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A million actions into a memory log of 1 000 lines: it keeps the newest 1 000, ids
    /// counting on.
    #[tokio::test]
    async fn a_million_lines_keep_the_memory_log_at_its_capacity() {
        let log = AuditLog::memory_with_capacity(1_000);
        for n in 0..1_000_000 {
            let target = format!("unk-{n}");
            let id = log
                .begin("ana", AuditAction::Settle, &target, "why")
                .await
                .unwrap();
            log.finish(id, "done").await.unwrap();
        }
        let lines = log.list(usize::MAX).await.unwrap();
        assert_eq!(lines.len(), 1_000);
        assert_eq!(lines[0].id, 1_000_000);
        assert_eq!(lines[999].id, 999_001);
        assert!(lines.iter().all(|l| l.outcome.as_deref() == Some("done")));
    }
}

#[cfg(all(test, feature = "postgres"))]
mod plan_tests {
    use super::AuditLog;

    /// The sweep reads the finished lines through the index on `at` over them.
    #[tokio::test]
    async fn pg_the_sweep_is_read_through_the_finished_at_index() {
        use crate::storage::testing::{plan, pool};
        let table = format!("surely_audit_plan_{:x}", crate::ids::random_u128() as u64);
        let pool = pool();
        let log = AuditLog::postgres(pool.clone()).with_table(&table).unwrap();
        log.migrate().await.unwrap();
        let shown = plan(&pool, &super::postgres::sweep_sql(&table), "0, 1000").await;
        pool.get()
            .await
            .unwrap()
            .batch_execute(&format!(
                "DROP TABLE {table}; DELETE FROM surely_migrations WHERE target = '{table}'"
            ))
            .await
            .unwrap();
        assert!(shown.contains(&format!("{table}_finished ")), "{shown}");
        assert!(!shown.contains("Seq Scan"), "{shown}");
        assert!(shown.contains("LockRows"), "{shown}");
    }
}
