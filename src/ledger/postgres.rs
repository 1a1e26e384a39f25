//! The PostgreSQL ledger.

use std::fmt;
use std::time::{Duration, SystemTime};

use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::{
    AttemptEvidence, Claim, Entry, EntryId, EntryState, Evidence, Filter, Ledger, LedgerError,
    LedgerStats, Settled, SettledBy, Settlement, Verdict,
};
use crate::classify::{AttemptClass, DeliveryPhase};
use crate::queue::{self, micros};
use crate::storage::{Component, Migration, Pool, Statements, Store};
use crate::{ConfigError, Semantics, StopReason};

/// The ledger's tables (`name` and `name_attempts`), and their migrations in version order.
pub(crate) static POSTGRES_COMPONENT: Component = Component {
    name: "ledger",
    default_table: "surely_ledger",
    migrations: &[
        Migration {
            version: 1,
            name: "entries and attempts",
            sql: |t| {
                // Index names take no schema: they live in their table's.
                let n = bare(t);
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                    id text PRIMARY KEY,
                    seq bigserial NOT NULL,
                    call_id bigint,
                    key text,
                    operation text,
                    semantics text NOT NULL,
                    stop text NOT NULL,
                    recorded_at timestamptz NOT NULL,
                    created_at timestamptz NOT NULL DEFAULT now(),
                    state text NOT NULL DEFAULT 'open'
                        CHECK (state IN ('open', 'claimed', 'manual', 'settled')),
                    fence bigint NOT NULL DEFAULT 0,
                    until timestamptz,
                    tries integer NOT NULL DEFAULT 0,
                    note text,
                    verdict text CHECK (verdict IN ('succeeded', 'failed')),
                    evidence text,
                    settled_by text CHECK (settled_by IN ('reconciler', 'manual')),
                    settled_who text,
                    verdict_at timestamptz,
                    settled_at timestamptz,
                    CHECK ((state = 'settled') = (verdict IS NOT NULL AND evidence IS NOT NULL
                        AND settled_by IS NOT NULL AND verdict_at IS NOT NULL
                        AND settled_at IS NOT NULL)),
                    CHECK ((settled_by = 'manual') = (settled_who IS NOT NULL))
                );
                CREATE TABLE IF NOT EXISTS {t}_attempts (
                    entry_id text NOT NULL REFERENCES {t} (id) ON DELETE CASCADE,
                    pos integer NOT NULL,
                    attempt bigint NOT NULL,
                    started_at timestamptz NOT NULL,
                    took_ns bigint NOT NULL,
                    class text NOT NULL,
                    phase text NOT NULL,
                    timeout text,
                    hedge boolean NOT NULL,
                    cancelled boolean NOT NULL,
                    downstream_id text,
                    PRIMARY KEY (entry_id, pos)
                );
                CREATE INDEX IF NOT EXISTS {n}_key ON {t} USING hash (key);
                CREATE INDEX IF NOT EXISTS {n}_due ON {t} (created_at, seq)
                    WHERE state IN ('open', 'claimed');
                CREATE INDEX IF NOT EXISTS {n}_unsettled ON {t} (state, created_at)
                    WHERE state <> 'settled';
                CREATE INDEX IF NOT EXISTS {n}_settled ON {t} (settled_at)
                    WHERE state = 'settled';"
                )
            },
        },
        Migration {
            version: 2,
            name: "intents in doubt",
            sql: |t| {
                let n = bare(t);
                // An index is named in its table's schema.
                let schema = t.strip_suffix(n).unwrap_or("");
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS digest text;
                ALTER TABLE {t} ADD COLUMN IF NOT EXISTS deadline timestamptz;
                ALTER TABLE {t} DROP CONSTRAINT IF EXISTS {n}_state_check;
                ALTER TABLE {t} ADD CONSTRAINT {n}_state_check
                    CHECK (state IN ('in_doubt', 'open', 'claimed', 'manual', 'settled'));
                DROP INDEX IF EXISTS {schema}{n}_due;
                CREATE INDEX {n}_due ON {t} (created_at, seq)
                    WHERE state IN ('in_doubt', 'open', 'claimed');"
                )
            },
        },
    ],
};

use crate::storage::bare;

