//! The fault layer: every fault shape, the policies, and the server side.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use proptest::prelude::*;
use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
use surely::fault::{
    EmptyBody, Fault, FaultPolicy, InjectFault, InjectFaultLayer, MakeResponse, NoResponse, Reply,
    Schedule, Seeded,
};
use surely::{Envelope, Error};
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};

type Req = http::Request<()>;
type Res = http::Response<String>;

/// An inner service that counts its runs (inside its future, as a real transport would) and
/// remembers when the last one ran.
#[derive(Clone, Default)]
struct Backend {
    runs: Arc<AtomicUsize>,
    ran_at: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl Backend {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn ran_at(&self) -> Option<Instant> {
        *self.ran_at.lock().unwrap()
    }

    fn service(
        &self,
    ) -> impl Service<
        Req,
        Response = Res,
        Error = Infallible,
        Future = impl std::future::Future<Output = Result<Res, Infallible>> + Send + use<>,
    > + Clone
           + use<> {
        let this = self.clone();
        service_fn(move |_req: Req| {
            let this = this.clone();
            async move {
                this.runs.fetch_add(1, Ordering::SeqCst);
                *this.ran_at.lock().unwrap() = Some(Instant::now());
                Ok::<_, Infallible>(http::Response::new(String::from("committed")))
            }
        })
    }
}

fn post() -> Req {
    http::Request::post("/orders").body(()).unwrap()
}

fn post_with(fault: Fault) -> Req {
    let mut req = post();
    req.extensions_mut().insert(fault);
    req
}

async fn send<S>(svc: &mut S, req: Req) -> Result<Res, Error<Infallible>>
where
    S: Service<Req, Response = Res, Error = Error<Infallible>>,
{
    svc.ready().await?.call(req).await
}

fn always(fault: Fault) -> impl Fn(&Req) -> Option<Fault> + Clone {
    move |_: &Req| Some(fault.clone())
}

// ===== the fault shapes =====

#[tokio::test(start_paused = true)]
async fn no_fault_passes_through() {
    let backend = Backend::default();
    let mut svc = InjectFaultLayer::new(()).layer(backend.service());
    let res = send(&mut svc, post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.body(), "committed");
    assert_eq!(backend.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn refuse_before_send_never_calls_inner() {
    let backend = Backend::default();
    let mut svc = InjectFaultLayer::new(always(Fault::RefuseBeforeSend)).layer(backend.service());

    let err = send(&mut svc, post()).await.unwrap_err();
    let fault = err.injected().expect("an injected fault");
    assert_eq!(fault.phase(), DeliveryPhase::NotSent);
    assert_eq!(
        fault.to_string(),
        "injected fault: connection refused before send"
    );
    assert_eq!(err.local_phase(), Some(DeliveryPhase::NotSent));
    // Whatever phase the caller assumed, a refusal is not sent.
    let c = err.classify_error(DeliveryPhase::Sent);
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert_eq!(c.phase(), DeliveryPhase::NotSent);
    assert_eq!(backend.runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn reset_after_send_runs_inner_once_and_loses_the_reply() {
    let backend = Backend::default();
    let mut svc = InjectFaultLayer::new(always(Fault::ResetAfterSend)).layer(backend.service());

    let err = send(&mut svc, post()).await.unwrap_err();
    assert_eq!(backend.runs(), 1, "the side effect happened exactly once");
    let fault = err.injected().expect("an injected fault");
    assert_eq!(fault.phase(), DeliveryPhase::Sent);
    assert_eq!(
        fault.to_string(),
        "injected fault: connection reset after the request was processed"
    );
    assert_eq!(err.to_string(), fault.to_string());
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::MaybeCommitted
    );
}

#[tokio::test(start_paused = true)]
async fn reset_after_send_drops_an_inner_error_too() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let inner = service_fn(move |_req: Req| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Err::<Res, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        }
    });
    let mut svc = InjectFaultLayer::new(always(Fault::ResetAfterSend)).layer(inner);
    let err = svc.ready().await.unwrap().call(post()).await.unwrap_err();
    assert!(!err.is_transport());
    assert_eq!(err.injected().unwrap().phase(), DeliveryPhase::Sent);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn delay_waits_exactly_before_calling_inner() {
    let backend = Backend::default();
    let delay = Duration::from_millis(1500);
    let mut svc = InjectFaultLayer::new(always(Fault::Delay(delay))).layer(backend.service());

    let start = Instant::now();
    let res = send(&mut svc, post()).await.unwrap();
    assert_eq!(res.body(), "committed");
    assert_eq!(start.elapsed(), delay);
    assert_eq!(
        backend.ran_at(),
        Some(start + delay),
        "the inner future ran after the delay"
    );
    assert_eq!(backend.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn delay_cut_short_by_a_timeout_never_runs_inner() {
    let backend = Backend::default();
    let mut svc = InjectFaultLayer::new(always(Fault::Delay(Duration::from_secs(10))))
        .layer(backend.service());

    let call = svc.ready().await.unwrap().call(post());
    let timed_out = tokio::time::timeout(Duration::from_secs(1), call).await;
    assert!(timed_out.is_err());
    assert_eq!(backend.runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn delay_reply_runs_inner_at_once_and_answers_late() {
    let backend = Backend::default();
    let delay = Duration::from_secs(3);
    let mut svc = InjectFaultLayer::new(always(Fault::DelayReply(delay))).layer(backend.service());

    let start = Instant::now();
    let res = send(&mut svc, post()).await.unwrap();
    assert_eq!(res.body(), "committed");
    assert_eq!(backend.ran_at(), Some(start));
    assert_eq!(start.elapsed(), delay);
}

#[tokio::test(start_paused = true)]
async fn delay_reply_cut_short_by_a_timeout_has_committed() {
    let backend = Backend::default();
    let mut svc = InjectFaultLayer::new(always(Fault::DelayReply(Duration::from_secs(10))))
        .layer(backend.service());

    let call = svc.ready().await.unwrap().call(post());
    let timed_out = tokio::time::timeout(Duration::from_secs(1), call).await;
    assert!(timed_out.is_err());
    assert_eq!(backend.runs(), 1, "a timeout after commit");
}

#[tokio::test(start_paused = true)]
async fn respond_answers_without_calling_inner() {
    let backend = Backend::default();
    let reply = Reply::new(StatusCode::SERVICE_UNAVAILABLE)
        .retry_after(Duration::from_secs(2))
        .header(
            http::HeaderName::from_static("x-upstream"),
            HeaderValue::from_static("overloaded"),
        );
    let mut svc = InjectFaultLayer::new(always(Fault::Respond(reply))).layer(backend.service());

    let res = send(&mut svc, post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "2");
    assert_eq!(res.headers()["x-upstream"], "overloaded");
    assert_eq!(res.body(), "", "the body is the default");
    assert_eq!(backend.runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn respond_after_send_runs_inner_and_replaces_its_answer() {
    let backend = Backend::default();
    let fault = Fault::RespondAfterSend(StatusCode::GATEWAY_TIMEOUT.into());
    let mut svc = InjectFaultLayer::new(always(fault)).layer(backend.service());

    let res = send(&mut svc, post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.body(), "");
    assert_eq!(backend.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn respond_without_a_response_maker_fails_with_the_matching_phase() {
    let backend = Backend::default();
    let policy = |req: &Req| {
        Some(if req.method() == http::Method::GET {
            Fault::Respond(StatusCode::SERVICE_UNAVAILABLE.into())
        } else {
            Fault::RespondAfterSend(StatusCode::BAD_GATEWAY.into())
        })
    };
    let mut svc = InjectFaultLayer::new(policy)
        .responses(NoResponse)
        .layer(backend.service());

    let get = http::Request::get("/orders").body(()).unwrap();
    let err = send(&mut svc, get).await.unwrap_err();
    assert_eq!(err.injected().unwrap().phase(), DeliveryPhase::NotSent);
    assert_eq!(
        err.to_string(),
        "injected fault: the response type cannot carry the injected 503 Service Unavailable \
         reply (refused before send)"
    );
    assert_eq!(backend.runs(), 0);

    let err = send(&mut svc, post()).await.unwrap_err();
    assert_eq!(err.injected().unwrap().phase(), DeliveryPhase::Sent);
    assert_eq!(backend.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_closure_builds_responses_of_its_own_type() {
    #[derive(Debug, PartialEq)]
    enum Answer {
        Stored,
        Status(u16),
    }
    struct Command;
    impl Envelope for Command {}

    let inner = service_fn(|_: Command| async { Ok::<_, std::io::Error>(Answer::Stored) });
    let mut svc = InjectFaultLayer::new(
        Schedule::new().at(1, Fault::Respond(StatusCode::TOO_MANY_REQUESTS.into())),
    )
    .responses(|reply: &Reply| Some(Answer::Status(reply.status().as_u16())))
    .layer(inner);

    let first = svc.ready().await.unwrap().call(Command).await.unwrap();
    assert_eq!(first, Answer::Stored);
    let second = svc.ready().await.unwrap().call(Command).await.unwrap();
    assert_eq!(second, Answer::Status(429));
}

#[test]
fn empty_body_copies_status_and_headers() {
    let reply = Reply::new(StatusCode::TOO_MANY_REQUESTS).retry_after(Duration::from_millis(1));
    let res: http::Response<Vec<u8>> = EmptyBody.make_response(&reply).unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.headers()["retry-after"],
        "1",
        "rounded up to a whole second"
    );
    assert!(res.body().is_empty());
}

#[tokio::test(start_paused = true)]
async fn inner_errors_pass_through_as_transport_errors() {
    let inner = service_fn(|_req: Req| async {
        Err::<Res, _>(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
    });
    let mut svc = InjectFaultLayer::new(()).layer(inner);
    let err = svc.ready().await.unwrap().call(post()).await.unwrap_err();
    assert!(err.is_transport());
    assert_eq!(
        err.transport_ref().unwrap().kind(),
        std::io::ErrorKind::ConnectionReset
    );
}

#[tokio::test(start_paused = true)]
async fn readiness_is_the_inner_services() {
    /// Never ready: fails `poll_ready`.
    struct Broken;
    impl Service<Req> for Broken {
        type Response = Res;
        type Error = std::io::Error;
        type Future = std::future::Ready<Result<Res, std::io::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Err(std::io::ErrorKind::ConnectionRefused.into()))
        }
        fn call(&mut self, _: Req) -> Self::Future {
            unreachable!("never ready")
        }
    }

    let mut svc = InjectFault::new(Broken, always(Fault::RefuseBeforeSend));
    let Err(err) = svc.ready().await else {
        panic!("the inner service is never ready")
    };
    assert!(err.is_transport());
    assert_eq!(
        err.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::Rejected
    );
}

#[tokio::test(start_paused = true)]
async fn layers_over_a_surely_error_without_nesting() {
    let backend = Backend::default();
    let inner = InjectFaultLayer::new(()).layer(backend.service());
    let mut svc = InjectFaultLayer::new(always(Fault::ResetAfterSend)).layer(inner);
    let err: Error<Infallible> = send(&mut svc, post()).await.unwrap_err();
    assert!(err.injected().is_some());
    assert_eq!(backend.runs(), 1);
}

/// The attempt timeout reads the request's progress handle: a timeout during a `Delay` is
/// before send, one during a `DelayReply` after it, even over a fake transport.
#[tokio::test(start_paused = true)]
async fn attempt_timeouts_see_how_far_a_delayed_request_got() {
    use surely::delivery::Progress;
    use surely::timeout::AttemptTimeoutLayer;

    for (fault, phase, class, runs) in [
        (
            Fault::Delay(Duration::from_secs(5)),
            DeliveryPhase::NotSent,
            AttemptClass::Rejected,
            0,
        ),
        (
            Fault::DelayReply(Duration::from_secs(5)),
            DeliveryPhase::Sent,
            AttemptClass::MaybeCommitted,
            1,
        ),
    ] {
        let backend = Backend::default();
        let mut svc = ServiceBuilder::new()
            .layer(AttemptTimeoutLayer::new(Duration::from_secs(1)))
            .layer(InjectFaultLayer::new(()))
            .service(backend.service());
        let mut req = post_with(fault);
        req.extensions_mut().insert(Progress::new());

        let err = send(&mut svc, req).await.unwrap_err();
        let elapsed = err.elapsed().expect("the attempt timed out");
        assert_eq!(elapsed.phase(), phase);
        assert_eq!(err.classify_error(DeliveryPhase::Sent).class(), class);
        assert_eq!(backend.runs(), runs);
    }
}

// ===== the policies =====

#[tokio::test(start_paused = true)]
async fn schedule_scripts_by_request_index_across_clones() {
    let backend = Backend::default();
    let schedule = Schedule::new().at(1, Fault::ResetAfterSend);
    let layer = InjectFaultLayer::new(schedule.clone());
    let mut a = layer.layer(backend.service());
    let mut b = a.clone();

    assert!(send(&mut a, post()).await.is_ok());
    let err = send(&mut b, post()).await.unwrap_err();
    assert_eq!(err.injected().unwrap().phase(), DeliveryPhase::Sent);
    assert!(send(&mut a, post()).await.is_ok());
    assert!(send(&mut b, post()).await.is_ok());
    assert_eq!(backend.runs(), 4);
    assert_eq!(schedule.seen(), 4);
}

#[test]
fn schedule_otherwise_and_exemptions() {
    let outage = Schedule::new()
        .otherwise(Fault::RefuseBeforeSend)
        .at(0, None)
        .at(2, Fault::ResetAfterSend);
    let faults: Vec<_> = (0..4).map(|_| outage.fault(&())).collect();
    assert_eq!(
        faults,
        [
            None,
            Some(Fault::RefuseBeforeSend),
            Some(Fault::ResetAfterSend),
            Some(Fault::RefuseBeforeSend),
        ]
    );

    let listed: Schedule = [None, Some(Fault::Delay(Duration::from_secs(1)))]
        .into_iter()
        .collect();
    let faults: Vec<_> = (0..3).map(|_| listed.fault(&())).collect();
    assert_eq!(
        faults,
        [None, Some(Fault::Delay(Duration::from_secs(1))), None]
    );

    // A later entry for the same index replaces the earlier one.
    let replaced = Schedule::new()
        .at(0, Fault::RefuseBeforeSend)
        .at(0, Fault::ResetAfterSend);
    assert_eq!(replaced.fault(&()), Some(Fault::ResetAfterSend));
}

#[test]
fn schedules_are_the_same_on_every_run() {
    let make = || {
        Schedule::new()
            .at(3, Fault::ResetAfterSend)
            .at(7, Fault::RefuseBeforeSend)
    };
    let run = |s: Schedule| (0..10).map(|_| s.fault(&())).collect::<Vec<_>>();
    assert_eq!(run(make()), run(make()));
}

fn mixed() -> [(f64, Fault); 3] {
    [
        (0.2, Fault::ResetAfterSend),
        (0.1, Fault::RefuseBeforeSend),
        (0.05, Fault::Respond(StatusCode::SERVICE_UNAVAILABLE.into())),
    ]
}

fn draws(policy: &Seeded, n: usize) -> Vec<Option<Fault>> {
    (0..n).map(|_| policy.fault(&())).collect()
}

#[test]
fn seeded_is_deterministic_for_a_seed() {
    let a = draws(&Seeded::new(42, mixed()).unwrap(), 1000);
    let b = draws(&Seeded::new(42, mixed()).unwrap(), 1000);
    assert_eq!(a, b);
    let c = draws(&Seeded::new(43, mixed()).unwrap(), 1000);
    assert_ne!(a, c, "another seed, another sequence");
}

#[test]
fn seeded_clones_share_one_sequence() {
    let reference = draws(&Seeded::new(9, mixed()).unwrap(), 20);
    let policy = Seeded::new(9, mixed()).unwrap();
    let clone = policy.clone();
    let interleaved: Vec<_> = (0..20)
        .map(|i| {
            if i % 2 == 0 {
                policy.fault(&())
            } else {
                clone.fault(&())
            }
        })
        .collect();
    assert_eq!(interleaved, reference);
}

#[test]
fn seeded_follows_its_probabilities() {
    let n = 20_000;
    let got = draws(&Seeded::new(7, mixed()).unwrap(), n);
    let share =
        |f: &dyn Fn(&Option<Fault>) -> bool| got.iter().filter(|x| f(x)).count() as f64 / n as f64;
    let reset = share(&|f| f == &Some(Fault::ResetAfterSend));
    let refused = share(&|f| f == &Some(Fault::RefuseBeforeSend));
    let respond = share(&|f| matches!(f, Some(Fault::Respond(_))));
    let pass = share(&|f| f.is_none());
    assert!((reset - 0.2).abs() < 0.02, "reset {reset}");
    assert!((refused - 0.1).abs() < 0.02, "refused {refused}");
    assert!((respond - 0.05).abs() < 0.02, "respond {respond}");
    assert!((pass - 0.65).abs() < 0.02, "pass {pass}");
}

#[test]
fn seeded_edges() {
    let never = Seeded::new(1, [(0.0, Fault::ResetAfterSend)]).unwrap();
    assert!(draws(&never, 1000).iter().all(Option::is_none));
    let always = Seeded::new(1, [(1.0, Fault::ResetAfterSend)]).unwrap();
    assert!(draws(&always, 1000)
        .iter()
        .all(|f| f == &Some(Fault::ResetAfterSend)));
    let none = Seeded::new(1, []).unwrap();
    assert!(draws(&none, 100).iter().all(Option::is_none));
    // Adding up to 1 with rounding either way: every request gets a fault.
    for faults in [
        [
            (0.1, Fault::ResetAfterSend),
            (0.2, Fault::RefuseBeforeSend),
            (0.7, Fault::ResetAfterSend),
        ],
        [
            (0.7, Fault::ResetAfterSend),
            (0.2, Fault::RefuseBeforeSend),
            (0.1, Fault::ResetAfterSend),
        ],
    ] {
        let full = Seeded::new(1, faults).unwrap();
        assert!(draws(&full, 1000).iter().all(Option::is_some));
    }
}

#[test]
fn bad_probabilities_are_errors() {
    for p in [
        f64::NAN,
        -0.1,
        -f64::EPSILON,
        1.5,
        1.0 + 1e-6,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ] {
        let err = Seeded::new(
            1,
            [(0.1, Fault::RefuseBeforeSend), (p, Fault::ResetAfterSend)],
        )
        .unwrap_err();
        assert_eq!(err.setting(), "fault probability", "{p}");
    }
    let err = Seeded::new(
        1,
        [(0.6, Fault::RefuseBeforeSend), (0.6, Fault::ResetAfterSend)],
    )
    .unwrap_err();
    assert_eq!(err.setting(), "fault probabilities");
    assert_eq!(
        err.to_string(),
        "invalid fault probabilities: must add up to at most 1"
    );
}

proptest! {
    #[test]
    fn seeded_accepts_exactly_the_valid_probabilities(
        seed in any::<u64>(),
        ps in prop::collection::vec(prop_oneof![0.0..=1.0f64, any::<f64>()], 0..6),
    ) {
        let valid = ps.iter().all(|p| (0.0..=1.0).contains(p))
            && ps.iter().sum::<f64>() <= 1.0 + 1e-9;
        let policy = Seeded::new(seed, ps.iter().map(|&p| (p, Fault::ResetAfterSend)));
        prop_assert_eq!(policy.is_ok(), valid);
        if let Ok(policy) = policy {
            for _ in 0..10 {
                let _ = policy.fault(&());
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_requests_own_fault_overrides_the_policy() {
    let backend = Backend::default();
    // Every request is reset, except the one that asks to be refused.
    let schedule = Schedule::new().otherwise(Fault::ResetAfterSend);
    let mut svc = InjectFaultLayer::new(schedule.clone()).layer(backend.service());

    let err = send(&mut svc, post_with(Fault::RefuseBeforeSend))
        .await
        .unwrap_err();
    assert_eq!(err.injected().unwrap().phase(), DeliveryPhase::NotSent);
    assert_eq!(backend.runs(), 0);
    assert_eq!(schedule.seen(), 1, "the policy was still asked");

    let err = send(&mut svc, post()).await.unwrap_err();
    assert_eq!(err.injected().unwrap().phase(), DeliveryPhase::Sent);
    assert_eq!(backend.runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_no_policy_only_marked_requests_get_faults() {
    let backend = Backend::default();
    let mut svc = InjectFaultLayer::new(()).layer(backend.service());

    assert!(send(&mut svc, post()).await.is_ok());
    let start = Instant::now();
    let res = send(
        &mut svc,
        post_with(Fault::Delay(Duration::from_millis(250))),
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::from_millis(250));
    let err = send(&mut svc, post_with(Fault::ResetAfterSend))
        .await
        .unwrap_err();
    assert!(err.injected().is_some());
    assert_eq!(backend.runs(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_closure_policy_sees_the_request() {
    let backend = Backend::default();
    let policy =
        |req: &Req| (req.method() == http::Method::POST).then_some(Fault::RefuseBeforeSend);
    let mut svc = ServiceBuilder::new()
        .layer(InjectFaultLayer::new(policy))
        .service(backend.service());

    let get = http::Request::get("/orders").body(()).unwrap();
    assert!(send(&mut svc, get).await.is_ok());
    assert!(send(&mut svc, post()).await.is_err());
    assert_eq!(backend.runs(), 1);
}

// ===== composition =====

#[test]
fn composes_with_service_builder() {
    fn assert_service<
        S: Service<Req, Response = Res, Error = Error<surely::BoxedError>> + Clone + Send,
    >(
        _: &S,
    ) {
    }

    let svc = ServiceBuilder::new()
        .layer(InjectFaultLayer::new(
            Seeded::new(1, [(0.5, Fault::ResetAfterSend)]).unwrap(),
        ))
        .map_err(|e: Infallible| -> tower::BoxError { match e {} })
        .service(Backend::default().service());
    assert_service(&svc);
    let _ = format!("{svc:?}", svc = svc.policy());
}

// ===== the server side =====

/// A hyper server whose handler commits, then has its reply thrown away: the client sees the
/// connection close without a response.
#[tokio::test]
async fn server_side_reset_after_send_closes_the_connection() {
    use bytes::Bytes;
    use http_body_util::{Empty, Full};
    use hyper_util::rt::TokioIo;

    use crate::support::serve::serve;

    let commits = Arc::new(AtomicUsize::new(0));
    let counted = commits.clone();
    let handler = service_fn(move |_req: http::Request<hyper::body::Incoming>| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                b"created",
            ))))
        }
    });
    let svc = InjectFaultLayer::new(Schedule::new().at(1, Fault::ResetAfterSend)).layer(handler);

    // Every connection gets a clone: the schedule counts requests across them.
    let addr = serve(svc).await;

    let request = || {
        http::Request::post("/orders")
            .header(http::header::HOST, "localhost")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let connect = || async {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        sender
    };

    let mut sender = connect().await;
    let res = sender.send_request(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    // The second request commits, and the connection closes before any response.
    let err = sender.send_request(request()).await.unwrap_err();
    assert!(err.is_incomplete_message(), "{err:?}");
    assert_eq!(commits.load(Ordering::SeqCst), 2);

    // A new connection works again.
    let mut sender = connect().await;
    let res = sender.send_request(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(commits.load(Ordering::SeqCst), 3);
}

/// The layer of an axum server: `Router::layer` takes `InjectServerFaultLayer`, served on
/// 127.0.0.1. A reset lets the handler commit and closes the connection before any answer; a
/// refusal never runs the handler and answers `503` not processed (classified *rejected*);
/// made-up replies answer without the handler, or after it.
#[tokio::test]
async fn server_faults_inside_an_axum_router_on_loopback() {
    use axum::routing::post;
    use axum::Router;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::TokioIo;
    use surely::classify::HttpRequestClassifier;
    use surely::fault::InjectServerFaultLayer;

    let commits = Arc::new(AtomicUsize::new(0));
    let counted = commits.clone();
    let create = move || {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, "created")
        }
    };
    let faults = Schedule::new()
        .at(1, Fault::ResetAfterSend)
        .at(2, Fault::RefuseBeforeSend)
        .at(
            3,
            Fault::Respond(
                Reply::new(StatusCode::TOO_MANY_REQUESTS).retry_after(Duration::from_secs(2)),
            ),
        )
        .at(4, Fault::RespondAfterSend(StatusCode::BAD_GATEWAY.into()));
    let app = Router::new()
        .route("/orders", post(create))
        .layer(InjectServerFaultLayer::new(faults));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let request = || {
        http::Request::post("/orders")
            .header(http::header::HOST, "localhost")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let connect = || async {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        sender
    };
    let keyed = HttpRequestClassifier::new(surely::Semantics::Keyed, false);

    let mut sender = connect().await;
    let res = sender.send_request(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(
        res.into_body().collect().await.unwrap().to_bytes(),
        "created"
    );
    assert_eq!(commits.load(Ordering::SeqCst), 1);

    // The handler commits; the connection closes before any byte of its answer.
    let err = sender.send_request(request()).await.unwrap_err();
    assert!(err.is_incomplete_message(), "{err:?}");
    assert_eq!(commits.load(Ordering::SeqCst), 2);

    // Refused: the handler does not run, and the answer says so.
    let mut sender = connect().await;
    let res = sender.send_request(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["surely-not-processed"], "injected-fault");
    let class = keyed.classify_status(res.status(), res.headers()).class();
    assert_eq!(class, AttemptClass::Rejected);
    assert_eq!(commits.load(Ordering::SeqCst), 2);

    // A made-up reply without the handler; then one after it.
    let res = sender.send_request(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["retry-after"], "2");
    assert!(res
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
    assert_eq!(commits.load(Ordering::SeqCst), 2);
    let res = sender.send_request(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(commits.load(Ordering::SeqCst), 3);

    // Then the handler's own answers again, on the same connection.
    let res = sender.send_request(request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(commits.load(Ordering::SeqCst), 4);
}

/// A keyed POST through the crate's client to an axum server whose idempotency layer sits on
/// the route and whose fault layer wraps the router: the first attempt commits and loses its
/// answer, the retry with the same key gets the replay, and the handler ran once.
#[tokio::test]
async fn a_reset_after_commit_in_an_axum_router_is_replayed_to_the_keyed_retry() {
    use axum::routing::post;
    use axum::Router;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use surely::fault::InjectServerFaultLayer;
    use surely::retry::ReplayBody;
    use surely::server::idempotency::IdempotencyLayer;
    use surely::server::store::MemoryStore;
    use surely::OutcomeExt;

    let commits = Arc::new(AtomicUsize::new(0));
    let counted = commits.clone();
    let create = move |body: Bytes| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, body)
        }
    };
    let keys = IdempotencyLayer::builder(MemoryStore::new())
        .build()
        .unwrap();
    let app = Router::new()
        .route("/orders", post(create).layer(keys))
        .layer(InjectServerFaultLayer::new(
            Schedule::new().at(0, Fault::ResetAfterSend),
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let hyper = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>();
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(5))
        .server_honours_keys()
        .build(hyper)
        .unwrap();
    let req = http::Request::post(format!("http://{addr}/orders"))
        .body(Full::new(Bytes::from_static(b"o-1")))
        .unwrap();
    let res = client.ready().await.unwrap().call(req).await;
    assert!(res.is_replayed(), "{:?}", res.call_outcome());
    let res = res.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "o-1");
    assert_eq!(commits.load(Ordering::SeqCst), 1, "the handler ran once");
}

/// The delays, inside a router called in process (paused time): `Delay` runs the handler after
/// its wait, `DelayReply` runs it at once and answers after its wait.
#[tokio::test(start_paused = true)]
async fn server_delays_inside_an_axum_router() {
    use axum::routing::post;
    use axum::Router;
    use surely::fault::InjectServerFaultLayer;

    let ran_at = Arc::new(std::sync::Mutex::new(None));
    let seen = ran_at.clone();
    let create = move || {
        let seen = seen.clone();
        async move {
            *seen.lock().unwrap() = Some(Instant::now());
            StatusCode::CREATED
        }
    };
    let d = Duration::from_millis(250);
    let app = Router::new()
        .route("/orders", post(create))
        .layer(InjectServerFaultLayer::new(
            Schedule::new()
                .at(0, Fault::Delay(d))
                .at(1, Fault::DelayReply(d)),
        ));
    let post = || {
        http::Request::post("/orders")
            .body(axum::body::Body::empty())
            .unwrap()
    };

    let start = Instant::now();
    let res = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(ran_at.lock().unwrap().unwrap() - start, d);
    assert_eq!(start.elapsed(), d);

    let start = Instant::now();
    let res = app.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(ran_at.lock().unwrap().unwrap(), start);
    assert_eq!(start.elapsed(), d);
}

/// Between the idempotency layer and the handler (in process, paused time): a reset leaves the
/// answer unreadable to the idempotency layer (`500`, the record `PROCESSING`: a duplicate gets
/// `409`); a refusal is not processed, so the key is released and the next request runs.
#[tokio::test(start_paused = true)]
async fn server_faults_inside_the_idempotency_layer() {
    use axum::routing::post;
    use axum::Router;
    use surely::fault::InjectServerFaultLayer;
    use surely::server::idempotency::IdempotencyLayer;
    use surely::server::store::MemoryStore;

    let commits = Arc::new(AtomicUsize::new(0));
    let counted = commits.clone();
    let create = move || {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED
        }
    };
    let keys = IdempotencyLayer::builder(MemoryStore::new())
        .build()
        .unwrap();
    let faults = InjectServerFaultLayer::new(
        Schedule::new()
            .at(0, Fault::ResetAfterSend)
            .at(1, Fault::RefuseBeforeSend),
    );
    let app = Router::new().route(
        "/orders",
        post(create).layer(ServiceBuilder::new().layer(keys).layer(faults)),
    );
    let post = |key: &str| {
        http::Request::post("/orders")
            .header("idempotency-key", key)
            .body(axum::body::Body::empty())
            .unwrap()
    };

    let res = app.clone().oneshot(post("k-reset")).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(commits.load(Ordering::SeqCst), 1);
    let res = app.clone().oneshot(post("k-reset")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT, "still processing");

    let res = app.clone().oneshot(post("k-refused")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(commits.load(Ordering::SeqCst), 1);
    let res = app.clone().oneshot(post("k-refused")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED, "released: runs now");
    assert_eq!(commits.load(Ordering::SeqCst), 2);
}
