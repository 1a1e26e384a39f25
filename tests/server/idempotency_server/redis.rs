//! The Redis store, against the server named by `SURELY_TEST_REDIS_URL`, or by default the one
//! every development and CI machine runs (`redis://127.0.0.1:6379`). A server that does not
//! answer fails the tests, with the address they tried: they never pass without it. Every test
//! keeps its keys under a prefix of its own (deleted at the end), so runs may overlap and repeat.
//!
//! Leases and retention here are short and real (the store reads Redis's clock): at most a
//! second, and every wait is bounded. The restart test runs a Redis server of its own
//! (`redis-server` on a free port), so that stopping it disturbs no other test.

use std::convert::Infallible;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http::StatusCode;
use surely::deps::redis::aio::ConnectionManager;
use surely::deps::redis::{self, AsyncCommands as _};
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::{
    Acquire, Checkpoint, Fence, IdempotencyStore, RedisStore, RequestDigest, StoredResponse,
};
use tower::{service_fn, Layer};

use super::support::{chain, handler, post, reply, send, Req, Seen};
use super::{record, scenarios};
use crate::support::names::suffix;
use crate::support::redis::{connection, forget, keys, url};

/// A store under a prefix of `test`'s own, and a connection to look at its keys; panics,
/// naming the server, if it does not answer.
async fn store(test: &str) -> Db {
    let mut conn = connection(test).await;
    let prefix = format!("surely:test:{}:", suffix());
    let store = RedisStore::new(conn.clone()).with_prefix(&prefix).unwrap();
    assert!(keys(&mut conn, &prefix).await.is_empty());
    Db {
        store,
        prefix,
        conn,
    }
}

struct Db {
    store: RedisStore,
    prefix: String,
    conn: ConnectionManager,
}

impl Db {
    /// A store of its own (its own connection, made on first use) on the same prefix: what
    /// another instance of the service has.
    fn another(&self) -> RedisStore {
        RedisStore::connect(&url())
            .unwrap()
            .with_prefix(&self.prefix)
            .unwrap()
    }

    /// The key of a record, found by its idempotency key.
    async fn record_key(&mut self, key: &str) -> String {
        let found: Vec<String> = keys(&mut self.conn, &self.prefix)
            .await
            .into_iter()
            .filter(|k| k.contains(":rec:") && k.ends_with(&format!(":{key}")))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        found.into_iter().next().unwrap()
    }

    async fn field(&mut self, record: &str, field: &str) -> Option<Vec<u8>> {
        self.conn.hget(record, field).await.unwrap()
    }

    /// Deletes the test's keys; again while a task the test left (a release after a caller went
    /// away) still writes, for at most a second.
    async fn forget(mut self) {
        for _ in 0..20 {
            forget(&mut self.conn, &self.prefix).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            if keys(&mut self.conn, &self.prefix).await.is_empty() {
                return;
            }
        }
        panic!("keys under {} keep coming back", self.prefix);
    }
}

#[tokio::test]
async fn redis_scenarios_422_400_413_tenants_stored_replay() {
    let db = store("redis_scenarios_422_400_413_tenants_stored_replay").await;
    scenarios::all(db.store.clone()).await;
    db.forget().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_64_concurrent_first_requests_run_the_handler_once() {
    let db = store("redis_64_concurrent_first_requests_run_the_handler_once").await;
    scenarios::concurrent_first_requests(db.store.clone()).await;
    db.forget().await;
}

/// The same, with each of the four layers on a store of its own (four connections, as four
/// instances of a service would have): still one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_concurrent_first_requests_across_instances_run_the_handler_once() {
    let db = store("redis_concurrent_first_requests_across_instances").await;
    let seen = Seen::default();
    let counted = seen.clone();
    let slow = service_fn(move |req: Req| {
        let (n, _) = counted.hit(&req);
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, Infallible>(reply(201, format!("order {n}")))
        }
    });
    let layers: Vec<_> = (0..4)
        .map(|_| IdempotencyLayer::builder(db.another()).build().unwrap())
        .collect();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let mut svc = layers[i % 4].layer(slow.clone());
        tasks.push(tokio::spawn(async move {
            send(&mut svc, post(Some("k-instances"), "o-1")).await
        }));
    }
    for t in tasks {
        let got = t.await.unwrap();
        assert!(
            got.status == StatusCode::CREATED || got.status == StatusCode::CONFLICT,
            "{got:?}"
        );
        if got.status == StatusCode::CREATED {
            assert_eq!(got.body, "order 1");
        }
    }
    assert_eq!(seen.calls(), 1, "the handler ran more than once");
    db.forget().await;
}

