//! Idempotency store throughput: what one record costs the server layer's store.
//!
//! Cases (`store/case`):
//!
//! * `memory/acquire_complete`: a new key each time (its `RecordKey` built inside the timed
//!   loop, as the layer builds it per request), `acquire` (the key is new: owner, fence 1), then
//!   `complete` with a small stored response. One iteration is one acquire + complete pair.
//!   The store keeps every record (its capacity raised past the default million, which this
//!   run outgrows), so it grows to millions of records during the run, and the figure
//!   includes the map's growth and its cache misses.
//! * `memory_bounded/acquire_complete`: the same, with a fresh store every 65 536 keys, as for a
//!   store whose sweeper keeps it small (the old stores are dropped after the timing).
//! * `memory/replay`: `acquire` of a completed key: the replay lookup of a duplicate.
//! * `memory/acquire_complete_digest`: the same as `memory/acquire_complete`, with a 3 000-byte
//!   operation, which `RecordKey` keeps as a prefix and a SHA-256 digest (client input of any
//!   length never becomes a 5xx).
//! * `postgres/acquire_complete`, `postgres/replay`, `postgres/acquire_complete_digest`: the
//!   same on PostgreSQL over loopback, when `SURELY_TEST_POSTGRES_URL` is set (a fresh table,
//!   dropped at the end).
//! * `redis/acquire_complete`, `redis/replay`, `redis/acquire_complete_digest`: the same on
//!   Redis over loopback, when `SURELY_TEST_REDIS_URL` is set (built with the `redis` feature;
//!   a fresh key prefix, its keys deleted at the end).
//! * `memory_layer/…` (and `postgres_layer/…`, `redis_layer/…`): one keyed request through the whole
//!   `IdempotencyLayer`, in process (body read and hashed, acquire, handler, complete), the
//!   handler yielding once: `inline`, dropped with a caller that leaves
//!   (`cancel_with_caller()`); `default`, finished on a task of its own should the caller leave,
//!   here with the caller waiting; `caller_leaves`, the caller gone after the first poll, and the
//!   work spawned and run to its end. The summary prints the ratio default ÷ inline; the target
//!   is ≤ 1.2.
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
use surely::idempotency::IdempotencyKey;
use surely::server::store::{
    Acquire, IdempotencyStore, MemoryStore, RecordKey, RequestDigest, StoredResponse,
};
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

/// A 3 000-byte operation, kept as a prefix and a digest.
fn long_operation() -> String {
    let mut op = String::from("POST /search/");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    while op.len() < 3_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        op.push(char::from(b'a' + (x % 26) as u8));
    }
    op
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

/// One acquire + complete of key `n` (with a 3 000-byte operation when `long` is given).
async fn acquire_complete<St: IdempotencyStore>(
    store: &St,
    n: u64,
    digest: &RequestDigest,
    res: &StoredResponse,
) {
    acquire_complete_as(store, key(n), digest, res).await
}

