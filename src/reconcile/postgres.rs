//! Reconciliation on PostgreSQL: a source paging through a query, and the differences' table.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::OnceCell;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;

use super::{
    check_person, cut, Difference, DifferenceStats, DifferenceStore, Fact, Item, ItemState, Marked,
    PageRequest, ReconcileError, RepairClaim, RepairId, Seen, SeenFact, Source, MAX_TEXT, MAX_WHO,
};
use crate::classify::BoxError;
use crate::queue::{self, micros};
use crate::storage::{bare, Component, Migration, Pool, Store};
use crate::ConfigError;

/// The differences' table, and its migrations in version order.
pub(crate) static POSTGRES_COMPONENT: Component = Component {
    name: "reconcile",
    default_table: "surely_reconcile",
    migrations: &[
        Migration {
            version: 1,
            name: "differences",
            sql: |t| {
                let n = bare(t);
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                    id text PRIMARY KEY,
                    seq bigserial NOT NULL,
                    rule text NOT NULL,
                    key bytea NOT NULL,
                    action text,
                    sources text[] NOT NULL,
                    present boolean[] NOT NULL,
                    vals bytea[] NOT NULL,
                    versions int8[] NOT NULL,
                    ats_us int8[] NOT NULL,
                    created_at timestamptz NOT NULL DEFAULT now(),
                    state text NOT NULL
                        CHECK (state IN ('open', 'claimed', 'repaired', 'manual', 'resolved')),
                    fence bigint NOT NULL DEFAULT 0,
                    until timestamptz,
                    tries integer NOT NULL DEFAULT 0,
                    note text,
                    who text,
                    CHECK ((action IS NULL) <= (state IN ('manual', 'resolved')))
                );
                CREATE INDEX IF NOT EXISTS {n}_due ON {t} (seq)
                    WHERE state IN ('open', 'claimed');
                CREATE INDEX IF NOT EXISTS {n}_open ON {t} (rule, created_at)
                    WHERE state IN ('open', 'claimed', 'manual');"
                )
            },
        },
        Migration {
            version: 2,
            name: "settled at",
            // When a difference became repaired or resolved: the sweep's time, read through
            // its index. Differences already done count from the migration.
            sql: |t| {
                let n = bare(t);
                format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS settled_at timestamptz;
                    UPDATE {t} SET settled_at = now()
                        WHERE state IN ('repaired', 'resolved') AND settled_at IS NULL;
                    CREATE INDEX IF NOT EXISTS {n}_settled ON {t} (settled_at)
                        WHERE state IN ('repaired', 'resolved');"
                )
            },
        },
    ],
};

/// The differences of services with more than one instance, or that must outlive a restart:
/// rows of a table (default `surely_reconcile`).
///
/// Every method is one statement (a mark that finds nothing to change reads the item once
/// more, to say why). Repairers claim with `FOR UPDATE SKIP LOCKED` and a lease on the
/// database's clock; marks are fenced by the claim's number. A difference's key and facts'
/// values are kept as `bytea`, so any bytes are kept as they are; a version is kept in an
/// `int8` with the same 64 bits (a version over `i64::MAX` reads negative in SQL, and back as
/// it was), a fact's time as microseconds since the Unix epoch.
///
/// The table is created by [`surely::postgres::migrate`](crate::postgres::migrate) (component
/// `reconcile`), or by [`migrate`](Self::migrate) for this store alone.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use surely::reconcile::{DifferenceStore, PostgresDifferences};
///
/// let pool = surely::postgres::connect("postgres://postgres@127.0.0.1:5432/test")?;
/// let store = PostgresDifferences::new(pool).with_table("billing.differences")?;
/// store.migrate().await?;
/// println!("{} open", store.stats().await?.open());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresDifferences {
    store: Store<Sql>,
}

struct Sql {
    record: String,
    claim: String,
    mark: String,
    look: String,
    retry_later: String,
    to_manual: String,
    resolve: String,
    get: String,
    list: String,
    list_state: String,
    stats: String,
    done: String,
    known: String,
    sweep: String,
}

