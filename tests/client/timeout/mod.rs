//! The attempt timeout through the public API: which limit fires, where it fired, and how that
//! is classified; and, over a real hyper client, what a `TrackBody` proves.

mod hyper_progress;
mod phases;
mod support;

use std::io;
use std::time::Duration;

use http::{Request, Response};
use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
use surely::deadline::{Deadline, SetDeadlineLayer};
use surely::delivery::Progress;
use surely::timeout::AttemptTimeoutLayer;
use surely::timeout::Elapsed;
use tokio::time::Instant;
use tower::{service_fn, Layer, Service};

use self::support::{call, hanging, ms, secs};

fn req() -> Request<()> {
    Request::post("/orders").body(()).unwrap()
}

fn per_try(d: Duration) -> AttemptTimeoutLayer {
    AttemptTimeoutLayer::new(d)
}

// ---- which limit fires --------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_per_try_timeout_fires() {
    let mut svc = per_try(ms(200)).layer(hanging());
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(Instant::now() - start, ms(200));

    assert!(err.is_elapsed());
    assert!(!err.is_deadline_exceeded());
    let elapsed = *err.elapsed().unwrap();
    assert_eq!(
        elapsed,
        Elapsed::new(DeliveryPhase::Sent, false).with_given(ms(200))
    );
    assert_eq!(elapsed.given(), Some(ms(200)));
    assert_eq!(elapsed.phase(), DeliveryPhase::Sent);
    assert!(!elapsed.is_deadline());
    assert_eq!(err.local_phase(), Some(DeliveryPhase::Sent));
    let c = err.classify_error(DeliveryPhase::Sent);
    assert_eq!(c.class(), AttemptClass::MaybeCommitted);
    assert_eq!(c.phase(), DeliveryPhase::Sent);
    assert_eq!(
        err.to_string(),
        "attempt timed out after the request was sent"
    );
}

