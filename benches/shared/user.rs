//! The user's code that `benches/assembly.rs` times and `benches/instructions` counts: the
//! request and response types, the inner services, the caller's `async fn`, the tower policy
//! and classifier a user writes, and the stacks both measure, made the same way in both.
//! Included with `#[path]` by each (this directory holds no bench of its own).

use std::cell::Cell;
use std::fmt;
use std::future::{ready, Ready};
use std::io;
use std::sync::Arc;
use std::time::Duration;

use surely::budget::{RatioBudget, RetryBudget};
use surely::classify::{Attempted, Classification};
use surely::{Envelope, IntoError, Semantics};
use tower::retry::budget::{Budget, TpsBudget};
use tower::retry::Policy;
use tower::{Service, ServiceExt};

/// Every timeout and deadline: long enough never to fire.
pub(crate) const LIMIT: Duration = Duration::from_secs(1);
/// Retries after the first attempt, for tower's policy and seatbelt's retry (surely's default
/// attempt limit, 3, less the first).
pub(crate) const RETRIES: u32 = 2;

/// The user's request: a read of item `n`, safe to send twice.
#[derive(Clone, Debug)]
pub(crate) struct Get(#[allow(dead_code)] pub(crate) u64);

impl Envelope for Get {
    fn semantics(&self) -> Semantics {
        Semantics::Safe
    }
}

/// The user's response.
#[derive(Debug)]
pub(crate) struct Page;

impl Envelope for Page {}

/// The user's transport error of the `large` shape: what failed, and 64 bytes of detail kept
/// inline (an address, a reason), as some clients keep theirs.
#[derive(Debug)]
pub(crate) struct FetchError {
    kind: io::ErrorKind,
    detail: [u8; 64],
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fetch failed: {} ({} bytes of detail)",
            self.kind,
            self.detail.len()
        )
    }
}

impl std::error::Error for FetchError {}

impl IntoError for FetchError {
    type Transport = FetchError;

    fn into_error(self) -> surely::Error<FetchError> {
        surely::Error::transport(self)
    }
}

/// A shape of inner service: its error type.
pub(crate) trait Shape: 'static {
    type Error: std::error::Error + IntoError + Send + Sync + 'static;

    /// The refusal of `fail_once`'s first attempts.
    fn refused() -> Self::Error;

    /// What seatbelt's timeout answers if it fires (never here; its layer asks for one).
    fn timed_out() -> Self::Error;
}

/// `std::io::Error`, one pointer wide.
pub(crate) enum Small {}

impl Shape for Small {
    type Error = io::Error;

    fn refused() -> io::Error {
        io::ErrorKind::ConnectionRefused.into()
    }

    fn timed_out() -> io::Error {
        io::ErrorKind::TimedOut.into()
    }
}

/// `FetchError`, 72 bytes.
pub(crate) enum Large {}

impl Shape for Large {
    type Error = FetchError;

    fn refused() -> FetchError {
        FetchError {
            kind: io::ErrorKind::ConnectionRefused,
            detail: [0; 64],
        }
    }

    fn timed_out() -> FetchError {
        FetchError {
            kind: io::ErrorKind::TimedOut,
            detail: [0; 64],
        }
    }
}

thread_local! {
    /// Inner calls on this thread (the runtime's) by the `fail_once` service.
    static ATTEMPTS: Cell<u64> = const { Cell::new(0) };
}

/// The inner service of `ready`: a page at once.
pub(crate) fn answer<S: Shape>(_: Get) -> Ready<Result<Page, S::Error>> {
    ready(Ok(Page))
}

/// The inner service of `fail_once`: even inner calls are refused, odd ones answered, so a call
/// that retries once always starts on an even one.
pub(crate) fn refuse_first<S: Shape>(_: Get) -> Ready<Result<Page, S::Error>> {
    let n = ATTEMPTS.with(|a| a.replace(a.get() + 1));
    ready(if n.is_multiple_of(2) {
        Err(S::refused())
    } else {
        Ok(Page)
    })
}

