//! Reconciliation on PostgreSQL: sources paged with keyset pagination over real tables, and
//! the differences' table. Real time, with short leases on the database's clock; against the
//! machine's local server (or `SURELY_TEST_POSTGRES_URL`).

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use surely::reconcile::{
    DifferenceStore, ItemState, Marked, PageRequest, PostgresDifferences, PostgresSource,
    Reconciler, RepairAnswer, RepairRequest, Repairer, Rule, Source, Want,
};

use super::{rules, Target};
use crate::support::postgres::{self, did_not_answer};

/// A schema of the test's own with `orders` (text keys), `payments` and `inventory` (bytea
/// keys), and the differences' table migrated in it.
struct Db {
    client: deadpool_postgres::Object,
    schema: String,
    pool: surely::postgres::Pool,
    store: PostgresDifferences,
}

impl Db {
    async fn new(test: &str) -> Db {
        let pool = postgres::pool();
        let (client, schema) = postgres::schema(&pool, test, "surely_rec").await;
        client
            .batch_execute(&format!(
                "CREATE TABLE {schema}.orders (id text PRIMARY KEY, status text NOT NULL,
                     version bigint NOT NULL, updated_at timestamptz NOT NULL);
                 CREATE TABLE {schema}.payments (id bytea PRIMARY KEY, status text NOT NULL,
                     version bigint NOT NULL, updated_at timestamptz NOT NULL);
                 CREATE TABLE {schema}.inventory (id bytea PRIMARY KEY, status text NOT NULL,
                     version bigint NOT NULL, updated_at timestamptz NOT NULL);"
            ))
            .await
            .unwrap();
        let store = PostgresDifferences::new(pool.clone())
            .with_table(&format!("{schema}.differences"))
            .unwrap();
        store
            .migrate()
            .await
            .unwrap_or_else(|e| did_not_answer(test, e));
        Db {
            client,
            schema,
            pool,
            store,
        }
    }

    fn source(&self, table: &str) -> PostgresSource {
        PostgresSource::new(
            self.pool.clone(),
            format!(
                "SELECT id AS key, status AS value, version, updated_at AS at
                 FROM {}.{table}",
                self.schema
            ),
        )
    }

    fn reconciler(&self) -> Reconciler<PostgresDifferences> {
        let mut b = Reconciler::builder(self.store.clone())
            .source("orders", self.source("orders"))
            .source("payments", self.source("payments"))
            .source("inventory", self.source("inventory"))
            .page_size(2);
        for rule in rules() {
            b = b.rule(rule);
        }
        b.build().unwrap()
    }

    async fn put(&self, table: &str, key: &[u8], status: &str, version: i64, secs_ago: f64) {
        let sql = if table == "orders" {
            format!(
                "INSERT INTO {}.orders VALUES (convert_from($1, 'UTF8'), $2, $3,
                     now() - $4 * interval '1 second')
                 ON CONFLICT (id) DO UPDATE SET status = $2, version = $3,
                     updated_at = now() - $4 * interval '1 second'",
                self.schema
            )
        } else {
            format!(
                "INSERT INTO {}.{table} VALUES ($1, $2, $3, now() - $4 * interval '1 second')
                 ON CONFLICT (id) DO UPDATE SET status = $2, version = $3,
                     updated_at = now() - $4 * interval '1 second'",
                self.schema
            )
        };
        self.client
            .execute(&sql, &[&key, &status, &version, &secs_ago])
            .await
            .unwrap();
    }

    async fn drop(self) {
        let target = self.store.table().to_owned();
        postgres::forget_schema(&self.client, &self.schema, &[&target]).await;
    }
}

/// The database's clock: the as-of time of the comparisons (the facts' times are on it).
async fn db_now(db: &Db) -> SystemTime {
    db.client
        .query_one("SELECT now()", &[])
        .await
        .unwrap()
        .get(0)
}