#[tokio::test(start_paused = true)]
async fn the_current_deadline_fires_first_when_earlier() {
    let mut svc = per_try(ms(200)).layer(hanging());
    let start = Instant::now();
    let err = surely::deadline::scope(Deadline::after(ms(120)), call(&mut svc, req()))
        .await
        .unwrap_err();
    assert_eq!(Instant::now() - start, ms(120));
    let elapsed = err.elapsed().unwrap();
    assert!(elapsed.is_deadline());
    assert_eq!(elapsed.phase(), DeliveryPhase::Sent);
    assert_eq!(
        err.to_string(),
        "call deadline reached after the request was sent"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_extension_deadline_fires_first_when_earlier() {
    let mut svc = per_try(secs(1)).layer(hanging());
    let start = Instant::now();
    let mut r = req();
    r.extensions_mut().insert(Deadline::after(ms(300)));
    let err = call(&mut svc, r).await.unwrap_err();
    assert_eq!(Instant::now() - start, ms(300));
    assert!(err.elapsed().unwrap().is_deadline());
}

#[tokio::test(start_paused = true)]
async fn the_per_try_timeout_fires_first_when_earlier_than_the_deadline() {
    let mut svc = per_try(ms(200)).layer(hanging());
    let start = Instant::now();
    let err = surely::deadline::scope(Deadline::after(secs(1)), call(&mut svc, req()))
        .await
        .unwrap_err();
    assert_eq!(Instant::now() - start, ms(200));
    assert!(!err.elapsed().unwrap().is_deadline());
}

#[tokio::test(start_paused = true)]
async fn the_deadline_layer_outside_bounds_the_attempt() {
    // The canonical order: the deadline layer outside makes its deadline current; the attempt
    // timeout inside obeys it and says so (rather than the outer layer's in-flight error).
    let inner = per_try(secs(5)).layer(hanging());
    let mut svc = SetDeadlineLayer::new(secs(2)).layer(inner);
    let start = Instant::now();
    let err = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(Instant::now() - start, secs(2));
    assert!(err.is_elapsed(), "{err:?}");
    assert!(err.elapsed().unwrap().is_deadline());
}

#[tokio::test(start_paused = true)]
async fn deadline_only_without_a_deadline_never_fires() {
    let mut svc = AttemptTimeoutLayer::deadline_only().layer(hanging());
    let out = tokio::time::timeout(secs(3600), call(&mut svc, req())).await;
    assert!(out.is_err(), "still pending after an hour");
}

#[tokio::test(start_paused = true)]
async fn deadline_only_fires_at_the_deadline() {
    let mut svc = AttemptTimeoutLayer::deadline_only().layer(hanging());
    let start = Instant::now();
    let err = surely::deadline::scope(Deadline::after(ms(750)), call(&mut svc, req()))
        .await
        .unwrap_err();
    assert_eq!(Instant::now() - start, ms(750));
    assert!(err.elapsed().unwrap().is_deadline());
}

#[tokio::test(start_paused = true)]
async fn the_per_try_clock_starts_at_the_first_poll() {
    let mut svc = per_try(ms(200)).layer(hanging());
    let start = Instant::now();
    let fut = svc.call(req());
    tokio::time::advance(secs(1)).await;
    let err = fut.await.unwrap_err();
    assert_eq!(Instant::now() - start, ms(1200));
    assert!(!err.elapsed().unwrap().is_deadline());
}

#[tokio::test(start_paused = true)]
async fn the_deadline_is_absolute_from_the_call() {
    // Unlike the per-try clock, the deadline does not move when the first poll is late.
    let mut svc = per_try(secs(10)).layer(hanging());
    let start = Instant::now();
    let mut r = req();
    r.extensions_mut().insert(Deadline::after(ms(500)));
    let fut = svc.call(r);
    tokio::time::advance(ms(400)).await;
    let err = fut.await.unwrap_err();
    assert_eq!(Instant::now() - start, ms(500));
    assert!(err.elapsed().unwrap().is_deadline());
}

// ---- where it fired -----------------------------------------------------------------------

fn with_progress(progress: &Progress) -> Request<()> {
    let mut r = req();
    r.extensions_mut().insert(progress.clone());
    r
}

#[tokio::test(start_paused = true)]
async fn not_sent_progress_makes_a_timeout_rejected() {
    let progress = Progress::new();
    let mut svc = per_try(ms(200)).layer(hanging());
    let err = call(&mut svc, with_progress(&progress)).await.unwrap_err();
    let elapsed = err.elapsed().unwrap();
    assert_eq!(elapsed.phase(), DeliveryPhase::NotSent);
    assert!(!elapsed.is_deadline());
    let c = err.classify_error(DeliveryPhase::Sent);
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert_eq!(c.phase(), DeliveryPhase::NotSent);
    assert_eq!(
        err.to_string(),
        "attempt timed out before the request was sent"
    );
}

#[tokio::test(start_paused = true)]
async fn sent_progress_makes_a_timeout_maybe_committed() {
    let progress = Progress::new();
    progress.mark(DeliveryPhase::Sent);
    let mut svc = per_try(ms(200)).layer(hanging());
    let err = call(&mut svc, with_progress(&progress)).await.unwrap_err();
    assert_eq!(err.elapsed().unwrap().phase(), DeliveryPhase::Sent);
    let c = err.classify_error(DeliveryPhase::NotSent);
    assert_eq!(c.class(), AttemptClass::MaybeCommitted);
    assert_eq!(c.phase(), DeliveryPhase::Sent);
}

#[tokio::test(start_paused = true)]
async fn progress_marked_during_the_attempt_is_read_when_it_fires() {
    // The transport writes the request 50 ms in, then hangs: the phase is read at the timeout,
    // not at the call.
    let transport = service_fn(|req: Request<()>| async move {
        let progress = req.extensions().get::<Progress>().unwrap().clone();
        tokio::time::sleep(ms(50)).await;
        progress.mark(DeliveryPhase::Sent);
        std::future::pending::<()>().await;
        Ok::<_, io::Error>(Response::new(()))
    });
    let progress = Progress::new();
    let mut svc = per_try(ms(200)).layer(transport);
    let err = call(&mut svc, with_progress(&progress)).await.unwrap_err();
    assert_eq!(err.elapsed().unwrap().phase(), DeliveryPhase::Sent);
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::MaybeCommitted
    );
}

#[tokio::test(start_paused = true)]
async fn response_started_progress_is_kept() {
    let progress = Progress::new();
    progress.mark(DeliveryPhase::ResponseStarted);
    let mut svc = per_try(ms(200)).layer(hanging());
    let err = surely::deadline::scope(
        Deadline::after(ms(100)),
        call(&mut svc, with_progress(&progress)),
    )
    .await
    .unwrap_err();
    let elapsed = err.elapsed().unwrap();
    assert_eq!(elapsed.phase(), DeliveryPhase::ResponseStarted);
    assert!(elapsed.is_deadline());
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::MaybeCommitted
    );
    assert_eq!(
        err.to_string(),
        "call deadline reached while reading the response"
    );
}

