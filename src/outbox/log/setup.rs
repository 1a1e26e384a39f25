//! What a log relay reads and writes with plain SQL: the checks at start, the slot and its
//! record, the events from the table (before the slot, requeued), the quarantine, the mark of
//! how far the table's events are published, and the sweep.

use std::time::Duration;

use pgwire_replication::PgWireError;
use tokio_postgres::Row;

use super::{LogError, LogErrorKind, WalPosition};
use crate::outbox::postgres::{publication, slots_table};
use crate::outbox::{event_of, Event, EventId, PostgresOutbox};
use crate::storage::micros;
use crate::ConfigError;

/// A slot's name as PostgreSQL takes it: 1 to 63 lower-case letters, digits and `_`.
pub(super) fn check_slot_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            "replication slot name",
            "must be 1 to 63 lower-case letters, digits and `_`",
        ))
    }
}

async fn client(outbox: &PostgresOutbox) -> Result<deadpool_postgres::Object, LogError> {
    outbox.pool().get().await.map_err(LogError::backend)
}

/// `wal_level`, the publication, the slot and its plugin; returns the server's
/// `wal_sender_timeout` (`None`: off).
pub(super) async fn check(
    outbox: &PostgresOutbox,
    slot: &str,
) -> Result<Option<Duration>, LogError> {
    let c = client(outbox).await?;
    let (schema, table) = match outbox.table().split_once('.') {
        Some((s, t)) => (s.to_owned(), t.to_owned()),
        None => (String::new(), outbox.table().to_owned()),
    };
    let publication = publication(outbox.table());
    let row = c
        .query_one(
            "SELECT current_setting('wal_level'),
                    EXISTS (SELECT 1 FROM pg_publication_tables
                            WHERE pubname = $1 AND tablename = $2
                              AND ($3 = '' OR schemaname = $3)),
                    (SELECT plugin::text FROM pg_replication_slots
                     WHERE slot_name = $4 AND database = current_database()),
                    (SELECT setting::int8 FROM pg_settings WHERE name = 'wal_sender_timeout')",
            &[&publication, &table, &schema, &slot],
        )
        .await
        .map_err(LogError::backend)?;
    let wal_level: String = row.get(0);
    if wal_level != "logical" {
        return Err(LogError::new(LogErrorKind::WalLevel(wal_level)));
    }
    if !row.get::<_, bool>(1) {
        return Err(LogError::new(LogErrorKind::NoPublication {
            publication,
            table: outbox.table().to_owned(),
        }));
    }
    match row.get::<_, Option<String>>(2) {
        None => Err(LogError::new(LogErrorKind::NoSlot(slot.to_owned()))),
        Some(plugin) if plugin != "pgoutput" => Err(LogError::new(LogErrorKind::WrongPlugin {
            slot: slot.to_owned(),
            plugin,
        })),
        Some(_) => {
            let timeout: Option<i64> = row.get(3);
            Ok(timeout
                .filter(|ms| *ms > 0)
                .map(|ms| Duration::from_millis(ms.unsigned_abs())))
        }
    }
}

/// The error of a replication stream that did not start: the slot held by another
/// connection (SQLSTATE 55006), missing (42704), or another failure of the stream.
pub(super) fn started_error(slot: &str, e: PgWireError) -> LogError {
    let text = e.to_string();
    if text.contains("55006") || text.contains("is active for PID") {
        LogError::new(LogErrorKind::SlotInUse(slot.to_owned()))
    } else if text.contains("42704") {
        LogError::new(LogErrorKind::NoSlot(slot.to_owned()))
    } else {
        LogError::stream(e)
    }
}

/// A slot's record.
pub(super) struct SlotRow {
    /// Whether the events enqueued before the slot are published.
    pub(super) caught_up: bool,
}

/// The slot's record; made at the first read of a slot created without
/// [`create`]: its boundary is then now, so that an event committed before it is published
/// from the table (and one committed between the slot's creation and now, twice).
pub(super) async fn slot_row(outbox: &PostgresOutbox, slot: &str) -> Result<SlotRow, LogError> {
    let c = client(outbox).await?;
    let slots = slots_table(outbox.table());
    c.execute(
        &format!(
            "INSERT INTO {slots} (slot, boundary) VALUES ($1, pg_current_snapshot())
             ON CONFLICT (slot) DO NOTHING"
        ),
        &[&slot],
    )
    .await
    .map_err(LogError::backend)?;
    let row = c
        .query_one(
            &format!("SELECT caught_up FROM {slots} WHERE slot = $1"),
            &[&slot],
        )
        .await
        .map_err(LogError::backend)?;
    Ok(SlotRow {
        caught_up: row.get(0),
    })
}

