//! No duration panics the server half (issue 42, item 1): every duration setting of each server
//! layer, of the memory store and of the server configuration, driven with values up to
//! `Duration::MAX`, and every deadline header with arbitrary bytes and numbers of any length. A
//! build may fail with a `ConfigError` naming the setting; whatever builds serves requests under
//! paused time without a panic, and the durations it reports back stay within `MAX_DURATION`.
//! (The PostgreSQL and Redis stores get the same drive in `idempotency_server/postgres.rs` and
//! `redis.rs`; the pushback headers in the client's tests, `classify/pushback.rs`.)

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use proptest::prelude::*;
use surely::deadline::Deadline;
use surely::idempotency::IdempotencyKey;
use surely::retry::{Query, Resolution};
use surely::server::config::ServerConfig;
use surely::server::deadline::{RecheckLayer, ServerDeadlineLayer};
use surely::server::idempotency::IdempotencyLayer;
use surely::server::limit::{AdaptiveLimitLayer, Aimd};
use surely::server::store::{
    Acquire, IdempotencyStore, MemoryStore, RecordKey, RecordState, RequestDigest, StoredResponse,
};
use surely::{ConfigError, MAX_DURATION};
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};

use crate::support::names::suffix;

/// Durations over the whole range: short ones, ones about `MAX_DURATION`, any at all, and the
/// ends.
pub(crate) fn duration() -> impl Strategy<Value = Duration> {
    let max = MAX_DURATION.as_secs();
    prop_oneof![
        (0u64..=5_000).prop_map(Duration::from_millis),
        (max - 2..=max + 2, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::ZERO),
        Just(MAX_DURATION),
        Just(Duration::MAX),
    ]
}

/// What a peer may send as a header value: any bytes, decimal numbers up to `u64::MAX` and past
/// it (up to 40 digits), and `grpc-timeout`-like values with too many digits.
pub(crate) fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..32),
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        "[0-9]{19,40}".prop_map(String::into_bytes),
        ("[0-9]{1,12}", "[HMSmun]").prop_map(|(d, u)| format!("{d}{u}").into_bytes()),
    ]
}

/// Runs `work` on a runtime of its own whose time is paused (and moves on when it idles).
pub(crate) fn paused<F: Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(work)
}

/// A refused setting is one of `settings`, and its reason is said.
fn refused(err: &ConfigError, settings: &[&str]) -> Result<(), TestCaseError> {
    prop_assert!(settings.contains(&err.setting()), "{err}");
    prop_assert!(!err.reason().is_empty());
    Ok(())
}

