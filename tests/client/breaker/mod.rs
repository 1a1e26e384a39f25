//! The circuit breaker: every transition, under paused time; the probe limit under a
//! multi-threaded runtime; and the breaker inside a retry layer with a deadline.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use surely::breaker::{
    BreakerLayer, BreakerState, CircuitBreaker, CircuitBreakerBuilder, SlidingWindow, WindowCounts,
};
use surely::classify::{AttemptClass, BoxError, ClassifyError, DeliveryPhase};
use surely::deadline::SetDeadlineLayer;
use surely::pushback::Pushback;
use surely::record::BreakerEventKind;
use surely::record::TransitionReason;
use surely::record::{InMemoryRecorder, RecordCallLayer};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::Error;
use surely::Outcome;
use surely::StopReason;
use tokio::time::{advance, Instant};
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

mod in_retry;

const BREAK: Duration = Duration::from_secs(5);

/// A dependency whose answer, delay and call count the test controls.
#[derive(Clone, Default)]
struct Backend {
    status: Arc<AtomicU16>,
    delay_ms: Arc<AtomicU64>,
    calls: Arc<AtomicUsize>,
}

type Svc = BoxCloneService<Request<()>, Response<()>, Error<std::io::Error>>;

impl Backend {
    fn new() -> Self {
        let b = Backend::default();
        b.answer(200);
        b
    }

    fn answer(&self, status: u16) {
        self.status.store(status, SeqCst);
    }

    fn delay(&self, d: Duration) {
        self.delay_ms.store(d.as_millis() as u64, SeqCst);
    }

    fn calls(&self) -> usize {
        self.calls.load(SeqCst)
    }