async fn acquire_complete_as<St: IdempotencyStore>(
    store: &St,
    key: RecordKey,
    digest: &RequestDigest,
    res: &StoredResponse,
) {
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
    let long = long_operation();
    group.bench_function("acquire_complete_digest", |b| {
        b.iter_custom(|iters| {
            let base = next;
            next += iters;
            rt.block_on(async {
                let start = Instant::now();
                for i in 0..iters {
                    let key = IdempotencyKey::new(format!("k-{}", base + i)).expect("a valid key");
                    let key = RecordKey::new("tenant", long.as_str(), key);
                    acquire_complete_as(store, key, &digest, &res).await;
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

    let memory = MemoryStore::new().with_capacity(usize::MAX);
    bench_store(&mut c, &rt, "memory", &memory, 100_000);
    println!("memory store: {} records after the bench", memory.len());
    drop(memory);
    bench_bounded(&mut c, &rt);
    let mut layers = vec![bench_layer(&mut c, &rt, "memory_layer", MemoryStore::new)];

    layers.extend(postgres(&mut c, &rt));
    layers.extend(redis(&mut c, &rt));
    c.final_summary();
    println!();
    println!(
        "the layer's keyed path, in process, the caller waiting: the default (the work goes on \
         if the caller leaves) ÷ cancel_with_caller"
    );
    for (name, inline, default) in layers {
        let ratio = default / inline;
        let verdict = if ratio <= 1.2 { "met" } else { "MISSED" };
        println!(
            "  {name:<16} inline {:>10.2?}  default {:>10.2?}  ratio {ratio:.2} (≤ 1.20) {verdict}",
            Duration::from_secs_f64(inline),
            Duration::from_secs_f64(default),
        );
    }
}

/// One keyed request through the whole layer, in process, its handler yielding once: with
/// `cancel_with_caller()` (`inline`), with the default that finishes the work on a task of its
/// own should the caller leave, while the caller waits (`default`), and when the caller leaves
/// after the first poll (`caller_leaves`: the work is spawned, and runs to its end there).
/// Returns the group's name and the median seconds per request of the first two.
///
/// A memory store is made anew every 65 536 requests (`store` makes them), as a sweeper keeps a
/// store small: otherwise the cases after the first would run on a store millions of records
/// larger, and measure its cache misses.
fn bench_layer<St: IdempotencyStore + Clone>(
    c: &mut Criterion,
    rt: &Runtime,
    name: &'static str,
    store: impl Fn() -> St,
) -> (&'static str, f64, f64) {
    const BOUND: u64 = 1 << 16;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use http_body_util::Full;
    use surely::server::idempotency::IdempotencyLayer;
    use tower::{Layer, Service, ServiceExt};

    let done = Arc::new(AtomicU64::new(0));
    let finished = done.clone();
    let handler = tower::service_fn(move |_req: http::Request<Full<Bytes>>| {
        let finished = finished.clone();
        async move {
            tokio::task::yield_now().await;
            finished.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(201)
                    .body(Full::new(Bytes::from_static(b"{\"id\":\"o-1\"}")))
                    .expect("a response"),
            )
        }
    });
    let request = |n: u64| {
        http::Request::post("/orders")
            .header("idempotency-key", format!("k-{n}"))
            .body(Full::new(Bytes::from_static(b"{\"item\":\"book\"}")))
            .expect("a request")
    };
    let mut medians = [0.0f64; 3];
    let mut next = 0u64;
    let mut group = c.benchmark_group(name);
    let cases = [
        ("inline", false, false),
        ("default", true, false),
        ("caller_leaves", true, true),
    ];
    for (i, (case, detach, leaves)) in cases.into_iter().enumerate() {
        let service = || {
            let builder = IdempotencyLayer::builder(store());
            let layer = if detach {
                builder.build()
            } else {
                builder.cancel_with_caller().build()
            }
            .expect("a layer");
            layer.layer(handler.clone())
        };
        let mut svc = service();
        let mut per_request = Vec::new();
        group.bench_function(case, |b| {
            b.iter_custom(|iters| {
                let base = next;
                next += iters;
                let took = rt.block_on(async {
                    let start = Instant::now();
                    for n in 0..iters {
                        if (base + n) % BOUND == BOUND - 1 {
                            svc = service();
                        }
                        let ready = ServiceExt::<http::Request<Full<Bytes>>>::ready(&mut svc)
                            .await
                            .expect("ready");
                        let mut call = ready.call(request(base + n));
                        if leaves {
                            let before = done.load(Ordering::SeqCst);
                            // One poll (the handler yields), then the caller is gone.
                            tokio::select! {
                                biased;
                                _ = &mut call => unreachable!("the handler yields first"),
                                _ = std::future::ready(()) => {}
                            }
                            drop(call);
                            while done.load(Ordering::SeqCst) == before {
                                tokio::task::yield_now().await;
                            }
                        } else {
                            let res = call.await.expect("an answer");
                            assert_eq!(res.status(), StatusCode::CREATED);
                        }
                    }
                    start.elapsed()
                });
                per_request.push(took.as_secs_f64() / iters as f64);
                took
            })
        });
        // The median of criterion's samples (the last ones; the ones before are warm-up).
        let tail = per_request.len().saturating_sub(20);
        let mut samples = per_request[tail..].to_vec();
        samples.sort_by(f64::total_cmp);
        medians[i] = samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN);
    }
    group.finish();
    println!(
        "{name}/caller_leaves: {:.2?} a request, to its handler's answer on a task of its own",
        Duration::from_secs_f64(medians[2])
    );
    (name, medians[0], medians[1])
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
fn postgres(c: &mut Criterion, rt: &Runtime) -> Option<(&'static str, f64, f64)> {
    use surely::server::store::PostgresStore;

    let Ok(url) = std::env::var("SURELY_TEST_POSTGRES_URL") else {
        println!("postgres: skipped (SURELY_TEST_POSTGRES_URL is not set)");
        return None;
    };
    let table = format!("surely_idem_bench_{}", std::process::id());
    let store = PostgresStore::connect(&url)
        .and_then(|s| {
            s.with_table(&table)
                .map_err(surely::server::store::StoreError::backend)
        })
        .expect("a store");
    rt.block_on(store.migrate()).expect("migrate");
    bench_store(c, rt, "postgres", &store, 2_000);
    let layers = bench_layer(c, rt, "postgres_layer", || store.clone());
    rt.block_on(async {
        let client = store.pool().get().await.expect("a connection");
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}; DROP FUNCTION IF EXISTS {table}_acquire"
            ))
            .await
            .expect("drop the bench table");
        client
            .execute("DELETE FROM surely_migrations WHERE target = $1", &[&table])
            .await
            .expect("forget the bench table's migrations");
    });
    Some(layers)
}

#[cfg(not(feature = "postgres"))]
fn postgres(_: &mut Criterion, _: &Runtime) -> Option<(&'static str, f64, f64)> {
    println!("postgres: skipped (built without the `postgres` feature)");
    None
}

#[cfg(feature = "redis")]
fn redis(c: &mut Criterion, rt: &Runtime) -> Option<(&'static str, f64, f64)> {
    use surely::deps::redis::AsyncCommands as _;
    use surely::server::store::RedisStore;

    let Ok(url) = std::env::var("SURELY_TEST_REDIS_URL") else {
        println!("redis: skipped (SURELY_TEST_REDIS_URL is not set)");
        return None;
    };
    let prefix = format!("surely:bench:{}:", std::process::id());
    let store = RedisStore::connect(&url)
        .expect("a Redis URL")
        .with_prefix(&prefix)
        .expect("a prefix");
    bench_store(c, rt, "redis", &store, 2_000);
    let layers = bench_layer(c, rt, "redis_layer", || store.clone());
    rt.block_on(async {
        let client = surely::deps::redis::Client::open(url).expect("a Redis URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection");
        let mut scan = conn
            .scan_match::<_, String>(format!("{prefix}*"))
            .await
            .expect("scan the bench's keys");
        let mut keys = Vec::new();
        while let Some(key) = scan.next_item().await {
            keys.push(key.expect("a key"));
        }
        drop(scan);
        for batch in keys.chunks(1000) {
            let _: () = conn.unlink(batch).await.expect("delete the bench's keys");
        }
        println!("redis: {} keys of the bench deleted", keys.len());
    });
    Some(layers)
}

#[cfg(not(feature = "redis"))]
fn redis(_: &mut Criterion, _: &Runtime) -> Option<(&'static str, f64, f64)> {
    println!("redis: skipped (built without the `redis` feature)");
    None
}
