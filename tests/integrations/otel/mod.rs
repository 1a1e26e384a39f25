//! `OtelRecorder` through a real client stack: what reaches an OpenTelemetry exporter (the SDK's
//! in-memory one, flushed by hand).

#![cfg(feature = "opentelemetry")]

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, SdkMeterProvider};
use surely::breaker::CircuitBreaker;
use surely::budget::TokenBucket;
use surely::fault::{Fault, InjectFaultLayer, Schedule};
use surely::hedge::{HedgeDelay, HedgeLayer};
use surely::record::{InMemoryRecorder, OtelRecorder, TracingRecorder};
use surely::Outcome;
use tower::{service_fn, Service, ServiceBuilder};

use crate::support::call;

#[cfg(feature = "admin")]
mod admin;
mod reconcile;
mod server;

/// A meter provider that exports to memory when flushed.
struct Metrics {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
}

impl Metrics {
    fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_periodic_exporter(exporter.clone())
            .build();
        Metrics { provider, exporter }
    }

    fn recorder(&self) -> OtelRecorder {
        OtelRecorder::new(&self.provider.meter("surely-test"))
    }

    /// Flushes, and runs `f` on the metric named `name` of the last export.
    fn with_metric<T>(&self, name: &str, f: impl FnOnce(&Metric) -> T) -> T {
        self.provider.force_flush().unwrap();
        let exported = self.exporter.get_finished_metrics().unwrap();
        let last = exported.last().expect("an export");
        let metric = last
            .scope_metrics()
            .flat_map(|s| s.metrics())
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("no metric {name}"));
        f(metric)
    }

    /// The sum of the counter `name` over the points that have every attribute of `attrs`.
    fn count(&self, name: &str, attrs: &[(&str, &str)]) -> u64 {
        self.with_metric(name, |m| match m.data() {
            AggregatedMetrics::U64(MetricData::Sum(sum)) => sum
                .data_points()
                .filter(|p| has(p.attributes(), attrs))
                .map(|p| p.value())
                .sum(),
            other => panic!("{name} is not a u64 counter: {other:?}"),
        })
    }

    /// The number of values in the histogram `name`, over the points that have `attrs`.
    fn histogram_count(&self, name: &str, attrs: &[(&str, &str)]) -> u64 {
        self.with_metric(name, |m| match m.data() {
            AggregatedMetrics::F64(MetricData::Histogram(h)) => h
                .data_points()
                .filter(|p| has(p.attributes(), attrs))
                .map(|p| p.count())
                .sum(),
            other => panic!("{name} is not an f64 histogram: {other:?}"),
        })
    }

    /// The last value of the gauge `name` at the point that has `attrs`.
    fn gauge(&self, name: &str, attrs: &[(&str, &str)]) -> Option<u64> {
        self.with_metric(name, |m| match m.data() {
            AggregatedMetrics::U64(MetricData::Gauge(g)) => g
                .data_points()
                .find(|p| has(p.attributes(), attrs))
                .map(|p| p.value()),
            other => panic!("{name} is not a u64 gauge: {other:?}"),
        })
    }

    /// The last value of the f64 gauge `name` (its only point).
    fn gauge_f64(&self, name: &str) -> Option<f64> {
        self.with_metric(name, |m| match m.data() {
            AggregatedMetrics::F64(MetricData::Gauge(g)) => {
                g.data_points().next().map(|p| p.value())
            }
            other => panic!("{name} is not an f64 gauge: {other:?}"),
        })
    }

    /// The attribute keys of every point of the u64 counter `name`.
    fn attribute_keys(&self, name: &str) -> Vec<String> {
        self.with_metric(name, |m| match m.data() {
            AggregatedMetrics::U64(MetricData::Sum(sum)) => sum
                .data_points()
                .flat_map(|p| p.attributes().map(|kv| kv.key.as_str().to_owned()))
                .collect(),
            other => panic!("{name} is not a u64 counter: {other:?}"),
        })
    }

    /// Whether the metric `name` has been exported at all.
    fn exported(&self, name: &str) -> bool {
        self.provider.force_flush().unwrap();
        let exported = self.exporter.get_finished_metrics().unwrap();
        exported.last().is_some_and(|last| {
            last.scope_metrics()
                .flat_map(|s| s.metrics())
                .any(|m| m.name() == name)
        })
    }
}