/// The ledger for services with more than one instance, or whose unknown calls must outlive a
/// restart: entries are rows of a table (default `surely_ledger`), their attempts rows of
/// `surely_ledger_attempts`.
///
/// Every method is one statement (a settlement that finds nothing to change reads the entry
/// once more, to say why). Reconcilers claim entries with `FOR UPDATE SKIP LOCKED` (they never
/// wait on one another, and never take the same entry at once) and a lease on the database's
/// clock: the entries of a reconciler that died come back when its lease passes. Changes are
/// fenced by the claim's number. Ages, backoffs, leases and retentions are all on the
/// database's clock, so instances whose clocks disagree still agree on them.
///
/// Keys are found by equality through a hash index, so a key of any length can be recorded
/// and found. Times are kept to the microsecond (PostgreSQL's precision); an attempt's
/// duration to the nanosecond.
///
/// The tables are created by [`surely::postgres::migrate`](crate::postgres::migrate)
/// (component `ledger`), or by [`migrate`](Self::migrate) for this ledger alone.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use surely::ledger::{Ledger, LedgerRecorder, PostgresLedger};
///
/// let pool = surely::postgres::connect("postgres://postgres@127.0.0.1:5432/test")?;
/// let ledger = PostgresLedger::new(pool).with_table("orders.unknown_calls")?;
/// ledger.migrate().await?;
/// let recorder = LedgerRecorder::new(ledger.clone());
/// println!("{} unsettled", ledger.stats().await?.unsettled());
/// # let _ = recorder; Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresLedger {
    store: Store<Sql>,
}

struct Sql {
    record: String,
    claim: String,
    settle: String,
    settle_manually: String,
    /// An intent, in doubt: one plain insert (an intent has no attempts yet).
    hold: String,
    forget: String,
    /// An entry's state and settlement, to say why a change found nothing to change.
    look: String,
    retry_later: String,
    to_manual: String,
    retry_now: String,
    get: String,
    /// `list`'s statement up to its `WHERE`.
    list: String,
    stats: String,
    sweep: String,
}

/// Where the ledger's table keeps the queue's part of an entry: claimed oldest first, by the
/// database's clock.
static QUEUE: queue::Columns = queue::Columns {
    key: "id",
    state: "state",
    fence: "fence",
    until: "until",
    tries: "tries",
    order: &["created_at", "seq"],
    settled_at: Some("settled_at"),
};

impl queue::SqlStates for EntryState {
    fn sql(self) -> &'static str {
        match self {
            EntryState::InDoubt => "'in_doubt'",
            EntryState::Open => "'open'",
            EntryState::Claimed => "'claimed'",
            EntryState::Manual => "'manual'",
            EntryState::Settled => "'settled'",
        }
    }
}

/// The columns an entry is read from, `e` being the entry's row.
const COLUMNS: &str = "e.id, e.call_id, e.key, e.operation, e.semantics, e.stop, e.recorded_at,
     e.state, e.digest, e.deadline,
     e.fence, e.tries, e.note, e.verdict, e.evidence, e.settled_by, e.settled_who,
     e.verdict_at,
     floor(EXTRACT(EPOCH FROM now() - e.created_at) * 1000000)::int8 AS age_us,
     a.attempt, a.started_at, a.took_ns, a.class, a.phase, a.timeout, a.hedge, a.cancelled,
     a.downstream_id";

/// The attempts of the entry `e`, as arrays in their order, for [`COLUMNS`].
fn attempts_join(t: &str) -> String {
    format!(
        "LEFT JOIN LATERAL (
             SELECT array_agg(x.attempt ORDER BY x.pos) AS attempt,
                    array_agg(x.started_at ORDER BY x.pos) AS started_at,
                    array_agg(x.took_ns ORDER BY x.pos) AS took_ns,
                    array_agg(x.class ORDER BY x.pos) AS class,
                    array_agg(x.phase ORDER BY x.pos) AS phase,
                    array_agg(x.timeout ORDER BY x.pos) AS timeout,
                    array_agg(x.hedge ORDER BY x.pos) AS hedge,
                    array_agg(x.cancelled ORDER BY x.pos) AS cancelled,
                    array_agg(x.downstream_id ORDER BY x.pos) AS downstream_id
             FROM {t}_attempts AS x WHERE x.entry_id = e.id
         ) AS a ON true"
    )
}

/// A settlement's columns, from `$n` on: the verdict, the evidence, by whom, who, and when
/// it was given.
fn settlement_set(n: usize) -> String {
    format!(
        "verdict = ${n}, evidence = ${}, settled_by = ${}, settled_who = ${}, verdict_at = ${}",
        n + 1,
        n + 2,
        n + 3,
        n + 4
    )
}

impl Statements for Sql {
    const COMPONENT: &'static Component = &POSTGRES_COMPONENT;
    const TABLE_SETTING: &'static str = "ledger table name";