/// Where the differences' table keeps the queue's part of an item: claimed in the order they
/// were recorded; swept by when it was repaired or resolved.
static QUEUE: queue::Columns = queue::Columns {
    key: "id",
    state: "state",
    fence: "fence",
    until: "until",
    tries: "tries",
    order: &["seq"],
    settled_at: Some("settled_at"),
};

impl queue::SqlStates for ItemState {
    fn sql(self) -> &'static str {
        match self {
            ItemState::Open => "'open'",
            ItemState::Claimed => "'claimed'",
            ItemState::Repaired => "'repaired'",
            ItemState::Manual => "'manual'",
            ItemState::Resolved => "'resolved'",
        }
    }
}

/// The columns an item is read from, each prefixed with `p` (a table's alias and a dot, or
/// nothing).
fn columns(p: &str) -> String {
    format!(
        "{p}id, {p}rule, {p}key, {p}action, {p}sources, {p}present, {p}vals, {p}versions,
         {p}ats_us, {p}state, {p}tries, {p}note, {p}who,
         floor(EXTRACT(EPOCH FROM now() - {p}created_at) * 1000000)::int8 AS age_us"
    )
}

impl crate::storage::Statements for Sql {
    const COMPONENT: &'static Component = &POSTGRES_COMPONENT;
    const TABLE_SETTING: &'static str = "reconcile table name";

    fn new(t: &str) -> Self {
        let queue = queue::Table::new(t, &QUEUE);
        Sql {
            record: format!(
                "INSERT INTO {t} (id, rule, key, action, sources, present, vals, versions, ats_us,
                     state, note, who)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                 ON CONFLICT (id) DO NOTHING"
            ),
            claim: queue.claim(&format!("c.fence, c.seq, {}", columns("c."))),
            // `$1` the id, `$2` the fence, `$3` the note.
            mark: queue.fenced(&format!("{}, note = $3", queue.settle(ItemState::Repaired))),
            look: queue.look("state"),
            // `$3` the note, `$4` the wait.
            retry_later: queue.fenced(&format!(
                "{}, note = $3",
                queue.retry_later(ItemState::Open, 4)
            )),
            // `$3` the note, `$4` who.
            to_manual: queue.fenced(&format!(
                "{}, note = $3, who = $4",
                queue.park(ItemState::Manual)
            )),
            // `$1` the id, `$2` who, `$3` how.
            resolve: queue.unsettled(
                &format!("{}, who = $2, note = $3", queue.settle(ItemState::Resolved)),
                1,
            ),
            get: format!("SELECT {} FROM {t} WHERE id = $1", columns("")),
            list: format!("SELECT {} FROM {t} ORDER BY seq LIMIT $1", columns("")),
            list_state: format!(
                "SELECT {} FROM {t} WHERE state = $2 ORDER BY seq LIMIT $1",
                columns("")
            ),
            stats: format!(
                "SELECT rule, count(*), count(*) FILTER (WHERE state = 'manual'),
                        floor(EXTRACT(EPOCH FROM now() - min(created_at)) * 1000000)::int8
                 FROM {t} WHERE state IN ('open', 'claimed', 'manual')
                 GROUP BY rule ORDER BY rule COLLATE \"C\""
            ),
            known: format!("SELECT id FROM {t} WHERE id = ANY($1)"),
            sweep: queue.sweep(),
            done: format!(
                "SELECT count(*) FILTER (WHERE state = 'repaired'),
                        count(*) FILTER (WHERE state = 'resolved')
                 FROM {t} WHERE state IN ('repaired', 'resolved')"
            ),
        }
    }
}

/// A time as microseconds since the Unix epoch (saturating).
fn time_us(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_micros()).map_or(i64::MIN, i64::saturating_neg),
    }
}