/// `fail_once`'s baseline: both inner answers of a call, and no layer.
pub(crate) fn refuse_first_bare<S: Shape>(req: Get) -> Ready<Result<Page, S::Error>> {
    let first = refuse_first::<S>(req.clone()).into_inner();
    ready(first.or_else(|_| refuse_first::<S>(req).into_inner()))
}

/// How the user calls a tower service: a small `async fn` of theirs around `ready` and `call`.
pub(crate) async fn get<S: Service<Get>>(svc: &mut S, n: u64) -> Result<S::Response, S::Error> {
    svc.ready().await?.call(Get(n)).await
}

/// The user's tower retry policy, as tower's budget docs lead one to write it: retry any error
/// while retries are left and the budget allows, deposit on success; any request that clones.
#[derive(Clone)]
pub(crate) struct RetryErrors {
    pub(crate) budget: Arc<TpsBudget>,
    pub(crate) left: u32,
}

impl<Rq: Clone, Res, E> Policy<Rq, Res, E> for RetryErrors {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Rq, result: &mut Result<Res, E>) -> Option<Ready<()>> {
        if result.is_ok() {
            self.budget.deposit();
            return None;
        }
        let go = self.left > 0 && self.budget.withdraw();
        self.left = self.left.saturating_sub(1);
        go.then(|| ready(()))
    }

    fn clone_request(&mut self, req: &Rq) -> Option<Rq> {
        Some(req.clone())
    }
}

/// The user's classifier: any answer a success; any error a failure at the phase the layer
/// that saw it knows (`Get` is safe, so even a request that may have arrived is retried).
pub(crate) fn classify_get<E>(
    attempt: Attempted<'_, Page, surely::Error<E>>,
    _: Semantics,
) -> Classification {
    match attempt {
        Attempted::Response(_) => Classification::success(),
        Attempted::Error(_, phase) => Classification::failure_at(phase),
    }
}

/// The budgets: at their defaults on `ready`; one retry per call on `fail_once`, where at
/// their defaults both would run dry after about a hundred calls.
pub(crate) fn tps(one_per_call: bool) -> Arc<TpsBudget> {
    Arc::new(if one_per_call {
        TpsBudget::new(Duration::from_secs(10), 10, 1.0)
    } else {
        TpsBudget::default()
    })
}

pub(crate) fn ratio(one_per_call: bool) -> Arc<dyn RetryBudget> {
    if one_per_call {
        Arc::new(
            RatioBudget::builder()
                .ratio(1.0)
                .build()
                .expect("a valid budget"),
        )
    } else {
        Arc::new(RatioBudget::default())
    }
}

// ---- inner services shaped like real transports ---------------------------------------------

/// What a transport's clones share: a pool's handle, its settings. The inner services below
/// read it on every call, as a transport reads its pool.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) open: std::sync::atomic::AtomicBool,
}

fn shared() -> Arc<Shared> {
    Arc::new(Shared {
        open: std::sync::atomic::AtomicBool::new(true),
    })
}

/// An inner service that holds an `Arc` to shared state, as hyper-util's client, tonic's
/// `Channel` and reqwest's `Client` do: every retry layer clones it for each call.
#[derive(Clone, Debug)]
pub(crate) struct ArcInner {
    shared: Arc<Shared>,
}

impl ArcInner {
    pub(crate) fn new() -> Self {
        ArcInner { shared: shared() }
    }

    /// The answer, by reference (what seatbelt's `Execute` calls).
    pub(crate) fn answer(&self, _: Get) -> Ready<Result<Page, io::Error>> {
        let open = self.shared.open.load(std::sync::atomic::Ordering::Relaxed);
        ready(if open {
            Ok(Page)
        } else {
            Err(Small::refused())
        })
    }
}

/// An inner service that captured a value (a flag of the user's), the answer depending on it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CapturedInner {
    healthy: bool,
}

