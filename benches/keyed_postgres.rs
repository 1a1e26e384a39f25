//! A keyed request on PostgreSQL, as a user sees it: over HTTP, through the server's
//! `IdempotencyLayer`, beside the same handler without the layer, in the same run.
//!
//! Two hyper HTTP/1 servers on 127.0.0.1 (`TCP_NODELAY` on, as axum's `serve` sets it) answer
//! `POST /orders` with one handler: it takes a connection from a deadpool pool, opens a
//! transaction, inserts one row (the order id is the request's body) into an orders table of the
//! bench's own (its statement prepared once per connection, `prepare_cached`), commits and
//! answers 201 with `{"id":"…"}`.
//!
//! * `bare`: the handler alone, on a pool of its own (16 connections, as the store's).
//! * `keyed`: the handler behind `IdempotencyLayer::builder(store).build()` on a
//!   `PostgresStore`, each request with a new `Idempotency-Key`; the handler uses
//!   `store.pool()` and completes the record inside its transaction with
//!   `store.complete_in(&txn, &ticket, &StoredResponse::new(201, &HeaderMap::new(), body))`,
//!   the `Ticket` taken from the request's extensions.
//! * `replay`: the keyed requests of the round sent again, each key already completed: the
//!   layer answers from the record (`idempotent-replayed: true`) and the handler does not run.
//! * `keyed_tx`, `replay_tx`: the same with `IdempotencyLayer::builder(store).in_transaction()`:
//!   the layer claims the key in a transaction, the handler inserts its order through the
//!   `KeyedTransaction` in the request's extensions, the layer stores the answer and commits.
//! * `floor`: no layer; the bare handler that also inserts, in its transaction, the row a
//!   completed record is (into a copy of the records table, its indexes included): what any
//!   store that keeps its record in the handler's transaction must at least write.
//! * `read`: no layer; a handler that reads one order by its id (one prepared `SELECT`, no
//!   transaction): what any replay that asks the database must at least do.
//!
//! The client is hyper-util's legacy `Client` (keep-alive), its tasks on the same tokio runtime
//! as the servers (multi-thread, 2 workers). Criterion's cases, one round per sample, in one
//! group `keyed_postgres`, sampled flat (10 samples, every round the same size N):
//!
//! * `c16`: 16 tasks, each sending requests in a loop until the round's N are sent, for each of
//!   `bare`, `keyed` and `replay` in turn (the order alternates with the round: bare, keyed,
//!   replay, then keyed, replay, bare), so that the database's drift falls on both sides.
//!   Criterion's estimate is the keyed phase's wall time ÷ N (1 ÷ requests per second).
//!   Around each phase the bench reads `pg_current_wal_insert_lsn()` (every WAL record
//!   inserted, committed or not) and, if `pg_stat_statements` answers, the statements run in
//!   the database. After the keyed phase, inside its WAL window but outside its time, a
//!   `SELECT count(*)` of the records table prunes the row versions its completions left
//!   dead: the first reader of each heap page does that and writes a `PRUNE` record (in no
//!   transaction) for it, which would otherwise fall on the replays (2 bytes a replay here).
//! * `c1`: one task, `bare` then `keyed` (alternating likewise), no replay.
//!
//! The summary after criterion's prints the median over the 10 rounds (the range in brackets)
//! of requests/s per case, the ratio keyed ÷ bare time per request (target ≤ 1.3 at 16 tasks;
//! shown at 1), replay ÷ bare write (target ≤ 0.5), and WAL bytes per request for each case
//! (target for a replay: 0). The WAL position is the server's: another session writing at the
//! same time adds its bytes, hence the minimum beside the median. Statements per request are
//! counted only where `pg_stat_statements` is loaded and created in the database (all
//! sessions' statements, approximately).
//!
//! The database is `SURELY_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); if it does not answer the bench says so and
//! exits with status 1. Its tables (orders, idempotency records) are fresh, named after the
//! process, and dropped at the end, their migration rows with them. A whole run takes about 30 s.
//!
//! ```text
//! cargo bench --all-features --bench keyed_postgres
//! ```

