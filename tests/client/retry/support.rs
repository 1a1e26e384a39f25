//! Shared helpers for the retry tests: a counting transport and the canonical client stack.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response};
use surely::deadline::SetDeadlineLayer;
use surely::fault::{FaultPolicy, InjectFaultLayer};
use surely::idempotency::SetIdempotencyKeyLayer;
use surely::record::{InMemoryRecorder, RecordAttemptLayer, RecordCallLayer};
use surely::retry::RetryLayer;
use surely::timeout::AttemptTimeoutLayer;
use surely::Envelope;
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

pub(crate) use crate::support::time::{ms, secs};

pub(crate) type Req = Request<String>;
pub(crate) type Res = Response<String>;
pub(crate) type Err = surely::Error<io::Error>;

/// The per-try timeout of the canonical stack.
pub(crate) const PER_TRY: Duration = Duration::from_secs(1);

/// What the transport saw of one request that reached it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) at: Instant,
    pub(crate) headers: HeaderMap,
}

/// A transport that answers 200 `ok` (with `grpc-status: 0` for gRPC requests), counting the
/// requests that reached it: the committed side effects.
#[derive(Clone, Debug)]
pub(crate) struct Probe {
    calls: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Probe {
    pub(crate) fn new() -> Self {
        Probe {
            calls: Arc::new(AtomicUsize::new(0)),
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Committed side effects so far.
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn service(
        &self,
    ) -> impl Service<Req, Response = Res, Error = io::Error> + Clone + use<> {
        let probe = self.clone();
        service_fn(move |req: Req| {
            let probe = probe.clone();
            async move {
                // Counted when the transport actually runs, not when its future is made.
                probe.calls.fetch_add(1, Ordering::SeqCst);
                probe.seen.lock().unwrap().push(Seen {
                    at: Instant::now(),
                    headers: req.headers().clone(),
                });
                let mut res = Response::new(String::from("ok"));
                if req.is_grpc() {
                    res.headers_mut()
                        .insert("grpc-status", HeaderValue::from_static("0"));
                }
                Ok::<_, io::Error>(res)
            }
        })
    }
}

/// The canonical stack: `RecordCallLayer → SetDeadlineLayer → RetryLayer → RecordAttemptLayer →
/// AttemptTimeoutLayer (1 s) → InjectFaultLayer → probe`. `deadline` is the call's total budget
/// (`None`: inherit only).
pub(crate) fn canonical<P>(
    retry: RetryLayer,
    policy: P,
    deadline: Option<Duration>,
    probe: &Probe,
    recorder: &InMemoryRecorder,
) -> impl Service<Req, Response = Res, Error = Err> + use<P>
where
    P: FaultPolicy<Req> + Clone,
{
    ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(deadline_layer(deadline))
        .layer(retry)
        .layer(RecordAttemptLayer::new(recorder.clone()))
        .layer(AttemptTimeoutLayer::new(PER_TRY))
        .layer(InjectFaultLayer::new(policy))
        .service(probe.service())
}

/// The canonical stack with an [`SetIdempotencyKeyLayer`] between the deadline and the retry
/// layers (`surely::docs::architecture`, layer order), told that the server honours its keys.
pub(crate) fn canonical_keyed<P>(
    retry: RetryLayer,
    policy: P,
    probe: &Probe,
    recorder: &InMemoryRecorder,
) -> impl Service<Req, Response = Res, Error = Err> + use<P>
where
    P: FaultPolicy<Req> + Clone,
{
    ServiceBuilder::new()
        .layer(RecordCallLayer::new(recorder.clone()))
        .layer(SetDeadlineLayer::inherit())
        .layer(SetIdempotencyKeyLayer::new().server_honours_keys())
        .layer(retry)
        .layer(RecordAttemptLayer::new(recorder.clone()))
        .layer(AttemptTimeoutLayer::new(PER_TRY))
        .layer(InjectFaultLayer::new(policy))
        .service(probe.service())
}

fn deadline_layer(deadline: Option<Duration>) -> SetDeadlineLayer {
    match deadline {
        Some(d) => SetDeadlineLayer::new(d),
        None => SetDeadlineLayer::inherit(),
    }
}

/// Calls `svc` once, and says how long the call took (paused time).
pub(crate) async fn timed<S>(svc: &mut S, req: Req) -> (Result<Res, Err>, Duration)
where
    S: Service<Req, Response = Res, Error = Err>,
{
    let start = Instant::now();
    let out = match svc.ready().await {
        Ok(svc) => svc.call(req).await,
        Err(e) => Err(e),
    };
    (out, start.elapsed())
}