    fn new(t: &str) -> Self {
        let queue = queue::Table::new(t, &QUEUE);
        let attempts = attempts_join(t);
        let settle = format!(
            "{}, {}",
            queue.settle(EntryState::Settled),
            settlement_set(3)
        );
        let settle_by_hand = format!(
            "{}, {}",
            queue.settle(EntryState::Settled),
            settlement_set(2)
        );
        Sql {
            // `$17` is the state recorded: `open`, or `in_doubt` for `$18` microseconds. An open
            // record of an intent in doubt makes it open, with the call's evidence.
            record: format!(
                "WITH entry AS (
                     INSERT INTO {t} (id, call_id, key, operation, semantics, stop, recorded_at,
                         digest, deadline, state, until)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $19, $20, $17, {hold})
                     ON CONFLICT (id) DO UPDATE
                     SET call_id = EXCLUDED.call_id, key = EXCLUDED.key,
                         operation = EXCLUDED.operation, semantics = EXCLUDED.semantics,
                         stop = EXCLUDED.stop, recorded_at = EXCLUDED.recorded_at,
                         digest = coalesce(EXCLUDED.digest, {t}.digest),
                         deadline = coalesce(EXCLUDED.deadline, {t}.deadline),
                         state = 'open', until = NULL
                     WHERE {t}.state = 'in_doubt' AND EXCLUDED.state = 'open'
                     RETURNING id
                 ), attempts AS (
                     INSERT INTO {t}_attempts (entry_id, pos, attempt, started_at, took_ns, class,
                         phase, timeout, hedge, cancelled, downstream_id)
                     SELECT entry.id, a.pos, a.attempt, a.started_at, a.took_ns, a.class, a.phase,
                            a.timeout, a.hedge, a.cancelled, a.downstream_id
                     FROM entry, unnest($8::int8[], $9::timestamptz[], $10::int8[], $11::text[],
                         $12::text[], $13::text[], $14::bool[], $15::bool[], $16::text[])
                         WITH ORDINALITY AS a(attempt, started_at, took_ns, class, phase, timeout,
                             hedge, cancelled, downstream_id, pos)
                 )
                 SELECT count(*) FROM entry",
                hold = queue::later(18),
            ),
            hold: format!(
                "INSERT INTO {t} (id, call_id, key, operation, semantics, stop, recorded_at,
                     digest, deadline, state, until)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'in_doubt', {hold})
                 ON CONFLICT (id) DO NOTHING",
                hold = queue::later(10),
            ),
            // Committed without waiting for the disk: a forgetting lost to a database crash
            // leaves an intent in doubt, which a reconciler settles by asking (one query);
            // the intent itself is written with the call waiting for the flush.
            forget: format!(
                "DELETE FROM {t} WHERE id = ANY($1) AND state = 'in_doubt'
                     AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
            ),
            claim: queue.claim_joined(COLUMNS, &attempts),
            // `$1` the id, `$2` the claim's fence, `$3` to `$7` the settlement.
            settle: queue.fenced(&settle),
            // `$1` the id, `$2` to `$6` the settlement.
            settle_manually: queue.unsettled(&settle_by_hand, 1),
            look: queue.look("state, verdict, evidence, settled_by, settled_who, verdict_at"),
            // `$1` the id, `$2` the fence, `$3` the note, `$4` the wait.
            retry_later: queue.fenced(&format!(
                "{}, note = $3",
                queue.retry_later(EntryState::Open, 4)
            )),
            to_manual: queue.fenced(&format!("{}, note = $3", queue.park(EntryState::Manual))),
            retry_now: queue.reopen(
                &[EntryState::Open, EntryState::Manual],
                EntryState::Open,
                "note = $2",
                "",
            ),
            get: format!("SELECT {COLUMNS} FROM {t} AS e {attempts} WHERE e.id = $1"),
            list: format!("SELECT {COLUMNS} FROM {t} AS e {attempts}"),
            stats: format!(
                "SELECT count(*) FILTER (WHERE state = 'open'),
                        count(*) FILTER (WHERE state = 'claimed'),
                        count(*) FILTER (WHERE state = 'manual'),
                        (SELECT count(*) FROM {t} WHERE state = 'settled'),
                        floor(EXTRACT(EPOCH FROM now() - min(created_at)) * 1000000)::int8,
                        count(*) FILTER (WHERE state = 'in_doubt')
                 FROM {t} WHERE state <> 'settled'"
            ),
            sweep: queue.sweep(),
        }
    }
}

impl PostgresLedger {
    /// A ledger over `pool`, in the tables `surely_ledger` and `surely_ledger_attempts`.
    pub fn new(pool: Pool) -> Self {
        PostgresLedger {
            store: Store::new(pool),
        }
    }