    fn service(
        &self,
    ) -> impl Service<
        Request<()>,
        Response = Response<()>,
        Error = std::io::Error,
        Future = impl std::future::Future<Output = std::io::Result<Response<()>>> + Send + use<>,
    > + Clone
           + Send
           + use<> {
        let b = self.clone();
        tower::service_fn(move |_req: Request<()>| {
            let b = b.clone();
            async move {
                b.calls.fetch_add(1, SeqCst);
                let delay = b.delay_ms.load(SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                let status = b.status.load(SeqCst);
                Ok(Response::builder().status(status).body(()).unwrap())
            }
        })
    }

    /// The backend behind a breaker.
    fn guarded(&self, breaker: &CircuitBreaker) -> Svc {
        BoxCloneService::new(BreakerLayer::new(breaker.clone()).layer(self.service()))
    }
}

/// A count window of 10, opening at 50% with at least 4 calls, a fixed 5 s break without
/// jitter, recording into `rec`.
fn builder(rec: &InMemoryRecorder) -> CircuitBreakerBuilder {
    CircuitBreaker::builder()
        .window(SlidingWindow::Count(10))
        .min_throughput(4)
        .failure_ratio(0.5)
        .break_duration(BREAK)
        .jitter(0.0)
        .recorder(rec.clone())
}

async fn call(svc: &mut Svc) -> Result<Response<()>, Error<std::io::Error>> {
    svc.ready().await?.call(Request::new(())).await
}

/// Calls and returns the status, panicking on a refusal.
async fn status(svc: &mut Svc) -> u16 {
    call(svc).await.expect("an answer").status().as_u16()
}

/// The state transitions recorded so far, as (from, to, reason).
fn transitions(rec: &InMemoryRecorder) -> Vec<(BreakerState, BreakerState, TransitionReason)> {
    rec.breaker_events()
        .iter()
        .filter_map(|e| match e.kind {
            BreakerEventKind::Transition {
                from, to, reason, ..
            } => Some((from, to, reason)),
            _ => None,
        })
        .collect()
}

fn break_durations(rec: &InMemoryRecorder) -> Vec<Duration> {
    rec.breaker_events()
        .iter()
        .filter_map(|e| match e.kind {
            BreakerEventKind::Transition { break_duration, .. } => break_duration,
            _ => None,
        })
        .collect()
}

/// Opens the breaker with 503s (four from an empty window).
async fn open_it(backend: &Backend, svc: &mut Svc, breaker: &CircuitBreaker) {
    backend.answer(503);
    for _ in 0..10 {
        assert_eq!(status(svc).await, 503);
        if breaker.state() == BreakerState::Open {
            return;
        }
    }
    panic!("the breaker did not open");
}

#[tokio::test(start_paused = true)]
async fn closed_opens_when_the_failure_ratio_is_reached_with_the_minimum_throughput() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).name("payments").build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);

    assert_eq!(status(&mut svc).await, 200);
    assert_eq!(status(&mut svc).await, 200);
    backend.answer(503);
    assert_eq!(status(&mut svc).await, 503);
    // 1 failure in 3 calls: under the minimum throughput.
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(status(&mut svc).await, 503);
    // 2 in 4: 50%, with 4 calls.
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(
        transitions(&rec),
        [(
            BreakerState::Closed,
            BreakerState::Open,
            TransitionReason::FailureRate {
                failures: 2,
                calls: 4
            }
        )]
    );
    let event = &rec.breaker_events()[0];
    assert_eq!(event.breaker.as_deref(), Some("payments"));
    assert_eq!(break_durations(&rec), [BREAK]);
    assert_eq!(
        event.to_string(),
        "breaker payments: closed -> open (2 failures in 4 calls), break 5000ms"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_burst_below_the_minimum_throughput_does_not_open() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).min_throughput(10).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    backend.answer(503);
    for _ in 0..9 {
        assert_eq!(status(&mut svc).await, 503);
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(breaker.window(), WindowCounts::new(9, 9));
    assert!(transitions(&rec).is_empty());
    // The tenth reaches the minimum throughput.
    assert_eq!(status(&mut svc).await, 503);
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn final_answers_and_conflicts_are_not_failures() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    for code in [404, 409, 400, 422, 404, 409, 404, 409] {
        backend.answer(code);
        assert_eq!(status(&mut svc).await, code);
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(breaker.window().failures, 0);
    // 429 and 500 are: the last 10 calls hold 5 of them after the fifth.
    for code in [429, 500, 429, 500] {
        backend.answer(code);
        assert_eq!(status(&mut svc).await, code);
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(status(&mut svc).await, 500);
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn transport_errors_are_classified_too() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let mut svc =
        BreakerLayer::new(breaker.clone()).layer(tower::service_fn(move |_req: Request<()>| {
            counted.fetch_add(1, SeqCst);
            async {
                Err::<Response<()>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            }
        }));
    for _ in 0..4 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap_err();
        assert!(err.is_transport());
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap_err();
    assert!(err.is_circuit_open());
    assert_eq!(calls.load(SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_rejects_at_once_without_calling_the_service() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    open_it(&backend, &mut svc, &breaker).await;
    backend.answer(200);

    let start = Instant::now();
    let err = call(&mut svc).await.unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(backend.calls(), 4);
    let open = *err.circuit_open().expect("a breaker refusal");
    assert_eq!(open.state(), BreakerState::Open);
    assert_eq!(open.retry_after(), Some(BREAK));
    assert_eq!(err.local_phase(), Some(DeliveryPhase::NotSent));
    assert_eq!(err.to_string(), "circuit breaker open: retry after 5000ms");

    advance(Duration::from_secs(2)).await;
    let err = call(&mut svc).await.unwrap_err();
    let open = err.circuit_open().unwrap();
    assert_eq!(open.retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(open.retry_at(), Some(start + BREAK));
    assert_eq!(backend.calls(), 4);

    // Both refusals were recorded.
    let rejected: Vec<_> = rec
        .breaker_events()
        .into_iter()
        .filter(|e| e.is_rejection())
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        rejected,
        [
            BreakerEventKind::Rejected {
                state: BreakerState::Open,
                retry_after: Some(BREAK)
            },
            BreakerEventKind::Rejected {
                state: BreakerState::Open,
                retry_after: Some(Duration::from_secs(3))
            },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_open_error_is_rejected_not_sent_with_the_remaining_break_as_pushback() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    open_it(&backend, &mut svc, &breaker).await;
    advance(Duration::from_secs(1)).await;
    let err = call(&mut svc).await.unwrap_err();
    for phase in [DeliveryPhase::Sent, DeliveryPhase::ResponseStarted] {
        let c = err.classify_error(phase);
        assert_eq!(c.class(), AttemptClass::Rejected);
        assert_eq!(c.phase(), DeliveryPhase::NotSent);
        assert_eq!(c.pushback(), Some(Pushback::After(Duration::from_secs(4))));
        assert!(c.is_retryable(surely::Semantics::NonIdempotent));
    }
    // Boxed, as tower's layers box errors: found along the chain.
    let boxed: BoxError = Box::new(err);
    let c = boxed.classify_error(DeliveryPhase::Sent);
    assert_eq!(
        (c.class(), c.phase()),
        (AttemptClass::Rejected, DeliveryPhase::NotSent)
    );
    assert_eq!(c.pushback(), Some(Pushback::After(Duration::from_secs(4))));
}

#[tokio::test(start_paused = true)]
async fn after_the_break_a_probe_goes_through_and_its_success_closes() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    open_it(&backend, &mut svc, &breaker).await;
    backend.answer(200);

    advance(BREAK - Duration::from_millis(1)).await;
    assert!(call(&mut svc).await.unwrap_err().is_circuit_open());
    advance(Duration::from_millis(1)).await;
    // Still open until a call comes.
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(status(&mut svc).await, 200);
    assert_eq!(backend.calls(), 5);
    assert_eq!(breaker.state(), BreakerState::Closed);
    // Closed with an empty window: one more failure does not reopen it.
    assert_eq!(breaker.window(), WindowCounts::default());
    backend.answer(503);
    assert_eq!(status(&mut svc).await, 503);
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(
        transitions(&rec)
            .into_iter()
            .map(|(from, to, reason)| (from, to, reason.to_string()))
            .collect::<Vec<_>>(),
        [
            (
                BreakerState::Closed,
                BreakerState::Open,
                "4 failures in 4 calls".to_owned()
            ),
            (
                BreakerState::Open,
                BreakerState::HalfOpen,
                "break ended".to_owned()
            ),
            (
                BreakerState::HalfOpen,
                BreakerState::Closed,
                "probes succeeded".to_owned()
            ),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_for_a_longer_break_up_to_the_cap() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec)
        .break_growth(2.0, Duration::from_secs(30))
        .build()
        .unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    open_it(&backend, &mut svc, &breaker).await;

    let mut expected = vec![BREAK];
    for next in [10, 20, 30, 30] {
        advance(*expected.last().unwrap()).await;
        // The probe fails: open again, for longer.
        assert_eq!(status(&mut svc).await, 503);
        assert_eq!(breaker.state(), BreakerState::Open);
        expected.push(Duration::from_secs(next));
        let err = call(&mut svc).await.unwrap_err();
        assert_eq!(
            err.circuit_open().unwrap().retry_after(),
            Some(Duration::from_secs(next))
        );
    }
    assert_eq!(break_durations(&rec), expected);
    assert_eq!(
        transitions(&rec)[1..3],
        [
            (
                BreakerState::Open,
                BreakerState::HalfOpen,
                TransitionReason::BreakEnded
            ),
            (
                BreakerState::HalfOpen,
                BreakerState::Open,
                TransitionReason::ProbeFailed
            ),
        ]
    );

    // Once closed, the next opening starts from the first break again.
    advance(Duration::from_secs(30)).await;
    backend.answer(200);
    assert_eq!(status(&mut svc).await, 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
    open_it(&backend, &mut svc, &breaker).await;
    assert_eq!(break_durations(&rec).last(), Some(&BREAK));
}

#[tokio::test(start_paused = true)]
async fn calls_are_rejected_while_the_probe_runs() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    open_it(&backend, &mut svc, &breaker).await;
    advance(BREAK).await;
    backend.answer(200);
    backend.delay(Duration::from_secs(1));

    let mut probe_svc = svc.clone();
    let probe = tokio::spawn(async move { status(&mut probe_svc).await });
    tokio::task::yield_now().await;
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let err = call(&mut svc).await.unwrap_err();
    let open = err.circuit_open().unwrap();
    assert_eq!(open.state(), BreakerState::HalfOpen);
    assert_eq!(open.retry_after(), None);
    // No pushback: the retry layer's backoff decides.
    assert_eq!(err.classify_error(DeliveryPhase::Sent).pushback(), None);
    assert_eq!(backend.calls(), 5);

    assert_eq!(probe.await.unwrap(), 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(status(&mut svc).await, 200);
}

#[tokio::test(start_paused = true)]
async fn more_probes_must_all_succeed_to_close() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).half_open_probes(2).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    open_it(&backend, &mut svc, &breaker).await;
    advance(BREAK).await;
    backend.answer(200);
    assert_eq!(status(&mut svc).await, 200);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    assert_eq!(status(&mut svc).await, 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_gives_its_place_back() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    open_it(&backend, &mut svc, &breaker).await;
    advance(BREAK).await;
    backend.answer(200);
    backend.delay(Duration::from_secs(1));

    let probe = svc.ready().await.unwrap().call(Request::new(()));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    assert!(call(&mut svc).await.unwrap_err().is_circuit_open());
    drop(probe);
    // The place is free again: this call is the probe, and closes the breaker.
    assert_eq!(status(&mut svc).await, 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn slow_calls_open_it_when_enabled() {
    let backend = Backend::new();
    backend.delay(Duration::from_millis(300));

    // Off by default: slow successes are successes.
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let mut svc = backend.guarded(&breaker);
    for _ in 0..6 {
        assert_eq!(status(&mut svc).await, 200);
    }
    assert_eq!(breaker.state(), BreakerState::Closed);

    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec)
        .slow_call_threshold(Some(Duration::from_millis(250)))
        .build()
        .unwrap();
    let mut svc = backend.guarded(&breaker);
    for _ in 0..3 {
        assert_eq!(status(&mut svc).await, 200);
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(breaker.window().failures, 3);
    assert_eq!(status(&mut svc).await, 200);
    assert_eq!(breaker.state(), BreakerState::Open);

    // A fast call is not slow.
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec)
        .slow_call_threshold(Some(Duration::from_millis(250)))
        .build()
        .unwrap();
    backend.delay(Duration::from_millis(200));
    let mut svc = backend.guarded(&breaker);
    for _ in 0..6 {
        assert_eq!(status(&mut svc).await, 200);
    }
    assert_eq!(breaker.window().failures, 0);
}

#[tokio::test(start_paused = true)]
async fn isolate_refuses_everything_until_reset() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    assert_eq!(status(&mut svc).await, 200);
    breaker.isolate();
    assert_eq!(breaker.state(), BreakerState::Isolated);
    advance(Duration::from_secs(3600)).await;
    let err = call(&mut svc).await.unwrap_err();
    let open = err.circuit_open().unwrap();
    assert_eq!(open.state(), BreakerState::Isolated);
    assert_eq!(open.retry_after(), None);
    // A retry layer is told to stop.
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).pushback(),
        Some(Pushback::Stop)
    );
    assert_eq!(backend.calls(), 1);

    breaker.reset();
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(status(&mut svc).await, 200);
    // Reset also closes an open breaker at once, with an empty window.
    open_it(&backend, &mut svc, &breaker).await;
    breaker.reset();
    assert_eq!(breaker.window(), WindowCounts::default());
    backend.answer(200);
    assert_eq!(status(&mut svc).await, 200);
    let reasons: Vec<_> = transitions(&rec).into_iter().map(|t| t.2).collect();
    assert_eq!(
        reasons,
        [
            TransitionReason::Isolated,
            TransitionReason::Reset,
            TransitionReason::FailureRate {
                failures: 3,
                calls: 4
            },
            TransitionReason::Reset,
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn clones_and_other_services_share_the_breaker() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let orders = Backend::new();
    let invoices = Backend::new();
    let layer = BreakerLayer::new(breaker.clone());
    let mut a = BoxCloneService::new(layer.layer(orders.service()));
    let mut a2 = a.clone();
    let mut b = invoices.guarded(&breaker.clone());

    orders.answer(503);
    assert_eq!(status(&mut a).await, 503);
    assert_eq!(status(&mut a2).await, 503);
    assert_eq!(status(&mut a).await, 503);
    assert_eq!(status(&mut a2).await, 503);
    assert_eq!(layer.breaker().state(), BreakerState::Open);
    // The other service is refused too, without calling its backend.
    assert!(call(&mut b).await.unwrap_err().is_circuit_open());
    assert_eq!(invoices.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_time_window_forgets_old_failures() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec)
        .window(SlidingWindow::Time {
            length: Duration::from_secs(10),
            buckets: 10,
        })
        .build()
        .unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    backend.answer(503);
    for _ in 0..3 {
        assert_eq!(status(&mut svc).await, 503);
    }
    assert_eq!(breaker.window().calls, 3);
    advance(Duration::from_secs(6)).await;
    // Still in the window: the fourth opens it ...
    let rec2 = InMemoryRecorder::new();
    let breaker2 = builder(&rec2)
        .window(SlidingWindow::Time {
            length: Duration::from_secs(10),
            buckets: 10,
        })
        .build()
        .unwrap();
    let mut svc2 = backend.guarded(&breaker2);
    for _ in 0..3 {
        assert_eq!(status(&mut svc2).await, 503);
    }
    advance(Duration::from_secs(9)).await;
    assert_eq!(status(&mut svc2).await, 503);
    assert_eq!(breaker2.state(), BreakerState::Open);
    // ... but after 10 s they are gone: the first window now holds one failure.
    advance(Duration::from_secs(5)).await;
    assert_eq!(breaker.window().calls, 0);
    assert_eq!(status(&mut svc).await, 503);
    assert_eq!(breaker.window(), WindowCounts::new(1, 1));
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_count_window_keeps_the_last_calls_only() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).min_throughput(10).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    backend.answer(503);
    for _ in 0..4 {
        assert_eq!(status(&mut svc).await, 503);
    }
    backend.answer(200);
    for _ in 0..10 {
        assert_eq!(status(&mut svc).await, 200);
    }
    assert_eq!(breaker.window(), WindowCounts::new(10, 0));
    backend.answer(503);
    for _ in 0..4 {
        assert_eq!(status(&mut svc).await, 503);
    }
    assert_eq!(breaker.window().failures, 4);
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(status(&mut svc).await, 503);
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn after_a_long_run_of_successes_failures_count_and_age_out_after_the_window() {
    let rec = InMemoryRecorder::new();
    // 3 failures in 10 stay under its ratio: only the window's counts change.
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    backend.answer(200);
    for _ in 0..25 {
        assert_eq!(status(&mut svc).await, 200);
    }
    let full = WindowCounts::new(10, 0);
    assert_eq!(breaker.window(), full);
    backend.answer(503);
    for _ in 0..3 {
        assert_eq!(status(&mut svc).await, 503);
    }
    backend.answer(200);
    for _ in 0..7 {
        assert_eq!(status(&mut svc).await, 200);
    }
    // The last 10 calls: 3 failures, 7 successes.
    assert_eq!(breaker.window().failures, 3);
    for _ in 0..3 {
        assert_eq!(status(&mut svc).await, 200);
    }
    assert_eq!(breaker.window(), full);
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_breaks_and_a_seed_repeats_them() {
    async fn breaks(seed: u64) -> Vec<Duration> {
        let rec = InMemoryRecorder::new();
        let breaker = builder(&rec)
            .jitter(0.5)
            .seed(seed)
            .break_growth(1.0, BREAK)
            .build()
            .unwrap();
        let backend = Backend::new();
        let mut svc = backend.guarded(&breaker);
        open_it(&backend, &mut svc, &breaker).await;
        for _ in 0..5 {
            advance(Duration::from_secs(10)).await;
            assert_eq!(status(&mut svc).await, 503);
        }
        break_durations(&rec)
    }
    let a = breaks(7).await;
    assert_eq!(a.len(), 6);
    assert!(a
        .iter()
        .all(|d| *d >= Duration::from_millis(2500) && *d <= BREAK));
    assert!(a.iter().any(|d| *d != a[0]), "jittered: {a:?}");
    assert_eq!(a, breaks(7).await);
    assert_ne!(a, breaks(8).await);
}

#[tokio::test(start_paused = true)]
async fn a_break_longer_than_the_clock_can_hold_does_not_panic() {
    let rec = InMemoryRecorder::new();
    // Past ten years, the builder refuses it; ten years is the longest break.
    let err = builder(&rec)
        .break_duration(Duration::MAX)
        .break_growth(2.0, Duration::MAX)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "breaker break duration");
    let breaker = builder(&rec)
        .break_duration(surely::MAX_DURATION)
        .break_growth(2.0, surely::MAX_DURATION)
        .build()
        .unwrap();
    let backend = Backend::new();
    let mut svc = backend.guarded(&breaker);
    open_it(&backend, &mut svc, &breaker).await;
    advance(Duration::from_secs(3600 * 24 * 365)).await;
    let err = call(&mut svc).await.unwrap_err();
    assert!(err.circuit_open().unwrap().retry_after().unwrap() > Duration::from_secs(3600));
    breaker.reset();
    backend.answer(200);
    assert_eq!(status(&mut svc).await, 200);
}

#[test]
fn bad_settings_are_errors() {
    let b = CircuitBreaker::builder;
    let cases = [
        (b().failure_ratio(0.0).build(), "breaker failure ratio"),
        (b().failure_ratio(1.5).build(), "breaker failure ratio"),
        (b().failure_ratio(f64::NAN).build(), "breaker failure ratio"),
        (b().min_throughput(0).build(), "breaker minimum throughput"),
        (
            b().slow_call_threshold(Some(Duration::ZERO)).build(),
            "breaker slow-call threshold",
        ),
        (
            b().break_duration(Duration::ZERO).build(),
            "breaker break duration",
        ),
        (
            b().break_growth(0.5, Duration::from_secs(60)).build(),
            "breaker break multiplier",
        ),
        (
            b().break_growth(2.0, Duration::from_secs(1)).build(),
            "breaker maximum break",
        ),
        (b().jitter(1.0).build(), "breaker jitter"),
        (b().jitter(-0.1).build(), "breaker jitter"),
        (b().half_open_probes(0).build(), "breaker half-open probes"),
        (
            b().half_open_probes(1001).build(),
            "breaker half-open probes",
        ),
        (
            b().window(SlidingWindow::Count(0)).build(),
            "breaker count window",
        ),
        (
            b().window(SlidingWindow::Time {
                length: Duration::from_secs(1),
                buckets: 0,
            })
            .build(),
            "breaker time window buckets",
        ),
        (
            b().window(SlidingWindow::Time {
                length: Duration::from_millis(5),
                buckets: 10,
            })
            .build(),
            "breaker time window",
        ),
    ];
    for (result, setting) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.setting(), setting, "{err}");
    }
    assert_eq!(
        b().failure_ratio(0.0).build().unwrap_err().to_string(),
        "invalid breaker failure ratio: must be greater than 0 and at most 1"
    );
    let ok = CircuitBreaker::new();
    assert_eq!(ok.state(), BreakerState::Closed);
}

/// Many tasks on a multi-threaded runtime record into the closed breaker's window at once: no
/// count is lost, in either kind of window.
#[test]
fn concurrent_records_are_all_counted() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let windows = [
        SlidingWindow::Count(1000),
        SlidingWindow::Time {
            length: Duration::from_secs(3600),
            buckets: 10,
        },
    ];
    for window in windows {
        let breaker = CircuitBreaker::builder()
            .window(window)
            .min_throughput(1000)
            .failure_ratio(1.0)
            .recorder(())
            .build()
            .unwrap();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for t in 0..8u16 {
                let svc = tower::service_fn(move |_req: Request<()>| async move {
                    let status = if t % 2 == 0 { 200 } else { 503 };
                    Ok::<_, Infallible>(Response::builder().status(status).body(()).unwrap())
                });
                let mut svc = BreakerLayer::new(breaker.clone()).layer(svc);
                tasks.push(tokio::spawn(async move {
                    for _ in 0..100 {
                        svc.ready()
                            .await
                            .unwrap()
                            .call(Request::new(()))
                            .await
                            .unwrap();
                        tokio::task::yield_now().await;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert_eq!(breaker.window(), WindowCounts::new(800, 400), "{window:?}");
        assert_eq!(breaker.state(), BreakerState::Closed);
    }
}

/// Many tasks on a multi-threaded runtime hit a breaker whose break has just ended: exactly
/// `probes` calls reach the service, whatever the interleaving, round after round.
#[test]
fn the_half_open_probe_limit_holds_under_concurrency() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    rt.block_on(async {
        for probes in [1u32, 3] {
            let breaker = CircuitBreaker::builder()
                .window(SlidingWindow::Count(4))
                .min_throughput(1)
                .break_duration(Duration::from_nanos(1))
                .break_growth(1.0, Duration::from_nanos(1))
                .jitter(0.0)
                .half_open_probes(probes)
                .recorder(())
                .build()
                .unwrap();
            for round in 0..40 {
                probe_round(&breaker, probes, round % 2 == 0).await;
            }
        }
    });
}

async fn probe_round(breaker: &CircuitBreaker, probes: u32, succeed: bool) {
    const TASKS: usize = 64;
    // Open it: one failure is enough here.
    breaker.reset();
    let svc = tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::builder().status(503).body(()).unwrap())
    });
    let mut once = BreakerLayer::new(breaker.clone()).layer(svc);
    once.ready()
        .await
        .unwrap()
        .call(Request::new(()))
        .await
        .unwrap();
    assert_eq!(breaker.state(), BreakerState::Open);

    let entered = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let status = if succeed { 200 } else { 503 };
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (entered, refused, gate) = (entered.clone(), refused.clone(), gate.clone());
        let svc = tower::service_fn(move |_req: Request<()>| {
            let (entered, gate) = (entered.clone(), gate.clone());
            async move {
                entered.fetch_add(1, SeqCst);
                gate.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(Response::builder().status(status).body(()).unwrap())
            }
        });
        let mut svc = BreakerLayer::new(breaker.clone()).layer(svc);
        tasks.push(tokio::spawn(async move {
            match svc.ready().await.unwrap().call(Request::new(())).await {
                Ok(_) => {}
                Err(e) => {
                    assert!(e.is_circuit_open());
                    refused.fetch_add(1, SeqCst);
                }
            }
        }));
    }
    // Until every task has either been refused or reached the service (where it waits).
    while entered.load(SeqCst) + refused.load(SeqCst) < TASKS {
        tokio::task::yield_now().await;
    }
    assert_eq!(entered.load(SeqCst), probes as usize, "probes let through");
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    gate.add_permits(TASKS);
    for t in tasks {
        t.await.unwrap();
    }
    let expected = if succeed {
        BreakerState::Closed
    } else {
        BreakerState::Open
    };
    assert_eq!(breaker.state(), expected);
}

/// SetDeadlineLayer → RetryLayer → BreakerLayer → service, under a call record: a refusal
/// is retried after the remaining break when the deadline allows it, and otherwise the call
/// stops at once, for the deadline.
#[tokio::test(start_paused = true)]
async fn inside_a_retry_a_refusal_waits_out_the_break_only_if_the_deadline_allows() {
    async fn client(
        deadline: Duration,
    ) -> (
        impl Service<Request<()>, Response = Response<()>, Error = Error<std::io::Error>>,
        Backend,
        InMemoryRecorder,
    ) {
        let rec = InMemoryRecorder::new();
        let breaker = builder(&rec).build().unwrap();
        let backend = Backend::new();
        // Open it through another service sharing the breaker.
        let mut direct = backend.guarded(&breaker);
        open_it(&backend, &mut direct, &breaker).await;
        backend.answer(200);
        let svc = ServiceBuilder::new()
            .layer(RecordCallLayer::new(rec.clone()))
            .layer(SetDeadlineLayer::new(deadline))
            .layer(
                RetryLayer::builder()
                    .backoff(Backoff::none())
                    .no_budget()
                    .build()
                    .unwrap(),
            )
            .layer(BreakerLayer::new(breaker))
            .service(backend.service());
        (svc, backend, rec)
    }

    // 10 s of budget: the POST waits out the 5 s break, and the probe succeeds.
    let (mut svc, backend, rec) = client(Duration::from_secs(10)).await;
    let start = Instant::now();
    let post = Request::post("/orders").body(()).unwrap();
    let res = svc.ready().await.unwrap().call(post).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(start.elapsed(), BREAK);
    assert_eq!(backend.calls(), 5);
    let call = &rec.calls()[0];
    assert_eq!(call.stop, StopReason::Success);
    assert_eq!(call.outcome, Outcome::Succeeded);

    // 2 s of budget: no wait is begun that the deadline cannot cover; nothing was sent.
    let (mut svc, backend, rec) = client(Duration::from_secs(2)).await;
    let start = Instant::now();
    let post = Request::post("/orders").body(()).unwrap();
    let err = svc.ready().await.unwrap().call(post).await.unwrap_err();
    assert!(err.is_circuit_open(), "{err:?}");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(backend.calls(), 4);
    let call = &rec.calls()[0];
    // The breaker's "come back after the break" is pushback, and it is never shortened.
    assert_eq!(call.stop, StopReason::PushbackStop);
    assert_eq!(call.attempts, 0);
    // Nothing was sent: the POST failed cleanly, it is not unknown.
    assert_eq!(call.outcome, Outcome::Failed);
}

/// A writer for tracing-subscriber that keeps what it is given.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn by_default_state_changes_go_to_tracing() {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let breaker = CircuitBreaker::builder().name("payments").build().unwrap();
        breaker.isolate();
        breaker.reset();
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("WARN"), "{text}");
    assert!(lines[0].contains("circuit breaker isolated"), "{text}");
    assert!(lines[0].contains("surely.breaker=\"payments\""), "{text}");
    assert!(
        lines[0].contains("surely.breaker.from=\"closed\""),
        "{text}"
    );
    assert!(lines[1].contains("INFO"), "{text}");
    assert!(
        lines[1].contains("surely.breaker.reason=reset by hand"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn another_breakers_refusal_counts_for_nothing() {
    let rec = InMemoryRecorder::new();
    let outer = builder(&rec).build().unwrap();
    let inner = builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = ServiceBuilder::new()
        .layer(BreakerLayer::new(outer.clone()))
        .layer(BreakerLayer::new(inner.clone()))
        .service(backend.service());
    inner.isolate();
    for _ in 0..10 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(Request::new(()))
            .await
            .unwrap_err();
        assert!(err.is_circuit_open());
    }
    assert_eq!(outer.window(), WindowCounts::default());
    assert_eq!(outer.state(), BreakerState::Closed);
    assert_eq!(backend.calls(), 0);
}

#[test]
fn a_closure_recorder_hears_the_breaker() {
    use std::sync::Mutex;
    use surely::record::Record;
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = heard.clone();
    let breaker = CircuitBreaker::builder()
        .recorder(move |record: Record<'_>| {
            if let Record::Breaker(event) = record {
                sink.lock().unwrap().push(event.to_string());
            }
        })
        .build()
        .unwrap();
    breaker.isolate();
    breaker.reset();
    let heard = heard.lock().unwrap();
    assert_eq!(heard.len(), 2, "{heard:?}");
    assert!(heard[0].contains("isolated"), "{heard:?}");
}

/// An attempt the call's deadline ended after it was given little time says nothing about the
/// dependency: it is not counted, and a half-open probe that ends so gives its place back. Given
/// enough time, the same timeout counts.
#[tokio::test(start_paused = true)]
async fn a_timeout_with_too_little_budget_to_tell_is_not_counted() {
    use surely::timeout::AttemptTimeoutLayer;
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let backend = Backend::new();
    backend.delay(Duration::from_millis(300));
    // The call's deadline, then the breaker, then attempts bounded by the deadline.
    let with_budget = |budget: Duration| -> Svc {
        BoxCloneService::new(
            ServiceBuilder::new()
                .layer(SetDeadlineLayer::new(budget))
                .layer(BreakerLayer::new(breaker.clone()))
                .layer(AttemptTimeoutLayer::deadline_only())
                .service(backend.service()),
        )
    };
    let mut short = with_budget(Duration::from_millis(50));
    for _ in 0..10 {
        let err = call(&mut short).await.unwrap_err();
        let elapsed = err.elapsed().expect("an attempt timeout");
        assert!(elapsed.is_deadline());
        assert_eq!(elapsed.given(), Some(Duration::from_millis(50)));
    }
    assert_eq!(breaker.window(), WindowCounts::default(), "none counted");
    assert_eq!(breaker.state(), BreakerState::Closed);

    // Given 200 ms, the dependency's 300 ms shows: counted, and the breaker opens.
    let mut long = with_budget(Duration::from_millis(200));
    for _ in 0..4 {
        assert!(call(&mut long).await.unwrap_err().is_elapsed());
    }
    assert_eq!(breaker.state(), BreakerState::Open);

    // After the break the dependency is healthy again. A probe with 50 ms left times out, and
    // gives its place back instead of reopening the breaker; the next one closes it.
    advance(BREAK).await;
    backend.delay(Duration::from_millis(60));
    assert!(call(&mut short).await.unwrap_err().is_elapsed());
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    assert_eq!(status(&mut long).await, 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
}

/// A server that refused to start on a request whose deadline it found spent (as
/// `ServerDeadlineLayer` answers: 504 with `surely-not-processed: deadline`) says nothing
/// about its health: not counted. A plain 504 is.
#[tokio::test(start_paused = true)]
async fn a_refusal_for_a_spent_deadline_is_not_counted() {
    let rec = InMemoryRecorder::new();
    let breaker = builder(&rec).build().unwrap();
    let answer = |marked: bool| -> Svc {
        BoxCloneService::new(BreakerLayer::new(breaker.clone()).layer(tower::service_fn(
            move |_req: Request<()>| async move {
                let mut res = Response::builder().status(504).body(()).unwrap();
                if marked {
                    res.headers_mut().insert(
                        surely::headers::NOT_PROCESSED,
                        http::HeaderValue::from_static("deadline"),
                    );
                }
                Ok::<_, std::io::Error>(res)
            },
        )))
    };
    let mut refused = answer(true);
    for _ in 0..10 {
        assert_eq!(status(&mut refused).await, 504);
    }
    assert_eq!(breaker.window(), WindowCounts::default(), "none counted");
    let mut failing = answer(false);
    for _ in 0..4 {
        assert_eq!(status(&mut failing).await, 504);
    }
    assert_eq!(breaker.state(), BreakerState::Open);
}