/// A real lease of 300 ms on Redis's clock: the second acquire after it takes over with fence
/// 2; the first owner's moves are refused; the layer then replays the new owner's result.
#[tokio::test]
async fn redis_lease_expiry_takeover_and_the_stale_owner_refused() {
    let db = store("redis_lease_expiry_takeover_and_the_stale_owner_refused").await;
    super::leases::a_lease_passes_and_the_stale_owner_is_refused(
        db.store.clone(),
        Duration::from_millis(300),
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

/// The owner renews its lease by Redis's clock; once another request took over, the old
/// owner's renewal is refused. Two leases of 300 ms pass: about 0.8 s.
#[tokio::test]
async fn redis_renewal_extends_the_owners_lease_only() {
    let db = store("redis_renewal_extends_the_owners_lease_only").await;
    super::leases::renewal_extends_the_owners_lease_only(
        db.store.clone(),
        Duration::from_millis(300),
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

/// A real one-second lease: the test waits it out (about 1.2 s).
#[test]
fn redis_a_shutdown_mid_handler_leaves_the_key_to_its_lease() {
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = setup.block_on(store(
        "redis_a_shutdown_mid_handler_leaves_the_key_to_its_lease",
    ));
    super::disconnect::a_shutdown_mid_handler_leaves_the_key_to_its_lease(
        || db.another(),
        Duration::from_secs(1),
        false,
    );
    setup.block_on(db.forget());
}

/// Real time: the store's leases run on Redis's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_handler_outlives_its_caller() {
    let db = store("redis_a_handler_outlives_its_caller").await;
    super::disconnect::a_handler_outlives_its_caller(db.store.clone()).await;
    db.forget().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_handler_cancelled_with_its_caller_frees_its_key() {
    let db = store("redis_a_handler_cancelled_with_its_caller_frees_its_key").await;
    super::disconnect::a_handler_cancelled_with_its_caller_frees_its_key(db.store.clone()).await;
    db.forget().await;
}

/// A short real threshold on Redis's clock: about 0.4 s.
#[tokio::test]
async fn redis_stuck_records_are_reported() {
    let db = store("redis_stuck_records_are_reported").await;
    super::recovery::stuck_records_are_reported(
        db.store.clone(),
        Duration::from_millis(250),
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

/// Real retentions of a quarter of a second and of 25 seconds: about 0.4 s.
#[tokio::test]
async fn redis_retention_by_operation() {
    let db = store("redis_retention_by_operation").await;
    super::recovery::retention_by_operation(
        db.store.clone(),
        Duration::from_millis(250),
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

#[tokio::test]
async fn redis_a_takeover_is_told_from_a_release() {
    let db = store("redis_a_takeover_is_told_from_a_release").await;
    super::events::a_takeover_is_told_from_a_release(
        db.store.clone(),
        Duration::from_millis(300),
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

/// Long paths, a 100 KB tenant, a 255-byte key, over real hyper: served, deduplicated and kept
/// apart, never a 5xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_client_input_never_makes_a_5xx() {
    let db = store("redis_client_input_never_makes_a_5xx").await;
    super::limits::client_input_never_makes_a_5xx(db.store.clone()).await;
    db.forget().await;
}

/// After retention the key gets the explicit error, until swept; Redis would delete the record
/// by itself a backstop after its retention, not sooner.
#[tokio::test]
async fn redis_expired_key_is_an_explicit_error() {
    let mut db = store("redis_expired_key_is_an_explicit_error").await;
    super::leases::an_expired_key_is_an_explicit_error_until_swept(
        db.store.clone(),
        Duration::from_millis(300),
        tokio::time::sleep,
    )
    .await;
    let record = db.record_key("k-old").await;
    let ttl: i64 = db.conn.pttl(&record).await.unwrap();
    // 7 days past its retention of 300 ms, by default (`docs::server_states`).
    assert!(ttl > 6 * 86_400_000 && ttl <= 7 * 86_400_000 + 300, "{ttl}");
    db.forget().await;
}

/// A record Redis deleted by its backstop leaves the sweeper's index; a key then runs anew.
#[tokio::test]
async fn redis_the_backstop_deletes_a_record_the_sweeper_did_not() {
    let mut db = store("redis_the_backstop_deletes_a_record_the_sweeper_did_not").await;
    let store = db
        .store
        .clone()
        .with_backstop(Duration::from_secs(1))
        .unwrap();
    let key = record("k-backstop");
    let digest = RequestDigest::of(b"o");
    let Acquire::Owner(f) = store
        .acquire(&key, &digest, Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("not the owner")
    };
    let done = StoredResponse::new(StatusCode::OK, &http::HeaderMap::new(), "ok".into());
    store
        .complete(&key, f, &done, Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(store.expired(Duration::ZERO, 10).await.unwrap().is_empty());
    assert_eq!(store.sweep(Duration::ZERO).await.unwrap(), 0);
    let ended: i64 = db.conn.zcard(format!("{}ended", db.prefix)).await.unwrap();
    assert_eq!(ended, 0, "the index let go of it");
    assert!(matches!(
        store.acquire(&key, &digest, Duration::from_secs(5)).await.unwrap(),
        Acquire::Owner(f) if f == Fence::new(1)
    ));
    assert!(store
        .clone()
        .with_backstop(Duration::from_millis(999))
        .is_err());
    db.forget().await;
}

#[tokio::test]
async fn redis_the_sweeper_never_deletes_a_processing_record() {
    let db = store("redis_the_sweeper_never_deletes_a_processing_record").await;
    super::sweeper_spares_processing(db.store.clone(), tokio::time::sleep).await;
    db.forget().await;
}

/// A real lease of 400 ms on Redis's clock: about 1.5 s.
#[tokio::test]
async fn redis_checkpoints_and_unknowns_in_the_store() {
    let db = store("redis_checkpoints_and_unknowns_in_the_store").await;
    super::takeover::checkpoints_and_unknowns_in_the_store(
        db.store.clone(),
        Duration::from_millis(400),
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

/// Instance A's runtime shut down after the charge; B's hook finds it. A real one-second lease:
/// about 1.5 s.
#[test]
fn redis_the_hook_finds_the_charge_and_the_answer_is_replayed() {
    takeover_on_redis(
        "redis_the_hook_finds_the_charge_and_the_answer_is_replayed",
        true,
    );
}

/// The same without a hook: unknown, settled, replayed.
#[test]
fn redis_without_a_hook_the_record_is_unknown_then_settled_and_replayed() {
    takeover_on_redis(
        "redis_without_a_hook_the_record_is_unknown_then_settled_and_replayed",
        false,
    );
}

fn takeover_on_redis(test: &str, with_hook: bool) {
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = setup.block_on(store(test));
    super::takeover::an_owner_dies_after_its_checkpoint(
        || db.another(),
        Duration::from_secs(1),
        false,
        super::takeover::Death::AfterCharge,
        with_hook,
    );
    setup.block_on(db.forget());
}

#[tokio::test]
async fn redis_what_is_stored() {
    let mut db = store("redis_what_is_stored").await;
    super::stored::what_is_stored(db.store.clone()).await;
    // The sealed body, as Redis holds it: not the secret.
    let sealed = db.record_key("k-sealed").await;
    let body = db.field(&sealed, "b").await.unwrap();
    assert!(!body.is_empty());
    assert!(
        !String::from_utf8_lossy(&body).contains("4242"),
        "the secret is not in Redis"
    );
    assert_eq!(
        db.field(&sealed, "fl").await.unwrap(),
        b"3",
        "compressed, then sealed"
    );
    let by_reference = db.record_key("k-ref").await;
    assert_eq!(
        db.field(&by_reference, "rs").await.unwrap(),
        b"payments/p-1"
    );
    assert_eq!(db.field(&by_reference, "rc").await.unwrap(), b"charged");
    assert_eq!(db.field(&by_reference, "b").await.unwrap(), b"");
    db.forget().await;
}

/// A real retention of half a second: about 1 s.
#[tokio::test]
async fn redis_the_archive_sees_records_before_the_sweep() {
    let db = store("redis_the_archive_sees_records_before_the_sweep").await;
    super::stored::the_archive_sees_records_before_the_sweep(
        db.store.clone(),
        Duration::from_millis(500),
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

/// A body of a mebibyte (the layer's default limit), a 64 KB evidence and a long checkpoint
/// value go in and come back whole.
#[tokio::test]
async fn redis_huge_values_are_kept_whole() {
    let db = store("redis_huge_values_are_kept_whole").await;
    let big: String = (0..1 << 20)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::new(db.store.clone()).layer(handler(seen.clone(), 201));
    let got = send(&mut svc, post(Some("k-big"), &big)).await;
    assert_eq!(got.status, 201);
    let again = send(&mut svc, post(Some("k-big"), &big)).await;
    assert!(again.replayed());
    assert_eq!(again.body, got.body);
    assert_eq!(seen.calls(), 1);

    let s = &db.store;
    let key = record("k-evidence");
    let digest = RequestDigest::of(b"o");
    let Acquire::Owner(f) = s
        .acquire(&key, &digest, Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("not the owner")
    };
    let value = "v".repeat(512);
    s.checkpoint(&key, f, &Checkpoint::new("step", value.clone()).unwrap())
        .await
        .unwrap();
    let evidence = "e\n\u{0}\"'".repeat(64 * 1024 / 5);
    s.mark_unknown(&key, f, &evidence).await.unwrap();
    match s
        .acquire(&key, &digest, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Acquire::Unknown { evidence: got } => assert_eq!(got, evidence),
        other => panic!("{other:?}"),
    }
    let unknowns = s.unknowns(10).await.unwrap();
    assert_eq!(unknowns.len(), 1);
    assert_eq!(unknowns[0].checkpoint("step"), Some(value.as_str()));
    assert_eq!(unknowns[0].evidence, evidence);
    db.forget().await;
}

/// Keys that look like Redis syntax or like this store's own names are records like any other:
/// none reaches another's record or the store's indexes.
#[tokio::test]
async fn redis_hostile_keys_stay_apart() {
    let db = store("redis_hostile_keys_stay_apart").await;
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::builder(db.store.clone())
        .tenant(|p: &http::request::Parts| Some(p.headers.get("x-tenant")?.to_str().ok()?.into()))
        .build()
        .unwrap()
        .layer(handler(seen.clone(), 201));
    let cases = [
        ("a", "k*"),
        ("a", "k?"),
        ("a:1:x", "k"),
        ("a", "1:x:k"),
        ("a", "ended"),
        ("a", "processing"),
        ("a", "*"),
        ("a\"'\\", "k"),
        ("a", "rec:0::"),
    ];
    for (tenant, key) in cases {
        let got = send(&mut svc, super::support::post_as(tenant, key, "o")).await;
        assert_eq!(got.status, 201, "{tenant:?} {key:?}: {got:?}");
        assert!(!got.replayed(), "{tenant:?} {key:?}");
    }
    for (tenant, key) in cases {
        let got = send(&mut svc, super::support::post_as(tenant, key, "o")).await;
        assert!(got.replayed(), "{tenant:?} {key:?}");
    }
    assert_eq!(seen.calls(), cases.len());
    db.forget().await;
}

/// Someone else's values under the store's prefix: a string where a record should be, a hash
/// with a state or a status this store never writes, an index entry naming a string. Each is
/// a backend error that names the key, never a panic; the layer answers 503, not processed.
#[tokio::test]
async fn redis_garbage_under_the_prefix_is_a_backend_error_naming_the_key() {
    let mut db = store("redis_garbage_under_the_prefix_is_a_backend_error_naming_the_key").await;
    let digest = RequestDigest::of(b"o");
    let lease = Duration::from_secs(5);
    let (a, b, c) = (record("k-a"), record("k-b"), record("k-c"));
    // Made by the store, so that their keys are the store's.
    for key in [&a, &b, &c] {
        db.store.acquire(key, &digest, lease).await.unwrap();
    }
    let (ka, kb, kc) = (
        db.record_key("k-a").await,
        db.record_key("k-b").await,
        db.record_key("k-c").await,
    );
    let _: () = db.conn.del(&ka).await.unwrap();
    let _: () = db.conn.set(&ka, "garbage").await.unwrap();
    let _: () = db.conn.hset(&kb, "s", "z").await.unwrap();
    let _: () = db
        .conn
        .hset_multiple(&kc, &[("s", "c"), ("e", "99999999999999"), ("st", "999")])
        .await
        .unwrap();
    let _: () = db.conn.hset(&kc, "d", digest.as_bytes()).await.unwrap();
    for (key, name) in [(&a, &ka), (&b, &kb), (&c, &kc)] {
        let err = db.store.acquire(key, &digest, lease).await.unwrap_err();
        assert!(err.is_backend(), "{err}");
        assert!(chain(&err).contains(name.as_str()), "{err}");
    }
    // An owner's move on the string: a backend error too, not stale.
    let err = db.store.release(&a, Fence::new(1)).await.unwrap_err();
    assert!(
        err.is_backend() && chain(&err).contains(ka.as_str()),
        "{err}"
    );

    // The layer over it: 503, not processed, and the handler does not run.
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::new(db.store.clone()).layer(handler(seen.clone(), 201));
    let got = send(&mut svc, post(Some("k-a"), "o")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.headers.contains_key(surely::headers::NOT_PROCESSED));
    assert_eq!(seen.calls(), 0);

    // A listing that meets a string in its index names it.
    let stray = format!("{}stray", db.prefix);
    let _: () = db.conn.set(&stray, "x").await.unwrap();
    let _: () = db
        .conn
        .zadd(format!("{}processing", db.prefix), &stray, 0)
        .await
        .unwrap();
    let err = db.store.stuck(Duration::ZERO, 10).await.unwrap_err();
    assert!(err.is_backend() && chain(&err).contains(&stray), "{err}");
    // A checkpoint that does not decode.
    let _: () = db
        .conn
        .zrem(format!("{}processing", db.prefix), &stray)
        .await
        .unwrap();
    let d = record("k-d");
    let Acquire::Owner(f) = db.store.acquire(&d, &digest, lease).await.unwrap() else {
        panic!("not the owner")
    };
    db.store.mark_unknown(&d, f, "why").await.unwrap();
    let kd = db.record_key("k-d").await;
    let _: () = db.conn.hset(&kd, "cp", "no equals sign\n").await.unwrap();
    let err = db.store.unknowns(10).await.unwrap_err();
    assert!(
        err.is_backend() && chain(&err).contains(kd.as_str()),
        "{err}"
    );
    db.forget().await;
}

/// Nothing listens on the address: every call is a backend error within seconds, and the layer
/// answers 503, not processed, as for any store that cannot be reached.
#[tokio::test]
async fn redis_unreachable_is_a_503_not_processed_within_seconds() {
    let closed = free_port();
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{closed}")).unwrap();
    let started = Instant::now();
    let err = store
        .acquire(
            &record("k"),
            &RequestDigest::of(b"o"),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::new(store).layer(handler(seen.clone(), 201));
    let got = send(&mut svc, post(Some("k"), "o")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.headers.contains_key(surely::headers::NOT_PROCESSED));
    assert!(got.headers.contains_key("retry-after"));
    assert_eq!(seen.calls(), 0);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // Many requests at once on a fresh store share its one connection attempt: they all fail
    // within the time of one, not one after the other.
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{closed}")).unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..32)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let key = record(&format!("k-{n}"));
                store
                    .acquire(&key, &RequestDigest::of(b"o"), Duration::from_secs(5))
                    .await
            })
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap().unwrap_err().is_backend());
    }
    let all = started.elapsed();
    assert!(all < Duration::from_secs(3), "{all:?}");
}

#[test]
fn redis_urls_and_prefixes_are_checked() {
    for bad in ["", "http://127.0.0.1:6379", "redis://[::1", "not a url"] {
        let err = RedisStore::connect(bad).unwrap_err();
        assert!(err.is_backend(), "{bad}: {err}");
    }
    let store = RedisStore::connect("redis://127.0.0.1:1").unwrap();
    assert_eq!(store.prefix(), "surely:idem:");
    let long = "x".repeat(65);
    for bad in ["", "a b", "a\nb", "a*", "{tag}", "é", long.as_str()] {
        let err = store.clone().with_prefix(bad).unwrap_err();
        assert_eq!(err.setting(), "redis key prefix", "{bad:?}");
    }
    assert_eq!(
        store.with_prefix("app/orders:idem-1.").unwrap().prefix(),
        "app/orders:idem-1."
    );
}

/// A port nothing listens on (for a moment: the test binds it, then lets it go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Redis server of the test's own, without persistence, on `port`.
struct OwnRedis(Child);

impl OwnRedis {
    async fn start(port: u16) -> Self {
        let server = OwnRedis(
            Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("redis-server (the restart test runs its own): {e}")),
        );
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url.as_str()).unwrap();
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let pong: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
                if pong.is_ok() {
                    return server;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server on {url} did not answer within 2 s");
    }

    fn stop(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Redis stops and comes back without its data: while it is down, the layer answers 503 (not
/// processed); after it is back, the store reconnects by itself, and the key it forgot runs
/// again: a lost Redis is a lost record, the cache-grade promise the docs make.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_restart_without_persistence_forgets_and_the_store_reconnects() {
    let port = free_port();
    let server = OwnRedis::start(port).await;
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}")).unwrap();
    let seen = Seen::default();
    let mut svc = IdempotencyLayer::new(store.clone()).layer(handler(seen.clone(), 201));
    assert_eq!(
        send(&mut svc, post(Some("k-restart"), "o")).await.status,
        201
    );
    assert!(send(&mut svc, post(Some("k-restart"), "o"))
        .await
        .replayed());

    server.stop();
    let started = Instant::now();
    let got = send(&mut svc, post(Some("k-restart"), "o")).await;
    assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(got.headers.contains_key(surely::headers::NOT_PROCESSED));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(seen.calls(), 1);

    let _server = OwnRedis::start(port).await;
    // The manager reconnects on the next calls; bounded.
    let mut got = send(&mut svc, post(Some("k-restart"), "o")).await;
    for _ in 0..50 {
        if got.status != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        got = send(&mut svc, post(Some("k-restart"), "o")).await;
    }
    assert_eq!(got.status, 201, "{got:?}");
    assert!(
        !got.replayed(),
        "the record was lost with the server's memory"
    );
    assert_eq!(seen.calls(), 2);
    assert_eq!(seen.fences(), vec![Some(1), Some(1)]);
}

/// Any lease, renewal, retention, sweep age and stuck threshold, up to `Duration::MAX`, and any
/// backstop: a backstop is refused past `MAX_DURATION`, and the store counts any other duration
/// past it as ten years.
#[test]
fn redis_any_durations_are_answered() {
    use proptest::test_runner::{Config, TestRunner};

    use crate::durations::{duration, store_any_durations};

    let rt = tokio::runtime::Runtime::new().unwrap();
    let db = rt.block_on(store("redis_any_durations_are_answered"));
    let mut runner = TestRunner::new(Config::with_cases(16));
    let strategy = (
        duration(),
        (duration(), duration(), duration(), duration(), duration()),
    );
    let result = runner.run(
        &strategy,
        |(backstop, (lease, renewal, retention, keep, older))| {
            let store = match db.store.clone().with_backstop(backstop) {
                Ok(store) => store,
                Err(e) => {
                    assert_eq!(e.setting(), "redis backstop");
                    assert!(
                        backstop < Duration::from_secs(1) || backstop > surely::MAX_DURATION,
                        "{e}"
                    );
                    db.store.clone()
                }
            };
            rt.block_on(store_any_durations(
                &store, lease, renewal, retention, keep, older,
            ))
        },
    );
    rt.block_on(db.forget());
    result.unwrap();
}

/// The lease of the abandoned-record tests, on Redis's clock.
const ABANDONED_LEASE: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_abandoned_records_without_a_hook_are_released_or_unknown() {
    let db = store("redis_abandoned_records_without_a_hook_are_released_or_unknown").await;
    super::abandoned::without_a_hook(db.store.clone(), ABANDONED_LEASE, tokio::time::sleep).await;
    db.forget().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_abandoned_records_each_verdict_of_the_hook_lands() {
    let db = store("redis_abandoned_records_each_verdict_of_the_hook_lands").await;
    super::abandoned::each_verdict_lands(db.store.clone(), ABANDONED_LEASE, tokio::time::sleep)
        .await;
    db.forget().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_abandoned_records_a_failing_hook_leaves_them_for_the_next_round() {
    let db = store("redis_abandoned_records_a_failing_hook_leaves_them_for_the_next_round").await;
    super::abandoned::a_failing_hook_leaves_the_record(
        db.store.clone(),
        ABANDONED_LEASE,
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_abandoned_records_wait_out_the_grace() {
    let db = store("redis_abandoned_records_wait_out_the_grace").await;
    super::abandoned::a_grace_leaves_the_client_time_to_come_back(
        db.store.clone(),
        ABANDONED_LEASE,
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_abandoned_records_only_they_are_taken() {
    let db = store("redis_abandoned_records_only_they_are_taken").await;
    super::abandoned::only_abandoned_records_are_taken(
        db.store.clone(),
        ABANDONED_LEASE,
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

/// Four instances (four connections) over one prefix: one script per round, so no record is
/// taken twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_abandoned_records_concurrent_rounds_take_each_once() {
    let db = store("redis_abandoned_records_concurrent_rounds_take_each_once").await;
    let stores = vec![db.store.clone(), db.another(), db.another(), db.another()];
    super::abandoned::concurrent_rounds_take_each_record_once(
        stores,
        ABANDONED_LEASE,
        tokio::time::sleep,
    )
    .await;
    db.forget().await;
}

/// A record acquired by an earlier version of the store is not in the index by lease: the
/// round's walk through the processing index finds it, and takes it over once its lease key
/// is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_abandoned_records_from_an_earlier_version_are_found() {
    let mut db = store("redis_abandoned_records_from_an_earlier_version_are_found").await;
    let digest = RequestDigest::of(b"o-1");
    let key = super::record("k-old");
    let Acquire::Owner(_) = db
        .store
        .acquire(&key, &digest, ABANDONED_LEASE)
        .await
        .unwrap()
    else {
        panic!("not the owner");
    };
    // As an earlier version left it: not in the index by lease.
    let leases = format!("{}leases", db.prefix);
    let record = db.record_key("k-old").await;
    let removed: i64 = db.conn.zrem(&leases, record).await.unwrap();
    assert_eq!(removed, 1, "the acquire indexed it by lease");
    tokio::time::sleep(ABANDONED_LEASE + ABANDONED_LEASE / 2).await;
    let taken = db
        .store
        .take_abandoned(Duration::ZERO, ABANDONED_LEASE, 10)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].key, key);
    assert_eq!(taken[0].fence, Fence::new(2));
    db.forget().await;
}