    /// The same ledger in another table, such as `orders.unknown_calls` (its attempts in
    /// `orders.unknown_calls_attempts`).
    ///
    /// # Errors
    ///
    /// The name is not a lower-case identifier (letters, digits, `_`, at most 50 bytes),
    /// optionally schema-qualified.
    pub fn with_table(self, table: &str) -> Result<Self, ConfigError> {
        Ok(PostgresLedger {
            store: self.store.with_table(table)?,
        })
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        self.store.pool()
    }

    /// The entries' table's name (the attempts' is this with `_attempts`).
    pub fn table(&self) -> &str {
        self.store.table()
    }

    /// Applies this ledger's tables' migrations that the database has not recorded yet.
    ///
    /// # Errors
    ///
    /// The database refused, or could not be reached.
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        self.store.migrate().await.map_err(LedgerError::backend)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, LedgerError> {
        self.store.client().await.map_err(LedgerError::backend)
    }

    /// Settles `id` with `sql` (fenced by `fence`, or not), or says why it did not.
    async fn settle_with(
        &self,
        sql: &str,
        id: &EntryId,
        fence: Option<i64>,
        settlement: &Settlement,
    ) -> Result<Settled, LedgerError> {
        let client = self.client().await?;
        let (by, who) = match &settlement.by {
            SettledBy::Reconciler => ("reconciler", None),
            SettledBy::Manual { who } => ("manual", Some(who.as_str())),
        };
        let id_str = id.as_str();
        let (verdict, evidence, at) = (
            settlement.verdict.as_str(),
            &settlement.evidence,
            &settlement.at,
        );
        // `$1` the id, then the fence if there is one, then the settlement.
        let params: Vec<&(dyn ToSql + Sync)> = match &fence {
            Some(fence) => vec![&id_str, fence, &verdict, evidence, &by, &who, at],
            None => vec![&id_str, &verdict, evidence, &by, &who, at],
        };
        let params = &params[..];
        // An unfenced (manual) settlement that found nothing may have raced the entry's
        // recording: once it is there, it is tried again.
        for _ in 0..3 {
            let n = client.execute(sql, params).await.map_err(by_content)?;
            if n == 1 {
                return Ok(Settled::Now(settlement.clone()));
            }
            let row = client
                .query_opt(&self.store.sql().look, &[&id.as_str()])
                .await
                .map_err(LedgerError::backend)?
                .ok_or_else(|| LedgerError::not_found(id))?;
            let state = parse_state(&row, "state")?;
            if state == EntryState::Settled {
                return Ok(Settled::Already(settlement_of(&row)?.ok_or_else(|| {
                    LedgerError::backend(format!("ledger entry {id} is settled without a verdict"))
                })?));
            }
            if fence.is_some() {
                return Err(LedgerError::stale());
            }
        }
        Err(LedgerError::backend(format!(
            "ledger entry {id} kept changing under a manual settlement"
        )))
    }

    /// Releases a claimed entry with `sql`, or says why not.
    async fn release(
        &self,
        sql: &str,
        claim: &Claim,
        note: &str,
        after: Option<Duration>,
    ) -> Result<(), LedgerError> {
        let client = self.client().await?;
        let id = &claim.entry.evidence.id;
        let fence = queue::fence(claim.fence());
        let note = super::truncate(note, super::MAX_TEXT);
        let n = match after {
            Some(after) => {
                client
                    .execute(sql, &[&id.as_str(), &fence, &note, &micros(after)])
                    .await
            }
            None => client.execute(sql, &[&id.as_str(), &fence, &note]).await,
        }
        .map_err(by_content)?;
        if n == 1 {
            return Ok(());
        }
        let found = client
            .query_opt(&self.store.sql().look, &[&id.as_str()])
            .await
            .map_err(LedgerError::backend)?;
        match found {
            Some(_) => Err(LedgerError::stale()),
            None => Err(LedgerError::not_found(id)),
        }
    }
}

/// A failed statement that wrote the caller's values: a value PostgreSQL refuses (a NUL byte in
/// a text, a time out of range) is the caller's doing, and writing it again would fail again;
/// anything else is the backend's.
fn by_content(e: tokio_postgres::Error) -> LedgerError {
    if crate::storage::is_input_error(&e) {
        LedgerError::refused("the database refused a value of the entry", e)
    } else {
        LedgerError::backend(e)
    }
}

fn semantics_str(s: Semantics) -> &'static str {
    match s {
        Semantics::Safe => "safe",
        Semantics::Idempotent => "idempotent",
        Semantics::Keyed => "keyed",
        Semantics::NonIdempotent => "non-idempotent",
    }
}

fn parse_semantics(name: &str) -> Option<Semantics> {
    Some(match name {
        "safe" => Semantics::Safe,
        "idempotent" => Semantics::Idempotent,
        "keyed" => Semantics::Keyed,
        "non-idempotent" => Semantics::NonIdempotent,
        _ => return None,
    })
}

