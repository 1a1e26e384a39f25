//! The breaker kept by a retry layer (`RetryLayerBuilder::circuit_breaker`) against the same
//! breaker as a `BreakerLayer` right inside the retry layer: the two must admit, refuse
//! and count exactly alike. Generated scripts drive both stacks in lockstep under paused time
//! (same calls, same answers, same instants) and compare everything they show.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use proptest::prelude::*;
use surely::breaker::{BreakerLayer, BreakerState, CircuitBreaker, SlidingWindow};
use surely::deadline::SetDeadlineLayer;
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;
use surely::retry::{RetryLayer, RetryLayerBuilder};
use surely::timeout::AttemptTimeoutLayer;
use surely::{Error, OutcomeExt};
use tower::util::BoxCloneService;
use tower::{Service, ServiceBuilder, ServiceExt};

use super::{transitions, Backend};

type Svc = BoxCloneService<Request<()>, Response<()>, Error<std::io::Error>>;

/// One answer of the scripted dependency: a status after a delay.
#[derive(Clone, Copy, Debug)]
struct Answer {
    status: u16,
    delay: Duration,
}

/// A dependency that gives its script's answers in turn, one per request it gets.
#[derive(Clone)]
struct Scripted {
    answers: Arc<Vec<Answer>>,
    calls: Arc<AtomicUsize>,
}

impl Scripted {
    fn new(answers: &[Answer]) -> Self {
        Scripted {
            answers: Arc::new(answers.to_vec()),
            calls: Arc::new(AtomicUsize::new(0)),
        }
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
        let s = self.clone();
        tower::service_fn(move |_req: Request<()>| {
            let n = s.calls.fetch_add(1, SeqCst);
            let answer = s.answers[n % s.answers.len()];
            async move {
                tokio::time::sleep(answer.delay).await;
                Ok(Response::builder().status(answer.status).body(()).unwrap())
            }
        })
    }
}

/// The breaker both stacks get a copy of: a small count window, a short seeded break.
#[derive(Clone, Copy, Debug)]
struct Settings {
    probes: u32,
    slow_call: Option<Duration>,
    deadline: Duration,
    per_try: Duration,
    attempts: u32,
}

fn breaker(s: &Settings, rec: &InMemoryRecorder) -> CircuitBreaker {
    CircuitBreaker::builder()
        .window(SlidingWindow::Count(8))
        .min_throughput(4)
        .failure_ratio(0.5)
        .break_duration(Duration::from_millis(300))
        .break_growth(2.0, Duration::from_secs(2))
        .jitter(0.1)
        .seed(7)
        .half_open_probes(s.probes)
        .slow_call_threshold(s.slow_call)
        .min_timeout_evidence(Duration::from_millis(40))
        .recorder(rec.clone())
        .build()
        .unwrap()
}

fn retry(s: &Settings) -> RetryLayerBuilder {
    RetryLayer::builder()
        .max_attempts(s.attempts)
        .backoff(Backoff::constant(Duration::from_millis(20)))
        .no_budget()
}

/// Deadline → retry → breaker layer → attempt timeout → `dep`.
fn layered(s: &Settings, breaker: CircuitBreaker, dep: &Scripted) -> Svc {
    BoxCloneService::new(
        ServiceBuilder::new()
            .layer(SetDeadlineLayer::new(s.deadline))
            .layer(retry(s).build().unwrap())
            .layer(BreakerLayer::new(breaker))
            .layer(AttemptTimeoutLayer::new(s.per_try))
            .service(dep.service()),
    )
}

/// Deadline → retry with its own breaker → attempt timeout → `dep`.
fn kept(s: &Settings, breaker: CircuitBreaker, dep: &Scripted) -> Svc {
    BoxCloneService::new(
        ServiceBuilder::new()
            .layer(SetDeadlineLayer::new(s.deadline))
            .layer(retry(s).circuit_breaker(breaker).build().unwrap())
            .layer(AttemptTimeoutLayer::new(s.per_try))
            .service(dep.service()),
    )
}

