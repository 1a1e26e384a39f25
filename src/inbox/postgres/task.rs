//! Tasks on PostgreSQL: a task's schedule in the inbox's `_tasks` table, its attempts'
//! evidence in `_task_steps`, written in the transaction that decided them.

use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::Object;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::{no_connection, InboxTransaction, PostgresInbox, DISCARDED, STALE};
use crate::inbox::memory::{check_person, no_such_task, stale_note};
use crate::inbox::wait::{decide, Decision, Prior};
use crate::inbox::{
    Begin, Consumer, Handler, InboxError, Processed, Reason, Step, Task, TaskState, TaskStats,
    Wait, Waiting,
};
use crate::outbox::Event;

/// The savepoint a task's handler runs after: a wait rolls back to it, and keeps the lock.
const SAVEPOINT: &str = "surely_task";

/// The tables of the inbox's tasks (migration 3).
pub(super) fn migration(t: &str) -> String {
    let n = crate::storage::bare(t);
    format!(
        "CREATE TABLE IF NOT EXISTS {t}_tasks (
            consumer text NOT NULL,
            event_id text NOT NULL,
            aggregate text NOT NULL,
            version bigint NOT NULL,
            kind text NOT NULL,
            header_names text[] NOT NULL,
            header_values text[] NOT NULL,
            payload bytea NOT NULL,
            state text NOT NULL,
            reason text NOT NULL,
            attempts integer NOT NULL,
            streak integer NOT NULL,
            first_at timestamptz NOT NULL,
            next_at timestamptz NOT NULL,
            why text NOT NULL,
            retried boolean NOT NULL DEFAULT false,
            handed_until timestamptz,
            PRIMARY KEY (consumer, event_id)
        );
        CREATE INDEX IF NOT EXISTS {n}_tasks_by_state ON {t}_tasks (consumer, state, first_at);
        CREATE TABLE IF NOT EXISTS {t}_task_steps (
            consumer text NOT NULL,
            event_id text NOT NULL,
            attempt integer NOT NULL,
            at timestamptz NOT NULL DEFAULT now(),
            reason text NOT NULL,
            why text NOT NULL,
            delay_us bigint NOT NULL,
            clamped_from_us bigint,
            PRIMARY KEY (consumer, event_id, attempt),
            FOREIGN KEY (consumer, event_id) REFERENCES {t}_tasks ON DELETE CASCADE
        );"
    )
}

/// The columns of a task as [`task_of`] reads them.
const COLUMNS: &str = "consumer, event_id, aggregate, version, kind, header_names, header_values, \
     payload, state, reason, attempts, \
     (extract(epoch FROM now() - first_at) * 1000000)::int8, \
     (GREATEST(extract(epoch FROM next_at - now()), 0) * 1000000)::int8, why";

/// The statements of the inbox's tasks.
pub(super) struct TaskSql {
    read: String,
    upsert: String,
    step: String,
    delete: String,
    stale: String,
    list: String,
    stats: String,
    one: String,
    steps: String,
    retry: String,
    discard: String,
    take_retried: String,
}