/// Microseconds since the Unix epoch as a time (saturating at what the platform holds).
fn us_time(us: i64) -> SystemTime {
    let d = Duration::from_micros(us.unsigned_abs());
    let t = if us >= 0 {
        UNIX_EPOCH.checked_add(d)
    } else {
        UNIX_EPOCH.checked_sub(d)
    };
    t.unwrap_or(UNIX_EPOCH)
}

/// Text PostgreSQL keeps: without NUL, which a `text` refuses.
fn no_nul(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "\u{fffd}").into()
    } else {
        text.into()
    }
}

/// `text` as a `text` column keeps it: NUL replaced, then cut to `max` bytes.
fn kept(text: &str, max: usize) -> String {
    cut(&no_nul(text), max).to_owned()
}

/// A failed statement that wrote the caller's values is the caller's doing; anything else is
/// the backend's.
fn by_content(e: tokio_postgres::Error) -> ReconcileError {
    if crate::storage::is_input_error(&e) {
        ReconcileError::refused("the database refused a value of the difference", e)
    } else {
        ReconcileError::backend(e)
    }
}

fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    name: &str,
) -> Result<T, ReconcileError> {
    row.try_get(name).map_err(ReconcileError::backend)
}

fn item_of(row: &Row) -> Result<Item, ReconcileError> {
    let id = RepairId::parse(get::<&str>(row, "id")?).map_err(ReconcileError::backend)?;
    let sources: Vec<String> = get(row, "sources")?;
    let present: Vec<bool> = get(row, "present")?;
    let vals: Vec<Vec<u8>> = get(row, "vals")?;
    let versions: Vec<i64> = get(row, "versions")?;
    let ats: Vec<i64> = get(row, "ats_us")?;
    let n = sources.len();
    if [present.len(), vals.len(), versions.len(), ats.len()]
        .iter()
        .any(|&l| l != n)
    {
        return Err(ReconcileError::backend(format!(
            "difference {id}: its facts' arrays differ in length"
        )));
    }
    // As many of each as of sources (checked above).
    let facts = present
        .into_iter()
        .zip(vals)
        .zip(versions.into_iter().zip(ats));
    let seen = sources
        .into_iter()
        .zip(facts)
        .map(|(source, ((present, val), (version, at)))| {
            Seen::new(
                source,
                present.then(|| {
                    SeenFact::new(
                        String::from_utf8_lossy(&val).into_owned(),
                        version as u64,
                        us_time(at),
                    )
                }),
            )
        })
        .collect();
    let state: &str = get(row, "state")?;
    let state = ItemState::parse(state)
        .ok_or_else(|| ReconcileError::backend(format!("difference {id}: state {state:?}")))?;
    let key: Vec<u8> = get(row, "key")?;
    let difference = Difference {
        id,
        rule: get(row, "rule")?,
        key: Bytes::from(key),
        seen,
        action: get(row, "action")?,
    };
    let tries: i32 = get(row, "tries")?;
    let age: i64 = get(row, "age_us")?;
    Ok(Item::new(
        difference,
        state,
        u32::try_from(tries).unwrap_or(0),
        get(row, "note")?,
        get(row, "who")?,
        Duration::from_micros(u64::try_from(age).unwrap_or(0)),
    ))
}

impl PostgresDifferences {
    /// A store over `pool`, in the table `surely_reconcile`.
    pub fn new(pool: Pool) -> Self {
        PostgresDifferences {
            store: Store::new(pool),
        }
    }

    /// The same store in another table, such as `billing.differences`.
    ///
    /// # Errors
    ///
    /// The name is not a lower-case identifier (letters, digits, `_`, at most 50 bytes),
    /// optionally schema-qualified.
    pub fn with_table(self, table: &str) -> Result<Self, ConfigError> {
        Ok(PostgresDifferences {
            store: self.store.with_table(table)?,
        })
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        self.store.pool()
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        self.store.table()
    }