use std::convert::Infallible;
use std::fmt::Display;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Incoming};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use surely::headers::IDEMPOTENT_REPLAYED;
use surely::postgres::Pool;
use surely::server::idempotency::{IdempotencyLayer, Ticket};
use surely::server::store::{KeyedTransaction, PostgresStore, StoredResponse};
use tokio::net::TcpListener;
use tokio_postgres::types::PgLsn;
use tower::{Layer, Service};

const VAR: &str = "SURELY_TEST_POSTGRES_URL";
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Criterion's samples per case: the rounds the summary's medians are over.
const ROUNDS: usize = 10;
const KEYED_TARGET: f64 = 1.3;
const REPLAY_TARGET: f64 = 0.5;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let url = std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned());
    let bench = match rt.block_on(Bench::start(&url)) {
        Ok(bench) => bench,
        Err(e) => {
            eprintln!(
                "keyed_postgres: PostgreSQL at {url} (set {VAR} to use another) did not answer: {e}"
            );
            std::process::exit(1);
        }
    };
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    let mut c16 = Vec::new();
    let mut c1 = Vec::new();
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut group = c.benchmark_group("keyed_postgres");
        group
            .sample_size(ROUNDS)
            .sampling_mode(SamplingMode::Flat)
            .measurement_time(Duration::from_secs(16));
        group.bench_function("c16", |b| {
            b.iter_custom(|n| {
                let round = rt.block_on(bench.round(16, n, true, c16.len()));
                let keyed = round.took(Case::Keyed).unwrap_or_default();
                c16.push(round);
                keyed
            })
        });
        group.measurement_time(Duration::from_secs(8));
        group.bench_function("c1", |b| {
            b.iter_custom(|n| {
                let round = rt.block_on(bench.round(1, n, false, c1.len()));
                let keyed = round.took(Case::Keyed).unwrap_or_default();
                c1.push(round);
                keyed
            })
        });
        group.finish();
        rt.block_on(bench.check())
    }));
    rt.block_on(bench.drop_tables());
    let checked = match run {
        Ok(checked) => checked,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    c.final_summary();
    summary(&c16, &c1, &checked);
}

/// The servers, the client and the tables of one run.
struct Bench {
    client: HttpClient,
    bare: Uri,
    keyed: Uri,
    keyed_tx: Uri,
    floor: Uri,
    read: Uri,
    /// The copy of the records table the floor writes to.
    floor_records: String,
    /// A pool of its own for the bench's reads (WAL position, counts, the tables).
    meta: Pool,
    orders: String,
    records: String,
    /// Whether `pg_stat_statements` answers.
    statements: bool,
    /// The next order number: every request's order id is new.
    next: AtomicU64,
    /// Requests that wrote an order, and the keyed ones among them.
    written: AtomicU64,
    keyed_written: AtomicU64,
}

/// One round of a case: N requests of each kind, their wall times, and what the database
/// counted around each phase (indexed by [`Case`]).
struct Round {
    n: u64,
    took: [Option<Duration>; CASES],
    wal: [Option<u64>; CASES],
    statements: [Option<i64>; CASES],
    /// CPU time, in ns, of this process (client, servers, layer) and of PostgreSQL's.
    cpu: [Option<(u64, u64)>; CASES],
}

impl Round {
    fn took(&self, case: Case) -> Option<Duration> {
        self.took[case as usize]
    }

    /// The time per request of `case` ÷ the bare write's.
    fn ratio(&self, case: Case) -> Option<f64> {
        Some(self.took(case)?.as_secs_f64() / self.took(Case::Bare)?.as_secs_f64())
    }
}

const CASES: usize = 7;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    Bare,
    /// The default mode: the record acquired before the handler, completed in its transaction.
    Keyed,
    Replay,
    /// `in_transaction()`: the key claimed in the handler's transaction.
    KeyedTx,
    ReplayTx,
    /// No layer: the bare handler that also inserts, in its transaction, the row a completed
    /// record is (in a copy of the records table, its indexes included): the floor under any
    /// store that keeps its record in the handler's transaction.
    Floor,
    /// No layer: a handler that reads one order by its id (one prepared `SELECT`, no
    /// transaction): the floor under any replay that asks the database.
    Read,
}