impl CapturedInner {
    pub(crate) fn new() -> Self {
        CapturedInner {
            healthy: std::hint::black_box(true),
        }
    }

    pub(crate) fn answer(&self, _: Get) -> Ready<Result<Page, io::Error>> {
        ready(if self.healthy {
            Ok(Page)
        } else {
            Err(Small::refused())
        })
    }
}

/// Bytes of settings beside the `Arc` in [`HyperSizedInner`], so that it is as large as
/// hyper-util's legacy `Client<HttpConnector, Empty<Bytes>>` (`benches/assembly.rs` prints
/// both sizes).
pub(crate) const HYPER_SETTINGS: usize = 296;

/// An inner service as large as hyper-util's client: an `Arc` to shared state, and its
/// settings (timeouts, pool sizes, HTTP/1 and HTTP/2 options) inline, cloned with it.
#[derive(Clone, Debug)]
pub(crate) struct HyperSizedInner {
    shared: Arc<Shared>,
    settings: [u8; HYPER_SETTINGS],
}

impl HyperSizedInner {
    pub(crate) fn new() -> Self {
        HyperSizedInner {
            shared: shared(),
            settings: std::hint::black_box([1; HYPER_SETTINGS]),
        }
    }

    pub(crate) fn answer(&self, _: Get) -> Ready<Result<Page, io::Error>> {
        let open = self.shared.open.load(std::sync::atomic::Ordering::Relaxed);
        ready(if open && self.settings[0] != 0 {
            Ok(Page)
        } else {
            Err(Small::refused())
        })
    }
}

/// The three as tower services.
macro_rules! inner_service {
    ($inner:ty) => {
        impl Service<Get> for $inner {
            type Response = Page;
            type Error = io::Error;
            type Future = Ready<Result<Page, io::Error>>;

            fn poll_ready(
                &mut self,
                _: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), io::Error>> {
                std::task::Poll::Ready(Ok(()))
            }

            fn call(&mut self, req: Get) -> Self::Future {
                self.answer(req)
            }
        }
    };
}
inner_service!(ArcInner);
inner_service!(CapturedInner);
inner_service!(HyperSizedInner);

/// surely's client as the user builds it over `$inner`, whose error is `$error`: no breaker,
/// the user's `classify::from_fn` classifier, no backoff, and a `RatioBudget` behind
/// `Arc<dyn RetryBudget>` (one retry per call when `$one_per_call`).
macro_rules! surely_client {
    ($inner:expr, $error:ty, $one_per_call:expr) => {
        surely::client()
            .no_breaker()
            .classifier(surely::classify::from_fn(classify_get::<$error>))
            .retry(|r| r.backoff(surely::retry::backoff::Backoff::none()))
            .budget(ratio($one_per_call))
            .build($inner)
            .expect("a valid client")
    };
}
pub(crate) use surely_client;

/// tower's `Retry` over its `Timeout` around `$inner`, with the user's policy.
macro_rules! tower_retry {
    ($inner:expr, $one_per_call:expr) => {
        tower::retry::Retry::new(
            RetryErrors {
                budget: tps($one_per_call),
                left: RETRIES,
            },
            tower::timeout::Timeout::new($inner, LIMIT),
        )
    };
}
pub(crate) use tower_retry;

/// surely's deadline (`LIMIT`, enforced in the attempts) over its attempt timeout around
/// `$inner`.
macro_rules! surely_deadline_attempt {
    ($inner:expr) => {
        tower::ServiceBuilder::new()
            .layer(
                surely::deadline::SetDeadlineLayer::builder()
                    .timeout(LIMIT)
                    .enforce_in_attempts()
                    .build()
                    .expect("a valid deadline"),
            )
            .layer(surely::timeout::AttemptTimeoutLayer::new(LIMIT))
            .service($inner)
    };
}
pub(crate) use surely_deadline_attempt;
