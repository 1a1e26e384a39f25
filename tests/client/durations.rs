//! Every duration setting of the client layers, and of the client's configuration, driven with
//! values up to `Duration::MAX`: a builder refuses one past `MAX_DURATION` (ten years) with a
//! `ConfigError` that names the setting, a layer's infallible `new` clamps it, and whatever
//! builds takes a call under paused time without a panic. One property per component; the
//! record layers take no duration, and the fault layer's delays are a caller's, waited out.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use proptest::prelude::*;
use surely::breaker::{BreakerLayer, CircuitBreaker, SlidingWindow};
use surely::budget::{RatioBudget, RetryBudget, TokenBucket};
use surely::deadline::SetDeadlineLayer;
use surely::fault::{Fault, InjectFaultLayer};
use surely::hedge::{HedgeDelay, HedgeLayer};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::timeout::{AttemptTimeoutLayer, BodyIdleTimeoutLayer};
use surely::{ConfigError, MAX_DURATION};
use tower::{service_fn, Layer, Service, ServiceExt};

/// Durations of every size: zero, short, around `MAX_DURATION`, anything, `Duration::MAX`.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        1 => Just(Duration::ZERO),
        3 => (1u64..5_000_000_000).prop_map(Duration::from_nanos),
        2 => (0u64..=2_000_000).prop_map(|ns| MAX_DURATION - Duration::from_nanos(ns)),
        2 => (1u64..=2_000_000).prop_map(|ns| MAX_DURATION + Duration::from_nanos(ns)),
        2 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        1 => Just(MAX_DURATION),
        1 => Just(Duration::MAX),
    ]
}

/// Runs `fut` on a current-thread runtime whose clock is paused: a wait of years passes at once.
fn paused<F: Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime")
        .block_on(fut)
}

/// Asserts that a refusal names one of `settings`, and that a duration past `MAX_DURATION`
/// among `given` was refused.
fn refused_by_name<T>(
    built: &Result<T, ConfigError>,
    given: &[Duration],
    settings: &[&str],
) -> Result<(), TestCaseError> {
    if let Err(e) = built {
        prop_assert!(
            settings.contains(&e.setting()),
            "refused as {:?}, not one of {settings:?}",
            e.setting()
        );
    }
    if given.iter().any(|d| *d > MAX_DURATION) {
        prop_assert!(built.is_err(), "a duration past MAX_DURATION was taken");
    }
    Ok(())
}

/// A transport that answers after `latency` with `status`.
fn answering(
    latency: Duration,
    status: u16,
) -> impl Service<
    Request<()>,
    Response = Response<()>,
    Error = std::io::Error,
    Future = impl Future<Output = Result<Response<()>, std::io::Error>>,
> + Clone {
    service_fn(move |_req: Request<()>| async move {
        tokio::time::sleep(latency).await;
        Ok(Response::builder().status(status).body(()).unwrap())
    })
}

/// A transport that refuses every other connection, the first one first.
fn refusing_every_other() -> impl Service<
    Request<()>,
    Response = Response<()>,
    Error = std::io::Error,
    Future = impl Future<Output = Result<Response<()>, std::io::Error>>,
> + Clone {
    let calls = Arc::new(AtomicU32::new(0));
    service_fn(move |_req: Request<()>| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if n.is_multiple_of(2) {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
            }
            Ok(Response::new(()))
        }
    })
}

/// A response body whose one frame comes after a wait.
struct Late {
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Late {
    fn new(latency: Duration) -> Self {
        Late {
            sleep: Some(Box::pin(tokio::time::sleep(latency))),
        }
    }
}

impl http_body::Body for Late {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        let Some(sleep) = self.sleep.as_mut() else {
            return Poll::Ready(None);
        };
        std::task::ready!(sleep.as_mut().poll(cx));
        self.sleep = None;
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b"o-1")))))
    }
}