// ---- passing through ----------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_ready_inner_passes_through() {
    let transport = service_fn(|_req: Request<()>| async {
        Ok::<_, io::Error>(Response::builder().status(202).body("queued").unwrap())
    });
    let mut svc = per_try(ms(200)).layer(transport);
    let start = Instant::now();
    let res = call(&mut svc, req()).await.unwrap();
    assert_eq!(res.status(), 202);
    assert_eq!(*res.body(), "queued");
    assert_eq!(Instant::now(), start);
}

#[tokio::test(start_paused = true)]
async fn an_inner_answering_in_time_passes_through() {
    let transport = service_fn(|_req: Request<()>| async {
        tokio::time::sleep(ms(199)).await;
        Ok::<_, io::Error>(Response::new("late but fine"))
    });
    let mut svc = per_try(ms(200)).layer(transport);
    let res = call(&mut svc, req()).await.unwrap();
    assert_eq!(*res.body(), "late but fine");
}

#[tokio::test(start_paused = true)]
async fn a_transport_error_passes_through() {
    let transport = service_fn(|_req: Request<()>| async {
        Err::<Response<()>, _>(io::Error::from(io::ErrorKind::ConnectionReset))
    });
    let mut svc = per_try(ms(200)).layer(transport);
    let err = call(&mut svc, req()).await.unwrap_err();
    assert!(err.is_transport());
    assert!(!err.is_elapsed());
    assert_eq!(
        err.transport_ref().unwrap().kind(),
        io::ErrorKind::ConnectionReset
    );
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::MaybeCommitted
    );
}

#[tokio::test(start_paused = true)]
async fn layers_stack_without_nesting_errors() {
    // Two attempt timeouts: the inner one's Error<io::Error> comes out as Error<io::Error>.
    let inner = per_try(ms(100)).layer(hanging());
    let mut svc = per_try(ms(300)).layer(inner);
    let start = Instant::now();
    let err: surely::Error<io::Error> = call(&mut svc, req()).await.unwrap_err();
    assert_eq!(Instant::now() - start, ms(100));
    assert!(err.is_elapsed());
}

// ---- configuration ------------------------------------------------------------------------

#[test]
fn zero_per_try_is_a_config_error() {
    let err = AttemptTimeoutLayer::builder()
        .per_try(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "attempt timeout");
    assert_eq!(
        err.to_string(),
        "invalid attempt timeout: must be greater than zero"
    );
    assert!(AttemptTimeoutLayer::builder()
        .per_try(Duration::from_nanos(1))
        .build()
        .is_ok());
    let err = AttemptTimeoutLayer::builder()
        .per_try(Duration::MAX)
        .build()
        .unwrap_err();
    assert_eq!(err.setting(), "attempt timeout");
}

/// `new` never fails: zero counts as a nanosecond, the shortest the builder accepts, and one
/// past ten years as ten years.
#[tokio::test(start_paused = true)]
async fn new_clamps_its_per_try_timeout_into_what_the_builder_accepts() {
    let layer = AttemptTimeoutLayer::new(Duration::ZERO);
    assert_eq!(layer.per_try(), Some(Duration::from_nanos(1)));
    let mut svc = layer.layer(hanging());
    let err: surely::Error<io::Error> = call(&mut svc, req()).await.unwrap_err();
    assert!(err.is_elapsed());

    let layer = AttemptTimeoutLayer::new(Duration::MAX);
    assert_eq!(layer.per_try(), Some(surely::MAX_DURATION));
    let mut svc = SetDeadlineLayer::new(secs(1)).layer(layer.layer(hanging()));
    let err: surely::Error<io::Error> = call(&mut svc, req()).await.unwrap_err();
    // The deadline, not the ten years, ended the attempt.
    assert!(err.elapsed().is_some_and(|e| e.is_deadline()));
}