impl TaskSql {
    pub(super) fn new(t: &str) -> Self {
        let key = "consumer = $1 AND event_id = $2";
        TaskSql {
            read: format!(
                "SELECT state, reason, attempts, streak,
                    (extract(epoch FROM now() - first_at) * 1000000)::int8,
                    (GREATEST(extract(epoch FROM next_at - now()), 0) * 1000000)::int8, why
                 FROM {t}_tasks WHERE {key}"
            ),
            upsert: format!(
                "INSERT INTO {t}_tasks AS k (consumer, event_id, aggregate, version, kind,
                    header_names, header_values, payload, state, reason, attempts, streak,
                    first_at, next_at, why)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, clock_timestamp(),
                    clock_timestamp() + $13::int8 * interval '1 microsecond', $14)
                 ON CONFLICT (consumer, event_id) DO UPDATE SET state = EXCLUDED.state,
                    reason = EXCLUDED.reason, attempts = EXCLUDED.attempts,
                    streak = EXCLUDED.streak, next_at = EXCLUDED.next_at, why = EXCLUDED.why,
                    retried = k.retried AND EXCLUDED.state = 'waiting', handed_until = NULL"
            ),
            step: format!(
                "INSERT INTO {t}_task_steps (consumer, event_id, attempt, at, reason, why,
                    delay_us, clamped_from_us)
                 VALUES ($1, $2, $3, clock_timestamp(), $4, $5, $6, $7)
                 ON CONFLICT DO NOTHING"
            ),
            delete: format!("DELETE FROM {t}_tasks WHERE {key}"),
            stale: format!(
                "INSERT INTO {t} (consumer, event_id, aggregate, version, outcome, result)
                 VALUES ($1, $2, $3, $4, {STALE}, $5)"
            ),
            list: format!(
                "SELECT {COLUMNS} FROM {t}_tasks
                 WHERE ($1::text IS NULL OR consumer = $1) AND ($3::text IS NULL OR state = $3)
                 ORDER BY first_at LIMIT $2"
            ),
            stats: format!(
                "SELECT state, reason, count(*),
                    (extract(epoch FROM now() - min(first_at)) * 1000000)::int8
                 FROM {t}_tasks GROUP BY state, reason"
            ),
            one: format!("SELECT {COLUMNS} FROM {t}_tasks WHERE {key}"),
            steps: format!(
                "SELECT attempt, at, reason, why, delay_us, clamped_from_us
                 FROM {t}_task_steps WHERE {key} ORDER BY attempt"
            ),
            retry: format!(
                "UPDATE {t}_tasks SET state = 'waiting', streak = 0, first_at = now(),
                    next_at = now(), why = $3, retried = true, handed_until = NULL
                 WHERE {key} AND state = 'manual'"
            ),
            discard: format!(
                "WITH task AS (
                    DELETE FROM {t}_tasks WHERE {key} AND state = 'manual'
                    RETURNING consumer, event_id, aggregate, version)
                 INSERT INTO {t} (consumer, event_id, aggregate, version, outcome, result)
                 SELECT consumer, event_id, aggregate, version, {DISCARDED}, $3 FROM task"
            ),
            take_retried: format!(
                "UPDATE {t}_tasks SET handed_until = now() + $3::int8 * interval '1 microsecond'
                 WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM {t}_tasks
                     WHERE consumer = $1 AND retried AND state = 'waiting'
                        AND next_at <= now()
                        AND (handed_until IS NULL OR handed_until <= now())
                     ORDER BY first_at LIMIT $2
                     FOR UPDATE SKIP LOCKED))
                 RETURNING {COLUMNS}"
            ),
        }
    }
}

/// A task's row as [`COLUMNS`] reads it, without its steps.
fn task_of(row: &Row) -> Result<Task, InboxError> {
    let e = InboxError::store;
    let event = crate::outbox::event_of(row).map_err(InboxError::Store)?;
    let state: String = row.try_get(8).map_err(e)?;
    let state = TaskState::from_code(&state)
        .ok_or_else(|| InboxError::store(format!("unknown task state `{state}`")))?;
    let reason: String = row.try_get(9).map_err(e)?;
    let attempts: i32 = row.try_get(10).map_err(e)?;
    let age: i64 = row.try_get(11).map_err(e)?;
    let due_in: i64 = row.try_get(12).map_err(e)?;
    Ok(Task {
        consumer: row.try_get(0).map_err(e)?,
        event,
        state,
        reason: Reason::from_code(&reason).map_err(InboxError::UnknownReason)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        age: from_micros(age),
        due_in: (state == TaskState::Waiting).then(|| from_micros(due_in)),
        why: row.try_get(13).map_err(e)?,
        steps: Vec::new(),
    })
}

