//! The crate's one way of talking to PostgreSQL: versioned migrations, run with one call, each
//! applied once, recorded, and rolled back whole when one fails. Against the machine's local
//! server (or `SURELY_TEST_POSTGRES_URL`); the tests fail if it does not answer.

#![cfg(feature = "postgres")]

use std::time::Duration;

use surely::idempotency::IdempotencyKey;
use surely::postgres::{Migrations, Pool};
use surely::server::store::{Acquire, IdempotencyStore, PostgresStore, RecordKey, RequestDigest};

use crate::support::names::unique;
use crate::support::postgres::{self, pool};

/// Drops `table` and forgets its migrations.
async fn forget(pool: &Pool, table: &str) {
    postgres::forget(pool, &[table], &[table]).await;
}

/// Every component, each in a table of this test's own: the idempotency store's in `table`,
/// the outbox's in `table_outbox`, the inbox's in `table_inbox`, the ledger's in
/// `table_ledger`, reconciliation's differences in `table_reconcile` (and, with the admin, its
/// audit log in `table_audit`).
fn migrations(table: &str) -> Migrations {
    #[cfg(feature = "admin")]
    let all = Migrations::new()
        .audit_table(&format!("{table}_audit"))
        .unwrap();
    #[cfg(not(feature = "admin"))]
    let all = Migrations::new();
    all.idempotency_table(table)
        .unwrap()
        .outbox_table(&format!("{table}_outbox"))
        .unwrap()
        .inbox_table(&format!("{table}_inbox"))
        .unwrap()
        .ledger_table(&format!("{table}_ledger"))
        .unwrap()
        .reconcile_table(&format!("{table}_reconcile"))
        .unwrap()
        .leases_table(&format!("{table}_leases"))
        .unwrap()
}

/// How many migrations `migrations(table)` applies to a new database.
const MIGRATIONS: usize = if cfg!(feature = "admin") { 20 } else { 18 };

/// Drops every table `migrations(table)` made, and forgets their migrations.
async fn forget_all(pool: &Pool, table: &str) {
    let tables = [
        table.to_owned(),
        format!("{table}_outbox_slots"),
        format!("{table}_outbox"),
        format!("{table}_inbox"),
        format!("{table}_inbox_versions"),
        format!("{table}_inbox_task_steps"),
        format!("{table}_inbox_tasks"),
        // The attempts first: they refer to the entries.
        format!("{table}_ledger_attempts"),
        format!("{table}_ledger"),
        format!("{table}_reconcile"),
        format!("{table}_audit"),
        format!("{table}_leases"),
    ];
    let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
    postgres::forget(pool, &tables, &tables).await;
}

#[tokio::test]
async fn migrations_apply_once_in_order_and_are_recorded() {
    let pool = pool();
    let table = unique("surely_mig_once");
    let migrations = migrations(&table);
    let applied = migrations.run(&pool).await.unwrap();
    let steps: Vec<String> = applied.iter().map(ToString::to_string).collect();
    assert_eq!(
        steps,
        [
            format!("idempotency {table} v1 (records)"),
            format!("idempotency {table} v2 (acquired_at)"),
            format!("idempotency {table} v3 (checkpoints_and_unknown)"),
            format!("idempotency {table} v4 (stored_forms)"),
            format!("idempotency {table} v5 (acquire_function)"),
            format!("idempotency {table} v6 (lease_index)"),
            format!("outbox {table}_outbox v1 (events)"),
            format!("outbox {table}_outbox v2 (quarantined index)"),
            format!("outbox {table}_outbox v3 (log)"),
            format!("outbox {table}_outbox v4 (log progress)"),
            format!("inbox {table}_inbox v1 (events and versions)"),
            format!("inbox {table}_inbox v2 (processed at index)"),
            format!("inbox {table}_inbox v3 (tasks and their steps)"),
            format!("ledger {table}_ledger v1 (entries and attempts)"),
            format!("ledger {table}_ledger v2 (intents in doubt)"),
            format!("reconcile {table}_reconcile v1 (differences)"),
            format!("reconcile {table}_reconcile v2 (settled at)"),
            #[cfg(feature = "admin")]
            format!("admin_audit {table}_audit v1 (audit)"),
            #[cfg(feature = "admin")]
            format!("admin_audit {table}_audit v2 (finished at index)"),
            format!("leases {table}_leases v1 (leases)"),
        ]
    );
    // Again: nothing to do.
    assert!(migrations.run(&pool).await.unwrap().is_empty());
    // The store over it works.
    let store = PostgresStore::new(pool.clone()).with_table(&table).unwrap();
    let key = RecordKey::new("t", "POST /orders", IdempotencyKey::new("k-1").unwrap());
    let digest = RequestDigest::of(b"o");
    assert!(matches!(
        store
            .acquire(&key, &digest, Duration::from_secs(30))
            .await
            .unwrap(),
        Acquire::Owner(_)
    ));
    assert_eq!(store.stuck(Duration::ZERO, 10).await.unwrap().len(), 1);
    forget_all(&pool, &table).await;
}