fn parse_stop(name: &str) -> Option<StopReason> {
    Some(match name {
        "success" => StopReason::Success,
        "final" => StopReason::Final,
        "conflict" => StopReason::Conflict,
        "unknown" => StopReason::Unknown,
        "not retried" => StopReason::NotRetried,
        "deadline" => StopReason::Deadline,
        "attempts exhausted" => StopReason::AttemptsExhausted,
        "budget exhausted" => StopReason::BudgetExhausted,
        "pushback" => StopReason::PushbackStop,
        "not replayable" => StopReason::NotReplayable,
        "upstream owns retries" => StopReason::UpstreamOwnsRetries,
        "cancelled" => StopReason::Cancelled,
        _ => return None,
    })
}

fn parse_class(name: &str) -> Option<AttemptClass> {
    Some(match name {
        "success" => AttemptClass::Success,
        "final" => AttemptClass::Final,
        "conflict" => AttemptClass::Conflict,
        "rejected" => AttemptClass::Rejected,
        "maybe committed" => AttemptClass::MaybeCommitted,
        _ => return None,
    })
}

fn parse_phase(name: &str) -> Option<DeliveryPhase> {
    Some(match name {
        "not sent" => DeliveryPhase::NotSent,
        "sent" => DeliveryPhase::Sent,
        "response started" => DeliveryPhase::ResponseStarted,
        _ => return None,
    })
}

/// `value`, read as `what` by `parse`, or an error that names the column and the value.
fn parsed<T>(what: &str, value: &str, parse: impl Fn(&str) -> Option<T>) -> Result<T, LedgerError> {
    parse(value).ok_or_else(|| {
        LedgerError::backend(format!(
            "the ledger table holds {what} {:?}, which this version does not know",
            super::truncate(value, 64)
        ))
    })
}

fn column<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    name: &str,
) -> Result<T, LedgerError> {
    row.try_get(name).map_err(LedgerError::backend)
}

fn parse_state(row: &Row, name: &str) -> Result<EntryState, LedgerError> {
    parsed("the state", column(row, name)?, EntryState::parse)
}

/// The settlement of a row of `look` or of an entry's columns, if it has one.
fn settlement_of(row: &Row) -> Result<Option<Settlement>, LedgerError> {
    let Some(verdict) = column::<Option<&str>>(row, "verdict")? else {
        return Ok(None);
    };
    let by = match column::<Option<&str>>(row, "settled_by")? {
        Some("reconciler") => SettledBy::Reconciler,
        Some("manual") => SettledBy::Manual {
            who: column::<Option<String>>(row, "settled_who")?.unwrap_or_default(),
        },
        other => {
            return Err(LedgerError::backend(format!(
                "the ledger table holds a settlement by {other:?}, which this version does not know"
            )))
        }
    };
    Ok(Some(Settlement {
        verdict: parsed("the verdict", verdict, Verdict::parse)?,
        evidence: column::<Option<String>>(row, "evidence")?.unwrap_or_default(),
        by,
        at: column::<Option<SystemTime>>(row, "verdict_at")?.unwrap_or(SystemTime::UNIX_EPOCH),
    }))
}

/// An entry's attempts, from its columns' arrays.
fn attempts_of(row: &Row) -> Result<Vec<AttemptEvidence>, LedgerError> {
    let Some(attempt) = column::<Option<Vec<i64>>>(row, "attempt")? else {
        return Ok(Vec::new());
    };
    let started: Vec<SystemTime> = column(row, "started_at")?;
    let took: Vec<i64> = column(row, "took_ns")?;
    let class: Vec<&str> = column(row, "class")?;
    let phase: Vec<&str> = column(row, "phase")?;
    let timeout: Vec<Option<String>> = column(row, "timeout")?;
    let hedge: Vec<bool> = column(row, "hedge")?;
    let cancelled: Vec<bool> = column(row, "cancelled")?;
    let downstream: Vec<Option<String>> = column(row, "downstream_id")?;
    let n = attempt.len();
    if [
        started.len(),
        took.len(),
        class.len(),
        phase.len(),
        timeout.len(),
        hedge.len(),
        cancelled.len(),
        downstream.len(),
    ]
    .iter()
    .any(|&len| len != n)
    {
        return Err(LedgerError::backend(
            "the ledger's attempts were read back with columns of different lengths",
        ));
    }
    let mut started = started.into_iter();
    let mut took = took.into_iter();
    let mut class = class.into_iter();
    let mut phase = phase.into_iter();
    let mut timeout = timeout.into_iter();
    let mut hedge = hedge.into_iter();
    let mut cancelled = cancelled.into_iter();
    let mut downstream = downstream.into_iter();
    // Every column has one value per attempt (checked above).
    attempt
        .into_iter()
        .map(|number| {
            Ok(AttemptEvidence {
                attempt: u32::try_from(number).map_err(|_| {
                    LedgerError::backend(format!("the ledger table holds attempt number {number}"))
                })?,
                started_at: started.next().unwrap_or(SystemTime::UNIX_EPOCH),
                took: Duration::from_nanos(
                    took.next()
                        .and_then(|ns| u64::try_from(ns).ok())
                        .unwrap_or(0),
                ),
                class: parsed("the attempt class", class.next().unwrap_or(""), parse_class)?,
                phase: parsed(
                    "the delivery phase",
                    phase.next().unwrap_or(""),
                    parse_phase,
                )?,
                timeout: timeout.next().flatten(),
                hedge: hedge.next().unwrap_or(false),
                cancelled: cancelled.next().unwrap_or(false),
                downstream_id: downstream.next().flatten(),
            })
        })
        .collect()
}

