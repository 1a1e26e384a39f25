// The floor of the `client::http()` preset on a GET, for `benches/overhead.rs` (timed, paired)
// and `benches/instructions` (counted): what any stack that does the preset's work on the wire
// and on the return path must do at the least, written by hand with no layer and no decision.
//
// * the deadline (`x-request-timeout-ms`, a value made once, as the preset's is for a call with
//   its whole budget left) and the retry owner marker written on the request;
// * a look for the caller's idempotency key (the key layer must know whether there is one);
// * the request's copy for a retry, kept until the answer (tower's stack makes it too);
// * the call's outcome handed back in the response's extensions.
//
// Over a bare `http::Response` each of these goes through `http`'s own maps: a custom header
// name is hashed byte by byte on every insert and look-up, and the first extension of a
// response allocates the map, its table and the boxed value. None of it is surely's code.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use http::HeaderValue;
use surely::headers::{DEFAULT_HEADER, IDEMPOTENCY_KEY, RETRY_OWNER};
use surely::{CallOutcome, Outcome, StopReason};
use tower::Service;

/// The floor's service over the transport `S`.
#[derive(Clone, Debug)]
pub(crate) struct Floor<S>(pub(crate) S);

impl<S, B, Rb> Service<http::Request<B>> for Floor<S>
where
    S: Service<http::Request<B>, Response = http::Response<Rb>>,
    B: Clone,
{
    type Response = http::Response<Rb>;
    type Error = S::Error;
    type Future = FloorFuture<S::Future, http::Request<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let headers = req.headers_mut();
        headers.insert(DEFAULT_HEADER, HeaderValue::from_static("10000"));
        headers.insert(RETRY_OWNER, HeaderValue::from_static("1"));
        std::hint::black_box(headers.contains_key(IDEMPOTENCY_KEY));
        let template = Some(req.clone());
        FloorFuture {
            inner: self.0.call(req),
            template,
        }
    }
}

pin_project_lite::pin_project! {
    /// The floor's future: the transport's, the request's copy beside it.
    pub(crate) struct FloorFuture<F, Rq> {
        #[pin]
        inner: F,
        template: Option<Rq>,
    }
}

impl<F, Rq, Rb, E> Future for FloorFuture<F, Rq>
where
    F: Future<Output = Result<http::Response<Rb>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = ready!(this.inner.poll(cx))?;
        this.template.take();
        let outcome = CallOutcome::new(Outcome::Succeeded, StopReason::Success, 1);
        res.extensions_mut().insert(outcome);
        Poll::Ready(Ok(res))
    }
}