fn whole_secs_up(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

proptest! {
    /// The server deadline layer: any maximum and minimum; any header, on HTTP and gRPC. The
    /// handler's deadline is never further than the maximum, nor than `MAX_DURATION`.
    #[test]
    fn server_deadline_any_setting_any_header(
        max in prop::option::of(duration()),
        min in prop::option::of(duration()),
        header in header_bytes(),
        grpc in any::<bool>(),
    ) {
        let mut builder = ServerDeadlineLayer::builder();
        if let Some(max) = max {
            builder = builder.max(max);
        }
        if let Some(min) = min {
            builder = builder.min(min);
        }
        let layer = match builder.build() {
            Ok(layer) => layer,
            Err(e) => return refused(&e, &["server deadline maximum", "server deadline minimum"]),
        };
        let status = paused(async move {
            let start = Instant::now();
            let handler = service_fn(move |_req: Request<()>| async move {
                if let Some(d) = surely::deadline::current() {
                    let away = d.instant().saturating_duration_since(start);
                    assert!(away <= MAX_DURATION, "{away:?}");
                    assert!(max.is_none_or(|max| away <= max), "{away:?}");
                }
                Ok::<_, Infallible>(Response::new(String::new()))
            });
            let mut svc = layer.layer(handler);
            let mut req = Request::post("/").body(()).unwrap();
            let name = if grpc { "grpc-timeout" } else { "x-request-timeout-ms" };
            if grpc {
                req.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
            }
            if let Ok(value) = HeaderValue::from_bytes(&header) {
                req.headers_mut().insert(name, value);
            }
            svc.ready().await.unwrap().call(req).await.unwrap().status()
        });
        prop_assert!(
            [StatusCode::OK, StatusCode::BAD_REQUEST, StatusCode::GATEWAY_TIMEOUT].contains(&status),
            "{status}"
        );
    }

    /// The recheck: any `needs`, any deadline on the request.
    #[test]
    fn recheck_any_needs_any_deadline(needs in duration(), budget in prop::option::of(duration())) {
        let status = paused(async move {
            let handler = service_fn(|_req: Request<()>| async {
                Ok::<_, Infallible>(Response::new(String::new()))
            });
            let mut svc = RecheckLayer::new(needs).layer(handler);
            let mut req = Request::new(());
            if let Some(budget) = budget {
                req.extensions_mut().insert(Deadline::after(budget));
            }
            svc.ready().await.unwrap().call(req).await.unwrap().status()
        });
        // `needs` counts as at most ten years; a deadline is at most about thirty years away.
        let passes = budget.is_none_or(|b| b.min(Duration::from_secs(30 * 365 * 86_400)) >= needs.min(MAX_DURATION));
        prop_assert_eq!(status == StatusCode::OK, passes, "{}", status);
    }

    /// The adaptive limit: any `Retry-After` and AIMD latency target; a refusal says the wait,
    /// rounded up to whole seconds (HTTP) or in milliseconds (gRPC).
    #[test]
    fn limit_any_retry_after_and_latency_target(
        retry_after in duration(),
        target in prop::option::of(duration()),
        takes in duration(),
        grpc in any::<bool>(),
    ) {
        let mut builder = AdaptiveLimitLayer::builder()
            .initial(1)
            .max(1)
            .retry_after(retry_after);
        if let Some(target) = target {
            builder = builder.algorithm(Aimd::new().latency_target(target));
        }
        let limit = match builder.build() {
            Ok(limit) => limit,
            Err(e) => return refused(&e, &["limit retry-after", "aimd latency target"]),
        };
        // The handler takes up to a minute of paused time.
        let takes = takes.min(Duration::from_secs(60));
        let refusal = paused(async move {
            let handler = service_fn(move |_req: Request<()>| async move {
                tokio::time::sleep(takes).await;
                Ok::<_, Infallible>(Response::new(String::new()))
            });
            let mut svc = limit.layer(handler);
            let req = || {
                let mut req = Request::new(());
                if grpc {
                    req.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
                }
                req
            };
            let first = svc.ready().await.unwrap().call(req());
            let refused = svc.ready().await.unwrap().call(req()).await.unwrap();
            first.await.unwrap();
            refused
        });
        let header = if grpc { "grpc-retry-pushback-ms" } else { "retry-after" };
        let said: u64 = refusal.headers()[header].to_str().unwrap().parse().unwrap();
        let expected = if grpc {
            u64::try_from(retry_after.as_millis()).unwrap()
        } else {
            whole_secs_up(retry_after)
        };
        prop_assert_eq!(said, expected);
    }

    /// The idempotency layer: any lease, renewal, in-flight `Retry-After`, retention and
    /// per-request retention; then a request, a duplicate while it runs, a replay, the sweeper,
    /// the stuck report and a settling round with any durations.
    #[test]
    fn idempotency_any_duration_setting(
        lease in duration(),
        renew_for in prop::option::of(duration()),
        in_flight in duration(),
        retention in duration(),
        by_request in prop::option::of(duration()),
        takes in 0u64..=2_000,
        later in duration(),
        keep in duration(),
        older in duration(),
        query in duration(),
    ) {
        let store = MemoryStore::new();
        let mut builder = IdempotencyLayer::builder(store.clone())
            .lease(lease)
            .in_flight_retry_after(in_flight)
            .retention(retention)
            .retention_by(move |_| by_request);
        if let Some(max) = renew_for {
            builder = builder.renew_for(max);
        }
        let layer = match builder.build() {
            Ok(layer) => layer,
            Err(e) => {
                return refused(&e, &[
                    "idempotency lease",
                    "idempotency lease renewal",
                    "idempotency in-flight retry-after",
                    "idempotency retention",
                ]);
            }
        };
        let takes = Duration::from_millis(takes);
        let (duplicate, replay) = paused(async move {
            let handler = service_fn(move |_req: Request<Full<Bytes>>| async move {
                tokio::time::sleep(takes).await;
                let res = Response::builder().status(201).body(Full::new(Bytes::from("o-1")));
                Ok::<_, Infallible>(res.unwrap())
            });
            let svc = layer.layer(handler);
            let post = || {
                Request::post("/orders")
                    .header("idempotency-key", "k-1")
                    .body(Full::new(Bytes::from("o-1")))
                    .unwrap()
            };
            let first = tokio::spawn(svc.clone().oneshot(post()));
            // Until the first request holds the record.
            while store.is_empty() {
                tokio::task::yield_now().await;
            }
            let duplicate = svc.clone().oneshot(post()).await.unwrap();
            assert_eq!(first.await.unwrap().unwrap().status(), 201);
            let replay = svc.clone().oneshot(post()).await.unwrap();
            // Time moves on (at most twenty years: the test clock is a std instant), and the
            // store's upkeep takes any durations.
            tokio::time::advance(later.min(Duration::from_secs(20 * 365 * 86_400))).await;
            layer.sweep(keep).await.unwrap();
            layer.report_stuck(older).await.unwrap();
            let resolver = |_q: Query| async { Resolution::<Response<Bytes>>::Unknown };
            layer.settle_unknowns(&resolver, query, 10).await.unwrap();
            (duplicate, replay)
        });
        match duplicate.status().as_u16() {
            409 => {
                let secs: u64 = duplicate.headers()["retry-after"].to_str().unwrap().parse().unwrap();
                prop_assert!(secs >= 1);
                prop_assert!(secs <= whole_secs_up(in_flight).max(1), "{secs}");
            }
            // The lease passed, or the first one had answered: taken over, or replayed.
            201 => {}
            other => prop_assert!(false, "duplicate answered {other}"),
        }
        // Replayed, or (a retention shorter than the handler) expired.
        prop_assert!([201, 410].contains(&replay.status().as_u16()), "{}", replay.status());
    }

    /// The memory store, called directly with any durations: the time left on a lease that it
    /// reports is the lease, at most `MAX_DURATION`.
    #[test]
    fn memory_store_any_durations(
        lease in duration(),
        renewal in duration(),
        retention in duration(),
        keep in duration(),
        older in duration(),
    ) {
        paused(async move {
            let store = MemoryStore::new();
            store_any_durations(&store, lease, renewal, retention, keep, older).await
        })?;
    }

    /// The server configuration, read from TOML with any durations (written as seconds and
    /// nanoseconds, or as years): read, built, or refused by its field's path, and what builds
    /// serves a request.
    #[test]
    fn configuration_any_durations(
        durations in prop::collection::vec(duration(), 8),
        years in prop::collection::vec(any::<u64>(), 8),
        as_years in prop::collection::vec(any::<bool>(), 8),
        aimd in any::<bool>(),
    ) {
        let text: Vec<String> = durations
            .iter()
            .zip(&years)
            .zip(&as_years)
            .map(|((d, y), &as_years)| {
                if as_years {
                    format!("{y}y")
                } else {
                    format!("{}s {}ns", d.as_secs(), d.subsec_nanos())
                }
            })
            .collect();
        let limit = if aimd {
            format!("algorithm = \"aimd\"\nlatency_target = \"{}\"", text[7])
        } else {
            String::new()
        };
        let toml = format!(
            "[deadline]\nmax = \"{}\"\nmin = \"{}\"\n\
             [idempotency]\nlease = \"{}\"\nrenew_for = \"{}\"\nin_flight_retry_after = \"{}\"\nretention = \"{}\"\n\
             [limit]\nretry_after = \"{}\"\n{limit}\n",
            text[0], text[1], text[2], text[3], text[4], text[5], text[6],
        );
        let Ok(config) = toml::from_str::<ServerConfig>(&toml) else {
            // A duration humantime cannot hold (years past `Duration::MAX`): refused as text.
            return Ok(());
        };
        let refused_at = |e: ConfigError, prefix: &str| -> Result<(), TestCaseError> {
            prop_assert!(e.setting().starts_with(prefix), "{e}");
            Ok(())
        };
        match config.deadline.layer() {
            Ok(layer) => {
                let status = paused(async move {
                    let handler = service_fn(|_req: Request<()>| async {
                        Ok::<_, Infallible>(Response::new(String::new()))
                    });
                    layer.layer(handler).oneshot(Request::new(())).await.unwrap().status()
                });
                prop_assert!([StatusCode::OK, StatusCode::GATEWAY_TIMEOUT].contains(&status));
            }
            Err(e) => refused_at(e, "deadline.")?,
        }
        match config.idempotency.layer(MemoryStore::new()) {
            Ok(layer) => {
                let status = paused(async move {
                    let handler = service_fn(|_req: Request<Full<Bytes>>| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                    });
                    let req = Request::post("/orders")
                        .header("idempotency-key", "k-1")
                        .body(Full::new(Bytes::new()))
                        .unwrap();
                    layer.layer(handler).oneshot(req).await.unwrap().status()
                });
                prop_assert_eq!(status, StatusCode::OK);
            }
            Err(e) => refused_at(e, "idempotency.")?,
        }
        match config.limit.layer() {
            Ok(layer) => {
                let status = paused(async move {
                    let handler = service_fn(|_req: Request<()>| async {
                        Ok::<_, Infallible>(Response::new(String::new()))
                    });
                    layer.layer(handler).oneshot(Request::new(())).await.unwrap().status()
                });
                prop_assert_eq!(status, StatusCode::OK);
            }
            Err(e) => refused_at(e, "limit.")?,
        }
    }
}