/// An entry, and its fence, from its columns.
fn entry_of(row: &Row) -> Result<(Entry, u64), LedgerError> {
    let id: String = column(row, "id")?;
    let id = EntryId::new(id).map_err(LedgerError::backend)?;
    let evidence = Evidence {
        id,
        // Kept as its bits: every u64 comes back.
        call: column::<Option<i64>>(row, "call_id")?.map(|c| c as u64),
        key: column(row, "key")?,
        operation: column(row, "operation")?,
        semantics: parsed("the semantics", column(row, "semantics")?, parse_semantics)?,
        stop: parsed("the stop reason", column(row, "stop")?, parse_stop)?,
        attempts: attempts_of(row)?,
        recorded_at: column(row, "recorded_at")?,
        digest: column(row, "digest")?,
        deadline: column(row, "deadline")?,
    };
    let state = parse_state(row, "state")?;
    let settlement = settlement_of(row)?;
    if (state == EntryState::Settled) != settlement.is_some() {
        return Err(LedgerError::backend(format!(
            "ledger entry {} is {} with{} a settlement",
            evidence.id,
            state.as_str(),
            if settlement.is_some() { "" } else { "out" }
        )));
    }
    let tries: i32 = column(row, "tries")?;
    let fence: i64 = column(row, "fence")?;
    let age: Option<i64> = column(row, "age_us")?;
    let entry = Entry {
        evidence,
        state,
        tries: u32::try_from(tries).unwrap_or(0),
        note: column(row, "note")?,
        settlement,
        age: Duration::from_micros(age.map_or(0, |a| u64::try_from(a).unwrap_or(0))),
    };
    Ok((entry, queue::fence_of(fence)))
}

impl PostgresLedger {
    /// Records an entry, open (`hold` none) or in doubt for `hold`.
    async fn write_entry(
        &self,
        evidence: &Evidence,
        hold: Option<Duration>,
    ) -> Result<bool, LedgerError> {
        let state = match hold {
            None => EntryState::Open,
            Some(_) => EntryState::InDoubt,
        };
        let hold = hold.map(micros);
        let a = &evidence.attempts;
        let attempt: Vec<i64> = a.iter().map(|a| i64::from(a.attempt)).collect();
        let started: Vec<SystemTime> = a.iter().map(|a| a.started_at).collect();
        let took: Vec<i64> = a
            .iter()
            .map(|a| i64::try_from(a.took.as_nanos()).unwrap_or(i64::MAX))
            .collect();
        let class: Vec<&str> = a.iter().map(|a| a.class.as_str()).collect();
        let phase: Vec<&str> = a.iter().map(|a| a.phase.as_str()).collect();
        let timeout: Vec<Option<&str>> = a.iter().map(|a| a.timeout.as_deref()).collect();
        let hedge: Vec<bool> = a.iter().map(|a| a.hedge).collect();
        let cancelled: Vec<bool> = a.iter().map(|a| a.cancelled).collect();
        let downstream: Vec<Option<&str>> = a.iter().map(|a| a.downstream_id.as_deref()).collect();
        // Kept as its bits: every u64 goes in.
        let call = evidence.call.map(|c| c as i64);
        let client = self.client().await?;
        let row = client
            .query_one(
                &self.store.sql().record,
                &[
                    &evidence.id.as_str(),
                    &call,
                    &evidence.key,
                    &evidence.operation,
                    &semantics_str(evidence.semantics),
                    &evidence.stop.as_str(),
                    &evidence.recorded_at,
                    &attempt,
                    &started,
                    &took,
                    &class,
                    &phase,
                    &timeout,
                    &hedge,
                    &cancelled,
                    &downstream,
                    &state.as_str(),
                    &hold,
                    &evidence.digest,
                    &evidence.deadline,
                ],
            )
            .await
            .map_err(by_content)?;
        let added: i64 = column(&row, "count")?;
        Ok(added == 1)
    }
}

