//! The Redis store on a real Redis Cluster: three primaries with a replica each, started by the
//! test with `redis-server` in cluster mode and joined with `redis-cli --cluster create`, on
//! loopback ports of its own, without persistence. The shared scenarios, the listings across
//! the shards, a slot caught mid-migration (`ASK`, then `TRYAGAIN`), and a primary killed while
//! requests with one key race.
//!
//! Waits here are against the cluster's own clock (its failure detection, a second's node
//! timeout): real, short, and bounded.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::StatusCode;
use surely::deps::redis::{self, Value};
use surely::idempotency::IdempotencyKey;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::{
    IdempotencyStore, RecordKey, RedisStore, RequestDigest, StoredResponse,
};
use tower::{service_fn, Layer};

use super::scenarios;
use super::support::{handler, post, reply, send, Req, Seen};
use crate::support::names::suffix;

/// A cluster of the test's own.
struct Cluster {
    dir: PathBuf,
    nodes: Vec<(u16, Option<Child>)>,
}

/// Six ports `p` with `p` and its cluster bus `p + 10000` free, below the ephemeral range: each
/// cluster of the process in a window of its own, so that two tests starting at once never pick
/// the same ports.
fn ports() -> Vec<u16> {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    let window = NEXT.fetch_add(1, Ordering::SeqCst) % 10;
    let start = 20_000 + (std::process::id() % 10) as u16 * 1_000 + window * 100;
    let found: Vec<u16> = (start..start + 100)
        .filter(|&p| free(p) && free(p + 10_000))
        .take(6)
        .collect();
    assert_eq!(found.len(), 6, "no six free port pairs from {start}");
    found
}

async fn query(port: u16, args: &[&str]) -> redis::RedisResult<Value> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut conn).await
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