/// The seed's cases over real tables, paged two rows at a time: the same differences as in
/// memory, recorded once; a rerun records nothing new, and the repairs are applied once.
#[tokio::test]
async fn pg_differences_are_found_once_and_repaired_once() {
    let db = Db::new("pg_differences_are_found_once_and_repaired_once").await;
    db.put("orders", b"o-1", "awaiting_payment", 2, 3600.0)
        .await;
    db.put("payments", b"o-1", "charged", 1, 3500.0).await;
    db.put("inventory", b"o-1", "reserved", 1, 3500.0).await;
    db.put("orders", b"o-2", "paid", 3, 3600.0).await;
    db.put("payments", b"o-2", "charged", 1, 3600.0).await;
    db.put("inventory", b"o-2", "reserved", 1, 3600.0).await;
    db.put("orders", b"o-3", "cancelling", 4, 4000.0).await;
    db.put("inventory", b"o-3", "released", 2, 3900.0).await;
    db.put("payments", b"o-4", "charged", 1, 7200.0).await;
    db.put("orders", b"o-5", "awaiting_payment", 1, 600.0).await;
    db.put("payments", b"o-5", "charged", 1, 60.0).await;

    let mut r = db.reconciler();
    let as_of = db_now(&db).await;
    let pass = r.run_once(as_of).await.unwrap();
    assert_eq!((pass.keys, pass.new, pass.in_flight), (5, 3, 1), "{pass:?}");
    let again = r.run_once(as_of).await.unwrap();
    assert_eq!((again.new, again.known), (0, 3), "{again:?}");

    let items = db.store.list(None, 10).await.unwrap();
    let keys: Vec<&[u8]> = items.iter().map(|i| i.difference.key.as_ref()).collect();
    assert_eq!(keys, [&b"o-1"[..], b"o-3", b"o-4"]);
    let o1 = &items[0].difference;
    assert_eq!(o1.seen[0].fact.as_ref().unwrap().version, 2);
    assert_eq!(o1.seen[1].fact.as_ref().unwrap().value, "charged");
    assert!(items[2].difference.seen[0].fact.is_none());

    let stats = db.store.stats().await.unwrap();
    assert_eq!(
        stats.open_by_rule,
        [
            ("order-inventory".to_owned(), 1),
            ("payment-order".to_owned(), 2)
        ]
    );

    let target = Target::default();
    let mut repairer = Repairer::builder(db.store.clone(), target.service())
        .build()
        .unwrap();
    let round = repairer.run_once().await.unwrap();
    assert_eq!((round.claimed, round.repaired), (3, 3), "{round:?}");
    assert_eq!(repairer.run_once().await.unwrap().claimed, 0);
    assert_eq!(r.run_once(as_of).await.unwrap().new, 0);
    assert!(target.applied().values().all(|&n| n == 1));
    assert_eq!(db.store.stats().await.unwrap().repaired, 3);
    db.drop().await;
}