fn get() -> Request<()> {
    Request::get("/orders/o-1").body(()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn deadline(timeout in duration(), reserve in duration(), latency in duration()) {
        // `new` never fails; its timeout is within what the builder takes.
        let layer = SetDeadlineLayer::new(timeout);
        let own = layer.timeout().unwrap();
        prop_assert!(own >= Duration::from_millis(2) && own <= MAX_DURATION);
        paused(async {
            let _ = layer.layer(answering(latency, 200)).oneshot(get()).await;
        });
        let built = SetDeadlineLayer::builder().timeout(timeout).reserve(reserve).build();
        refused_by_name(&built, &[timeout], &["deadline timeout", "deadline reserve"])?;
        if let Ok(layer) = built {
            paused(async {
                let _ = layer.layer(answering(latency, 200)).oneshot(get()).await;
            });
        }
    }

    #[test]
    fn timeout(per_try in duration(), idle in duration(), latency in duration()) {
        let layer = AttemptTimeoutLayer::new(per_try);
        prop_assert!(layer.per_try().is_some_and(|d| !d.is_zero() && d <= MAX_DURATION));
        paused(async {
            let _ = layer.layer(answering(latency, 200)).oneshot(get()).await;
        });
        let built = AttemptTimeoutLayer::builder().per_try(per_try).build();
        refused_by_name(&built, &[per_try], &["attempt timeout"])?;
        if let Ok(layer) = built {
            paused(async {
                let _ = layer.layer(answering(latency, 200)).oneshot(get()).await;
            });
        }

        let layer = BodyIdleTimeoutLayer::new(idle);
        prop_assert!(!layer.idle().is_zero() && layer.idle() <= MAX_DURATION);
        let built = BodyIdleTimeoutLayer::builder().idle(idle).build();
        refused_by_name(&built, &[idle], &["body idle timeout"])?;
        for layer in [Some(layer), built.ok()].into_iter().flatten() {
            // A body that waits `latency` for its one frame.
            let server = service_fn(move |_req: Request<()>| async move {
                Ok::<_, std::io::Error>(Response::new(Late::new(latency)))
            });
            paused(async {
                let res = layer.layer(server).oneshot(get()).await.unwrap();
                let _ = res.into_body().collect().await;
            });
        }
    }

    #[test]
    fn retry(
        max_pushback in duration(),
        min_attempt in duration(),
        base in duration(),
        cap in duration(),
        deadline in duration(),
    ) {
        let backoff = Backoff::exponential(base).cap(cap).build();
        let mut builder = RetryLayer::builder()
            .max_pushback(max_pushback)
            .min_attempt_time(min_attempt);
        if let Ok(backoff) = backoff.clone() {
            builder = builder.backoff(backoff);
        }
        let built = builder.build();
        let mut given = vec![max_pushback, min_attempt];
        if backoff.is_ok() {
            given.extend([base, cap]);
        }
        refused_by_name(
            &built,
            &given,
            &[
                "retry max pushback",
                "retry minimum attempt time",
                "retry backoff base delay",
                "retry backoff cap",
            ],
        )?;
        if let Ok(layer) = built {
            paused(async {
                // Refused, then answered: the retry waits its backoff, within the deadline.
                let svc = SetDeadlineLayer::new(deadline).layer(layer.layer(refusing_every_other()));
                let _ = svc.oneshot(get()).await;
                // A 503 with `Retry-After: 1`: the server's pushback, against the cap.
                let svc = SetDeadlineLayer::new(deadline).layer(
                    RetryLayer::builder()
                        .max_pushback(max_pushback.min(MAX_DURATION))
                        .build()
                        .unwrap()
                        .layer(service_fn(|_req: Request<()>| async {
                            Ok::<_, std::io::Error>(
                                Response::builder()
                                    .status(503)
                                    .header(http::header::RETRY_AFTER, "1")
                                    .body(())
                                    .unwrap(),
                            )
                        })),
                );
                let _ = svc.oneshot(get()).await;
            });
        }
    }

    #[test]
    fn hedge(
        delay in duration(),
        fallback in duration(),
        min_attempt in duration(),
        latency in duration(),
        fixed in any::<bool>(),
    ) {
        let delay_setting = if fixed {
            HedgeDelay::fixed(delay)
        } else {
            HedgeDelay::percentile(95.0).fallback(fallback).min_samples(1).window(4)
        };
        let built = HedgeLayer::builder()
            .delay(delay_setting)
            .min_attempt_time(min_attempt)
            .build();
        let given = if fixed { [delay, min_attempt] } else { [fallback, min_attempt] };
        refused_by_name(
            &built,
            &given,
            &["hedge delay", "hedge delay fallback", "hedge minimum attempt time"],
        )?;
        if let Ok(layer) = built {
            paused(async {
                let svc = layer.layer(answering(latency, 200));
                for _ in 0..3 {
                    let _ = svc.clone().oneshot(get()).await;
                }
            });
        }
    }

    #[test]
    fn breaker(
        slow_call in duration(),
        break_duration in duration(),
        max_break in duration(),
        length in duration(),
        evidence in duration(),
        time_window in any::<bool>(),
    ) {
        let window = if time_window {
            SlidingWindow::Time { length, buckets: 4 }
        } else {
            SlidingWindow::Count(4)
        };
        let built = CircuitBreaker::builder()
            .window(window)
            .min_throughput(2)
            .slow_call_threshold(Some(slow_call))
            .break_duration(break_duration)
            .break_growth(2.0, max_break)
            .min_timeout_evidence(evidence)
            .build();
        let mut given = vec![slow_call, break_duration, max_break, evidence];
        if time_window {
            given.push(length);
        }
        refused_by_name(
            &built,
            &given,
            &[
                "breaker slow-call threshold",
                "breaker break duration",
                "breaker maximum break",
                "breaker time window",
                "breaker minimum timeout evidence",
            ],
        )?;
        if let Ok(breaker) = built {
            paused(async {
                // Open it, come back after the break, fail the probe: a longer break.
                let svc = BreakerLayer::new(breaker.clone()).layer(answering(Duration::ZERO, 503));
                for _ in 0..4 {
                    let _ = svc.clone().oneshot(get()).await;
                }
                tokio::time::sleep(max_break.max(break_duration)).await;
                for _ in 0..3 {
                    let _ = svc.clone().oneshot(get()).await;
                }
                breaker.reset();
                let _ = svc.oneshot(get()).await;
            });
        }
    }

    #[test]
    fn fault(delay in duration(), hold in duration(), latency in duration()) {
        // A caller's delays, injected: waited out under paused time, never a panic.
        let faults = surely::fault::Schedule::new()
            .at(0, Fault::Delay(delay))
            .at(1, Fault::DelayReply(hold));
        let svc = InjectFaultLayer::new(faults).layer(answering(latency, 200));
        paused(async {
            for _ in 0..2 {
                let _ = svc.clone().oneshot(get()).await;
            }
        });
    }

    #[test]
    fn budget(ttl in duration(), max_tokens in any::<u32>(), token_ratio in any::<f64>()) {
        let built = RatioBudget::builder().ttl(ttl).build();
        if ttl > MAX_DURATION {
            prop_assert!(built.is_err());
        }
        if let Err(e) = &built {
            prop_assert_eq!(e.setting(), "retry budget ttl");
        }
        let bucket = TokenBucket::builder().max_tokens(max_tokens).token_ratio(token_ratio).build();
        paused(async {
            for budget in [built.ok().map(|b| Arc::new(b) as Arc<dyn RetryBudget>),
                bucket.ok().map(|b| Arc::new(b) as Arc<dyn RetryBudget>)].into_iter().flatten()
            {
                budget.deposit();
                let _ = budget.withdraw();
                tokio::time::sleep(ttl.min(MAX_DURATION)).await;
                let _ = budget.withdraw();
            }
        });
    }

    #[test]
    fn client(timeout in duration(), per_try in duration(), idle in duration(), latency in duration()) {
        let built = surely::client()
            .timeout(timeout)
            .per_try_timeout(per_try)
            .body_idle_timeout(idle)
            .build(service_fn(move |_req: Request<String>| async move {
                tokio::time::sleep(latency).await;
                Ok::<_, std::io::Error>(Response::new(Full::new(Bytes::from_static(b"o-1"))))
            }));
        refused_by_name(
            &built,
            &[timeout, per_try, idle],
            &["deadline timeout", "attempt timeout", "body idle timeout"],
        )?;
        if let Ok(svc) = built {
            paused(async {
                let req = Request::get("/orders/o-1").body(String::new()).unwrap();
                if let Ok(res) = svc.oneshot(req).await {
                    let _ = res.into_body().collect().await;
                }
            });
        }
    }
}

#[cfg(feature = "serde")]
mod config {
    use super::*;
    use surely::config::{ClientConfig, HedgeConfig, WindowConfig};

    /// How to set one key of a configuration.
    type Set = fn(&mut ClientConfig, Duration);

    /// Every duration key of the configuration, and how to set it.
    fn keys() -> Vec<(&'static str, Set)> {
        vec![
            ("timeout", |c, d| c.timeout = Some(d)),
            ("per_try_timeout", |c, d| c.per_try_timeout = Some(d)),
            ("body_idle_timeout", |c, d| c.body_idle_timeout = Some(d)),
            ("retry.max_pushback", |c, d| c.retry.max_pushback = Some(d)),
            ("retry.min_attempt_time", |c, d| {
                c.retry.min_attempt_time = Some(d)
            }),
            ("retry.backoff.base", |c, d| c.retry.backoff.base = Some(d)),
            ("retry.backoff.max", |c, d| c.retry.backoff.max = Some(d)),
            ("budget.ttl", |c, d| c.budget.ttl = Some(d)),
            ("breaker.slow_call_threshold", |c, d| {
                c.breaker.slow_call_threshold = Some(d)
            }),
            ("breaker.break_duration", |c, d| {
                c.breaker.break_duration = Some(d)
            }),
            ("breaker.max_break", |c, d| c.breaker.max_break = Some(d)),
            ("breaker.min_timeout_evidence", |c, d| {
                c.breaker.min_timeout_evidence = Some(d)
            }),
            ("breaker.window.length", |c, d| {
                let mut window = WindowConfig::default();
                window.length = Some(d);
                c.breaker.window = Some(window);
            }),
            ("hedge.delay", |c, d| {
                let mut hedge = HedgeConfig::default();
                hedge.delay = Some(d);
                c.hedge = Some(hedge);
            }),
            ("hedge.fallback", |c, d| {
                let mut hedge = HedgeConfig::default();
                hedge.fallback = Some(d);
                c.hedge = Some(hedge);
            }),
            ("hedge.min_attempt_time", |c, d| {
                let mut hedge = HedgeConfig::default();
                hedge.min_attempt_time = Some(d);
                c.hedge = Some(hedge);
            }),
        ]
    }

    /// A transport that answers after `latency`, with a body.
    fn transport(
        latency: Duration,
    ) -> impl Service<
        Request<String>,
        Response = Response<Full<Bytes>>,
        Error = std::io::Error,
        Future = impl Future<Output = Result<Response<Full<Bytes>>, std::io::Error>>,
    > + Clone {
        service_fn(move |_req: Request<String>| async move {
            tokio::time::sleep(latency).await;
            Ok(Response::new(Full::new(Bytes::from_static(b"o-1"))))
        })
    }

    /// One call through `svc`, its body read.
    async fn drive<S, B>(svc: S)
    where
        S: Service<Request<String>, Response = Response<B>>,
        B: http_body::Body,
    {
        let req = Request::get("/orders/o-1").body(String::new()).unwrap();
        if let Ok(res) = svc.oneshot(req).await {
            let _ = res.into_body().collect().await;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Each key alone: past ten years, refused by its path; otherwise refused by its path
        /// or built, and a built client takes a call.
        #[test]
        fn config_keys(d in duration(), latency in duration()) {
            for (path, set) in keys() {
                let mut config = ClientConfig::default();
                set(&mut config, d);
                let base = surely::client().body_idle_timeout(Duration::from_secs(1));
                let built = if config.hedge.is_some() {
                    config
                        .apply_hedged(base)
                        .and_then(|b| b.build(transport(latency)))
                        .map(|svc| paused(drive(svc)))
                } else {
                    config
                        .apply(base)
                        .and_then(|b| b.build(transport(latency)))
                        .map(|svc| paused(drive(svc)))
                };
                if d > MAX_DURATION {
                    let e = built.as_ref().err();
                    prop_assert_eq!(e.map(ConfigError::setting), Some(path), "{:?}", e);
                } else if let Err(e) = &built {
                    // Within the bound, a key may still break a rule it shares with another,
                    // which the refusal may name: the break and the longest break; a timeout
                    // no longer than the deadline layer's reserve, which the file does not set.
                    let related = match path {
                        "breaker.break_duration" => "breaker.max_break",
                        "timeout" => "deadline reserve",
                        other => other,
                    };
                    prop_assert!(
                        e.setting() == path || e.setting() == related,
                        "{} = {:?}: {:?}",
                        path,
                        d,
                        e
                    );
                }
            }
        }
    }
}