    /// Applies this store's table's migrations that the database has not recorded yet.
    ///
    /// # Errors
    ///
    /// The database refused, or could not be reached.
    pub async fn migrate(&self) -> Result<(), ReconcileError> {
        self.store.migrate().await.map_err(ReconcileError::backend)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, ReconcileError> {
        self.store.client().await.map_err(ReconcileError::backend)
    }

    /// Why a fenced or manual change of `id` changed nothing.
    async fn why_not(
        &self,
        client: &deadpool_postgres::Object,
        id: &RepairId,
    ) -> Result<Marked, ReconcileError> {
        let row = client
            .query_opt(&self.store.sql().look, &[&id.as_str()])
            .await
            .map_err(ReconcileError::backend)?
            .ok_or_else(|| ReconcileError::not_found(id))?;
        match get::<&str>(&row, "state")? {
            "repaired" | "resolved" => Ok(Marked::Already),
            _ => Err(ReconcileError::stale()),
        }
    }

    /// Inserts `d` unless its id is there; whether it inserted it.
    async fn insert(
        &self,
        client: &deadpool_postgres::Object,
        d: &Difference,
    ) -> Result<bool, ReconcileError> {
        let sources: Vec<&str> = d.seen.iter().map(|s| s.source.as_str()).collect();
        let present: Vec<bool> = d.seen.iter().map(|s| s.fact.is_some()).collect();
        let vals: Vec<&[u8]> = d
            .seen
            .iter()
            .map(|s| s.fact.as_ref().map_or(&b""[..], |f| f.value.as_bytes()))
            .collect();
        let versions: Vec<i64> = d
            .seen
            .iter()
            .map(|s| s.fact.as_ref().map_or(0, |f| f.version as i64))
            .collect();
        let ats: Vec<i64> = d
            .seen
            .iter()
            .map(|s| s.fact.as_ref().map_or(0, |f| time_us(f.at)))
            .collect();
        let manual = d.action.is_none();
        let state = if manual { "manual" } else { "open" };
        let note = manual.then_some(super::NO_REPAIR);
        let who = manual.then_some(super::RULES);
        let key: &[u8] = &d.key;
        let n = client
            .execute(
                &self.store.sql().record,
                &[
                    &d.id.as_str(),
                    &d.rule.as_str(),
                    &key,
                    &d.action.as_deref(),
                    &sources,
                    &present,
                    &vals,
                    &versions,
                    &ats,
                    &state,
                    &note,
                    &who,
                ],
            )
            .await
            .map_err(by_content)?;
        Ok(n == 1)
    }

    async fn release(
        &self,
        sql: &str,
        claim: &RepairClaim,
        extra: &[&(dyn ToSql + Sync)],
    ) -> Result<(), ReconcileError> {
        let client = self.client().await?;
        let id = claim.item.difference.id.as_str();
        let fence = queue::fence(claim.fence());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&id, &fence];
        params.extend_from_slice(extra);
        let n = client.execute(sql, &params).await.map_err(by_content)?;
        if n == 1 {
            return Ok(());
        }
        match self.why_not(&client, &claim.item.difference.id).await {
            Ok(Marked::Already) | Err(_) => Err(ReconcileError::stale()),
            Ok(Marked::Now) => Ok(()),
        }
    }
}

impl fmt::Debug for PostgresDifferences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresDifferences")
            .field("table", &self.store.table())
            .finish_non_exhaustive()
    }
}

impl DifferenceStore for PostgresDifferences {
    async fn record(&self, d: &Difference) -> Result<bool, ReconcileError> {
        let client = self.client().await?;
        self.insert(&client, d).await
    }