/// A repairer applies and dies before its mark; after its lease (on the database's clock)
/// another one sends the same repair id, and the target applies it once. The dead claim
/// cannot mark.
#[tokio::test]
async fn pg_a_crash_between_the_repair_and_its_mark_applies_it_once() {
    let db = Db::new("pg_a_crash_between_the_repair_and_its_mark_applies_it_once").await;
    db.put("orders", b"o-1", "awaiting_payment", 2, 3600.0)
        .await;
    db.put("payments", b"o-1", "charged", 1, 3500.0).await;
    db.reconciler().run_once(db_now(&db).await).await.unwrap();
    let target = Target::default();
    // The first repairer's target applies, then never answers: the process dies there.
    let t = target.clone();
    let dying = tower::service_fn(move |req: RepairRequest| {
        let t = t.clone();
        async move {
            t.apply(&req);
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(RepairAnswer::Applied)
        }
    });
    let mut first = Repairer::builder(db.store.clone(), dying)
        .lease(Duration::from_millis(300))
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    tokio::select! {
        _ = first.run_once() => panic!("the first repairer must not finish"),
        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
    }
    drop(first);
    let d = db.store.list(None, 1).await.unwrap().remove(0).difference;
    assert_eq!(target.calls(&d.id), 1);
    // Within the lease, nobody takes it; after it, the next repairer does.
    let mut second = Repairer::builder(db.store.clone(), target.service())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    assert_eq!(second.run_once().await.unwrap().claimed, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let round = second.run_once().await.unwrap();
    assert_eq!((round.claimed, round.repaired), (1, 1), "{round:?}");
    assert_eq!(target.calls(&d.id), 2, "the same repair id was sent again");
    assert_eq!(target.applied()[&d.id], 1, "and applied once");
    assert_eq!(
        db.store.get(&d.id).await.unwrap().unwrap().state,
        ItemState::Repaired
    );
    db.drop().await;
}

/// A claim whose lease passed cannot mark; a person's resolution is checked and kept.
#[tokio::test]
async fn pg_a_stale_claim_cannot_mark() {
    let db = Db::new("pg_a_stale_claim_cannot_mark").await;
    let d = surely::reconcile::Difference::new("r", "k", vec![], Some("fix".to_owned()));
    assert!(db.store.record(&d).await.unwrap());
    assert!(!db.store.record(&d).await.unwrap());
    let old = db
        .store
        .claim(10, Duration::from_millis(100))
        .await
        .unwrap()
        .remove(0);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let new = db
        .store
        .claim(10, Duration::from_secs(10))
        .await
        .unwrap()
        .remove(0);
    assert!(new.fence() > old.fence());
    assert!(db
        .store
        .mark_repaired(&old, "late")
        .await
        .unwrap_err()
        .is_stale());
    assert!(db
        .store
        .to_manual(&old, "me", "late")
        .await
        .unwrap_err()
        .is_stale());
    db.store
        .to_manual(&new, "host-1", "the order service refused")
        .await
        .unwrap();
    let item = db.store.get(&d.id).await.unwrap().unwrap();
    assert_eq!(
        (item.state, item.who.as_deref()),
        (ItemState::Manual, Some("host-1"))
    );
    assert!(db
        .store
        .resolve_manually(&d.id, "", "x")
        .await
        .unwrap_err()
        .is_invalid());
    assert_eq!(
        db.store
            .resolve_manually(&d.id, "ana", "fixed by hand")
            .await
            .unwrap(),
        Marked::Now
    );
    assert_eq!(
        db.store
            .resolve_manually(&d.id, "ana", "again")
            .await
            .unwrap(),
        Marked::Already
    );
    let missing = surely::reconcile::RepairId::of("none", b"", &[]);
    assert!(db
        .store
        .resolve_manually(&missing, "ana", "x")
        .await
        .unwrap_err()
        .is_not_found());
    // Without a repair, a difference is in the manual queue from the start.
    let manual = surely::reconcile::Difference::new("r", "k2", vec![], None);
    db.store.record(&manual).await.unwrap();
    let item = db.store.get(&manual.id).await.unwrap().unwrap();
    assert_eq!(
        (item.state, item.who.as_deref()),
        (ItemState::Manual, Some("rules"))
    );
    let stats = db.store.stats().await.unwrap();
    assert_eq!((stats.open(), stats.manual, stats.resolved), (1, 1, 1));
    db.drop().await;
}

/// Four repairers at once over one table: every difference is sent to the target once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_four_repairers_at_once_repair_each_difference_once() {
    let db = Db::new("pg_four_repairers_at_once_repair_each_difference_once").await;
    db.client
        .batch_execute(&format!(
            "INSERT INTO {s}.orders SELECT 'o-' || lpad(n::text, 4, '0'), 'awaiting_payment', 1,
                 now() - interval '1 hour' FROM generate_series(1, 120) AS n;
             INSERT INTO {s}.payments SELECT convert_to('o-' || lpad(n::text, 4, '0'), 'UTF8'),
                 'charged', 1, now() - interval '1 hour' FROM generate_series(1, 120) AS n;",
            s = db.schema
        ))
        .await
        .unwrap();
    let pass = db.reconciler().run_once(db_now(&db).await).await.unwrap();
    assert_eq!(pass.new, 120, "{pass:?}");
    let target = Target::default();
    let mut tasks = Vec::new();
    for n in 0..4 {
        let t = target.clone();
        let service = tower::service_fn(move |req: RepairRequest| {
            let t = t.clone();
            async move {
                tokio::task::yield_now().await;
                Ok::<_, std::io::Error>(t.apply(&req))
            }
        });
        let mut repairer = Repairer::builder(db.store.clone(), service)
            .name(format!("repairer-{n}"))
            .batch(5)
            .build()
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let mut repaired = 0;
            loop {
                let round = repairer.run_once().await.unwrap();
                repaired += round.repaired;
                if round.claimed == 0 {
                    return repaired;
                }
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 120);
    for item in db.store.list(None, 1000).await.unwrap() {
        assert_eq!(item.state, ItemState::Repaired);
        assert_eq!(target.calls(&item.difference.id), 1);
    }
    db.drop().await;
}

/// Hostile keys and values in bytea columns (empty, NUL, not UTF-8, a megabyte) are paged,
/// recorded and read back as they were; a value with NUL is kept; nothing panics.
#[tokio::test]
async fn pg_huge_and_hostile_keys_are_kept_as_they_are() {
    let db = Db::new("pg_huge_and_hostile_keys_are_kept_as_they_are").await;
    let huge = vec![b'k'; 1 << 20];
    let keys: Vec<&[u8]> = vec![b"", b"\0", b"a\0b", &[0xff, 0xfe, 0x00, 0x80], &huge];
    // Tables without an index on the key: a megabyte is over a btree entry's limit.
    db.client
        .batch_execute(&format!(
            "CREATE TABLE {s}.big_payments (id bytea NOT NULL, status text NOT NULL,
                 version bigint NOT NULL, updated_at timestamptz NOT NULL);
             CREATE TABLE {s}.big_inventory (LIKE {s}.big_payments);",
            s = db.schema
        ))
        .await
        .unwrap();
    for k in &keys {
        for (table, status, version) in [
            ("big_payments", "charged", 1),
            ("big_inventory", "released", i64::MAX),
        ] {
            db.client
                .execute(
                    &format!(
                        "INSERT INTO {}.{table} VALUES ($1, $2, $3, now() - interval '1 hour')",
                        db.schema
                    ),
                    &[k, &status, &version],
                )
                .await
                .unwrap();
        }
    }
    let mut r = Reconciler::builder(db.store.clone())
        .source("payments", db.source("big_payments"))
        .source("inventory", db.source("big_inventory"))
        .rule(
            Rule::new("stock", ["payments", "inventory"])
                .repair([Want::is("charged"), Want::Present], "check-stock"),
        )
        .page_size(2)
        .build()
        .unwrap();
    let as_of = db_now(&db).await;
    let pass = r.run_once(as_of).await.unwrap();
    assert_eq!((pass.keys, pass.new), (5, 5), "{pass:?}");
    assert_eq!(r.run_once(as_of).await.unwrap().new, 0);
    let mut got: Vec<Bytes> = db
        .store
        .list(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|i| {
            assert_eq!(
                i.difference.seen[1].fact.as_ref().unwrap().version,
                i64::MAX as u64
            );
            i.difference.key
        })
        .collect();
    got.sort();
    let mut want: Vec<Bytes> = keys.iter().map(|k| Bytes::copy_from_slice(k)).collect();
    want.sort();
    assert_eq!(got, want);

    // A text key column pages in byte order, whatever the database's collation.
    for k in ["b", "B", "a", "é", "Z"] {
        db.put("orders", k.as_bytes(), "x", 1, 10.0).await;
    }
    let orders = db.source("orders");
    let mut seen = Vec::new();
    let mut after: Option<Bytes> = None;
    loop {
        let page = orders
            .page(PageRequest::new(after.as_deref(), 2, as_of))
            .await
            .unwrap();
        seen.extend(page.iter().map(|f| f.key.clone()));
        if page.len() < 2 {
            break;
        }
        after = page.last().map(|f| f.key.clone());
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted);
    assert_eq!(seen.len(), 5);

    // The query may use `$1`, the as-of time: a table with history answers as of it.
    let as_of_source = PostgresSource::new(
        db.pool.clone(),
        format!(
            "SELECT id AS key, status AS value, version, updated_at AS at
             FROM {}.orders WHERE updated_at <= $1",
            db.schema
        ),
    );
    let now = db_now(&db).await;
    for (as_of, rows) in [(now, 5), (now - Duration::from_secs(60), 0)] {
        let page = as_of_source
            .page(PageRequest::new(None, 10, as_of))
            .await
            .unwrap();
        assert_eq!(page.len(), rows);
    }

    // A query whose key is neither text nor bytea, or a negative version, is a source error.
    let bad = PostgresSource::new(
        db.pool.clone(),
        "SELECT 1 AS key, 'v' AS value, 1 AS version, now() AS at",
    );
    assert!(bad.page(PageRequest::new(None, 10, as_of)).await.is_err());
    let negative = PostgresSource::new(
        db.pool.clone(),
        "SELECT 'k'::text AS key, 'v' AS value, -1 AS version, now() AS at",
    );
    assert!(negative
        .page(PageRequest::new(None, 10, as_of))
        .await
        .is_err());
    let infinite = PostgresSource::new(
        db.pool.clone(),
        "SELECT 'k'::text AS key, 'v' AS value, 1 AS version, 'infinity'::timestamptz AS at",
    );
    assert!(infinite
        .page(PageRequest::new(None, 10, as_of))
        .await
        .is_err());
    db.drop().await;
}

