//! How fast a reconciliation compares keys, beside a hand-written join of the same facts, and
//! how keyset pagination reads a PostgreSQL table beside a plain `SELECT` of the same rows, in
//! the same run.
//!
//! In memory: three `MemorySource`s (orders, payments, inventory) of 100 000 keys each, two
//! rules (the `examples/reconcile.rs` ones), one key in a hundred a difference:
//!
//! * `reconcile/memory pass, fresh store`: a whole pass into an empty `MemoryDifferences`
//!   (1 000 differences recorded), pages of 1 000;
//! * `reconcile/memory pass, known`: the same pass again over a store that has them all (the
//!   rerun);
//! * `reconcile/hand join`: the baseline, a loop over the orders' `BTreeMap` looking up the
//!   same key in the other two and comparing the values (no paging, no rules, nothing kept).
//!
//! Criterion's throughput is keys per second. The target is at least 50 000 keys compared per
//! second.
//!
//! On PostgreSQL (feature `postgres`; the database is `SURELY_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`, and the bench says so and skips this part if it
//! does not answer): two tables of 100 000 rows (text keys, `COLLATE "C"` primary key) in a
//! schema of the bench's own, dropped at the end:
//!
//! * `reconcile_pg/keyset pages of 1000`: every row read through `PostgresSource`;
//! * `reconcile_pg/plain select`: the same rows and columns in one `SELECT ... ORDER BY key`;
//! * `reconcile_pg/pass`: a whole reconciliation of the two tables into a `PostgresDifferences`
//!   that already holds their differences (the rerun).
//!
//! ```text
//! cargo bench --all-features --bench reconcile
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use criterion::{BatchSize, Criterion, Throughput};
use surely::reconcile::{MemoryDifferences, MemorySource, Reconciler, Rule, Want};

const KEYS: u64 = 100_000;

fn rules() -> Vec<Rule> {
    vec![
        Rule::new("payment-order", ["orders", "payments"])
            .grace(Duration::from_secs(300))
            .consistent([Want::is("paid"), Want::is("charged")])
            .consistent([Want::Any, Want::Missing])
            .repair(
                [Want::is("awaiting_payment"), Want::is("charged")],
                "mark-paid",
            ),
        Rule::new("order-inventory", ["orders", "inventory"])
            .grace(Duration::from_secs(300))
            .consistent([
                Want::one_of(["awaiting_payment", "paid"]),
                Want::is("reserved"),
            ])
            .consistent([Want::is("cancelled"), Want::is("released")])
            .consistent([Want::Any, Want::Missing])
            .repair(
                [Want::is("cancelling"), Want::is("released")],
                "finish-cancel",
            ),
    ]
}

/// The three systems: every key paid, charged and reserved, but one in a hundred still
/// waiting for payment.
fn systems() -> [MemorySource; 3] {
    let at = SystemTime::now() - Duration::from_secs(3600);
    let (orders, payments, inventory) = (
        MemorySource::new(),
        MemorySource::new(),
        MemorySource::new(),
    );
    for n in 0..KEYS {
        let key = format!("o-{n:08}");
        let status = if n % 100 == 0 {
            "awaiting_payment"
        } else {
            "paid"
        };
        orders.put(key.clone(), status, 2, at);
        payments.put(key.clone(), "charged", 1, at);
        inventory.put(key, "reserved", 1, at);
    }
    [orders, payments, inventory]
}

fn reconciler(
    systems: &[MemorySource; 3],
    store: MemoryDifferences,
) -> Reconciler<MemoryDifferences> {
    let mut b = Reconciler::builder(store)
        .source("orders", systems[0].clone())
        .source("payments", systems[1].clone())
        .source("inventory", systems[2].clone());
    for r in rules() {
        b = b.rule(r);
    }
    b.build().unwrap()
}