/// Tables in a schema of their own (`billing.idempotency`): every component migrates, and its
/// indexes are named without the schema, which PostgreSQL refuses in an index's name.
#[tokio::test]
async fn tables_in_a_schema_of_their_own_migrate() {
    let pool = pool();
    let (client, schema) = postgres::schema(
        &pool,
        "tables_in_a_schema_of_their_own_migrate",
        "surely_mig_schema",
    )
    .await;
    let table = format!("{schema}.calls");
    let applied = migrations(&table).run(&pool).await;
    let targets = [
        table.clone(),
        format!("{table}_outbox"),
        format!("{table}_inbox"),
        format!("{table}_ledger"),
        format!("{table}_reconcile"),
        format!("{table}_audit"),
    ];
    let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
    let forget = postgres::forget_schema(&client, &schema, &targets);
    let applied = match applied {
        Ok(applied) => {
            forget.await;
            applied
        }
        Err(e) => {
            forget.await;
            panic!("migrating into schema {schema}: {e}");
        }
    };
    assert_eq!(applied.len(), MIGRATIONS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_that_migrate_together_apply_each_migration_once() {
    let table = unique("surely_mig_race");
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let table = table.clone();
            tokio::spawn(async move { migrations(&table).run(&pool()).await.unwrap().len() })
        })
        .collect();
    let mut total = 0;
    for run in runs {
        total += run.await.unwrap();
    }
    assert_eq!(total, MIGRATIONS, "each migration applied by one instance");
    forget_all(&pool(), &table).await;
}

#[tokio::test]
async fn a_table_made_before_the_records_is_brought_up_to_date() {
    let pool = pool();
    let table = unique("surely_mig_old");
    // The table as the store made it before migrations were versioned.
    pool.get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE {table} (
                tenant text NOT NULL, operation text NOT NULL, key text NOT NULL,
                digest bytea NOT NULL, state smallint NOT NULL, fence bigint NOT NULL,
                lease_until timestamptz, expires_at timestamptz, status smallint,
                header_names text[], header_values bytea[], body bytea,
                PRIMARY KEY (tenant, operation, key));
             INSERT INTO {table} (tenant, operation, key, digest, state, fence, lease_until)
             VALUES ('t', 'POST /orders', 'k-old', '\\x00', 0, 1, now() - interval '1 hour');"
        ))
        .await
        .unwrap();
    let store = PostgresStore::new(pool.clone()).with_table(&table).unwrap();
    // Not migrated yet: an acquire says what to run, and the request is not the client's fault.
    let key = RecordKey::new("t", "POST /orders", IdempotencyKey::new("k-new").unwrap());
    let digest = RequestDigest::of(b"o");
    let err = store
        .acquire(&key, &digest, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err}");
    // The message says what failed, its source why.
    let message = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        message.contains(&format!("{table}_acquire does not exist"))
            && message.contains("surely::postgres::migrate"),
        "{message}"
    );
    store.migrate().await.unwrap();
    assert!(matches!(
        store
            .acquire(&key, &digest, Duration::from_secs(30))
            .await
            .unwrap(),
        Acquire::Owner(_)
    ));
    // The old processing record has no acquisition time: it counts from its lease.
    let stuck = store.stuck(Duration::from_secs(60), 10).await.unwrap();
    assert_eq!(stuck.len(), 1);
    assert_eq!(stuck[0].key.key().as_str(), "k-old");
    // And the rows say the five migrations are done.
    let n: i64 = pool
        .get()
        .await
        .unwrap()
        .query_one(
            "SELECT count(*) FROM surely_migrations WHERE component = 'idempotency' AND target = $1",
            &[&table],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 6);
    forget(&pool, &table).await;
}