/// What a call showed its caller, in a form two stacks can be compared by.
fn seen(res: Result<Response<()>, Error<std::io::Error>>) -> String {
    match res {
        Ok(res) => {
            let call = res.call_outcome().map(|c| (c.outcome(), c.attempts()));
            format!("{} {call:?}", res.status())
        }
        Err(e) => {
            let call = e.call_outcome().map(|c| (c.outcome(), c.attempts()));
            format!(
                "open={} deadline={} elapsed={} {call:?}",
                e.is_circuit_open(),
                e.is_deadline_exceeded(),
                e.elapsed().is_some()
            )
        }
    }
}

/// One step of a script: a pause, then calls made together (one or two).
#[derive(Clone, Copy, Debug)]
struct Step {
    pause: Duration,
    together: usize,
    post: bool,
}

fn answer() -> impl Strategy<Value = Answer> {
    (
        prop_oneof![Just(200u16), Just(503), Just(500), Just(404), Just(429)],
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::from_millis(30)),
            Just(Duration::from_millis(120)),
            Just(Duration::from_millis(900)),
        ],
    )
        .prop_map(|(status, delay)| Answer { status, delay })
}

fn step() -> impl Strategy<Value = Step> {
    (0u64..500, 1usize..=2, any::<bool>()).prop_map(|(pause, together, post)| Step {
        pause: Duration::from_millis(pause),
        together,
        post,
    })
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        1u32..=2,
        prop_oneof![Just(None), Just(Some(Duration::from_millis(100)))],
        prop_oneof![Just(150u64), Just(600), Just(2_000)],
        prop_oneof![Just(50u64), Just(200), Just(1_000)],
        1u32..=3,
    )
        .prop_map(
            |(probes, slow_call, deadline, per_try, attempts)| Settings {
                probes,
                slow_call,
                deadline: Duration::from_millis(deadline),
                per_try: Duration::from_millis(per_try),
                attempts,
            },
        )
}

fn request(post: bool) -> Request<()> {
    let req = if post {
        Request::post("/orders")
    } else {
        Request::get("/orders")
    };
    req.body(()).unwrap()
}

async fn one(svc: &Svc, post: bool) -> String {
    let svc = svc.clone();
    seen(svc.oneshot(request(post)).await)
}

/// Runs `steps` on both stacks in lockstep; returns the first difference, if any.
async fn compare(s: Settings, answers: Vec<Answer>, steps: Vec<Step>) -> Result<(), String> {
    compare_with(s, answers, steps, breaker).await
}