/// One record's life in `store`, with any durations: acquired (the lease it reports is at most
/// `MAX_DURATION`), renewed, completed; then the upkeep (expired, sweep, stuck). Shared by the
/// memory, PostgreSQL and Redis stores' properties; a store error fails it.
pub(crate) async fn store_any_durations<St: IdempotencyStore>(
    store: &St,
    lease: Duration,
    renewal: Duration,
    retention: Duration,
    keep: Duration,
    older: Duration,
) -> Result<(), TestCaseError> {
    let key = RecordKey::new(
        "",
        "POST /orders",
        IdempotencyKey::new(format!("k-{}", suffix())).unwrap(),
    );
    let digest = RequestDigest::of(b"o-1");
    let fence = store
        .acquire(&key, &digest, lease)
        .await
        .unwrap()
        .fence()
        .unwrap();
    match store.acquire(&key, &digest, lease).await.unwrap() {
        Acquire::InFlight { retry_after } => {
            prop_assert!(retry_after <= MAX_DURATION, "{retry_after:?}");
            if let Some(RecordState::Processing { lease_left }) =
                store.inspect(&key).await.unwrap().map(|v| v.state)
            {
                prop_assert!(lease_left <= MAX_DURATION, "{lease_left:?}");
            }
            store.renew(&key, fence, renewal).await.unwrap();
            let done =
                StoredResponse::new(StatusCode::CREATED, &http::HeaderMap::new(), "o-1".into());
            store.complete(&key, fence, &done, retention).await.unwrap();
        }
        // A lease too short to see: the second request took the record over.
        taken => prop_assert!(taken.fence().is_some(), "{taken:?}"),
    }
    store.expired(keep, 10).await.unwrap();
    store.sweep(keep).await.unwrap();
    store.stuck(older, 10).await.unwrap();
    Ok(())
}