fn memory(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let systems = systems();
    let mut group = c.benchmark_group("reconcile");
    group.throughput(Throughput::Elements(KEYS));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("memory pass, fresh store", |b| {
        b.iter_batched(
            || reconciler(&systems, MemoryDifferences::new()),
            |mut r| {
                let pass = rt.block_on(r.run_once(SystemTime::now())).unwrap();
                assert_eq!(pass.new, KEYS / 100);
            },
            BatchSize::PerIteration,
        )
    });
    let mut known = reconciler(&systems, MemoryDifferences::new());
    rt.block_on(known.run_once(SystemTime::now())).unwrap();
    group.bench_function("memory pass, known", |b| {
        b.iter(|| {
            let pass = rt.block_on(known.run_once(SystemTime::now())).unwrap();
            assert_eq!((pass.new, pass.known), (0, KEYS / 100));
        })
    });
    // The baseline: the same facts, copied out into maps, joined by hand.
    let maps: Vec<BTreeMap<bytes::Bytes, String>> = systems
        .iter()
        .map(|s| {
            let mut m = BTreeMap::new();
            let page = rt
                .block_on(surely::reconcile::Source::page(
                    s,
                    surely::reconcile::PageRequest::new(None, KEYS as usize, SystemTime::now()),
                ))
                .unwrap();
            for f in page {
                m.insert(f.key, f.value);
            }
            m
        })
        .collect();
    group.bench_function("hand join", |b| {
        b.iter(|| {
            let mut differences = 0u64;
            for (key, order) in &maps[0] {
                let paid = maps[1].get(key).map(String::as_str);
                let stock = maps[2].get(key).map(String::as_str);
                if order == "awaiting_payment" && paid == Some("charged") {
                    differences += 1;
                }
                if order == "cancelling" && stock == Some("released") {
                    differences += 1;
                }
            }
            assert_eq!(differences, KEYS / 100);
        })
    });
    group.finish();
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use surely::reconcile::{PageRequest, PostgresDifferences, PostgresSource, Source};

    const VAR: &str = "SURELY_TEST_POSTGRES_URL";
    const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

    pub(crate) fn postgres(c: &mut Criterion) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let url = std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned());
        let pool = surely::postgres::connect(&url).unwrap();
        let schema = format!("surely_bench_reconcile_{}", std::process::id());
        let client = match rt.block_on(pool.get()) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("PostgreSQL at {url} (set {VAR} to use another) did not answer: {e}; the PostgreSQL cases are skipped");
                return;
            }
        };
        rt.block_on(client.batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.orders (key text COLLATE \"C\" PRIMARY KEY, value text NOT NULL,
                 version bigint NOT NULL, at timestamptz NOT NULL);
             CREATE TABLE {schema}.payments (LIKE {schema}.orders INCLUDING ALL);
             INSERT INTO {schema}.orders SELECT 'o-' || lpad(n::text, 8, '0'),
                 CASE WHEN n % 100 = 0 THEN 'awaiting_payment' ELSE 'paid' END, 2,
                 now() - interval '1 hour' FROM generate_series(0, {last}) AS n;
             INSERT INTO {schema}.payments SELECT 'o-' || lpad(n::text, 8, '0'), 'charged', 1,
                 now() - interval '1 hour' FROM generate_series(0, {last}) AS n;
             ANALYZE {schema}.orders; ANALYZE {schema}.payments;",
            last = KEYS - 1
        )))
        .unwrap();
        let source = |t: &str| {
            PostgresSource::new(
                pool.clone(),
                format!("SELECT key, value, version, at FROM {schema}.{t}"),
            )
        };
        let orders = source("orders");
        let mut group = c.benchmark_group("reconcile_pg");
        group.throughput(Throughput::Elements(KEYS));
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(15));
        group.bench_function("keyset pages of 1000", |b| {
            b.iter(|| {
                rt.block_on(async {
                    let (mut n, mut after) = (0u64, None::<bytes::Bytes>);
                    loop {
                        let page = orders
                            .page(PageRequest::new(after.as_deref(), 1000, SystemTime::now()))
                            .await
                            .unwrap();
                        n += page.len() as u64;
                        if page.len() < 1000 {
                            break;
                        }
                        after = page.last().map(|f| f.key.clone());
                    }
                    assert_eq!(n, KEYS);
                })
            })
        });
        let plain = format!(
            "SELECT key, value, version::int8, (EXTRACT(EPOCH FROM at) * 1000000)::int8
             FROM {schema}.orders ORDER BY key"
        );
        group.bench_function("plain select", |b| {
            b.iter(|| {
                rt.block_on(async {
                    let client = pool.get().await.unwrap();
                    let rows = client.query(&plain, &[]).await.unwrap();
                    let facts: Vec<(String, String, i64, i64)> = rows
                        .iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                        .collect();
                    assert_eq!(facts.len() as u64, KEYS);
                })
            })
        });
        let store = PostgresDifferences::new(pool.clone())
            .with_table(&format!("{schema}.differences"))
            .unwrap();
        rt.block_on(store.migrate()).unwrap();
        let mut r = Reconciler::builder(store)
            .source("orders", source("orders"))
            .source("payments", source("payments"))
            .rule(rules().remove(0))
            .build()
            .unwrap();
        rt.block_on(r.run_once(SystemTime::now())).unwrap();
        group.bench_function("pass", |b| {
            b.iter(|| {
                let pass = rt.block_on(r.run_once(SystemTime::now())).unwrap();
                assert_eq!(pass.known, KEYS / 100);
            })
        });
        group.finish();
        rt.block_on(async {
            client
                .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
                .await
                .unwrap();
            client
                .execute(
                    "DELETE FROM surely_migrations WHERE target = $1",
                    &[&format!("{schema}.differences")],
                )
                .await
                .unwrap();
        });
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    memory(&mut c);
    #[cfg(feature = "postgres")]
    pg::postgres(&mut c);
    c.final_summary();
}