fn from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// A duration in whole microseconds, for a step (never more than a policy's ten years).
fn micros(d: Duration) -> i64 {
    crate::storage::micros(d)
}

/// A step's row.
fn step_of(row: &Row) -> Result<Step, InboxError> {
    let e = InboxError::store;
    let attempt: i32 = row.try_get(0).map_err(e)?;
    let reason: String = row.try_get(2).map_err(e)?;
    let delay: i64 = row.try_get(4).map_err(e)?;
    let clamped: Option<i64> = row.try_get(5).map_err(e)?;
    Ok(Step {
        attempt: u32::try_from(attempt).unwrap_or(0),
        at: row.try_get(1).map_err(e)?,
        reason: Reason::from_code(&reason).map_err(InboxError::UnknownReason)?,
        why: row.try_get(3).map_err(e)?,
        delay: from_micros(delay),
        clamped_from: clamped.map(from_micros),
    })
}

/// A task's schedule as the transaction read it, after the lock.
struct Found {
    why: String,
    state: String,
    reason: String,
    prior: (u32, u32),
    age: Duration,
    due_in: Duration,
}

impl PostgresInbox {
    /// Processes a delivery of a task in a transaction of its own, and commits it: what
    /// [`MemoryInbox::process_task`](crate::inbox::MemoryInbox::process_task) does, with the
    /// task's schedule in the inbox's `_tasks` table and each attempt's evidence in
    /// `_task_steps` (features `durable` and `postgres`).
    ///
    /// The handler writes through the [`InboxTransaction`] it is given, after a savepoint: its
    /// `Ok` commits its writes with the event's record; its [`Wait`] rolls them back to the
    /// savepoint and commits the task's new schedule instead, in the same transaction, under
    /// the same lock. So the schedule is written **before** the delivery is acknowledged
    /// negatively: a consumer that dies after the commit and before its `nak` gets the
    /// delivery again on the broker's own schedule (JetStream's ack wait), and the inbox
    /// answers [`Waiting`](Processed::Waiting) with the time left, without running the
    /// handler. One that dies before the commit left nothing: the attempt is run again.
    ///
    /// The times are the database's clock, shared by every consumer: a task's next time is
    /// counted from when its handler answered (`clock_timestamp()`), not from when its
    /// transaction began, so that a slow handler does not make its task due sooner.
    ///
    /// ```no_run
    /// # async fn consume(inbox: surely::inbox::PostgresInbox, event: surely::outbox::Event)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// use surely::inbox::{Consumer, Wait};
    ///
    /// let consumer = Consumer::builder("inventory").build()?;
    /// let processed = inbox
    ///     .process_task_and_commit(&consumer, &event, |txn| {
    ///         Box::pin(async move {
    ///             let row = txn.query_one("SELECT qty FROM stock WHERE sku = $1", &[&"sku-42"]).await?;
    ///             if row.get::<_, i32>(0) < 1 {
    ///                 return Err(Wait::business("sku-42 is out of stock"));
    ///             }
    ///             txn.execute("UPDATE stock SET qty = qty - 1 WHERE sku = $1", &[&"sku-42"]).await?;
    ///             Ok("reserved".into())
    ///         })
    ///     })
    ///     .await?;
    /// match processed.delay() {
    ///     Some(delay) => { /* acknowledge negatively, to come back in `delay` */ }
    ///     None => { /* acknowledge */ }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A statement or the commit failed (nothing was committed, or the connection was lost
    /// during the `COMMIT`, and a redelivery finds what was); or the task's stored reason is
    /// one this version does not know ([`InboxError::UnknownReason`]): the task is held as it
    /// is, the handler not run.
    pub async fn process_task_and_commit<F>(
        &self,
        consumer: &Consumer,
        event: &Event,
        handler: F,
    ) -> Result<Processed, InboxError>
    where
        F: for<'t> FnOnce(&'t InboxTransaction) -> Handler<'t, Wait>,
    {
        self.process_delivered(consumer, event, None, handler).await
    }

    /// [`process_task_and_commit`](Self::process_task_and_commit) of a message the broker
    /// delivered `deliveries` times, if it says: past the consumer's
    /// [`max_deliveries`](Consumer::max_deliveries), the task goes to a person before its
    /// handler runs.
    pub(in crate::inbox) async fn process_delivered<F>(
        &self,
        consumer: &Consumer,
        event: &Event,
        deliveries: Option<u64>,
        handler: F,
    ) -> Result<Processed, InboxError>
    where
        F: for<'t> FnOnce(&'t InboxTransaction) -> Handler<'t, Wait>,
    {
        let (name, versions) = (consumer.name(), consumer.versions());
        let sql = &self.store.sql();
        let (mut txn, prepared, begun, found) = self.open(name, event, versions).await?;
        let id = event.id().as_str();
        let key: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&name, &id];
        let ticket = match (begun, found) {
            (Err(e), _) => return Err(InboxError::store(e)),
            (Ok(()), Err(e)) => return Err(e),
            (Ok(()), Ok(Begin::Fresh(ticket))) => ticket,
            (Ok(()), Ok(Begin::Done(processed @ Processed::Stale { .. }))) => {
                // Stale by its version: its record is in the transaction; its schedule goes.
                txn.execute(&sql.task.delete, &key)
                    .await
                    .map_err(InboxError::store)?;
                commit(&mut txn).await?;
                return Ok(processed);
            }
            (Ok(()), Ok(Begin::Done(processed))) => return Ok(processed),
        };
        let found = match txn.query_opt(&sql.task.read, &key).await {
            Ok(row) => row.map(|row| found_of(&row)).transpose()?,
            Err(e) => return Err(InboxError::store(e)),
        };
        let prior = match &found {
            None => None,
            Some(found) => {
                let reason = Reason::from_code(&found.reason).map_err(|e| {
                    tracing::error!(
                        consumer = name,
                        event = id,
                        code = e.code(),
                        "inbox: a task's stored reason is unknown: held"
                    );
                    InboxError::UnknownReason(e)
                })?;
                let waiting = Waiting {
                    reason,
                    attempts: found.prior.0,
                    delay: found.due_in,
                    clamped_from: None,
                    early: true,
                    why: found.why.clone(),
                };
                match TaskState::from_code(&found.state) {
                    Some(TaskState::Manual) => return Ok(self.early(Processed::Manual { reason })),
                    Some(TaskState::Waiting) if !found.due_in.is_zero() => {
                        return Ok(self.early(Processed::Waiting(waiting)))
                    }
                    Some(TaskState::Waiting) => {}
                    None => {
                        return Err(InboxError::store(format!(
                            "unknown task state `{}`",
                            found.state
                        )))
                    }
                }
                Some(Prior {
                    reason,
                    attempts: found.prior.0,
                    streak: found.prior.1,
                })
            }
        };
        if let Some(n) = deliveries.filter(|n| *n > consumer.max_deliveries()) {
            let prior = prior.unwrap_or(Prior {
                reason: Reason::Transient,
                attempts: 0,
                streak: 0,
            });
            let why = format!(
                "delivered {n} times, over the consumer's limit of {}: its handler may kill its \
                 consumer; not run",
                consumer.max_deliveries()
            );
            tracing::warn!(
                consumer = name,
                event = id,
                deliveries = n,
                "inbox: a task went to the manual queue"
            );
            let state = (prior.reason, prior.attempts, prior.streak);
            self.schedule(
                &txn,
                event,
                name,
                TaskState::Manual,
                state,
                Duration::ZERO,
                &why,
            )
            .await?;
            commit(&mut txn).await?;
            self.counters.to_manual();
            return Ok(Processed::Manual {
                reason: prior.reason,
            });
        }
        txn.batch_execute(&format!("SAVEPOINT {SAVEPOINT}"))
            .await
            .map_err(InboxError::store)?;
        let ran = tokio::time::Instant::now();
        let wait = match handler(&txn).await {
            Ok(result) => {
                let client = txn.take().ok_or_else(no_connection)?;
                // One flight, in this order: each request goes out when its future is first
                // polled, and `join!` polls them in turn. The delete is sent with its text
                // (`query_typed`: no prepare round trip first), so that it runs before the
                // `COMMIT`, in the same transaction as the record.
                let delete: [(&(dyn ToSql + Sync), Type); 2] =
                    [(&name, Type::TEXT), (&id, Type::TEXT)];
                let (recorded, deleted, committed) = tokio::join!(
                    self.record(&client, Some(&prepared), &ticket, &result),
                    client.query_typed(&sql.task.delete, &delete),
                    client.batch_execute("COMMIT")
                );
                return match (recorded, deleted, committed) {
                    (Ok(_), Ok(_), Ok(())) => Ok(self.applied(result)),
                    (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                        if e.as_db_error().is_none() {
                            drop(Object::take(client));
                        }
                        Err(InboxError::store(e))
                    }
                };
            }
            Err(wait) => wait,
        };
        txn.batch_execute(&format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}"))
            .await
            .map_err(InboxError::store)?;
        // The age when the handler answered: as read when the transaction began, and the
        // handler's time since (a slow handler must not push its task past its expiry).
        let age = found
            .as_ref()
            .map_or(Duration::ZERO, |f| f.age.saturating_add(ran.elapsed()));
        let decision = decide(consumer, prior, age, &wait);
        let step = decision.step(&wait);
        let processed = match decision {
            Decision::Stale { current, why } => {
                let note = stale_note(event.version(), current, &why);
                let (aggregate, version) = (event.aggregate(), event.version());
                txn.execute(
                    &sql.task.stale,
                    &[&name, &id, &aggregate, &version, &note.as_bytes()],
                )
                .await
                .map_err(InboxError::store)?;
                txn.execute(&sql.task.delete, &key)
                    .await
                    .map_err(InboxError::store)?;
                Processed::Stale { applied: current }
            }
            Decision::Retry {
                reason,
                attempts,
                streak,
                delay,
                clamped_from,
            } => {
                self.schedule(
                    &txn,
                    event,
                    name,
                    TaskState::Waiting,
                    (reason, attempts, streak),
                    delay,
                    wait.why(),
                )
                .await?;
                Processed::Waiting(Waiting {
                    reason,
                    attempts,
                    delay,
                    clamped_from,
                    early: false,
                    why: wait.why().to_owned(),
                })
            }
            Decision::Manual {
                reason,
                attempts,
                streak,
                why,
            } => {
                tracing::warn!(consumer = name, event = id, %reason, why, "inbox: a task went to the manual queue");
                self.schedule(
                    &txn,
                    event,
                    name,
                    TaskState::Manual,
                    (reason, attempts, streak),
                    Duration::ZERO,
                    &why,
                )
                .await?;
                Processed::Manual { reason }
            }
        };
        if let Some(step) = step {
            let attempt = i32::try_from(step.attempt).unwrap_or(i32::MAX);
            let clamped = step.clamped_from.map(micros);
            txn.execute(
                &sql.task.step,
                &[
                    &name,
                    &id,
                    &attempt,
                    &step.reason.code(),
                    &step.why,
                    &micros(step.delay),
                    &clamped,
                ],
            )
            .await
            .map_err(InboxError::store)?;
        }
        commit(&mut txn).await?;
        if let Processed::Manual { .. } = processed {
            self.counters.to_manual();
        }
        self.counters.count(&processed);
        Ok(processed)
    }

    /// Counts an answer given before the handler ran, and returns it; the transaction rolls
    /// back when it is dropped.
    fn early(&self, processed: Processed) -> Processed {
        self.counters.count(&processed);
        processed
    }

    /// Writes a task's schedule: `state`, with `(reason, attempts, streak)`, due in `delay`.
    #[allow(clippy::too_many_arguments)]
    async fn schedule(
        &self,
        txn: &InboxTransaction,
        event: &Event,
        consumer: &str,
        state: TaskState,
        (reason, attempts, streak): (Reason, u32, u32),
        delay: Duration,
        why: &str,
    ) -> Result<(), InboxError> {
        let names: Vec<&str> = event.headers().iter().map(|(n, _)| n.as_str()).collect();
        let values: Vec<&str> = event.headers().iter().map(|(_, v)| v.as_str()).collect();
        let attempts = i32::try_from(attempts).unwrap_or(i32::MAX);
        let streak = i32::try_from(streak).unwrap_or(i32::MAX);
        let payload: &[u8] = event.payload();
        txn.execute(
            &self.store.sql().task.upsert,
            &[
                &consumer,
                &event.id().as_str(),
                &event.aggregate(),
                &event.version(),
                &event.kind(),
                &names,
                &values,
                &payload,
                &state.code(),
                &reason.code(),
                &attempts,
                &streak,
                &micros(delay),
                &why,
            ],
        )
        .await
        .map(drop)
        .map_err(InboxError::store)
    }

    /// The tasks of `consumer` (every consumer's if `None`) that wait or are in the manual
    /// queue (only those in `state`, if given), the oldest first, at most `limit`; without
    /// their steps ([`task`](Self::task) has them).
    ///
    /// # Errors
    ///
    /// The database failed, or a task's stored reason is unknown to this version.
    pub async fn tasks(
        &self,
        consumer: Option<&str>,
        state: Option<TaskState>,
        limit: usize,
    ) -> Result<Vec<Task>, InboxError> {
        let client = self.store.client().await.map_err(InboxError::store)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let state = state.map(TaskState::code);
        let rows = client
            .query(&self.store.sql().task.list, &[&consumer, &limit, &state])
            .await
            .map_err(InboxError::store)?;
        rows.iter().map(task_of).collect()
    }

    /// The tasks counted by state and reason, with the oldest's age
    /// ([`TaskStore::stats`](crate::inbox::TaskStore::stats)); a task whose stored reason or
    /// state this version does not know is counted in [`TaskStats::unknown`].
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn task_stats(&self) -> Result<TaskStats, InboxError> {
        let client = self.store.client().await.map_err(InboxError::store)?;
        let rows = client
            .query(&self.store.sql().task.stats, &[])
            .await
            .map_err(InboxError::store)?;
        let mut stats = TaskStats::default();
        for row in rows {
            let e = InboxError::store;
            let state: String = row.try_get(0).map_err(e)?;
            let reason: String = row.try_get(1).map_err(e)?;
            let tasks: i64 = row.try_get(2).map_err(e)?;
            let oldest: i64 = row.try_get(3).map_err(e)?;
            let tasks = u64::try_from(tasks).unwrap_or(0);
            match (TaskState::from_code(&state), Reason::from_code(&reason)) {
                (Some(state), Ok(reason)) => stats.add(state, reason, tasks, from_micros(oldest)),
                _ => stats.unknown = stats.unknown.saturating_add(tasks),
            }
        }
        Ok(stats)
    }

    /// The task of `consumer` for the event `event_id`, with its steps, if it waits or is in
    /// the manual queue.
    ///
    /// # Errors
    ///
    /// As [`tasks`](Self::tasks).
    pub async fn task(&self, consumer: &str, event_id: &str) -> Result<Option<Task>, InboxError> {
        let client = self.store.client().await.map_err(InboxError::store)?;
        let sql = &self.store.sql().task;
        let key: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&consumer, &event_id];
        let (row, steps) = tokio::join!(
            client.query_opt(&sql.one, &key),
            client.query(&sql.steps, &key),
        );
        let Some(row) = row.map_err(InboxError::store)? else {
            return Ok(None);
        };
        let mut task = task_of(&row)?;
        task.steps = steps
            .map_err(InboxError::store)?
            .iter()
            .map(step_of)
            .collect::<Result<_, _>>()?;
        Ok(Some(task))
    }

    /// A person sends a task in the manual queue back to its handler, as
    /// [`MemoryInbox::retry_task`](crate::inbox::MemoryInbox::retry_task) does;
    /// [`take_retried`](Self::take_retried) hands its event to a consumer.
    ///
    /// # Errors
    ///
    /// [`InboxError::Invalid`] or [`InboxError::NoSuchTask`] as the memory inbox's; or the
    /// database failed.
    pub async fn retry_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<(), InboxError> {
        check_person(who, why)?;
        let client = self.store.client().await.map_err(InboxError::store)?;
        let note = format!("retried by {who}: {why}");
        let n = client
            .execute(&self.store.sql().task.retry, &[&consumer, &event_id, &note])
            .await
            .map_err(InboxError::store)?;
        if n == 0 {
            return Err(no_such_task(consumer, event_id));
        }
        Ok(())
    }

    /// A person discards a task in the manual queue, as
    /// [`MemoryInbox::discard_task`](crate::inbox::MemoryInbox::discard_task) does: one
    /// statement deletes its schedule and records the event as processed.
    ///
    /// # Errors
    ///
    /// As [`retry_task`](Self::retry_task).
    pub async fn discard_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<Bytes, InboxError> {
        check_person(who, why)?;
        let client = self.store.client().await.map_err(InboxError::store)?;
        let result = Bytes::from(format!("discarded by {who}: {why}"));
        let body: &[u8] = &result;
        let n = client
            .execute(
                &self.store.sql().task.discard,
                &[&consumer, &event_id, &body],
            )
            .await
            .map_err(InboxError::store)?;
        if n == 0 {
            return Err(no_such_task(consumer, event_id));
        }
        Ok(result)
    }

    /// The events of at most `limit` tasks of `consumer` that a person
    /// [retried](Self::retry_task) and that are due, each handed out for `lease`: process each
    /// with [`process_task_and_commit`](Self::process_task_and_commit), which ends the
    /// hand-out. Their broker message was acknowledged when they went to the manual queue, so
    /// the inbox delivers them from then on: a retried task that waits again is handed out
    /// again once its time comes, until it is applied, stale, or back in the manual queue.
    /// Call it on a timer (every few seconds). A consumer that dies holding one lets another
    /// take it once the lease passes. Several consumers may call it at once: each task goes to
    /// one.
    ///
    /// # Errors
    ///
    /// The database failed.
    pub async fn take_retried(
        &self,
        consumer: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Event>, InboxError> {
        let client = self.store.client().await.map_err(InboxError::store)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                &self.store.sql().task.take_retried,
                &[&consumer, &limit, &micros(lease)],
            )
            .await
            .map_err(InboxError::store)?;
        rows.iter()
            .map(|row| task_of(row).map(|t| t.event))
            .collect()
    }
}

/// What the task's read found.
fn found_of(row: &Row) -> Result<Found, InboxError> {
    let e = InboxError::store;
    let attempts: i32 = row.try_get(2).map_err(e)?;
    let streak: i32 = row.try_get(3).map_err(e)?;
    let age: i64 = row.try_get(4).map_err(e)?;
    let due_in: i64 = row.try_get(5).map_err(e)?;
    Ok(Found {
        why: row.try_get(6).map_err(e)?,
        state: row.try_get(0).map_err(e)?,
        reason: row.try_get(1).map_err(e)?,
        prior: (
            u32::try_from(attempts).unwrap_or(0),
            u32::try_from(streak).unwrap_or(0),
        ),
        age: from_micros(age),
        due_in: from_micros(due_in),
    })
}

/// Commits the transaction.
async fn commit(txn: &mut InboxTransaction) -> Result<(), InboxError> {
    let conn = txn.take().ok_or_else(no_connection)?;
    conn.batch_execute("COMMIT")
        .await
        .map_err(InboxError::store)
}