/// Creates the slot and records its boundary: the events of transactions the slot does not
/// carry (committed before it) are those visible in a snapshot taken after it was made. A
/// slot made again keeps how far the table was published if its previous catch-up had ended.
pub(super) async fn create(outbox: &PostgresOutbox, slot: &str) -> Result<WalPosition, LogError> {
    check_slot_name(slot).map_err(|e| LogError::backend(e.to_string()))?;
    let c = client(outbox).await?;
    let row = c
        .query_one(
            "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE)
            {
                LogError::new(LogErrorKind::WalLevel(
                    "below logical (the slot could not be made)".to_owned(),
                ))
            } else {
                LogError::backend(e)
            }
        })?;
    let at: String = row.get(0);
    let slots = slots_table(outbox.table());
    c.execute(
        &format!(
            "INSERT INTO {slots} (slot, boundary) VALUES ($1, pg_current_snapshot())
             ON CONFLICT (slot) DO UPDATE SET
                 boundary = EXCLUDED.boundary,
                 published_below = CASE WHEN {slots}.caught_up
                                        THEN {slots}.published_below END,
                 caught_up = false,
                 confirmed = NULL,
                 confirmed_at = NULL,
                 created_at = now()"
        ),
        &[&slot],
    )
    .await
    .map_err(LogError::backend)?;
    at.parse()
        .map_err(|e: ConfigError| LogError::backend(e.to_string()))
}

/// Drops the slot (its record is kept: a slot made again under the name starts from what it
/// says). Returns whether there was one.
pub(super) async fn drop(outbox: &PostgresOutbox, slot: &str) -> Result<bool, LogError> {
    let c = client(outbox).await?;
    let row = c
        .query_one(
            "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots
             WHERE slot_name = $1 AND database = current_database()",
            &[&slot],
        )
        .await
        .map_err(LogError::backend)?;
    Ok(row.get::<_, i64>(0) > 0)
}

/// The events read from the table with `EVENT_COLUMNS`' order, and their claims.
fn events(rows: &[Row]) -> Result<Vec<(i64, Event, i64)>, LogError> {
    rows.iter()
        .map(|row| {
            let event = event_of(row).map_err(LogError::backend)?;
            let seq: i64 = row.try_get(0).map_err(LogError::backend)?;
            let claim: i64 = row.try_get(9).map_err(LogError::backend)?;
            Ok((seq, event, claim))
        })
        .collect()
}

const EVENT_COLUMNS: &str = "o.seq, o.id, o.aggregate, o.version, o.kind, o.header_names, \
     o.header_values, o.payload, o.failures, o.claim";

/// Up to `limit` pending events after `after` (in the order enqueued) that the slot does not
/// carry: committed before its boundary, not published below its mark, or requeued.
pub(super) async fn before_slot(
    outbox: &PostgresOutbox,
    slot: &str,
    after: i64,
    limit: usize,
) -> Result<Vec<(i64, Event, i64)>, LogError> {
    let t = outbox.table();
    let slots = slots_table(t);
    let c = client(outbox).await?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = c
        .query(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM {t} o JOIN {slots} s ON s.slot = $1
                 WHERE o.state = 0 AND o.seq > $2
                   AND (o.xact IS NULL OR pg_visible_in_snapshot(o.xact, s.boundary))
                   AND (s.published_below IS NULL OR o.xact IS NULL
                        OR o.xact >= s.published_below OR o.claim > 0)
                 ORDER BY o.seq LIMIT $3"
            ),
            &[&slot, &after, &limit],
        )
        .await
        .map_err(LogError::backend)?;
    events(&rows)
}

/// The slot's catch-up is done.
pub(super) async fn caught_up(outbox: &PostgresOutbox, slot: &str) -> Result<(), LogError> {
    let slots = slots_table(outbox.table());
    client(outbox)
        .await?
        .execute(
            &format!("UPDATE {slots} SET caught_up = true WHERE slot = $1"),
            &[&slot],
        )
        .await
        .map_err(LogError::backend)?;
    Ok(())
}

/// A pending event, read from the table, with its claim.
pub(super) async fn pending_event(
    outbox: &PostgresOutbox,
    id: &EventId,
) -> Result<Option<(Event, i64)>, LogError> {
    let t = outbox.table();
    let rows = client(outbox)
        .await?
        .query(
            &format!("SELECT {EVENT_COLUMNS} FROM {t} o WHERE o.id = $1 AND o.state = 0"),
            &[&id.as_str()],
        )
        .await
        .map_err(LogError::backend)?;
    Ok(events(&rows)?.pop().map(|(_, e, c)| (e, c)))
}