#[tokio::test]
async fn a_migration_that_fails_applies_nothing_and_says_which() {
    let pool = pool();
    // The records table exists (another table's migrations made it), so that this run's
    // records, had it written any, would show.
    let other = unique("surely_mig_other");
    migrations(&other).run(&pool).await.unwrap();
    forget_all(&pool, &other).await;
    let table = unique("surely_mig_fail");
    // Something else already has the name: a view, on which no index can be made.
    pool.get()
        .await
        .unwrap()
        .batch_execute(&format!("CREATE VIEW {table} AS SELECT 1 AS state"))
        .await
        .unwrap();
    let err = migrations(&table).run(&pool).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains(&format!("applying idempotency {table} v1 (records)")),
        "{message}"
    );
    let client = pool.get().await.unwrap();
    let n: i64 = client
        .query_one(
            "SELECT count(*) FROM surely_migrations WHERE target = $1",
            &[&table],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "nothing recorded");
    client
        .batch_execute(&format!("DROP VIEW {table}"))
        .await
        .unwrap();
}

#[test]
fn a_table_name_that_is_not_an_identifier_is_refused() {
    for bad in ["", "Orders", "orders;drop table x", "a.b.c", "1st"] {
        let err = Migrations::new().idempotency_table(bad).unwrap_err();
        assert!(
            err.to_string().contains("lower-case identifier"),
            "{bad}: {err}"
        );
    }
    assert!(Migrations::new()
        .idempotency_table("billing.idem_2")
        .is_ok());
    assert!(Migrations::new().ledger_table("bad; drop").is_err());
    assert!(Migrations::new().ledger_table("ops.unknown_calls").is_ok());
}

#[test]
fn a_url_that_does_not_parse_is_an_error_not_a_panic() {
    let err = surely::postgres::connect("not a url at all").unwrap_err();
    assert!(
        err.to_string().starts_with("cannot make a PostgreSQL pool"),
        "{err}"
    );
    // Why it does not parse is tokio-postgres's error, the source, said once.
    let cause = std::error::Error::source(&err).expect("tokio-postgres's error");
    assert!(
        !err.to_string().contains(&cause.to_string()),
        "{err}: {cause}"
    );
}

/// A database that does not answer fails the run at its first step, which the message names;
/// the pool's error is the source, not repeated in the message.
#[tokio::test]
async fn a_migration_that_cannot_connect_says_its_cause_once() {
    let closed = crate::support::serve::closed_port();
    let pool = surely::postgres::connect(&format!("postgres://postgres@{closed}/test")).unwrap();
    let err = surely::postgres::migrate(&pool).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "PostgreSQL migration failed while connecting"
    );
    let cause = std::error::Error::source(&err).expect("the pool's error");
    assert!(
        !err.to_string().contains(&cause.to_string()),
        "{err}: {cause}"
    );
}

/// What tokio-postgres logged (the server's notices), for the test below.
static NOTICES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

struct Notices;

impl log::Log for Notices {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        if record.target().starts_with("tokio_postgres") {
            let line = format!("{} {}", record.level(), record.args());
            NOTICES.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    }
    fn flush(&self) {}
}

/// A restart's migrations, with nothing to do, log nothing at INFO: no "already exists,
/// skipping" notice from the server on every start.
#[tokio::test]
async fn migrations_with_nothing_to_do_log_nothing() {
    // Other tests of this binary log through `tracing`'s scoped subscribers, not `log`.
    let _ = log::set_logger(&Notices);
    log::set_max_level(log::LevelFilter::Info);
    let pool = pool();
    let table = unique("surely_mig_quiet");
    migrations(&table).run(&pool).await.unwrap();
    assert!(migrations(&table).run(&pool).await.unwrap().is_empty());
    let said: Vec<String> = NOTICES
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&table) || l.contains("surely_migrations"))
        .cloned()
        .collect();
    forget_all(&pool, &table).await;
    assert!(said.is_empty(), "{said:#?}");
}