impl Case {
    const ALL: [Case; CASES] = [
        Case::Bare,
        Case::Keyed,
        Case::Replay,
        Case::KeyedTx,
        Case::ReplayTx,
        Case::Floor,
        Case::Read,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::Bare => "bare",
            Case::Keyed => "keyed",
            Case::Replay => "replay",
            Case::KeyedTx => "keyed_tx",
            Case::ReplayTx => "replay_tx",
            Case::Floor => "floor",
            Case::Read => "read",
        }
    }

    fn is_replay(self) -> bool {
        matches!(self, Case::Replay | Case::ReplayTx)
    }
}

impl Bench {
    async fn start(url: &str) -> Result<Self, String> {
        let meta = surely::postgres::connect(url).map_err(|e| e.to_string())?;
        let probe = async {
            let client = meta.get().await.map_err(|e| with_sources(&e))?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| with_sources(&e))
        };
        tokio::time::timeout(Duration::from_secs(10), probe)
            .await
            .map_err(|_| "no answer in 10 s".to_owned())??;

        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let suffix = format!("{}_{nanos}", std::process::id());
        let orders = format!("surely_bench_orders_{suffix}");
        let records = format!("surely_bench_idem_{suffix}");
        let floor_records = format!("surely_bench_floor_{suffix}");
        let store = PostgresStore::connect(url)
            .map_err(|e| e.to_string())?
            .with_table(&records)
            .map_err(|e| e.to_string())?;
        let client = meta.get().await.map_err(|e| e.to_string())?;
        client
            .batch_execute(&format!("CREATE TABLE {orders} (id text PRIMARY KEY)"))
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        client
            .batch_execute(&format!(
                "CREATE TABLE {floor_records} (LIKE {records} INCLUDING ALL)"
            ))
            .await
            .map_err(|e| e.to_string())?;
        let statements = client
            .query_one(STATEMENTS, &[])
            .await
            .map(|row| row.try_get::<_, Option<i64>>(0).is_ok())
            .unwrap_or(false);
        drop(client);

