//! Idempotency store throughput: what one record costs the server layer's store.
//!
//! Cases (`store/case`):
//!
//! * `memory/acquire_complete`: a new key each time (its `RecordKey` built inside the timed
//!   loop, as the layer builds it per request), `acquire` (the key is new: owner, fence 1), then
//!   `complete` with a small stored response. One iteration is one acquire + complete pair.
//!   The store keeps every record, so it grows to millions of records during the run, and
//!   the figure includes the map's growth and its cache misses.
//! * `memory_bounded/acquire_complete`: the same, with a fresh store every 65 536 keys, as for a
//!   store whose sweeper keeps it small (the old stores are dropped after the timing).
//! * `memory/replay`: `acquire` of a completed key: the replay lookup of a duplicate.
//! * `postgres/acquire_complete`, `postgres/replay`: the same on PostgreSQL over loopback, when
//!   `SURELY_TEST_POSTGRES_URL` is set (a fresh table, dropped at the end).
//!
//! Everything runs on a current-thread tokio runtime, so the memory figures are one core's.
//! Criterion's estimate gives the mean time per operation (ops/s = 1 / mean); after it, a
//! separate pass times each operation on its own (100 000 for memory, 2 000 for PostgreSQL) and
//! prints p50 and p99 per operation, and ops/s over that pass.
//!
//! ```text
//! cargo bench --bench store -- --warm-up-time 1 --measurement-time 3
//! ```

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::Criterion;
use http::{HeaderMap, StatusCode};
use surely::idempotency::store::{
    Acquire, IdempotencyStore, MemoryStore, RecordKey, RequestDigest, StoredResponse,
};
use surely::idempotency::IdempotencyKey;
use tokio::runtime::Runtime;

const LEASE: Duration = Duration::from_secs(30);
const RETENTION: Duration = Duration::from_secs(3600);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn key(n: u64) -> RecordKey {
    let key = IdempotencyKey::new(format!("k-{n}")).expect("a valid key");
    RecordKey::new("tenant", "POST /orders", key)
}

fn response() -> StoredResponse {
    let mut headers = HeaderMap::new();
    headers.insert("location", "/orders/o-1".parse().expect("a header value"));
    StoredResponse::new(
        StatusCode::CREATED,
        &headers,
        Bytes::from_static(b"{\"id\":\"o-1\"}"),
    )
}

/// One acquire + complete of key `n`.
async fn acquire_complete<St: IdempotencyStore>(
    store: &St,
    n: u64,
    digest: &RequestDigest,
    res: &StoredResponse,
) {
    let key = key(n);
    match store.acquire(&key, digest, LEASE).await {
        Ok(Acquire::Owner(fence)) => {
            let done = store.complete(&key, fence, res, RETENTION).await;
            assert!(done.is_ok(), "complete failed: {done:?}");
        }
        other => panic!("not the owner of a new key: {other:?}"),
    }
}

async fn replay<St: IdempotencyStore>(store: &St, key: &RecordKey, digest: &RequestDigest) {
    match store.acquire(key, digest, LEASE).await {
        Ok(Acquire::Completed(r)) => assert_eq!(r.status(), StatusCode::CREATED),
        other => panic!("not a replay: {other:?}"),
    }
}

/// Per-operation latencies over `n` operations: (ops/s, p50, p99).
fn percentiles(mut samples: Vec<Duration>, total: Duration) -> (f64, Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (
        samples.len() as f64 / total.as_secs_f64(),
        at(0.50),
        at(0.99),
    )
}

fn report(name: &str, (ops, p50, p99): (f64, Duration, Duration)) {
    println!("{name:<28} {ops:>12.0} ops/s   p50 {p50:>10.2?}   p99 {p99:>10.2?}");
}

/// Times each of `n` operations of `op(i)`.
fn per_op<St: IdempotencyStore>(
    rt: &Runtime,
    store: &St,
    n: u64,
    op: impl AsyncOp<St>,
) -> (f64, Duration, Duration) {
    rt.block_on(async {
        let mut samples = Vec::with_capacity(n as usize);
        let start = Instant::now();
        for i in 0..n {
            let t = Instant::now();
            op.run(store, i).await;
            samples.push(t.elapsed());
        }
        percentiles(samples, start.elapsed())
    })
}

/// An operation of the bench on a store (a trait, since async closures borrowing their
/// arguments are awkward to name).
trait AsyncOp<St> {
    async fn run(&self, store: &St, i: u64);
}

struct AcquireComplete {
    base: u64,
    digest: RequestDigest,
    res: StoredResponse,
}