    async fn record_many(&self, differences: &[Difference]) -> Result<Vec<bool>, ReconcileError> {
        let client = self.client().await?;
        let ids: Vec<&str> = differences.iter().map(|d| d.id.as_str()).collect();
        let rows = client
            .query(&self.store.sql().known, &[&ids])
            .await
            .map_err(ReconcileError::backend)?;
        let known: std::collections::HashSet<String> = rows
            .iter()
            .map(|r| r.try_get::<_, String>(0))
            .collect::<Result<_, _>>()
            .map_err(ReconcileError::backend)?;
        let mut new = Vec::with_capacity(differences.len());
        for d in differences {
            new.push(!known.contains(d.id.as_str()) && self.insert(&client, d).await?);
        }
        Ok(new)
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<RepairClaim>, ReconcileError> {
        let client = self.client().await?;
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let rows = client
            .query(&self.store.sql().claim, &[&max, &micros(lease)])
            .await
            .map_err(ReconcileError::backend)?;
        // In the order they were recorded.
        let mut claims = rows
            .iter()
            .map(|row| {
                let fence = queue::fence_of(get(row, "fence")?);
                let seq: i64 = get(row, "seq")?;
                Ok((seq, RepairClaim::new(item_of(row)?, fence)))
            })
            .collect::<Result<Vec<_>, ReconcileError>>()?;
        claims.sort_by_key(|(seq, _)| *seq);
        Ok(claims.into_iter().map(|(_, c)| c).collect())
    }

    async fn mark_repaired(
        &self,
        claim: &RepairClaim,
        note: &str,
    ) -> Result<Marked, ReconcileError> {
        let client = self.client().await?;
        let id = &claim.item.difference.id;
        let fence = queue::fence(claim.fence());
        let note = kept(note, MAX_TEXT);
        let n = client
            .execute(
                &self.store.sql().mark,
                &[&id.as_str(), &fence, &note.as_str()],
            )
            .await
            .map_err(by_content)?;
        if n == 1 {
            return Ok(Marked::Now);
        }
        self.why_not(&client, id).await
    }

    async fn retry_later(
        &self,
        claim: &RepairClaim,
        note: &str,
        after: Duration,
    ) -> Result<(), ReconcileError> {
        let note = kept(note, MAX_TEXT);
        self.release(
            &self.store.sql().retry_later,
            claim,
            &[&note, &micros(after)],
        )
        .await
    }

    async fn to_manual(
        &self,
        claim: &RepairClaim,
        who: &str,
        why: &str,
    ) -> Result<(), ReconcileError> {
        let note = kept(why, MAX_TEXT);
        let who = kept(who, MAX_WHO);
        self.release(&self.store.sql().to_manual, claim, &[&note, &who])
            .await
    }

    async fn resolve_manually(
        &self,
        id: &RepairId,
        who: &str,
        why: &str,
    ) -> Result<Marked, ReconcileError> {
        check_person(who, why)?;
        let client = self.client().await?;
        let n = client
            .execute(&self.store.sql().resolve, &[&id.as_str(), &who, &why])
            .await
            .map_err(by_content)?;
        if n == 1 {
            return Ok(Marked::Now);
        }
        self.why_not(&client, id).await
    }

    async fn get(&self, id: &RepairId) -> Result<Option<Item>, ReconcileError> {
        let client = self.client().await?;
        let row = client
            .query_opt(&self.store.sql().get, &[&id.as_str()])
            .await
            .map_err(ReconcileError::backend)?;
        row.as_ref().map(item_of).transpose()
    }

    async fn list(
        &self,
        state: Option<ItemState>,
        limit: usize,
    ) -> Result<Vec<Item>, ReconcileError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match state {
            Some(s) => {
                client
                    .query(&self.store.sql().list_state, &[&limit, &s.as_str()])
                    .await
            }
            None => client.query(&self.store.sql().list, &[&limit]).await,
        }
        .map_err(ReconcileError::backend)?;
        rows.iter().map(item_of).collect()
    }