        let insert: Arc<str> = format!("INSERT INTO {orders} (id) VALUES ($1)").into();
        let bare = Orders {
            pool: surely::postgres::connect(url).map_err(|e| e.to_string())?,
            insert: insert.clone(),
            store: None,
        };
        let keyed = Orders {
            pool: store.pool().clone(),
            insert: insert.clone(),
            store: Some(store.clone()),
        };
        let keyed_tx = OrdersInTransaction {
            insert: insert.clone(),
        };
        let floor = Floor {
            pool: surely::postgres::connect(url).map_err(|e| e.to_string())?,
            insert,
            record: format!(
                "INSERT INTO {floor_records} (tenant, operation, key, fence, status, header_names,
                     header_values, body, expires_at, resource, result_code, body_flags, digest,
                     state, acquired_at)
                 VALUES ('', 'POST /orders', $1, 1, 201, $2, $3, $4,
                     now() + make_interval(secs => 86400), NULL, NULL, 0, $5, 1, now())"
            )
            .into(),
        };
        let floor = serve(tower::service_fn(move |req: Request<Incoming>| {
            floor.clone().create(req)
        }))
        .await;
        let read = ReadOrder {
            pool: surely::postgres::connect(url).map_err(|e| e.to_string())?,
            select: format!("SELECT id FROM {orders} WHERE id = $1").into(),
        };
        let read = serve(tower::service_fn(move |req: Request<Incoming>| {
            read.clone().create(req)
        }))
        .await;
        let bare = serve(tower::service_fn(move |req: Request<Incoming>| {
            bare.clone().create(req)
        }))
        .await;
        let tx_layer = IdempotencyLayer::builder(store.clone())
            .in_transaction()
            .build()
            .map_err(|e| e.to_string())?;
        let keyed_tx = serve(tx_layer.layer(tower::service_fn(
            move |req: Request<Full<Bytes>>| keyed_tx.clone().create(req),
        )))
        .await;
        let layer = IdempotencyLayer::builder(store)
            .build()
            .map_err(|e| e.to_string())?;
        let keyed = serve(
            layer.layer(tower::service_fn(move |req: Request<Full<Bytes>>| {
                keyed.clone().create(req)
            })),
        )
        .await;

        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let uri = |addr: SocketAddr| {
            format!("http://{addr}/orders")
                .parse::<Uri>()
                .expect("a URI")
        };
        Ok(Bench {
            client: Client::builder(TokioExecutor::new()).build(connector),
            bare: uri(bare),
            keyed: uri(keyed),
            keyed_tx: uri(keyed_tx),
            floor: uri(floor),
            read: uri(read),
            floor_records,
            meta,
            orders,
            records,
            statements,
            next: AtomicU64::new(0),
            written: AtomicU64::new(0),
            keyed_written: AtomicU64::new(0),
        })
    }

    /// One round: `n` bare requests, `n` keyed ones in each mode (and, with `replay`, the keyed
    /// ones again), from `tasks` tasks; the order alternates with `index` (a replay always
    /// after its keyed phase).
    async fn round(&self, tasks: usize, n: u64, replay: bool, index: usize) -> Round {
        let first = self.next.fetch_add(n, Ordering::Relaxed);
        let mut round = Round {
            n,
            took: [None; CASES],
            wal: [None; CASES],
            statements: [None; CASES],
            cpu: [None; CASES],
        };
        let cases: &[Case] = match (replay, index % 2) {
            (true, 0) => &[
                Case::Bare,
                Case::Read,
                Case::Keyed,
                Case::Replay,
                Case::Floor,
                Case::KeyedTx,
                Case::ReplayTx,
            ],
            (true, _) => &[
                Case::KeyedTx,
                Case::ReplayTx,
                Case::Floor,
                Case::Keyed,
                Case::Replay,
                Case::Bare,
                Case::Read,
            ],
            (false, 0) => &[Case::Bare, Case::Keyed, Case::Floor, Case::KeyedTx],
            (false, _) => &[Case::KeyedTx, Case::Floor, Case::Keyed, Case::Bare],
        };
        for &case in cases {
            let before = self.probe(replay).await;
            let cpu_before = cpu();
            let took = self.drive(case, first, n, tasks).await;
            let cpu_after = cpu();
            if replay && matches!(case, Case::Keyed | Case::KeyedTx) {
                self.prune().await;
            }
            let after = self.probe(replay).await;
            let i = case as usize;
            if let (Some(before), Some(after)) = (before, after) {
                round.wal[i] = Some(after.0.saturating_sub(before.0));
                round.statements[i] = before.1.zip(after.1).map(|(b, a)| a - b - 1);
            }
            round.took[i] = Some(took);
            if let (Some(b), Some(a)) = (cpu_before, cpu_after) {
                round.cpu[i] = Some((a.0.saturating_sub(b.0), a.1.saturating_sub(b.1)));
            }
        }
        self.written.fetch_add(4 * n, Ordering::Relaxed);
        self.keyed_written.fetch_add(2 * n, Ordering::Relaxed);
        round
    }

    /// The server's WAL insert position, and the statements run in the database so far.
    async fn probe(&self, on: bool) -> Option<(u64, Option<i64>)> {
        if !on {
            return None;
        }
        let client = self
            .meta
            .get()
            .await
            .expect("a connection for the bench's reads");
        let row = client
            .query_one("SELECT pg_current_wal_insert_lsn()", &[])
            .await
            .expect("the WAL position");
        let lsn: PgLsn = row.get(0);
        let statements = if self.statements {
            let row = client
                .query_one(STATEMENTS, &[])
                .await
                .expect("pg_stat_statements");
            row.get::<_, Option<i64>>(0)
        } else {
            None
        };
        Some((u64::from(lsn), statements))
    }

    /// Reads the records table through, outside the timing: the first reader of a heap page
    /// prunes the row versions that the completions left dead, and writes WAL for it (a
    /// `PRUNE` record per page, in no transaction). Done here, that WAL counts as the keyed
    /// writes' (it is theirs), not as the replays' that would otherwise read those pages first.
    async fn prune(&self) {
        let client = self
            .meta
            .get()
            .await
            .expect("a connection for the bench's reads");
        client
            .simple_query(&format!("SELECT count(*) FROM {}", self.records))
            .await
            .expect("a read of the records");
    }

    /// Sends requests `first..first + n` of `case` from `tasks` tasks; the wall time.
    async fn drive(&self, case: Case, first: u64, n: u64, tasks: usize) -> Duration {
        let next = Arc::new(AtomicU64::new(0));
        let uri = match case {
            Case::Bare => self.bare.clone(),
            Case::Keyed | Case::Replay => self.keyed.clone(),
            Case::KeyedTx | Case::ReplayTx => self.keyed_tx.clone(),
            Case::Floor => self.floor.clone(),
            Case::Read => self.read.clone(),
        };
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..tasks {
            let (client, uri, next) = (self.client.clone(), uri.clone(), next.clone());
            set.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    send(&client, &uri, case, first + i).await;
                }
            });
        }
        while let Some(done) = set.join_next().await {
            done.expect("a client task");
        }
        start.elapsed()
    }

    /// The orders and the records the run left: one order per bare and first keyed request
    /// (none per replay), one record per key.
    async fn check(&self) -> String {
        let client = self.meta.get().await.expect("a connection");
        let count = |table: &str| format!("SELECT count(*) FROM {table}");
        let orders: i64 = client
            .query_one(&count(&self.orders), &[])
            .await
            .expect("the orders")
            .get(0);
        let records: i64 = client
            .query_one(&count(&self.records), &[])
            .await
            .expect("the records")
            .get(0);
        let written = self.written.load(Ordering::Relaxed) as i64;
        let keyed = self.keyed_written.load(Ordering::Relaxed) as i64;
        assert_eq!(
            orders, written,
            "one order per first request, none per replay"
        );
        assert_eq!(records, keyed, "one record per key");
        format!("checked: {orders} orders for {written} first requests, {records} records for {keyed} keys")
    }

    async fn drop_tables(&self) {
        let client = self.meta.get().await.expect("a connection");
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {}; DROP TABLE IF EXISTS {}; DROP TABLE IF EXISTS {};
                 DROP FUNCTION IF EXISTS {}_acquire;",
                self.orders, self.records, self.floor_records, self.records
            ))
            .await
            .expect("drop the bench's tables");
        client
            .execute(
                "DELETE FROM surely_migrations WHERE target = $1",
                &[&self.records],
            )
            .await
            .expect("forget the bench's migrations");
    }
}