fn has<'a>(point: impl Iterator<Item = &'a KeyValue>, attrs: &[(&str, &str)]) -> bool {
    let point: Vec<_> = point.collect();
    attrs.iter().all(|(k, v)| {
        point
            .iter()
            .any(|kv| kv.key.as_str() == *k && kv.value.as_str() == *v)
    })
}

fn ok_transport(
) -> impl Service<Request<String>, Response = Response<String>, Error = io::Error> + Clone {
    service_fn(|_req: Request<String>| async { Ok(Response::new(String::from("done"))) })
}

fn post() -> Request<String> {
    Request::post("http://orders.test/orders")
        .body("o-1".to_owned())
        .unwrap()
}

fn get() -> Request<String> {
    Request::get("http://orders.test/orders/o-1")
        .body(String::new())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn an_unknown_post_is_counted_as_unknown() {
    let metrics = Metrics::new();
    let records = InMemoryRecorder::new();
    // No key: a POST whose reply was lost cannot be sent again.
    let mut client = surely::client()
        .no_idempotency_keys()
        .recorder((records.clone(), metrics.recorder()))
        .build(
            ServiceBuilder::new()
                .layer(InjectFaultLayer::new(
                    Schedule::new().at(0, Fault::ResetAfterSend),
                ))
                .service(ok_transport()),
        )
        .unwrap();

    call(&mut client, post()).await.unwrap_err();
    assert_eq!(records.calls()[0].outcome, Outcome::Unknown);

    let unknown = [
        ("surely.outcome", "unknown"),
        ("surely.stop_reason", "unknown"),
        ("http.request.method", "POST"),
    ];
    assert_eq!(metrics.count("surely.client.calls", &unknown), 1);
    assert_eq!(metrics.count("surely.client.calls", &[]), 1);
    assert_eq!(
        metrics.histogram_count("surely.client.call.duration", &unknown),
        1
    );
    assert_eq!(
        metrics.count(
            "surely.client.attempts",
            &[
                ("surely.class", "maybe committed"),
                ("surely.phase", "sent")
            ]
        ),
        1
    );
    // Nothing was retried, hedged or refused.
    assert!(!metrics.exported("surely.client.retries"));
    assert!(!metrics.exported("surely.client.hedges"));
    assert!(!metrics.exported("surely.client.budget.refusals"));

    // The next one succeeds.
    call(&mut client, post()).await.unwrap();
    let succeeded = [
        ("surely.outcome", "succeeded"),
        ("surely.stop_reason", "success"),
    ];
    assert_eq!(metrics.count("surely.client.calls", &succeeded), 1);
    assert_eq!(metrics.count("surely.client.calls", &unknown), 1);
    // One histogram value per call.
    assert_eq!(
        metrics.histogram_count("surely.client.call.duration", &[]),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_retried_get_counts_two_attempts_and_one_retry() {
    let metrics = Metrics::new();
    let mut client = surely::client()
        .recorder((TracingRecorder::new(), metrics.recorder()))
        .build(
            ServiceBuilder::new()
                .layer(InjectFaultLayer::new(
                    Schedule::new().at(0, Fault::RefuseBeforeSend),
                ))
                .service(ok_transport()),
        )
        .unwrap();

    let res = call(&mut client, get()).await.unwrap();
    assert_eq!(res.body(), "done");

    assert_eq!(metrics.count("surely.client.attempts", &[]), 2);
    assert_eq!(
        metrics.count(
            "surely.client.attempts",
            &[("surely.class", "rejected"), ("surely.phase", "not sent")]
        ),
        1
    );
    assert_eq!(
        metrics.count("surely.client.attempts", &[("surely.class", "success")]),
        1
    );
    assert_eq!(
        metrics.count(
            "surely.client.retries",
            &[
                ("http.request.method", "GET"),
                ("surely.retry.pushback", "false")
            ]
        ),
        1
    );
    assert_eq!(
        metrics.count(
            "surely.client.calls",
            &[
                ("surely.outcome", "succeeded"),
                ("http.request.method", "GET")
            ]
        ),
        1
    );
    assert_eq!(
        metrics.histogram_count("surely.client.call.duration", &[]),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_breaker_opening_and_its_refusals_are_counted() {
    let metrics = Metrics::new();
    let breaker = CircuitBreaker::builder()
        .name("orders")
        .min_throughput(2)
        .recorder(metrics.recorder())
        .build()
        .unwrap();
    let mut client = surely::client()
        .no_retry()
        .breaker(breaker)
        .recorder(metrics.recorder())
        .build(
            ServiceBuilder::new()
                .layer(InjectFaultLayer::new(
                    Schedule::new().otherwise(Fault::RefuseBeforeSend),
                ))
                .service(ok_transport()),
        )
        .unwrap();

    for _ in 0..3 {
        call(&mut client, get()).await.unwrap_err();
    }

    assert_eq!(
        metrics.count(
            "surely.client.breaker.transitions",
            &[
                ("surely.breaker", "orders"),
                ("surely.breaker.from", "closed"),
                ("surely.breaker.to", "open"),
            ]
        ),
        1
    );
    assert_eq!(
        metrics.count(
            "surely.client.breaker.rejections",
            &[
                ("surely.breaker", "orders"),
                ("surely.breaker.state", "open")
            ]
        ),
        1
    );
    let state = |s| {
        metrics.gauge(
            "surely.client.breaker.state",
            &[("surely.breaker", "orders"), ("surely.breaker.state", s)],
        )
    };
    assert_eq!(state("open"), Some(1));
    assert_eq!(state("closed"), Some(0));
    // Two attempts reached the transport; the third call was refused before any.
    assert_eq!(metrics.count("surely.client.attempts", &[]), 2);
    assert_eq!(metrics.count("surely.client.calls", &[]), 3);
    assert_eq!(
        metrics.histogram_count("surely.client.call.duration", &[]),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn a_hedge_that_won_is_counted() {
    let metrics = Metrics::new();
    // The first attempt is slow; the hedge sent after 50 ms answers at once.
    let sent = Arc::new(AtomicUsize::new(0));
    let transport = service_fn(move |_req: Request<String>| {
        let n = sent.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok::<_, io::Error>(Response::new(format!("answer {n}")))
        }
    });
    let mut client = surely::client()
        .hedge(HedgeLayer::builder().delay(HedgeDelay::fixed(Duration::from_millis(50))))
        .recorder(metrics.recorder())
        .build(transport)
        .unwrap();

    let res = call(&mut client, get()).await.unwrap();
    assert_eq!(res.body(), "answer 1");

    assert_eq!(
        metrics.count(
            "surely.client.hedges",
            &[("surely.class", "success"), ("surely.hedge.won", "true")]
        ),
        1
    );
    assert_eq!(metrics.count("surely.client.hedges", &[]), 1);
    assert_eq!(metrics.count("surely.client.attempts", &[]), 2);
    // A hedge is not a retry.
    assert!(!metrics.exported("surely.client.retries"));
    assert_eq!(
        metrics.histogram_count("surely.client.call.duration", &[]),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_retry_the_budget_refused_is_counted() {
    let metrics = Metrics::new();
    // One token: the first failure spends it, and the budget refuses the retry.
    let mut client = surely::client()
        .budget(Arc::new(
            TokenBucket::builder()
                .max_tokens(1)
                .token_ratio(0.1)
                .build()
                .unwrap(),
        ))
        .no_breaker()
        .recorder(metrics.recorder())
        .build(
            ServiceBuilder::new()
                .layer(InjectFaultLayer::new(
                    Schedule::new().otherwise(Fault::RefuseBeforeSend),
                ))
                .service(ok_transport()),
        )
        .unwrap();

    call(&mut client, get()).await.unwrap_err();

    let refused = metrics.count(
        "surely.client.calls",
        &[
            ("surely.outcome", "failed"),
            ("surely.stop_reason", "budget exhausted"),
        ],
    );
    assert_eq!(refused, 1);
    assert_eq!(
        metrics.count(
            "surely.client.budget.refusals",
            &[("http.request.method", "GET")]
        ),
        1
    );
}
