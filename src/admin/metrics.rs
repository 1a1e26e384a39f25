//! The admin's gauges: what waits for a person, as OpenTelemetry observable gauges.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use opentelemetry::metrics::{Meter, ObservableGauge};
use opentelemetry::KeyValue;

use super::Admin;

/// What the last [`refresh`](AdminMetrics::refresh) read; `None` for a store the admin was not
/// given (its gauges then report nothing).
#[derive(Clone, Debug, Default)]
struct Snapshot {
    open: Option<u64>,
    manual: Option<u64>,
    oldest: Option<f64>,
    quarantine: Option<u64>,
    unknown: Option<u64>,
    stuck: Option<u64>,
    tasks: Option<crate::inbox::TaskStats>,
}

/// The admin's numbers as OpenTelemetry observable gauges (features `admin` and
/// `opentelemetry`), made by [`Admin::metrics`].
///
/// The stores are read by [`refresh`](Self::refresh) (or [`run`](Self::run), every interval),
/// never inside the SDK's collection: a collection reports the last values read, so that a
/// slow or unreachable database never holds up the export. A store that fails to answer keeps
/// its last values and is logged (`tracing` warning).
///
/// | name | unit | what |
/// | --- | --- | --- |
/// | `surely.admin.ledger.open` | `{entry}` | ledger entries waiting for a reconciler (open and claimed) |
/// | `surely.admin.ledger.manual` | `{entry}` | ledger entries in the manual queue |
/// | `surely.admin.ledger.oldest_age` | `s` | the oldest unsettled entry's age (0 without any) |
/// | `surely.admin.outbox.quarantine` | `{event}` | quarantined outbox events |
/// | `surely.admin.idempotency.unknown` | `{record}` | `UNKNOWN` idempotency records (at most 1,000 counted) |
/// | `surely.admin.idempotency.stuck` | `{record}` | records processing for longer than the admin's `stuck_after` (at most 1,000 counted) |
/// | `surely.admin.tasks` | `{task}` | the inbox's tasks, by `state` (`waiting`, `manual`) and `reason` (`transient`, `paced`, `business`, `person`), one point per pair that has tasks; tasks whose reason this version does not know under `reason` `unknown` |
/// | `surely.admin.tasks.oldest_age` | `s` | the oldest task's age (since its first wait, or a person's retry), by `state` and `reason` |
///
/// ```
/// use std::time::Duration;
/// use surely::admin::Admin;
/// use surely::ledger::MemoryLedger;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let meter = opentelemetry::global::meter("orders");
/// let admin = Admin::builder().ledger(MemoryLedger::new()).build();
/// let metrics = admin.metrics(&meter);
/// metrics.refresh().await;
/// // In a service: tokio::spawn(metrics.run(Duration::from_secs(30), shutdown));
/// # }
/// ```
#[derive(Debug)]
pub struct AdminMetrics {
    admin: Admin,
    snapshot: Arc<Mutex<Snapshot>>,
    _gauges: ([ObservableGauge<u64>; 5], ObservableGauge<f64>),
    _tasks: (ObservableGauge<u64>, ObservableGauge<f64>),
}

/// A task count's attributes: its state and reason codes.
fn task_attributes(c: &crate::inbox::TaskCount) -> [KeyValue; 2] {
    [
        KeyValue::new("state", c.state.code()),
        KeyValue::new("reason", c.reason.code()),
    ]
}