/// Four reconcilers at once over the same tables and one store: each difference is one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_four_reconcilers_at_once_record_each_difference_once() {
    let db = Db::new("pg_four_reconcilers_at_once_record_each_difference_once").await;
    db.client
        .batch_execute(&format!(
            "INSERT INTO {s}.orders SELECT 'o-' || lpad(n::text, 4, '0'),
                 CASE WHEN n % 3 = 0 THEN 'awaiting_payment' ELSE 'paid' END, 1,
                 now() - interval '1 hour' FROM generate_series(1, 300) AS n;
             INSERT INTO {s}.payments SELECT convert_to('o-' || lpad(n::text, 4, '0'), 'UTF8'),
                 'charged', 1, now() - interval '1 hour' FROM generate_series(1, 300) AS n;
             INSERT INTO {s}.inventory SELECT convert_to('o-' || lpad(n::text, 4, '0'), 'UTF8'),
                 'reserved', 1, now() - interval '1 hour' FROM generate_series(1, 300) AS n
                 WHERE n % 3 <> 0;",
            s = db.schema
        ))
        .await
        .unwrap();
    let as_of = db_now(&db).await;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let mut r = db.reconciler();
            tokio::spawn(async move { r.run_once(as_of).await.unwrap() })
        })
        .collect();
    let (mut new, mut known) = (0, 0);
    for t in tasks {
        let pass = t.await.unwrap();
        assert_eq!(pass.differences, 100, "{pass:?}");
        new += pass.new;
        known += pass.known;
    }
    assert_eq!((new, known), (100, 300));
    assert_eq!(db.store.list(None, 1000).await.unwrap().len(), 100);
    db.drop().await;
}