impl Ledger for PostgresLedger {
    async fn record(&self, evidence: &Evidence) -> Result<bool, LedgerError> {
        self.write_entry(evidence, None).await
    }

    async fn record_in_doubt(
        &self,
        evidence: &Evidence,
        hold: Duration,
    ) -> Result<bool, LedgerError> {
        if !evidence.attempts.is_empty() {
            // Not an intent: the whole evidence goes in.
            return self.write_entry(evidence, Some(hold)).await;
        }
        // Every journaled call waits for this one: a statement prepared once per connection.
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.store.sql().hold)
            .await
            .map_err(LedgerError::backend)?;
        let call = evidence.call.map(|c| c as i64);
        let added = client
            .execute(
                &statement,
                &[
                    &evidence.id.as_str(),
                    &call,
                    &evidence.key,
                    &evidence.operation,
                    &semantics_str(evidence.semantics),
                    &evidence.stop.as_str(),
                    &evidence.recorded_at,
                    &evidence.digest,
                    &evidence.deadline,
                    &micros(hold),
                ],
            )
            .await
            .map_err(by_content)?;
        Ok(added == 1)
    }

    async fn forget_in_doubt(&self, ids: &[EntryId]) -> Result<u64, LedgerError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<&str> = ids.iter().map(EntryId::as_str).collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&self.store.sql().forget)
            .await
            .map_err(LedgerError::backend)?;
        client
            .execute(&statement, &[&ids])
            .await
            .map_err(LedgerError::backend)
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Claim>, LedgerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = client
            .query(&self.store.sql().claim, &[&max, &micros(lease)])
            .await
            .map_err(LedgerError::backend)?;
        rows.iter()
            .map(|row| entry_of(row).map(|(entry, fence)| Claim::new(entry, fence)))
            .collect()
    }

    async fn settle(&self, claim: &Claim, settlement: &Settlement) -> Result<Settled, LedgerError> {
        self.settle_with(
            &self.store.sql().settle,
            &claim.entry.evidence.id,
            Some(queue::fence(claim.fence())),
            settlement,
        )
        .await
    }

    async fn retry_later(
        &self,
        claim: &Claim,
        note: &str,
        after: Duration,
    ) -> Result<(), LedgerError> {
        self.release(&self.store.sql().retry_later, claim, note, Some(after))
            .await
    }

    async fn to_manual(&self, claim: &Claim, reason: &str) -> Result<(), LedgerError> {
        self.release(&self.store.sql().to_manual, claim, reason, None)
            .await
    }

    async fn settle_manually(
        &self,
        id: &EntryId,
        settlement: &Settlement,
    ) -> Result<Settled, LedgerError> {
        self.settle_with(&self.store.sql().settle_manually, id, None, settlement)
            .await
    }

    async fn retry_now(&self, id: &EntryId, note: &str) -> Result<(), LedgerError> {
        let client = self.client().await?;
        let note = super::truncate(note, super::MAX_TEXT);
        let n = client
            .execute(&self.store.sql().retry_now, &[&id.as_str(), &note])
            .await
            .map_err(by_content)?;
        if n == 1 {
            return Ok(());
        }
        let found = client
            .query_opt(&self.store.sql().look, &[&id.as_str()])
            .await
            .map_err(LedgerError::backend)?;
        match found {
            Some(row) => {
                let state: String = row.try_get(0).map_err(LedgerError::backend)?;
                let state = EntryState::parse(&state).unwrap_or(EntryState::Settled);
                Err(LedgerError::conflict(id, state))
            }
            None => Err(LedgerError::not_found(id)),
        }
    }

    async fn get(&self, id: &EntryId) -> Result<Option<Entry>, LedgerError> {
        let client = self.client().await?;
        let row = client
            .query_opt(&self.store.sql().get, &[&id.as_str()])
            .await
            .map_err(LedgerError::backend)?;
        row.map(|row| entry_of(&row).map(|(entry, _)| entry))
            .transpose()
    }

    async fn list(&self, filter: &Filter) -> Result<Vec<Entry>, LedgerError> {
        if filter.limit == 0 {
            return Ok(Vec::new());
        }
        let state = filter.state.map(EntryState::as_str);
        let older = filter.older_than.map(micros);
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&limit];
        let mut conditions = Vec::new();
        if let Some(key) = &filter.key {
            params.push(key);
            conditions.push(format!("e.key = ${}", params.len()));
        }
        if let Some(state) = &state {
            params.push(state);
            conditions.push(format!("e.state = ${}", params.len()));
        }
        if let Some(older) = &older {
            params.push(older);
            conditions.push(format!(
                "e.created_at <= now() - ${}::int8 * interval '1 microsecond'",
                params.len()
            ));
        }
        let mut sql = self.store.sql().list.clone();
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        sql.push_str(" ORDER BY e.created_at, e.seq LIMIT $1");
        let client = self.client().await?;
        let rows = client.query(&sql, &params).await.map_err(by_content)?;
        rows.iter()
            .map(|row| entry_of(row).map(|(entry, _)| entry))
            .collect()
    }

    async fn stats(&self) -> Result<LedgerStats, LedgerError> {
        let client = self.client().await?;
        let row = client
            .query_one(&self.store.sql().stats, &[])
            .await
            .map_err(LedgerError::backend)?;
        let count = |i: usize| -> Result<u64, LedgerError> {
            let n: i64 = row.try_get(i).map_err(LedgerError::backend)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let oldest: Option<i64> = row.try_get(4).map_err(LedgerError::backend)?;
        Ok(LedgerStats {
            in_doubt: count(5)?,
            open: count(0)?,
            claimed: count(1)?,
            manual: count(2)?,
            settled: count(3)?,
            oldest_unsettled: oldest
                .map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0))),
        })
    }

    async fn sweep(&self, retention: Duration) -> Result<u64, LedgerError> {
        let mut total = 0u64;
        loop {
            let n = self.sweep_batch(retention, queue::SWEEP_BATCH).await?;
            total = total.saturating_add(n);
            if n < queue::SWEEP_BATCH as u64 {
                return Ok(total);
            }
        }
    }

    async fn sweep_batch(&self, retention: Duration, limit: usize) -> Result<u64, LedgerError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        client
            .execute(&self.store.sql().sweep, &[&micros(retention), &limit])
            .await
            .map_err(LedgerError::backend)
    }
}