fn lock(s: &Mutex<Snapshot>) -> MutexGuard<'_, Snapshot> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl Admin {
    /// Registers the admin's gauges on `meter`; see [`AdminMetrics`].
    pub fn metrics(&self, meter: &Meter) -> AdminMetrics {
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let gauge = |name: &'static str,
                     unit: &'static str,
                     description: &'static str,
                     read: fn(&Snapshot) -> Option<u64>| {
            let snapshot = snapshot.clone();
            meter
                .u64_observable_gauge(name)
                .with_unit(unit)
                .with_description(description)
                .with_callback(move |observer| {
                    if let Some(v) = read(&lock(&snapshot)) {
                        observer.observe(v, &[]);
                    }
                })
                .build()
        };
        let counts = [
            gauge(
                "surely.admin.ledger.open",
                "{entry}",
                "Ledger entries waiting for a reconciler (open and claimed)",
                |s| s.open,
            ),
            gauge(
                "surely.admin.ledger.manual",
                "{entry}",
                "Ledger entries in the manual queue",
                |s| s.manual,
            ),
            gauge(
                "surely.admin.outbox.quarantine",
                "{event}",
                "Quarantined outbox events",
                |s| s.quarantine,
            ),
            gauge(
                "surely.admin.idempotency.unknown",
                "{record}",
                "UNKNOWN idempotency records",
                |s| s.unknown,
            ),
            gauge(
                "surely.admin.idempotency.stuck",
                "{record}",
                "Idempotency records processing past the admin's threshold",
                |s| s.stuck,
            ),
        ];
        let oldest = {
            let snapshot = snapshot.clone();
            meter
                .f64_observable_gauge("surely.admin.ledger.oldest_age")
                .with_unit("s")
                .with_description("The oldest unsettled ledger entry's age")
                .with_callback(move |observer| {
                    if let Some(v) = lock(&snapshot).oldest {
                        observer.observe(v, &[]);
                    }
                })
                .build()
        };
        let tasks = {
            let snapshot = snapshot.clone();
            meter
                .u64_observable_gauge("surely.admin.tasks")
                .with_unit("{task}")
                .with_description("The inbox's tasks, by state and reason")
                .with_callback(move |observer| {
                    if let Some(stats) = &lock(&snapshot).tasks {
                        for c in &stats.counts {
                            observer.observe(c.tasks, &task_attributes(c));
                        }
                        if stats.unknown > 0 {
                            observer.observe(stats.unknown, &[KeyValue::new("reason", "unknown")]);
                        }
                    }
                })
                .build()
        };
        let tasks_oldest = {
            let snapshot = snapshot.clone();
            meter
                .f64_observable_gauge("surely.admin.tasks.oldest_age")
                .with_unit("s")
                .with_description("The oldest task's age, by state and reason")
                .with_callback(move |observer| {
                    if let Some(stats) = &lock(&snapshot).tasks {
                        for c in &stats.counts {
                            observer.observe(c.oldest.as_secs_f64(), &task_attributes(c));
                        }
                    }
                })
                .build()
        };
        AdminMetrics {
            admin: self.clone(),
            snapshot,
            _gauges: (counts, oldest),
            _tasks: (tasks, tasks_oldest),
        }
    }
}

impl AdminMetrics {
    /// Reads the stores once, for the gauges' next collection.
    pub async fn refresh(&self) {
        let inner = &self.admin.inner;
        let mut next = lock(&self.snapshot).clone();
        if let Some(ledger) = &inner.ledger {
            match ledger.stats().await {
                Ok(s) => {
                    next.open = Some(s.open + s.claimed);
                    next.manual = Some(s.manual);
                    next.oldest = Some(s.oldest_unsettled.unwrap_or_default().as_secs_f64());
                }
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "admin metrics: the ledger did not answer"
                ),
            }
        }
        if let Some(outbox) = &inner.outbox {
            match outbox.stats().await {
                Ok(s) => next.quarantine = Some(s.quarantined),
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "admin metrics: the outbox did not answer"
                ),
            }
        }
        if let Some(store) = &inner.idempotency {
            match store.unknowns(super::pages::MAX_LIMIT).await {
                Ok(u) => next.unknown = Some(u.len() as u64),
                Err(e) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "admin metrics: the idempotency store did not answer"
                    )
                }
            }
            match store
                .stuck(inner.stuck_after, super::pages::MAX_LIMIT)
                .await
            {
                Ok(s) => next.stuck = Some(s.len() as u64),
                Err(e) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "admin metrics: the idempotency store did not answer"
                    )
                }
            }
        }
        if let Some(tasks) = &inner.tasks {
            match tasks.stats().await {
                Ok(s) => next.tasks = Some(s),
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "admin metrics: the task store did not answer"
                ),
            }
        }
        *lock(&self.snapshot) = next;
    }

    /// Refreshes every `every` until `shutdown` completes.
    pub async fn run(self, every: Duration, shutdown: impl Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            self.refresh().await;
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    }
}