/// Values and notes the database's `text` would refuse (NUL) are kept or cleaned, never an
/// error: a fact's value with NUL is kept as it was (`bytea`), a refusal's reason with NUL is
/// kept with the NUL replaced, a huge one cut.
#[tokio::test]
async fn pg_hostile_values_and_reasons_are_kept() {
    let db = Db::new("pg_hostile_values_and_reasons_are_kept").await;
    let at = SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
    let seen = vec![
        surely::reconcile::Seen::new(
            "orders",
            Some(surely::reconcile::SeenFact::new(
                "a\0b\u{202e}",
                u64::MAX,
                at,
            )),
        ),
        surely::reconcile::Seen::new("payments", None),
    ];
    let d = surely::reconcile::Difference::new("r", vec![0u8, 0xff], seen, Some("fix".to_owned()));
    assert!(db.store.record(&d).await.unwrap());
    let back = db.store.get(&d.id).await.unwrap().unwrap().difference;
    assert_eq!(back, d);
    let service = tower::service_fn(|_req: RepairRequest| async {
        Ok::<_, std::io::Error>(RepairAnswer::Refused(format!(
            "no\0pe{}",
            "x".repeat(100_000)
        )))
    });
    let mut repairer = Repairer::builder(db.store.clone(), service)
        .build()
        .unwrap();
    assert_eq!(repairer.run_once().await.unwrap().to_manual, 1);
    let note = db.store.get(&d.id).await.unwrap().unwrap().note.unwrap();
    assert!(
        note.contains("no\u{fffd}pe") && note.len() <= 16 * 1024,
        "{}",
        note.len()
    );
    db.drop().await;
}

