//! The server fault layer's service.

use std::convert::Infallible;
use std::task::{Context, Poll};

use http::{HeaderValue, Response, StatusCode};
use tower_service::Service;

use super::future::{ResponseFuture, WrapBody};
use super::{FaultBody, InjectServerFaultLayer};
use crate::delivery::Progress;
use crate::fault::future::{ResponseFuture as FaultFuture, Then};
use crate::fault::{Fault, FaultPolicy, Reply};
use crate::headers::NOT_PROCESSED;
use crate::Envelope;

/// The value of [`NOT_PROCESSED`] on the answer to an injected
/// [`RefuseBeforeSend`](Fault::RefuseBeforeSend).
const REFUSED: &str = "injected-fault";

/// Injects the [`Fault`]s its [`FaultPolicy`] chooses into the requests of a server's service
/// whose error is [`Infallible`], and answers each as a server can: made by
/// [`InjectServerFaultLayer`], which says what each fault becomes.
///
/// # Readiness
///
/// `poll_ready` is the inner service's; the faults that do not reach it
/// ([`RefuseBeforeSend`](Fault::RefuseBeforeSend), [`Respond`](Fault::Respond)) leave the
/// readiness they were given unused, as [`InjectFault`](crate::fault::InjectFault) does.
#[derive(Clone, Debug)]
pub struct InjectServerFault<S, P> {
    inner: S,
    policy: P,
}

impl<S, P> InjectServerFault<S, P> {
    /// Wraps `inner`, asking `policy` which fault each request gets.
    pub fn new(inner: S, policy: P) -> Self {
        InjectServerFault { inner, policy }
    }

    /// [`InjectServerFaultLayer::new`]`(policy)`, whose services are `InjectServerFault`s.
    pub fn layer(policy: P) -> InjectServerFaultLayer<P> {
        InjectServerFaultLayer::new(policy)
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    inner_accessors!();
}

impl<S, P, Req, RB> Service<Req> for InjectServerFault<S, P>
where
    S: Service<Req, Response = Response<RB>, Error = Infallible>,
    P: FaultPolicy<Req>,
    Req: Envelope,
{
    type Response = Response<FaultBody<RB>>;
    type Error = Infallible;
    type Future = ResponseFuture<S::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // Asked for every request, as `InjectFault` does, so that a schedule counts them all.
        let chosen = self.policy.fault(&req);
        let fault = match req.extensions().and_then(|e| e.get::<Fault>()) {
            Some(own) => Some(own.clone()),
            None => chosen,
        };
        let Some(fault) = fault else {
            let future = WrapBody::new(self.inner.call(req), false);
            return ResponseFuture::new(FaultFuture::call(future, Then::Pass));
        };
        tracing::debug!(?fault, "injecting a fault into a server's answer");
        let future = match fault {
            Fault::RefuseBeforeSend => FaultFuture::ready(Ok(not_processed())),
            Fault::ResetAfterSend => {
                FaultFuture::call(WrapBody::new(self.inner.call(req), true), Then::Pass)
            }
            Fault::Delay(delay) => {
                FaultFuture::delay(delay, WrapBody::new(self.inner.call(req), false))
            }
            Fault::DelayReply(delay) => {
                let progress = req.extensions().and_then(|e| e.get::<Progress>()).cloned();
                let future = WrapBody::new(self.inner.call(req), false);
                FaultFuture::call(future, Then::Hold(delay, progress))
            }
            Fault::Respond(reply) => FaultFuture::ready(Ok(made_up(&reply))),
            Fault::RespondAfterSend(reply) => {
                let future = WrapBody::new(self.inner.call(req), false);
                FaultFuture::call(future, Then::Replace(Ok(made_up(&reply))))
            }
        };
        ResponseFuture::new(future)
    }
}

/// The answer to a refusal before send: `503`, not processed.
fn not_processed<B>() -> Response<FaultBody<B>> {
    let mut res = Response::new(FaultBody::empty());
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    res.headers_mut()
        .insert(NOT_PROCESSED, HeaderValue::from_static(REFUSED));
    res
}

/// A reply's status and headers, with an empty body.
fn made_up<B>(reply: &Reply) -> Response<FaultBody<B>> {
    let mut res = Response::new(FaultBody::empty());
    *res.status_mut() = reply.status();
    *res.headers_mut() = reply.headers().clone();
    res
}