/// CPU time so far, in ns (from `/proc/*/schedstat`, Linux): this process's threads, and every
/// process named `postgres` (the server's backends, its WAL and background writers) on a
/// server on this machine. `None` where `/proc` does not tell.
fn cpu() -> Option<(u64, u64)> {
    let on_cpu = |path: std::path::PathBuf| -> Option<u64> {
        std::fs::read_to_string(path)
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let mut own = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        // A thread that ended between the listing and the read counts nothing.
        own += on_cpu(task.ok()?.path().join("schedstat")).unwrap_or(0);
    }
    let mut postgres = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let path = entry.path();
        let is_postgres = std::fs::read_to_string(path.join("comm"))
            .is_ok_and(|comm| comm.trim_end() == "postgres");
        if is_postgres {
            postgres += on_cpu(path.join("schedstat")).unwrap_or(0);
        }
    }
    Some((own, postgres))
}

/// The statements run in this database so far, by every session.
const STATEMENTS: &str = "SELECT sum(calls)::int8 FROM pg_stat_statements
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())";

/// Sends order `n` of `case`, and checks the answer: 201, replayed only for a replay.
async fn send(client: &HttpClient, uri: &Uri, case: Case, n: u64) {
    let id = match case {
        Case::Bare => format!("b-{n}"),
        Case::Keyed | Case::Replay => format!("k-{n}"),
        Case::KeyedTx | Case::ReplayTx => format!("t-{n}"),
        Case::Floor => format!("f-{n}"),
        // The bare write's order of the same number, written earlier in the round.
        Case::Read => format!("b-{n}"),
    };
    let mut req = Request::post(uri.clone());
    if !matches!(case, Case::Bare | Case::Floor | Case::Read) {
        req = req.header("idempotency-key", id.as_str());
    }
    let req = req.body(Full::new(Bytes::from(id))).expect("a request");
    let res = client
        .request(req)
        .await
        .unwrap_or_else(|e| panic!("order {n}: the server did not answer: {e}"));
    let status = res.status();
    let replayed = res
        .headers()
        .get(IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v == "true");
    let body = res
        .into_body()
        .collect()
        .await
        .expect("the response's body")
        .to_bytes();
    let expected = if case == Case::Read {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    assert!(
        status == expected && replayed == case.is_replay(),
        "order {n}: {status}, replayed: {replayed}, {body:?}"
    );
}

/// The handler: one order in one transaction, the idempotency record completed in it when the
/// layer is in front (`store`).
#[derive(Clone)]
struct Orders {
    pool: Pool,
    insert: Arc<str>,
    store: Option<PostgresStore>,
}

impl Orders {
    async fn create<B>(self, req: Request<B>) -> Result<Response<Full<Bytes>>, Infallible>
    where
        B: Body + Send,
        B::Data: Send,
        B::Error: Display,
    {
        Ok(answer(StatusCode::CREATED, self.write(req).await))
    }

    async fn write<B>(&self, req: Request<B>) -> Result<Bytes, String>
    where
        B: Body + Send,
        B::Data: Send,
        B::Error: Display,
    {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.map_err(failed("the body"))?.to_bytes();
        let id = std::str::from_utf8(&body).map_err(failed("the order id"))?;
        let mut client = self.pool.get().await.map_err(failed("a connection"))?;
        let txn = client.transaction().await.map_err(failed("BEGIN"))?;
        let insert = txn
            .prepare_cached(&self.insert)
            .await
            .map_err(failed("PREPARE"))?;
        txn.execute(&insert, &[&id])
            .await
            .map_err(failed("INSERT"))?;
        let reply = Bytes::from(format!("{{\"id\":\"{id}\"}}"));
        if let Some(store) = &self.store {
            let ticket = parts
                .extensions
                .get::<Ticket>()
                .ok_or("no ticket in the request's extensions")?;
            let stored = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), reply.clone());
            store
                .complete_in(&txn, ticket, &stored)
                .await
                .map_err(failed("complete_in"))?;
        }
        txn.commit().await.map_err(failed("COMMIT"))?;
        Ok(reply)
    }
}