/// The differences' sweeper deletes repaired and resolved differences past the retention, at
/// most its limit a batch, the longest done first; never an open, claimed or manual one; two
/// instances' batches at once delete disjoint differences.
#[tokio::test]
async fn pg_the_sweeper_deletes_done_differences_a_bounded_batch_at_a_time() {
    use crate::sweeping::{exec, two_batches_beside_held_rows, HOUR};
    use surely::maintenance::Chore;
    use surely::reconcile::Difference;
    let db = Db::new("pg_the_sweeper_deletes_done_differences_a_bounded_batch_at_a_time").await;
    let store = &db.store;
    for i in 0..10 {
        let d = Difference::new("r", format!("k{i:02}"), vec![], Some("fix".to_owned()));
        assert!(store.record(&d).await.unwrap());
    }
    // One in the manual queue from the start.
    let manual = Difference::new("r", "k-manual", vec![], None);
    store.record(&manual).await.unwrap();
    let claims = store.claim(9, Duration::from_secs(60)).await.unwrap();
    for c in &claims[..6] {
        assert_eq!(store.mark_repaired(c, "fixed").await.unwrap(), Marked::Now);
    }
    for c in &claims[6..8] {
        let id = &c.item.difference.id;
        assert_eq!(
            store.resolve_manually(id, "ana", "by hand").await.unwrap(),
            Marked::Now
        );
    }
    // k08 claimed, k09 open, k-manual manual.
    let sweeper = store.sweeper(2 * HOUR).unwrap();
    assert_eq!(sweeper.name(), format!("reconcile {}", store.table()));
    assert_eq!(sweeper.run(100).await.unwrap().done, 0, "done just now");
    let t = store.table();
    exec(
        &db.pool,
        &format!(
            "UPDATE {t} SET settled_at = now() - interval '3 hours' - seq * interval '1 minute'
             WHERE settled_at IS NOT NULL"
        ),
    )
    .await;
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (3, true));
    let keys = |state: ItemState| async move {
        store
            .list(Some(state), 100)
            .await
            .unwrap()
            .into_iter()
            .map(|i| String::from_utf8(i.difference.key.to_vec()).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(keys(ItemState::Resolved).await, Vec::<String>::new());
    assert_eq!(
        keys(ItemState::Repaired).await,
        ["k00", "k01", "k02", "k03", "k04"],
        "the longest done first"
    );
    let other = store.sweeper(2 * HOUR).unwrap();
    let lock =
        format!("SELECT 1 FROM {t} WHERE state = 'repaired' ORDER BY seq LIMIT 2 FOR UPDATE");
    let swept = two_batches_beside_held_rows(&db.pool, &sweeper, &other, &lock).await;
    assert_eq!(swept, 3, "disjoint, every done difference not held");
    let batch = sweeper.run(100).await.unwrap();
    assert_eq!((batch.done, batch.more), (2, false));
    assert_eq!(keys(ItemState::Claimed).await, ["k08"]);
    assert_eq!(keys(ItemState::Open).await, ["k09"]);
    assert_eq!(keys(ItemState::Manual).await, ["k-manual"]);

    let err = store.sweeper(Duration::ZERO).unwrap_err();
    assert_eq!(err.setting(), "reconcile retention");
    db.drop().await;
}

/// Migration 2 gives the differences already done a settled time (the migration's), and
/// leaves the others without one.
#[tokio::test]
async fn pg_migration_2_backfills_the_settled_time_of_done_differences() {
    let pool = postgres::pool();
    let (client, schema) = postgres::schema(
        &pool,
        "pg_migration_2_backfills_the_settled_time_of_done_differences",
        "surely_rec",
    )
    .await;
    let table = format!("{schema}.differences");
    // The table as version 1 made it, with a repaired, a resolved and an open difference.
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (
                id text PRIMARY KEY, seq bigserial NOT NULL, rule text NOT NULL,
                key bytea NOT NULL, action text, sources text[] NOT NULL,
                present boolean[] NOT NULL, vals bytea[] NOT NULL, versions int8[] NOT NULL,
                ats_us int8[] NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
                state text NOT NULL, fence bigint NOT NULL DEFAULT 0, until timestamptz,
                tries integer NOT NULL DEFAULT 0, note text, who text);
             INSERT INTO {table} (id, rule, key, action, sources, present, vals, versions,
                 ats_us, state)
             SELECT i, 'r', 'k'::bytea, 'fix', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', s
             FROM (VALUES ('a', 'repaired'), ('b', 'resolved'), ('c', 'open')) AS v (i, s);
             INSERT INTO surely_migrations (component, target, version, name)
             VALUES ('reconcile', '{table}', 1, 'differences');"
        ))
        .await
        .unwrap();
    let store = PostgresDifferences::new(pool.clone())
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let rows = client
        .query(
            &format!("SELECT id, settled_at IS NOT NULL FROM {table} ORDER BY id"),
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        got,
        [
            ("a".to_owned(), true),
            ("b".to_owned(), true),
            ("c".to_owned(), false)
        ]
    );
    postgres::forget_schema(&client, &schema, &[&table]).await;
}