impl Cluster {
    async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("surely-cluster-{}", suffix()));
        let mut nodes = Vec::new();
        for port in ports() {
            let node_dir = dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--save", "", "--appendonly", "no"])
                // A replica syncs at once, not after the five seconds' default wait for others.
                .args(["--repl-diskless-sync-delay", "0"])
                .arg("--dir")
                .arg(&node_dir)
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("redis-server (the cluster tests run their own): {e}"));
            nodes.push((port, Some(child)));
        }
        let cluster = Cluster { dir, nodes };
        for &(port, _) in &cluster.nodes {
            let up = Instant::now();
            while query(port, &["PING"]).await.is_err() {
                assert!(
                    up.elapsed() < Duration::from_secs(5),
                    "node {port} did not start"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        let out = tokio::task::spawn_blocking(move || {
            Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "1", "--cluster-yes"])
                .output()
                .expect("redis-cli --cluster create")
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        cluster.wait_ok(Duration::from_secs(30)).await;
        cluster
    }

    /// A store on the cluster under a prefix of its own.
    fn store(&self) -> RedisStore {
        RedisStore::cluster(self.urls())
            .unwrap()
            .with_prefix(&format!("surely:test:{}:", suffix()))
            .unwrap()
    }

    fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|(p, _)| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    fn live(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes
            .iter()
            .filter(|(_, c)| c.is_some())
            .map(|(p, _)| *p)
    }

    /// Until every live node says the cluster is whole, and they agree on who serves each slot.
    async fn wait_ok(&self, within: Duration) {
        let started = Instant::now();
        loop {
            let mut ok = true;
            for port in self.live() {
                let info = query(port, &["CLUSTER", "INFO"]).await.map(|v| text(&v));
                ok &= info.is_ok_and(|i| i.contains("cluster_state:ok"));
                // A replica that has not synced could not take over.
                let repl = query(port, &["INFO", "replication"])
                    .await
                    .map(|v| text(&v));
                ok &= repl.is_ok_and(|r| {
                    r.contains("role:master") || r.contains("master_link_status:up")
                });
            }
            let mut owners = Vec::new();
            for port in self.live() {
                owners.push(self.slot_owners(port).await);
            }
            ok &= owners.windows(2).all(|w| w[0] == w[1]);
            if ok {
                return;
            }
            assert!(
                started.elapsed() < within,
                "the cluster was not whole within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Each slot range's primary, by port, as node `asked` sees it.
    async fn slot_owners(&self, asked: u16) -> Vec<(i64, i64, u16)> {
        let Ok(Value::Array(ranges)) = query(asked, &["CLUSTER", "SLOTS"]).await else {
            return Vec::new();
        };
        let mut out: Vec<(i64, i64, u16)> = ranges
            .iter()
            .filter_map(|r| match r {
                Value::Array(r) => match (&r[0], &r[1], &r[2]) {
                    (Value::Int(a), Value::Int(b), Value::Array(primary)) => match primary[1] {
                        Value::Int(p) => Some((*a, *b, p as u16)),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    async fn any(&self) -> u16 {
        self.live().next().unwrap()
    }

    /// The slot of `key`.
    async fn slot(&self, key: &str) -> i64 {
        match query(self.any().await, &["CLUSTER", "KEYSLOT", key]).await {
            Ok(Value::Int(n)) => n,
            other => panic!("CLUSTER KEYSLOT {key}: {other:?}"),
        }
    }

    /// The port of the primary that serves `slot`.
    async fn primary_of(&self, slot: i64) -> u16 {
        let owners = self.slot_owners(self.any().await).await;
        owners
            .iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .map(|(_, _, p)| *p)
            .unwrap_or_else(|| panic!("no primary for slot {slot}: {owners:?}"))
    }

    async fn node_id(&self, port: u16) -> String {
        text(&query(port, &["CLUSTER", "MYID"]).await.unwrap())
    }

    fn kill(&mut self, port: u16) {
        let node = self.nodes.iter_mut().find(|(p, _)| *p == port).unwrap();
        let mut child = node.1.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.nodes {
            if let Some(child) = child {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The bucket of a record, as the store's docs give it: FNV-1a (64-bit) of its name after
/// `rec:`, modulo 16.
fn bucket(tenant: &str, operation: &str, key: &str) -> u64 {
    let name = format!(
        "{}:{tenant}:{}:{operation}:{key}",
        tenant.len(),
        operation.len()
    );
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % 16
}

fn record(key: &str) -> RecordKey {
    RecordKey::new("", "POST /orders", IdempotencyKey::new(key).unwrap())
}

/// The scenarios every store passes, and the listings, which read every bucket's index on
/// every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_the_store_works_across_shards() {
    let cluster = Cluster::start().await;
    let store = || cluster.store();
    assert_eq!(store().buckets(), Some(RedisStore::CLUSTER_BUCKETS));
    scenarios::all(store()).await;
    scenarios::concurrent_first_requests(store()).await;
    scenarios::inspect_reads_each_state(store()).await;

    // The buckets spread over the three primaries.
    let mut primaries = std::collections::BTreeSet::new();
    for b in 0..16 {
        primaries.insert(
            cluster
                .primary_of(cluster.slot(&format!("{{{b}}}")).await)
                .await,
        );
    }
    assert_eq!(primaries.len(), 3, "{primaries:?}");

    // 48 records in flight, across the buckets: every listing sees them all, oldest first.
    let store = store();
    let digest = RequestDigest::of(b"o");
    let names: Vec<String> = (0..48).map(|i| format!("lk-{i}")).collect();
    let buckets: std::collections::BTreeSet<u64> = names
        .iter()
        .map(|n| bucket("", "POST /orders", n))
        .collect();
    assert!(buckets.len() >= 12, "{buckets:?}");
    let mut fences = Vec::new();
    for name in &names {
        let acquired = store
            .acquire(&record(name), &digest, Duration::from_secs(60))
            .await
            .unwrap();
        fences.push(acquired.fence().unwrap());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let stuck = store.stuck(Duration::ZERO, 1000).await.unwrap();
    assert_eq!(stuck.len(), 48);
    assert!(stuck.windows(2).all(|w| w[0].age >= w[1].age));
    let oldest = store.stuck(Duration::ZERO, 5).await.unwrap();
    let first: Vec<&str> = oldest.iter().map(|r| r.key.key().as_str()).collect();
    assert_eq!(first, ["lk-0", "lk-1", "lk-2", "lk-3", "lk-4"]);

    for i in 0..10 {
        store
            .mark_unknown(&record(&names[i]), fences[i], "lost")
            .await
            .unwrap();
    }
    assert_eq!(store.unknowns(1000).await.unwrap().len(), 10);
    assert_eq!(store.unknowns(3).await.unwrap().len(), 3);
    let answer = StoredResponse::from_parts(StatusCode::CREATED, std::iter::empty(), "ok".into());
    for i in 10..35 {
        store
            .complete(&record(&names[i]), fences[i], &answer, Duration::ZERO)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let expired = store.expired(Duration::ZERO, 1000).await.unwrap();
    assert_eq!(expired.len(), 25);
    assert_eq!(store.forget(&expired[..20]).await.unwrap(), 20);
    assert_eq!(store.sweep(Duration::ZERO).await.unwrap(), 5);
    assert!(store
        .expired(Duration::ZERO, 1000)
        .await
        .unwrap()
        .is_empty());

    // Abandoned records, taken from every bucket in turn, each once.
    for i in 35..41 {
        store
            .renew(&record(&names[i]), fences[i], Duration::from_millis(1))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let two = store
        .take_abandoned(Duration::ZERO, Duration::from_secs(30), 2)
        .await
        .unwrap();
    assert_eq!(two.len(), 2);
    let rest = store
        .take_abandoned(Duration::ZERO, Duration::from_secs(30), 100)
        .await
        .unwrap();
    assert_eq!(rest.len(), 4);
    let mut taken: Vec<String> = two
        .iter()
        .chain(&rest)
        .map(|r| r.key.key().as_str().to_owned())
        .collect();
    taken.sort();
    let mut want: Vec<String> = names[35..41].to_vec();
    want.sort();
    assert_eq!(taken, want);
}

/// A slot caught mid-migration: the bucket's keys are split between two shards, the script
/// cannot run (`ASK`, then `TRYAGAIN`), and the layer answers `503`, not processed, without
/// running the handler. Once the slot is stable again, the same request runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_slot_mid_migration_is_a_503_not_processed() {
    let cluster = Cluster::start().await;
    let store = cluster.store();
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::new(store).layer(handler(seen.clone(), 201));

    // A first key makes its bucket's indexes exist on the slot's primary.
    let first = "mig-first";
    let b = bucket("", "POST /orders", first);
    assert_eq!(send(&mut svc, post(Some(first), "o")).await.status, 201);
    // Another new key of the same bucket.
    let second = (0..)
        .map(|i| format!("mig-{i}"))
        .find(|k| bucket("", "POST /orders", k) == b)
        .unwrap();

    let slot = cluster.slot(&format!("{{{b}}}")).await;
    let source = cluster.primary_of(slot).await;
    let primaries: std::collections::BTreeSet<u16> = cluster
        .slot_owners(source)
        .await
        .iter()
        .map(|(_, _, p)| *p)
        .collect();
    let target = *primaries.iter().find(|p| **p != source).unwrap();
    let (source_id, target_id) = (cluster.node_id(source).await, cluster.node_id(target).await);
    let slot_s = slot.to_string();
    query(
        target,
        &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &source_id],
    )
    .await
    .unwrap();
    query(
        source,
        &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &target_id],
    )
    .await
    .unwrap();

    // A new key, and the first key's replay: both scripts touch keys the migration split (a
    // lease or a record not on the source), so neither runs; the layer says not processed.
    for key in [second.as_str(), first] {
        let got = send(&mut svc, post(Some(key), "o")).await;
        assert_eq!(
            got.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{key}: {got:?}"
        );
        assert!(got.headers.contains_key(surely::headers::NOT_PROCESSED));
        assert!(got.headers.contains_key("retry-after"));
    }
    assert_eq!(
        seen.calls(),
        1,
        "the handler did not run for the refused requests"
    );

    for port in [source, target] {
        query(port, &["CLUSTER", "SETSLOT", &slot_s, "STABLE"])
            .await
            .unwrap();
    }
    let got = send(&mut svc, post(Some(&second), "o")).await;
    assert_eq!(got.status, 201, "{got:?}");
    assert_eq!(seen.calls(), 2);
    assert!(send(&mut svc, post(Some(&second), "o")).await.replayed());
}

/// A primary killed while requests with one key race: every answer is one the docs name (the
/// first run's `201`, a replay, `409` in flight, `503` not processed or commit unknown), the
/// handler runs at most twice (twice when the claim was lost with the primary, or when the
/// failover outlasted the two-second lease and a racer took the key over, the losses the
/// store's docs warn of), and the store serves again once a replica took over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_a_primary_killed_while_one_key_races() {
    let mut cluster = Cluster::start().await;
    let store = cluster.store();
    let seen = Seen::default();
    let h = seen.clone();
    let slow = service_fn(move |req: Req| {
        let (n, _) = h.hit(&req);
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, std::convert::Infallible>(reply(201, format!("order {n}")))
        }
    });
    let layer = IdempotencyLayer::builder(store)
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let svc = layer.layer(slow);

    let key = "race-1";
    let slot = cluster
        .slot(&format!("{{{}}}", bucket("", "POST /orders", key)))
        .await;
    let primary = cluster.primary_of(slot).await;

    let stop = Arc::new(AtomicBool::new(false));
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let mut svc = svc.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let g = send(&mut svc, post(Some(key), "o")).await;
                    got.push(g);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                got
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.kill(primary);
    let killed = Instant::now();
    // Until a replica serves the slot, and the cluster agrees on it.
    while cluster.primary_of(slot).await == primary {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "no failover in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.wait_ok(Duration::from_secs(20)).await;
    let failover = killed.elapsed();
    // Requests keep racing on the new primary for a while, past the lease.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    let mut all = Vec::new();
    for r in racers {
        all.extend(r.await.unwrap());
    }

    let mut counts = std::collections::BTreeMap::new();
    for g in &all {
        let what = match (g.status.as_u16(), g.replayed(), g.code()) {
            (201, true, _) => "201 replayed",
            (201, false, _) => "201 ran",
            (409, _, _) => "409 in flight",
            (503, _, Some("IDEMPOTENCY_COMMIT_UNKNOWN")) => "503 commit unknown",
            (503, _, _) if g.headers.contains_key(surely::headers::NOT_PROCESSED) => {
                "503 not processed"
            }
            _ => panic!("an answer the docs do not name: {g:?}"),
        };
        *counts.entry(what).or_insert(0) += 1;
    }
    let runs = seen.calls();
    println!(
        "failover in {failover:?}; {} answers {counts:?}; handler runs {runs}",
        all.len()
    );
    assert!((1..=2).contains(&runs), "handler runs: {runs}");
    assert!(counts.get("201 ran").copied().unwrap_or(0) <= runs);

    // The store serves again: a new key runs once, then replays.
    let mut svc = svc;
    let fresh = (0..)
        .map(|i| format!("after-{i}"))
        .find(|k| bucket("", "POST /orders", k) == bucket("", "POST /orders", key))
        .unwrap();
    let before = seen.calls();
    assert_eq!(send(&mut svc, post(Some(&fresh), "o")).await.status, 201);
    assert!(send(&mut svc, post(Some(&fresh), "o")).await.replayed());
    assert_eq!(seen.calls(), before + 1);
}