/// The handler behind `in_transaction()`: one order, written in the transaction the layer
/// opened; the layer stores the answer and commits.
#[derive(Clone)]
struct OrdersInTransaction {
    insert: Arc<str>,
}

impl OrdersInTransaction {
    async fn create(self, req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
        Ok(answer(StatusCode::CREATED, self.write(req).await))
    }

    async fn write(&self, req: Request<Full<Bytes>>) -> Result<Bytes, String> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.map_err(failed("the body"))?.to_bytes();
        let id = std::str::from_utf8(&body).map_err(failed("the order id"))?;
        let txn = parts
            .extensions
            .get::<KeyedTransaction>()
            .ok_or("no transaction in the request's extensions")?;
        let client = txn.client().await.map_err(failed("the transaction"))?;
        let insert = client
            .prepare_cached(&self.insert)
            .await
            .map_err(failed("PREPARE"))?;
        client
            .execute(&insert, &[&id])
            .await
            .map_err(failed("INSERT"))?;
        Ok(Bytes::from(format!("{{\"id\":\"{id}\"}}")))
    }
}

/// The floor: the bare handler that also writes, in its transaction, the row of a completed
/// record (the values the layer would store for its answer).
#[derive(Clone)]
struct Floor {
    pool: Pool,
    insert: Arc<str>,
    record: Arc<str>,
}

impl Floor {
    async fn create(self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        Ok(answer(StatusCode::CREATED, self.write(req).await))
    }

