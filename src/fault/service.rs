//! The fault layer's service.

use std::task::{Context, Poll};

use tower_service::Service;

use super::future::{ResponseFuture, Then};
use super::{EmptyBody, Fault, FaultPolicy, InjectFaultLayer, InjectedFault, MakeResponse, Reply};
use crate::classify::DeliveryPhase;
use crate::delivery::Progress;
use crate::{Envelope, Error, IntoError};

/// Injects the [`Fault`]s its [`FaultPolicy`] chooses into the requests of the service it
/// wraps. Made by [`InjectFaultLayer`]; see the [module docs](super).
///
/// Its error is the crate's [`Error`], over the inner service's transport error: the inner
/// service's errors pass through as they are, and injected failures are
/// [`Error::injected`](crate::Error::injected).
///
/// # Readiness
///
/// `poll_ready` is the inner service's, and every `call` is one `call` of the inner service
/// except for the faults that do not reach it ([`RefuseBeforeSend`](Fault::RefuseBeforeSend)
/// and [`Respond`](Fault::Respond)). Those still consumed the readiness the caller obtained:
/// whatever the inner service reserved for that call (a concurrency permit, a buffer slot)
/// stays reserved, unused, and serves the next request, as for any tower service that is
/// polled ready and then not called. The inner service is not cloned, so it need not be
/// `Clone`.
#[derive(Clone, Debug)]
pub struct InjectFault<S, P, M = EmptyBody> {
    pub(super) inner: S,
    pub(super) policy: P,
    pub(super) make_response: M,
}

impl<S, P> InjectFault<S, P> {
    /// Wraps `inner`, asking `policy` which fault each request gets, and building the
    /// responses of [`Respond`](Fault::Respond) faults with [`EmptyBody`], as
    /// [`InjectFaultLayer::new`].
    pub fn new(inner: S, policy: P) -> Self {
        InjectFault {
            inner,
            policy,
            make_response: EmptyBody,
        }
    }

    /// [`InjectFaultLayer::new`]`(policy)`, whose services are `InjectFault`s.
    pub fn layer(policy: P) -> InjectFaultLayer<P> {
        InjectFaultLayer::new(policy)
    }
}

impl<S, P, M> InjectFault<S, P, M> {
    /// This service, building the responses of [`Respond`](Fault::Respond) and
    /// [`RespondAfterSend`](Fault::RespondAfterSend) faults with `make_response` instead.
    pub fn responses<M2>(self, make_response: M2) -> InjectFault<S, P, M2> {
        InjectFault {
            inner: self.inner,
            policy: self.policy,
            make_response,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    inner_accessors!();
}

impl<S, P, M, Req> Service<Req> for InjectFault<S, P, M>
where
    S: Service<Req>,
    S::Error: IntoError,
    P: FaultPolicy<Req>,
    M: MakeResponse<S::Response>,
    Req: Envelope,
{
    type Response = S::Response;
    type Error = Error<<S::Error as IntoError>::Transport>;
    type Future = ResponseFuture<S::Future, S::Response, <S::Error as IntoError>::Transport>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // The policy is asked for every request, so that its counters and draws follow the
        // request order even when a request brings its own fault.
        let chosen = self.policy.fault(&req);
        let fault = match req.extensions().and_then(|e| e.get::<Fault>()) {
            Some(own) => Some(own.clone()),
            None => chosen,
        };
        let Some(fault) = fault else {
            return ResponseFuture::call(self.inner.call(req), Then::Pass);
        };
        tracing::debug!(?fault, "injecting a fault");
        match fault {
            Fault::RefuseBeforeSend => ResponseFuture::ready(Err(InjectedFault::refused())),
            Fault::ResetAfterSend => ResponseFuture::call(self.inner.call(req), Then::Reset),
            Fault::Delay(delay) => ResponseFuture::delay(delay, self.inner.call(req)),
            Fault::DelayReply(delay) => {
                let progress = req.extensions().and_then(|e| e.get::<Progress>()).cloned();
                ResponseFuture::call(self.inner.call(req), Then::Hold(delay, progress))
            }
            Fault::Respond(reply) => {
                ResponseFuture::ready(self.reply(&reply, DeliveryPhase::NotSent))
            }
            Fault::RespondAfterSend(reply) => {
                let replacement = self.reply(&reply, DeliveryPhase::Sent);
                ResponseFuture::call(self.inner.call(req), Then::Replace(replacement))
            }
        }
    }
}

impl<S, P, M> InjectFault<S, P, M> {
    fn reply<Res>(&self, reply: &Reply, phase: DeliveryPhase) -> Result<Res, InjectedFault>
    where
        M: MakeResponse<Res>,
    {
        self.make_response
            .make_response(reply)
            .ok_or_else(|| InjectedFault::no_response(reply.status(), phase))
    }
}