/// Quarantines the pending row with this id (as the table has it), with the reason.
pub(super) async fn quarantine(
    outbox: &PostgresOutbox,
    id: &str,
    reason: &str,
) -> Result<(), LogError> {
    let t = outbox.table();
    client(outbox)
        .await?
        .execute(
            &format!(
                "UPDATE {t} SET state = 2, failures = failures + 1, last_error = $2
                 WHERE id = $1 AND state = 0"
            ),
            &[&id, &reason],
        )
        .await
        .map_err(LogError::backend)?;
    Ok(())
}

/// Marks published the events read from the table, each under the claim it was read with.
pub(super) async fn mark_published(
    outbox: &PostgresOutbox,
    marks: &[(EventId, i64)],
) -> Result<(), LogError> {
    let t = outbox.table();
    let ids: Vec<&str> = marks.iter().map(|(id, _)| id.as_str()).collect();
    let claims: Vec<i64> = marks.iter().map(|(_, c)| *c).collect();
    client(outbox)
        .await?
        .execute(
            &format!(
                "UPDATE {t} o SET state = 1, published_at = now()
                 FROM unnest($1::text[], $2::int8[]) AS m(id, claim)
                 WHERE o.id = m.id AND o.claim = m.claim AND o.state = 0"
            ),
            &[&ids, &claims],
        )
        .await
        .map_err(LogError::backend)?;
    Ok(())
}

/// A mark taken at a heartbeat: every transaction below `below` had ended when the log was
/// at `position`; once the slot is confirmed there, their events are published.
#[derive(Clone, Debug)]
pub(super) struct Watermark {
    pub(super) position: WalPosition,
    below: String,
}

/// Writes the heartbeat into the log and takes a mark.
pub(super) async fn heartbeat(outbox: &PostgresOutbox) -> Result<Watermark, LogError> {
    let row = client(outbox)
        .await?
        .query_one(
            &format!(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text,
                        pg_current_wal_lsn()::text,
                        pg_logical_emit_message(false, '{}', '')::text",
                super::HEARTBEAT_PREFIX
            ),
            &[],
        )
        .await
        .map_err(LogError::backend)?;
    let below: String = row.get(0);
    let position: String = row.get(1);
    Ok(Watermark {
        position: position
            .parse()
            .map_err(|e: ConfigError| LogError::backend(e.to_string()))?,
        below,
    })
}

/// Records that the events of transactions below the mark are published (once the slot's
/// catch-up is done: before, the table holds events the slot does not carry), and where the
/// slot is confirmed.
pub(super) async fn published_below(
    outbox: &PostgresOutbox,
    slot: &str,
    mark: &Watermark,
    confirmed: WalPosition,
    published_seq: Option<i64>,
) -> Result<(), LogError> {
    let slots = slots_table(outbox.table());
    client(outbox)
        .await?
        .execute(
            &format!(
                "UPDATE {slots} SET
                     published_below = CASE WHEN caught_up
                         THEN GREATEST(published_below, $2::text::xid8)
                         ELSE published_below END,
                     published_seq = GREATEST(published_seq, $4),
                     confirmed = $3, confirmed_at = now()
                 WHERE slot = $1"
            ),
            &[&slot, &mark.below, &confirmed.to_string(), &published_seq],
        )
        .await
        .map_err(LogError::backend)?;
    Ok(())
}

/// Deletes, in bounded batches, the events published `retention` ago or more: those the
/// slots carried (pending, below every slot's mark) and those marked published.
pub(super) async fn sweep(outbox: &PostgresOutbox, retention: Duration) -> Result<u64, LogError> {
    const BATCH: i64 = 1000;
    let t = outbox.table();
    let slots = slots_table(t);
    let c = client(outbox).await?;
    let statement = format!(
        "DELETE FROM {t} WHERE id = ANY(ARRAY(
             SELECT o.id FROM {t} o
             WHERE o.state = 0 AND o.claim = 0
               AND o.xact < (SELECT CASE WHEN bool_and(published_below IS NOT NULL)
                                         THEN min(published_below) END
                             FROM {slots})
               AND o.enqueued_at <= now() - $1::int8 * interval '1 microsecond'
             ORDER BY o.seq LIMIT $2
             FOR UPDATE SKIP LOCKED))"
    );
    let retention_us = micros(retention);
    let mut total = 0u64;
    loop {
        let n = c
            .execute(&statement, &[&retention_us, &BATCH])
            .await
            .map_err(LogError::backend)?;
        total = total.saturating_add(n);
        if n < BATCH as u64 {
            break;
        }
    }
    use crate::outbox::OutboxStore;
    let marked = outbox.sweep(retention).await.map_err(LogError::backend)?;
    Ok(total.saturating_add(marked))
}
