//! What the intent journal costs a call on PostgreSQL, against the same calls not journaled
//! and a bare insert, in the same run.
//!
//! The client is `surely::client()` with a `LedgerRecorder` over a `PostgresLedger` as its
//! recorder; `journaled` adds `.journal(recorder)`, `plain` does not. Two inner service shapes:
//!
//! * `ready`: the transport answers at once (the journal's cost alone shows);
//! * `order`: the transport writes the order itself: one `INSERT` into an orders table of the
//!   bench's own, on a pool of its own, committed (a call that is a database write, as the
//!   order service's is).
//!
//! And the baseline `bare`: one `INSERT` of the same shape on that pool, without any client.
//!
//! Each case runs rounds of 1 600 successful `POST /orders` calls from 16 tasks at once (and a
//! round of 200 from one task, `c1`), alternating the order of the cases from round to round.
//! Criterion's estimate is a round's wall time ÷ its calls. After criterion, the summary prints
//! the medians (calls/s), the ratios `journaled ÷ plain` per shape and `journaled(ready) ÷
//! bare`, the intents each journaled call wrote and forgot (the recorder's counts: one and
//! one, the forgetting in batches), and the WAL bytes per call of each case, one round alone
//! between two readings of `pg_current_wal_insert_lsn()`.
//!
//! The database is `SURELY_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); if it does not answer the bench says so and
//! exits with status 1. Its tables are fresh and dropped at the end. A run takes about 40 s.
//!
//! ```text
//! cargo bench --all-features --bench journal_postgres
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use http::{Request, Response};
use surely::ledger::{Ledger, LedgerRecorder, PostgresLedger};
use surely::postgres::Pool;
use tower::{Service, ServiceExt};

const VAR: &str = "SURELY_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const ROUNDS: usize = 10;
const TASKS: usize = 16;
const PER_ROUND: usize = 1_600;
const PER_ROUND_C1: usize = 200;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    Bare,
    Plain(Shape),
    Journaled(Shape),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shape {
    Ready,
    Order,
}

impl Case {
    fn name(self) -> String {
        match self {
            Case::Bare => "bare insert".to_owned(),
            Case::Plain(s) => format!("plain {}", s.name()),
            Case::Journaled(s) => format!("journaled {}", s.name()),
        }
    }
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Ready => "ready",
            Shape::Order => "order",
        }
    }
}

const CASES: [Case; 5] = [
    Case::Bare,
    Case::Plain(Shape::Ready),
    Case::Journaled(Shape::Ready),
    Case::Plain(Shape::Order),
    Case::Journaled(Shape::Order),
];

struct World {
    orders: Pool,
    table: String,
    ledger: PostgresLedger,
    recorder: LedgerRecorder,
    next: std::sync::atomic::AtomicU64,
}

impl World {
    fn id(&self) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("o-{n}")
    }

    async fn insert(&self, id: &str) -> Result<(), std::io::Error> {
        let client = self.orders.get().await.map_err(std::io::Error::other)?;
        let sql = format!("INSERT INTO {} (id) VALUES ($1)", self.table);
        let stmt = client
            .prepare_cached(&sql)
            .await
            .map_err(std::io::Error::other)?;
        client
            .execute(&stmt, &[&id])
            .await
            .map_err(std::io::Error::other)?;
        Ok(())
    }
}

/// One task's client for `case` (none for the bare insert).
type Client =
    tower::util::BoxService<Request<String>, Response<String>, surely::Error<std::io::Error>>;

fn client(world: &Arc<World>, case: Case) -> Option<Client> {
    let (shape, journaled) = match case {
        Case::Bare => return None,
        Case::Plain(s) => (s, false),
        Case::Journaled(s) => (s, true),
    };
    let w = world.clone();
    let transport = tower::service_fn(move |req: Request<String>| {
        let w = w.clone();
        async move {
            if shape == Shape::Order {
                w.insert(req.body()).await?;
            }
            Ok::<_, std::io::Error>(Response::new(String::new()))
        }
    });
    let builder = surely::client()
        .no_breaker()
        .recorder(world.recorder.clone());
    let builder = if journaled {
        builder.journal(world.recorder.clone())
    } else {
        builder
    };
    Some(tower::util::BoxService::new(
        builder.build(transport).unwrap(),
    ))
}