    async fn write(&self, req: Request<Incoming>) -> Result<Bytes, String> {
        let body = req
            .into_body()
            .collect()
            .await
            .map_err(failed("the body"))?
            .to_bytes();
        let id = std::str::from_utf8(&body).map_err(failed("the order id"))?;
        let reply = Bytes::from(format!("{{\"id\":\"{id}\"}}"));
        let mut client = self.pool.get().await.map_err(failed("a connection"))?;
        let txn = client.transaction().await.map_err(failed("BEGIN"))?;
        let insert = txn
            .prepare_cached(&self.insert)
            .await
            .map_err(failed("PREPARE"))?;
        txn.execute(&insert, &[&id])
            .await
            .map_err(failed("INSERT"))?;
        let record = txn
            .prepare_cached(&self.record)
            .await
            .map_err(failed("PREPARE"))?;
        let (names, values): (Vec<&str>, Vec<&[u8]>) = (Vec::new(), Vec::new());
        let digest: &[u8] = &[7u8; 32];
        let stored: &[u8] = &reply;
        txn.execute(&record, &[&id, &names, &values, &stored, &digest])
            .await
            .map_err(failed("INSERT record"))?;
        txn.commit().await.map_err(failed("COMMIT"))?;
        Ok(reply)
    }
}

/// The floor under a replay: one order read by its id, one prepared `SELECT` outside any
/// transaction.
#[derive(Clone)]
struct ReadOrder {
    pool: Pool,
    select: Arc<str>,
}

impl ReadOrder {
    async fn create(self, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
        Ok(answer(StatusCode::OK, self.read(req).await))
    }

    async fn read(&self, req: Request<Incoming>) -> Result<Bytes, String> {
        let body = req
            .into_body()
            .collect()
            .await
            .map_err(failed("the body"))?
            .to_bytes();
        let id = std::str::from_utf8(&body).map_err(failed("the order id"))?;
        let client = self.pool.get().await.map_err(failed("a connection"))?;
        let select = client
            .prepare_cached(&self.select)
            .await
            .map_err(failed("PREPARE"))?;
        let row = client
            .query_opt(&select, &[&id])
            .await
            .map_err(failed("SELECT"))?;
        let found: Option<String> = row.map(|r| r.get(0));
        Ok(Bytes::from(format!("{{\"id\":{found:?}}}")))
    }
}

/// A handler's answer: `ok` with the body, or a 500 saying what failed.
fn answer(ok: StatusCode, done: Result<Bytes, String>) -> Response<Full<Bytes>> {
    let (status, body) = match done {
        Ok(body) => (ok, body),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Bytes::from(e)),
    };
    let mut res = Response::new(Full::new(body));
    *res.status_mut() = status;
    res
}

/// `e` and the errors under it, `a: b: c` (a source its parent already quotes only once).
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.ends_with(&more) {
            text = format!("{text}: {more}");
        }
        source = e.source();
    }
    text
}

fn failed<E: Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Serves `svc` on 127.0.0.1 over HTTP/1 (keep-alive, `TCP_NODELAY`) until the runtime ends.
async fn serve<S>(svc: S) -> SocketAddr
where
    S: Service<Request<Incoming>, Response = Response<Full<Bytes>>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port on 127.0.0.1");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// The median of `values` and their range; NaN when there are none.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    match (values.first(), values.last()) {
        (Some(&min), Some(&max)) => (values[values.len() / 2], min, max),
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}

fn verdict(value: f64, target: f64) -> &'static str {
    if value <= target {
        "met"
    } else {
        "MISSED"
    }
}

/// The last `ROUNDS` rounds (criterion's samples; the ones before are its warm-up).
fn measured(rounds: &[Round]) -> &[Round] {
    &rounds[rounds.len().saturating_sub(ROUNDS)..]
}