impl<St: IdempotencyStore> AsyncOp<St> for AcquireComplete {
    async fn run(&self, store: &St, i: u64) {
        acquire_complete(store, self.base + i, &self.digest, &self.res).await
    }
}

struct Replay {
    key: RecordKey,
    digest: RequestDigest,
}

impl<St: IdempotencyStore> AsyncOp<St> for Replay {
    async fn run(&self, store: &St, _: u64) {
        replay(store, &self.key, &self.digest).await
    }
}

fn bench_store<St: IdempotencyStore>(
    c: &mut Criterion,
    rt: &Runtime,
    name: &str,
    store: &St,
    per_op_n: u64,
) {
    let digest = RequestDigest::of(b"{\"item\":\"book\",\"qty\":1}");
    let res = response();
    let mut next = 0u64;
    let mut group = c.benchmark_group(name);
    group.bench_function("acquire_complete", |b| {
        b.iter_custom(|iters| {
            let base = next;
            next += iters;
            rt.block_on(async {
                let start = Instant::now();
                for i in 0..iters {
                    acquire_complete(store, base + i, &digest, &res).await;
                }
                start.elapsed()
            })
        })
    });
    let done = key(u64::MAX);
    rt.block_on(acquire_complete(store, u64::MAX, &digest, &res));
    group.bench_function("replay", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    replay(store, &done, &digest).await;
                }
                start.elapsed()
            })
        })
    });
    group.finish();

    let base = next;
    let pair = AcquireComplete {
        base,
        digest,
        res: res.clone(),
    };
    report(
        &format!("{name}/acquire_complete"),
        per_op(rt, store, per_op_n, pair),
    );
    let again = Replay { key: done, digest };
    report(
        &format!("{name}/replay"),
        per_op(rt, store, per_op_n, again),
    );
}

fn main() {
    let rt = runtime();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();

    let memory = MemoryStore::new();
    bench_store(&mut c, &rt, "memory", &memory, 100_000);
    println!("memory store: {} records after the bench", memory.len());
    drop(memory);
    bench_bounded(&mut c, &rt);

    postgres(&mut c, &rt);
    c.final_summary();
}

/// Acquire + complete on stores that never hold more than 65 536 records.
fn bench_bounded(c: &mut Criterion, rt: &Runtime) {
    const BOUND: u64 = 1 << 16;
    let digest = RequestDigest::of(b"{\"item\":\"book\",\"qty\":1}");
    let res = response();
    let mut group = c.benchmark_group("memory_bounded");
    group.bench_function("acquire_complete", |b| {
        b.iter_custom(|iters| {
            let mut stores = vec![MemoryStore::new()];
            let elapsed = rt.block_on(async {
                let start = Instant::now();
                for i in 0..iters {
                    if i % BOUND == BOUND - 1 {
                        stores.push(MemoryStore::new());
                    }
                    let store = stores.last().expect("a store");
                    acquire_complete(store, i, &digest, &res).await;
                }
                start.elapsed()
            });
            drop(stores);
            elapsed
        })
    });
    group.finish();
    let mut stores = vec![MemoryStore::new()];
    let (ops, p50, p99) = rt.block_on(async {
        let n = 200_000u64;
        let mut samples = Vec::with_capacity(n as usize);
        let start = Instant::now();
        for i in 0..n {
            if i % BOUND == BOUND - 1 {
                stores.push(MemoryStore::new());
            }
            let store = stores.last().expect("a store");
            let t = Instant::now();
            acquire_complete(store, i, &digest, &res).await;
            samples.push(t.elapsed());
        }
        percentiles(samples, start.elapsed())
    });
    report("memory_bounded/acquire_complete", (ops, p50, p99));
}

#[cfg(feature = "postgres")]
fn postgres(c: &mut Criterion, rt: &Runtime) {
    use surely::idempotency::store::PostgresStore;

    let Ok(url) = std::env::var("SURELY_TEST_POSTGRES_URL") else {
        println!("postgres: skipped (SURELY_TEST_POSTGRES_URL is not set)");
        return;
    };
    let table = format!("surely_idem_bench_{}", std::process::id());
    let store = PostgresStore::connect(&url)
        .and_then(|s| {
            s.with_table(&table)
                .map_err(surely::idempotency::store::StoreError::backend)
        })
        .expect("a store");
    rt.block_on(store.migrate()).expect("migrate");
    bench_store(c, rt, "postgres", &store, 2_000);
    rt.block_on(async {
        let client = store.pool().get().await.expect("a connection");
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
            .await
            .expect("drop the bench table");
    });
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &mut Criterion, _: &Runtime) {
    println!("postgres: skipped (built without the `postgres` feature)");
}