impl fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLedger")
            .field("table", &self.store.table())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_written_is_read_back() {
        for s in [
            Semantics::Safe,
            Semantics::Idempotent,
            Semantics::Keyed,
            Semantics::NonIdempotent,
        ] {
            assert_eq!(parse_semantics(semantics_str(s)), Some(s));
        }
        for s in [
            StopReason::Success,
            StopReason::Final,
            StopReason::Conflict,
            StopReason::Unknown,
            StopReason::NotRetried,
            StopReason::Deadline,
            StopReason::AttemptsExhausted,
            StopReason::BudgetExhausted,
            StopReason::PushbackStop,
            StopReason::NotReplayable,
            StopReason::UpstreamOwnsRetries,
            StopReason::Cancelled,
        ] {
            assert_eq!(parse_stop(s.as_str()), Some(s));
        }
        for c in [
            AttemptClass::Success,
            AttemptClass::Final,
            AttemptClass::Conflict,
            AttemptClass::Rejected,
            AttemptClass::MaybeCommitted,
        ] {
            assert_eq!(parse_class(c.as_str()), Some(c));
        }
        for p in [
            DeliveryPhase::NotSent,
            DeliveryPhase::Sent,
            DeliveryPhase::ResponseStarted,
        ] {
            assert_eq!(parse_phase(p.as_str()), Some(p));
        }
        assert!(parse_stop("gone").is_none());
    }

    #[test]
    fn a_table_name_without_its_schema() {
        assert_eq!(bare("orders.unknown"), "unknown");
        assert_eq!(bare("unknown"), "unknown");
    }

    /// The sweep reads the settled entries through the index on `settled_at`.
    #[tokio::test]
    async fn pg_the_sweep_is_read_through_the_settled_at_index() {
        use crate::storage::testing::{plan, pool};
        let table = format!("surely_ledger_plan_{:x}", crate::ids::random_u128() as u64);
        let ledger = PostgresLedger::new(pool()).with_table(&table).unwrap();
        ledger.migrate().await.unwrap();
        let shown = plan(ledger.pool(), &ledger.store.sql().sweep, "0, 1000").await;
        ledger
            .pool()
            .get()
            .await
            .unwrap()
            .batch_execute(&format!(
                "DROP TABLE {table}_attempts, {table};
                 DELETE FROM surely_migrations WHERE target = '{table}'"
            ))
            .await
            .unwrap();
        assert!(shown.contains(&format!("{table}_settled ")), "{shown}");
        assert!(!shown.contains("Seq Scan"), "{shown}");
        assert!(shown.contains("LockRows"), "{shown}");
    }
}