    async fn stats(&self) -> Result<DifferenceStats, ReconcileError> {
        let client = self.client().await?;
        let rows = client
            .query(&self.store.sql().stats, &[])
            .await
            .map_err(ReconcileError::backend)?;
        let mut stats = DifferenceStats::default();
        for row in &rows {
            let rule: String = row.try_get(0).map_err(ReconcileError::backend)?;
            let open: i64 = row.try_get(1).map_err(ReconcileError::backend)?;
            let manual: i64 = row.try_get(2).map_err(ReconcileError::backend)?;
            let age: i64 = row.try_get(3).map_err(ReconcileError::backend)?;
            stats.open_by_rule.push((rule, open as u64));
            stats.manual = stats.manual.saturating_add(manual as u64);
            let age = Duration::from_micros(u64::try_from(age).unwrap_or(0));
            stats.oldest_open = stats.oldest_open.max(Some(age));
        }
        let done = client
            .query_one(&self.store.sql().done, &[])
            .await
            .map_err(ReconcileError::backend)?;
        let repaired: i64 = done.try_get(0).map_err(ReconcileError::backend)?;
        let resolved: i64 = done.try_get(1).map_err(ReconcileError::backend)?;
        stats.repaired = repaired as u64;
        stats.resolved = resolved as u64;
        Ok(stats)
    }

    async fn sweep_batch(&self, retention: Duration, limit: usize) -> Result<u64, ReconcileError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        client
            .execute(&self.store.sql().sweep, &[&micros(retention), &limit])
            .await
            .map_err(ReconcileError::backend)
    }
}

/// A source that pages through a query of yours with keyset pagination: each page is the
/// query's rows after the previous page's last key, `ORDER BY key LIMIT n`, so a page costs an
/// index range scan however deep into the keys it is, where `OFFSET` would read and drop every
/// row before it.
///
/// The query returns one row per key with the columns `key` (`bytea`, or `text`: compared
/// byte by byte, `COLLATE "C"`), `value` (any type with a text form), `version` (an integer,
/// at least 0) and `at` (a `timestamptz` or `timestamp`). It may use `$1`, the comparison's
/// as-of time (`timestamptz`), for a table that keeps history. The adapter wraps it:
///
/// ```sql
/// SELECT key, value::text, version::int8, EXTRACT(EPOCH FROM at) * 1000000
/// FROM (<your query>) AS q
/// WHERE key > $2            -- after the first page
/// ORDER BY key LIMIT $3
/// ```
///
/// PostgreSQL pushes the `WHERE` and `ORDER BY` into a simple query over a table, so an index
/// on the key column serves every page (for a `text` key, an index with `COLLATE "C"`, or the
/// database's collation being `C`). The query is the user's code: it is run as given, and must
/// come from your program, never from input.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use surely::reconcile::PostgresSource;
///
/// let pool = surely::postgres::connect("postgres://postgres@127.0.0.1:5432/test")?;
/// let orders = PostgresSource::new(
///     pool,
///     "SELECT order_id AS key, status AS value, row_version AS version, updated_at AS at
///      FROM orders",
/// );
/// # let _ = orders; Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresSource {
    pool: Pool,
    query: Arc<str>,
    statements: Arc<OnceCell<Statements>>,
}

#[derive(Clone)]
struct Statements {
    first: String,
    next: String,
    key_is_text: bool,
}

impl PostgresSource {
    /// A source over `pool` running `query` (see above).
    pub fn new(pool: Pool, query: impl Into<Arc<str>>) -> Self {
        PostgresSource {
            pool,
            query: query.into(),
            statements: Arc::new(OnceCell::new()),
        }
    }

    /// The query.
    pub fn query(&self) -> &str {
        &self.query
    }

    /// The wrapped statements, made once: the key's type decides how it is ordered.
    async fn statements(
        &self,
        client: &deadpool_postgres::Object,
    ) -> Result<&Statements, BoxError> {
        self.statements
            .get_or_try_init(|| async {
                let probe = format!("SELECT q.key FROM ({}) AS q LIMIT 0", self.query);
                let stmt = client.prepare_typed(&probe, &[Type::TIMESTAMPTZ]).await?;
                let key_type = stmt
                    .columns()
                    .first()
                    .map(|c| c.type_().clone())
                    .ok_or("the query has no `key` column")?;
                let key_is_text = match key_type {
                    Type::BYTEA => false,
                    Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => true,
                    other => {
                        return Err(BoxError::from(format!(
                            "the query's `key` column is {other}, not bytea or text"
                        )))
                    }
                };
                let key = if key_is_text {
                    "q.key COLLATE \"C\""
                } else {
                    "q.key"
                };
                let select = format!(
                    "SELECT q.key, q.value::text AS value, q.version::int8 AS version,
                            (EXTRACT(EPOCH FROM q.at) * 1000000)::int8 AS at_us
                     FROM ({}) AS q",
                    self.query
                );
                Ok(Statements {
                    first: format!("{select} ORDER BY {key} LIMIT $3"),
                    next: format!("{select} WHERE {key} > $2 ORDER BY {key} LIMIT $3"),
                    key_is_text,
                })
            })
            .await
    }