/// As [`compare`], the retry layer keeping a breaker made by `kept_breaker`.
async fn compare_with(
    s: Settings,
    answers: Vec<Answer>,
    steps: Vec<Step>,
    kept_breaker: fn(&Settings, &InMemoryRecorder) -> CircuitBreaker,
) -> Result<(), String> {
    let (rec_a, rec_b) = (InMemoryRecorder::new(), InMemoryRecorder::new());
    let (breaker_a, breaker_b) = (breaker(&s, &rec_a), kept_breaker(&s, &rec_b));
    let (dep_a, dep_b) = (Scripted::new(&answers), Scripted::new(&answers));
    let a = layered(&s, breaker_a.clone(), &dep_a);
    let b = kept(&s, breaker_b.clone(), &dep_b);
    for (i, step) in steps.iter().enumerate() {
        tokio::time::sleep(step.pause).await;
        let (seen_a, seen_b) = if step.together == 1 {
            let (x, y) = tokio::join!(biased; one(&a, step.post), one(&b, step.post));
            (vec![x], vec![y])
        } else {
            let (x1, x2, y1, y2) = tokio::join!(
                biased;
                one(&a, step.post),
                one(&a, false),
                one(&b, step.post),
                one(&b, false)
            );
            (vec![x1, x2], vec![y1, y2])
        };
        let here = |what: &str, x: &dyn std::fmt::Debug, y: &dyn std::fmt::Debug| {
            format!("step {i} ({step:?}): {what}: layer {x:?}, kept by the retry layer {y:?}")
        };
        if seen_a != seen_b {
            return Err(here("results", &seen_a, &seen_b));
        }
        if breaker_a.state() != breaker_b.state() {
            return Err(here("state", &breaker_a.state(), &breaker_b.state()));
        }
        if breaker_a.window() != breaker_b.window() {
            return Err(here("window", &breaker_a.window(), &breaker_b.window()));
        }
        let (calls_a, calls_b) = (dep_a.calls.load(SeqCst), dep_b.calls.load(SeqCst));
        if calls_a != calls_b {
            return Err(here("requests sent", &calls_a, &calls_b));
        }
    }
    if transitions(&rec_a) != transitions(&rec_b) {
        return Err(format!(
            "transitions: layer {:?}, kept {:?}",
            transitions(&rec_a),
            transitions(&rec_b)
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn a_breaker_kept_by_the_retry_layer_counts_as_a_breaker_layer_inside_it(
        s in settings(),
        answers in prop::collection::vec(answer(), 1..24),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let diff = rt.block_on(compare(s, answers, steps));
        prop_assert!(diff.is_ok(), "{}", diff.unwrap_err());
    }
}

/// The differential test above must be able to fail: a breaker that counts differently (here,
/// one that never opens) is told apart.
#[test]
fn the_comparison_tells_a_different_breaker_apart() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let s = Settings {
        probes: 1,
        slow_call: None,
        deadline: Duration::from_secs(2),
        per_try: Duration::from_secs(1),
        attempts: 1,
    };
    let down = vec![Answer {
        status: 503,
        delay: Duration::ZERO,
    }];
    let steps = vec![
        Step {
            pause: Duration::ZERO,
            together: 1,
            post: false,
        };
        6
    ];
    // Alike: both open after four failures.
    rt.block_on(compare(s, down.clone(), steps.clone()))
        .unwrap();
    // Not alike: the kept breaker needs more calls to open.
    let slower = |s: &Settings, rec: &InMemoryRecorder| {
        CircuitBreaker::builder()
            .min_throughput(5)
            .break_duration(Duration::from_millis(300))
            .half_open_probes(s.probes)
            .recorder(rec.clone())
            .build()
            .unwrap()
    };
    let diff = rt.block_on(compare_with(s, down, steps, slower));
    assert!(
        diff.unwrap_err().contains("step 3"),
        "it differs at the fourth call"
    );
}

/// A probe dropped in flight (its caller went away) gives its place back with the breaker
/// kept by the retry layer too.
#[tokio::test(start_paused = true)]
async fn a_kept_breakers_probe_dropped_in_flight_gives_its_place_back() {
    let rec = InMemoryRecorder::new();
    let breaker = super::builder(&rec).build().unwrap();
    let backend = Backend::new();
    let mut svc = ServiceBuilder::new()
        .layer(
            RetryLayer::builder()
                .max_attempts(1)
                .circuit_breaker(breaker.clone())
                .build()
                .unwrap(),
        )
        .service(backend.service());
    backend.answer(503);
    for _ in 0..4 {
        let res = svc.ready().await.unwrap().call(request(false)).await;
        assert_eq!(res.unwrap().status(), 503);
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    tokio::time::advance(super::BREAK).await;
    // The probe goes out and is dropped before it answers.
    backend.answer(200);
    backend.delay(Duration::from_secs(1));
    let probe = svc.ready().await.unwrap().call(request(false));
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let refused = svc.ready().await.unwrap().call(request(false)).await;
    assert!(
        refused.unwrap_err().is_circuit_open(),
        "one probe at a time"
    );
    drop(probe);
    // Its place is free: the next call is the probe, and its success closes the breaker.
    backend.delay(Duration::ZERO);
    let res = svc.ready().await.unwrap().call(request(false)).await;
    assert_eq!(res.unwrap().status(), 200);
    assert_eq!(breaker.state(), BreakerState::Closed);
    // Four failures and the last probe: the dropped one was never polled, the refused one
    // never made.
    assert_eq!(backend.calls(), 5);
}