/// One round of `n` calls by `tasks` tasks; its wall time.
async fn round(world: &Arc<World>, case: Case, tasks: usize, n: usize) -> Duration {
    let left = Arc::new(std::sync::atomic::AtomicUsize::new(n));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let world = world.clone();
            let left = left.clone();
            tokio::spawn(async move {
                let mut client = client(&world, case);
                while left
                    .fetch_update(
                        std::sync::atomic::Ordering::Relaxed,
                        std::sync::atomic::Ordering::Relaxed,
                        |l| l.checked_sub(1),
                    )
                    .is_ok()
                {
                    let id = world.id();
                    match &mut client {
                        None => world.insert(&id).await.unwrap(),
                        Some(client) => {
                            let req = Request::post("/orders").body(id).unwrap();
                            client.ready().await.unwrap().call(req).await.unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let took = start.elapsed();
    // The forgetting is off the call's path; it is done before the next round.
    world.recorder.flush().await;
    took
}

/// The server's WAL insert position, in bytes.
async fn wal(pool: &Pool) -> i64 {
    let client = pool.get().await.unwrap();
    let row = client
        .query_one(
            "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let url = std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pid = std::process::id();
    let table = format!("surely_bench_journal_orders_{pid}");
    let ledger_table = format!("surely_bench_journal_ledger_{pid}");
    let world = rt.block_on(async {
        let orders = surely::postgres::connect(&url).unwrap();
        let ledger_pool = surely::postgres::connect(&url).unwrap();
        let client = match orders.get().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("journal_postgres: PostgreSQL at {url} did not answer: {e}");
                std::process::exit(1);
            }
        };
        client
            .batch_execute(&format!("CREATE TABLE {table} (id text PRIMARY KEY)"))
            .await
            .unwrap();
        let ledger = PostgresLedger::new(ledger_pool)
            .with_table(&ledger_table)
            .unwrap();
        ledger.migrate().await.unwrap();
        let recorder = LedgerRecorder::new(ledger.clone());
        Arc::new(World {
            orders,
            table: table.clone(),
            ledger,
            recorder,
            next: std::sync::atomic::AtomicU64::new(0),
        })
    });

    let mut times: Vec<(String, Vec<f64>)> = CASES.iter().map(|c| (c.name(), Vec::new())).collect();
    let mut c1: Vec<(String, Vec<f64>)> = CASES.iter().map(|c| (c.name(), Vec::new())).collect();
    let mut criterion = Criterion::default()
        .sample_size(ROUNDS)
        .without_plots()
        .configure_from_args();
    {
        let mut group = criterion.benchmark_group("journal_postgres");
        group.sampling_mode(SamplingMode::Flat);
        group.sample_size(ROUNDS);
        group.measurement_time(Duration::from_secs(1));
        group.warm_up_time(Duration::from_millis(200));
        let mut turn = 0usize;
        group.bench_function("c16", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    turn += 1;
                    // Every case once, in an order that turns with the round.
                    for k in 0..CASES.len() {
                        let i = (k + turn) % CASES.len();
                        let took = rt.block_on(round(&world, CASES[i], TASKS, PER_ROUND));
                        times[i].1.push(PER_ROUND as f64 / took.as_secs_f64());
                        if CASES[i] == Case::Journaled(Shape::Order) {
                            total += took / PER_ROUND as u32;
                        }
                    }
                }
                total
            })
        });
        group.bench_function("c1", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    turn += 1;
                    for k in 0..CASES.len() {
                        let i = (k + turn) % CASES.len();
                        let took = rt.block_on(round(&world, CASES[i], 1, PER_ROUND_C1));
                        c1[i].1.push(PER_ROUND_C1 as f64 / took.as_secs_f64());
                        if CASES[i] == Case::Journaled(Shape::Order) {
                            total += took / PER_ROUND_C1 as u32;
                        }
                    }
                }
                total
            })
        });
        group.finish();
    }

    // What a call writes: one round of each case alone, between two readings of the WAL
    // position, and the recorder's counts of intents written and forgotten.
    let writes = rt.block_on(async {
        let pool = world.ledger.pool().clone();
        let mut wal_per_call = Vec::new();
        for case in CASES {
            let before = wal(&pool).await;
            round(&world, case, TASKS, PER_ROUND).await;
            let after = wal(&pool).await;
            wal_per_call.push((case.name(), (after - before) as f64 / PER_ROUND as f64));
        }
        let before = world.recorder.writes();
        round(&world, Case::Journaled(Shape::Order), TASKS, PER_ROUND).await;
        let after = world.recorder.writes();
        let left = world.ledger.stats().await.unwrap();
        (
            (after.intents - before.intents) as f64 / PER_ROUND as f64,
            (after.forgotten - before.forgotten) as f64 / PER_ROUND as f64,
            left.unsettled(),
            wal_per_call,
        )
    });

    println!();
    println!("journal_postgres: calls/s, median over {ROUNDS} rounds [min, max]");
    for (label, set) in [("16 tasks", &times), ("1 task", &c1)] {
        let medians: Vec<f64> = set.iter().map(|(_, v)| median(v.clone()).0).collect();
        for (name, v) in set.iter() {
            let (m, lo, hi) = median(v.clone());
            println!("  {label:>8}  {name:<16} {m:>9.0}  [{lo:.0}, {hi:.0}]");
        }
        let time = |i: usize| 1.0 / medians[i];
        println!(
            "  {label:>8}  journaled ÷ plain (time per call): ready {:.2}, order {:.2}; journaled ready ÷ bare insert {:.2}",
            time(2) / time(1),
            time(4) / time(3),
            time(2) / time(0),
        );
    }
    println!(
        "  per journaled call: {:.3} intents written, {:.3} forgotten; unsettled left {}",
        writes.0, writes.1, writes.2
    );
    let wal_line: Vec<String> = writes
        .3
        .iter()
        .map(|(name, b)| format!("{name} {b:.0}"))
        .collect();
    println!("  WAL bytes per call (16 tasks): {}", wal_line.join(", "));

    rt.block_on(async {
        let client = world.orders.get().await.unwrap();
        let _ = client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {ledger_table}_attempts;
                 DROP TABLE IF EXISTS {ledger_table};
                 DELETE FROM surely_migrations WHERE target = '{ledger_table}'"
            ))
            .await;
    });
    criterion.final_summary();
}