    async fn page_now(&self, request: PageRequest<'_>) -> Result<Vec<Fact>, BoxError> {
        let client = self.pool.get().await?;
        let st = self.statements(&client).await?.clone();
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        let key_type = if st.key_is_text {
            Type::TEXT
        } else {
            Type::BYTEA
        };
        let types = [Type::TIMESTAMPTZ, key_type, Type::INT8];
        let rows = match request.after {
            None => {
                let stmt = client.prepare_typed_cached(&st.first, &types).await?;
                let none: Option<&str> = None;
                if st.key_is_text {
                    client
                        .query(&stmt, &[&request.as_of, &none, &limit])
                        .await?
                } else {
                    client
                        .query(&stmt, &[&request.as_of, &None::<&[u8]>, &limit])
                        .await?
                }
            }
            Some(after) => {
                let stmt = client.prepare_typed_cached(&st.next, &types).await?;
                if st.key_is_text {
                    let after = std::str::from_utf8(after)?;
                    client
                        .query(&stmt, &[&request.as_of, &after, &limit])
                        .await?
                } else {
                    client
                        .query(&stmt, &[&request.as_of, &after, &limit])
                        .await?
                }
            }
        };
        rows.iter()
            .map(|row| {
                let key: Bytes = if st.key_is_text {
                    Bytes::from(row.try_get::<_, String>(0)?)
                } else {
                    Bytes::from(row.try_get::<_, Vec<u8>>(0)?)
                };
                let value: Option<String> = row.try_get(1)?;
                let version: i64 = row.try_get(2)?;
                let version = u64::try_from(version).map_err(|_| {
                    format!(
                        "key {}: version {version} is negative",
                        super::key_display(&key)
                    )
                })?;
                let at: Option<i64> = row.try_get(3)?;
                Ok(Fact::new(
                    key,
                    value.unwrap_or_default(),
                    version,
                    at.map_or(UNIX_EPOCH, us_time),
                ))
            })
            .collect()
    }
}

impl fmt::Debug for PostgresSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSource")
            .field("query", &self.query)
            .finish_non_exhaustive()
    }
}

impl Source for PostgresSource {
    fn page(
        &self,
        request: PageRequest<'_>,
    ) -> impl Future<Output = Result<Vec<Fact>, BoxError>> + Send {
        self.page_now(request)
    }
}

#[cfg(test)]
mod tests {
    use super::PostgresDifferences;

    /// The sweep reads the repaired and resolved differences through the index on
    /// `settled_at` that migration 2 made.
    #[tokio::test]
    async fn pg_the_sweep_is_read_through_the_settled_at_index() {
        use crate::storage::testing::{plan, pool};
        let table = format!(
            "surely_reconcile_plan_{:x}",
            crate::ids::random_u128() as u64
        );
        let store = PostgresDifferences::new(pool()).with_table(&table).unwrap();
        store.migrate().await.unwrap();
        let shown = plan(store.pool(), &store.store.sql().sweep, "0, 1000").await;
        store
            .pool()
            .get()
            .await
            .unwrap()
            .batch_execute(&format!(
                "DROP TABLE {table}; DELETE FROM surely_migrations WHERE target = '{table}'"
            ))
            .await
            .unwrap();
        assert!(shown.contains(&format!("{table}_settled ")), "{shown}");
        assert!(!shown.contains("Seq Scan"), "{shown}");
        assert!(shown.contains("LockRows"), "{shown}");
    }
}