/// Each duration setting of the server half refuses more than `MAX_DURATION`, naming itself,
/// and takes `MAX_DURATION` itself.
#[test]
fn every_duration_setting_is_at_most_ten_years() {
    let over = MAX_DURATION + Duration::from_nanos(1);
    let store = MemoryStore::new;
    let idem = || IdempotencyLayer::builder(store());
    // Each setting: its name, a build with one nanosecond over, a build with the bound.
    type Check = (
        &'static str,
        Result<(), ConfigError>,
        Result<(), ConfigError>,
    );
    let checks: Vec<Check> = vec![
        (
            "server deadline maximum",
            ServerDeadlineLayer::builder().max(over).build().map(drop),
            ServerDeadlineLayer::builder()
                .max(MAX_DURATION)
                .build()
                .map(drop),
        ),
        (
            "server deadline minimum",
            ServerDeadlineLayer::builder().min(over).build().map(drop),
            ServerDeadlineLayer::builder()
                .min(MAX_DURATION)
                .build()
                .map(drop),
        ),
        (
            "aimd latency target",
            AdaptiveLimitLayer::builder()
                .algorithm(Aimd::new().latency_target(over))
                .build()
                .map(drop),
            AdaptiveLimitLayer::builder()
                .algorithm(Aimd::new().latency_target(MAX_DURATION))
                .build()
                .map(drop),
        ),
        (
            "idempotency lease",
            idem().lease(over).build().map(drop),
            idem().lease(MAX_DURATION).build().map(drop),
        ),
        (
            "idempotency lease renewal",
            idem().renew_for(over).build().map(drop),
            idem().renew_for(MAX_DURATION).build().map(drop),
        ),
        (
            "idempotency in-flight retry-after",
            idem().in_flight_retry_after(over).build().map(drop),
            idem().in_flight_retry_after(MAX_DURATION).build().map(drop),
        ),
        (
            "idempotency retention",
            idem().retention(over).build().map(drop),
            idem().retention(MAX_DURATION).build().map(drop),
        ),
    ];
    for (setting, refused, taken) in checks {
        let err = refused.unwrap_err();
        assert_eq!(err.setting(), setting);
        assert_eq!(
            err.to_string(),
            format!("invalid {setting}: must be at most ten years")
        );
        taken.unwrap_or_else(|e| panic!("{setting}: {e}"));
    }
    // The limit's refusals keep their own bound, an hour.
    let err = AdaptiveLimitLayer::builder()
        .retry_after(over)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "limit retry-after");
    // The recheck's infallible `new` clamps: ten years left is enough for any `needs`.
    paused(async {
        let handler = service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        });
        let mut svc = RecheckLayer::new(Duration::MAX).layer(handler);
        let mut req = Request::new(());
        req.extensions_mut().insert(Deadline::after(MAX_DURATION));
        let res = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    });
}