fn summary(c16: &[Round], c1: &[Round], checked: &str) {
    let per_s = |d: Duration, n: u64| n as f64 / d.as_secs_f64();
    println!();
    println!(
        "a keyed POST through IdempotencyLayer on PostgreSQL over hyper, beside the bare handler"
    );
    let (c16, c1) = (measured(c16), measured(c1));
    let rate = |rounds: &[Round], case: Case| {
        spread(
            rounds
                .iter()
                .filter_map(|r| Some(per_s(r.took(case)?, r.n)))
                .collect(),
        )
    };
    let ratio = |rounds: &[Round], case: Case| {
        spread(rounds.iter().filter_map(|r| r.ratio(case)).collect())
    };
    if let Some(first) = c16.first() {
        println!(
            "16 tasks, {} rounds of {} requests per case; medians [range]:",
            c16.len(),
            first.n
        );
        for case in Case::ALL {
            let (median, min, max) = rate(c16, case);
            println!(
                "  {:<9} {median:>8.0} req/s [{min:.0}–{max:.0}]",
                case.name()
            );
        }
        for case in [
            Case::Floor,
            Case::Keyed,
            Case::KeyedTx,
            Case::Read,
            Case::Replay,
            Case::ReplayTx,
        ] {
            let target = if case.is_replay() {
                REPLAY_TARGET
            } else {
                KEYED_TARGET
            };
            let (median, min, max) = ratio(c16, case);
            let verdict = if matches!(case, Case::Floor | Case::Read) {
                "(no layer: a floor)".to_owned()
            } else {
                format!("(≤ {target:.2}) {}", verdict(median, target))
            };
            println!(
                "  ratio {:<9} ÷ bare write, time per request  {median:.2} [{min:.2}–{max:.2}] \
                 {verdict}",
                case.name(),
            );
        }
        let over_floor = |rounds: &[Round]| {
            spread(
                rounds
                    .iter()
                    .filter_map(|r| {
                        Some(
                            r.took(Case::KeyedTx)?.as_secs_f64()
                                / r.took(Case::Floor)?.as_secs_f64(),
                        )
                    })
                    .collect(),
            )
        };
        let (median, min, max) = over_floor(c16);
        let replay_over_read = spread(
            c16.iter()
                .filter_map(|r| {
                    Some(r.took(Case::Replay)?.as_secs_f64() / r.took(Case::Read)?.as_secs_f64())
                })
                .collect(),
        );
        println!(
            "  ratio replay    ÷ read, time per request        {:.2} [{:.2}–{:.2}]",
            replay_over_read.0, replay_over_read.1, replay_over_read.2
        );
        println!(
            "  ratio keyed_tx  ÷ floor, time per request       {median:.2} [{min:.2}–{max:.2}]"
        );
        // Per request, over the rounds that counted it.
        let per_request = |of: &dyn Fn(&Round) -> Option<f64>| {
            spread(
                c16.iter()
                    .filter_map(|r| Some(of(r)? / r.n as f64))
                    .collect(),
            )
        };
        for case in Case::ALL {
            let i = case as usize;
            let (median, min, max) = per_request(&|r| r.wal[i].map(|w| w as f64));
            let target = if case.is_replay() {
                format!(" (target 0) {}", verdict(median, 0.0))
            } else {
                String::new()
            };
            println!(
                "  WAL bytes per {:<9} request  {median:>8.0} [{min:.0}–{max:.0}]{target}",
                case.name()
            );
        }
        for case in Case::ALL {
            let i = case as usize;
            let (own, _, _) = per_request(&|r| r.cpu[i].map(|c| c.0 as f64 / 1e3));
            let (pg, _, _) = per_request(&|r| r.cpu[i].map(|c| c.1 as f64 / 1e3));
            if own.is_nan() {
                continue;
            }
            println!(
                "  CPU µs per {:<9} request: this process {own:>6.1}, PostgreSQL {pg:>6.1}, \
                 both {:>6.1}",
                case.name(),
                own + pg
            );
        }
        if c16.iter().all(|r| r.statements[0].is_none()) {
            println!(
                "  statements per request: not counted (pg_stat_statements is not loaded and \
                 created in this database)"
            );
        } else {
            for case in Case::ALL {
                let i = case as usize;
                let (median, min, max) = per_request(&|r| r.statements[i].map(|s| s as f64));
                println!(
                    "  statements per {:<9} request {median:>6.1} [{min:.1}–{max:.1}] \
                     (every session's)",
                    case.name()
                );
            }
        }
    }
    if let Some(first) = c1.first() {
        println!(
            "1 task, {} rounds of {} requests per case: bare {:.0} req/s, keyed {:.0} req/s, \
             keyed_tx {:.0} req/s",
            c1.len(),
            first.n,
            rate(c1, Case::Bare).0,
            rate(c1, Case::Keyed).0,
            rate(c1, Case::KeyedTx).0,
        );
        for case in [Case::Floor, Case::Keyed, Case::KeyedTx] {
            let (median, min, max) = ratio(c1, case);
            println!(
                "  ratio {:<9} ÷ bare {median:.2} [{min:.2}–{max:.2}] (shown)",
                case.name()
            );
        }
    }
    println!("{checked}");
}
