//! Records that match what happened: a refusal made no attempt, the deadline is the reason when
//! it cut the last attempt short, and a retry that never went out is not listed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use surely::breaker::CircuitBreaker;
use surely::deadline::Deadline;
use surely::headers::IDEMPOTENCY_KEY;
use surely::ledger::{LedgerRecorder, LedgerStats, MemoryLedger};
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;
use surely::{Outcome, StopReason};
use tower::{service_fn, Service, ServiceExt};

use super::{answers, call, get, ms, post};

#[tokio::test(start_paused = true)]
async fn a_call_refused_before_any_attempt_records_none() {
    let records = InMemoryRecorder::new();
    let count = Arc::new(AtomicU32::new(0));
    let breaker = CircuitBreaker::builder()
        .min_throughput(2)
        .break_duration(Duration::from_secs(60))
        .jitter(0.0)
        .build()
        .unwrap();
    let mut client = surely::client()
        .timeout(Duration::from_secs(2))
        .breaker(breaker.clone())
        .retry(|r| r.backoff(Backoff::none()).max_attempts(2))
        .recorder(records.clone())
        .build(answers(503, &count))
        .unwrap();

    let mut late = post();
    late.extensions_mut()
        .insert(Deadline::after(Duration::ZERO));
    tokio::time::advance(ms(1)).await;
    call(&mut client, late).await.unwrap_err();

    let mut bad = post();
    bad.headers_mut()
        .insert(IDEMPOTENCY_KEY, HeaderValue::from_static("two words"));
    call(&mut client, bad).await.unwrap_err();

    // Two 503s open the breaker; the next call is refused by it.
    call(&mut client, get()).await.unwrap();
    let err = call(&mut client, get()).await.unwrap_err();
    assert!(err.is_circuit_open());

    let calls = records.calls();
    let summary: Vec<_> = calls
        .iter()
        .map(|c| (c.attempts, c.outcome, c.stop))
        .collect();
    assert_eq!(
        summary,
        vec![
            (0, Outcome::Failed, StopReason::Deadline),
            (0, Outcome::Failed, StopReason::Final),
            (2, Outcome::Failed, StopReason::AttemptsExhausted),
            (0, Outcome::Failed, StopReason::PushbackStop),
        ]
    );
    assert_eq!(records.attempts().len(), 2);
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_that_cut_the_last_attempt_is_the_reason_the_record_gives() {
    let count = Arc::new(AtomicU32::new(0));
    let seen = count.clone();
    // Refused, then an attempt that hangs until the deadline ends it: the last one the limit
    // allows.
    let transport = service_fn(move |_req: Request<String>| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
            }
            std::future::pending::<()>().await;
            Ok(Response::new(String::new()))
        }
    });
    let records = InMemoryRecorder::new();
    let mut client = surely::client()
        .timeout(Duration::from_secs(1))
        .retry(|r| r.backoff(Backoff::none()).max_attempts(2))
        .recorder(records.clone())
        .build(transport)
        .unwrap();
    let err = call(&mut client, get()).await.unwrap_err();
    assert!(err.elapsed().is_some_and(|e| e.is_deadline()), "{err}");
    let record = &records.calls()[0];
    assert_eq!(record.stop, StopReason::Deadline);
    assert_eq!(err.stop_reason(), Some(StopReason::Deadline));
    assert_eq!((record.attempts, err.attempts()), (2, 2));
}

/// A service that answers every request `503` with `Retry-After: 1`, counting them.
fn busy_service(
    count: Arc<AtomicU32>,
) -> impl Service<Request<String>, Response = Response<String>, Error = std::io::Error> + Clone {
    service_fn(move |_req: Request<String>| {
        count.fetch_add(1, Ordering::SeqCst);
        async {
            Ok::<_, std::io::Error>(
                Response::builder()
                    .status(503)
                    .header(http::header::RETRY_AFTER, "1")
                    .body(String::new())
                    .unwrap(),
            )
        }
    })
}

/// An unkeyed POST whose only attempt got a `503` with `Retry-After` (rejected, not processed),
/// dropped by its caller while it waits: nothing was processed, so the call failed, and a ledger
/// has nothing to settle.
#[tokio::test(start_paused = true)]
async fn an_unkeyed_post_dropped_while_it_waits_out_a_retry_after_failed() {
    let count = Arc::new(AtomicU32::new(0));
    let busy = busy_service(count.clone());
    let records = InMemoryRecorder::new();
    let mut client = surely::client()
        .recorder(records.clone())
        .build(busy)
        .unwrap();
    let svc = client.ready().await.unwrap();
    let dropped = tokio::time::timeout(ms(500), svc.call(post())).await;
    assert!(dropped.is_err());
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let record = &records.calls()[0];
    assert_eq!(
        records.attempts()[0].class(),
        surely::classify::AttemptClass::Rejected
    );
    assert_eq!(record.stop, StopReason::Cancelled);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.outcome, Outcome::Failed, "{record}");

    // The same, with attempts recorded when their bodies end (the `http()` preset's way), and a
    // ledger of unknown calls beside the records: it gets no entry.
    let records = InMemoryRecorder::new();
    let ledger = MemoryLedger::new();
    let unknowns = LedgerRecorder::new(ledger.clone());
    let mut client = surely::client()
        .settle_at_body_end()
        .recorder((records.clone(), unknowns.clone()))
        .build(busy_service(count.clone()))
        .unwrap();
    let svc = client.ready().await.unwrap();
    let dropped = tokio::time::timeout(ms(500), svc.call(post())).await;
    assert!(dropped.is_err());
    unknowns.flush().await;
    assert_eq!(unknowns.writes().queued, 0);
    assert_eq!(ledger.stats_now(), LedgerStats::default());
    let record = &records.calls()[0];
    assert_eq!(
        records.attempts()[0].class(),
        surely::classify::AttemptClass::Rejected
    );
    assert_eq!(record.stop, StopReason::Cancelled);
    assert_eq!(record.attempts, 1);
    assert_eq!(record.outcome, Outcome::Failed, "{record}");
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_it_waits_out_a_retry_after_lists_no_retry() {
    let count = Arc::new(AtomicU32::new(0));
    let busy = busy_service(count.clone());
    let records = InMemoryRecorder::new();
    let mut client = surely::client()
        .recorder(records.clone())
        .build(busy)
        .unwrap();
    let svc = client.ready().await.unwrap();
    // The caller gives up half-way through the second it was asked to wait.
    let dropped = tokio::time::timeout(ms(500), svc.call(get())).await;
    assert!(dropped.is_err());
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let record = &records.calls()[0];
    assert_eq!(record.stop, StopReason::Cancelled);
    assert_eq!(record.attempts, 1);
    assert!(record.retries.is_empty(), "{:?}", record.retries);

    // Let through, the same call lists the one retry it made.
    records.clear();
    let svc = client.ready().await.unwrap();
    svc.call(get()).await.unwrap();
    let record = &records.calls()[0];
    assert_eq!(record.retries.len(), 2, "{:?}", record.retries);
    assert!(record
        .retries
        .iter()
        .all(|r| r.pushback && r.wait == ms(1000)));
}
