//! The deadline layer's service.

use std::marker::PhantomData;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use super::future::{ResponseFuture, State};
use super::layer::{Config, MIN_WIRE_MILLIS};
use super::timer::{Enforcement, OwnTimer};
use super::{codec, Deadline, SetDeadlineLayer, WireHeader, DEFAULT_HEADER, GRPC_TIMEOUT};
use crate::context::CallTally;
use crate::context::{CallDeadline, Context};
use crate::{Envelope, Error, IntoError};

/// The service made by [`SetDeadlineLayer`]: gives each call a total budget, propagates it,
/// and refuses a call with none left. See [`SetDeadlineLayer`] for what it does to a call.
///
/// # Readiness
///
/// `poll_ready` is the inner service's. A refused call does not call the inner service, so the
/// readiness it reserved stays reserved for the next call, as with tower's `Filter`.
#[derive(Clone, Debug)]
pub struct SetDeadline<S, T = OwnTimer> {
    pub(super) inner: S,
    pub(super) config: Config,
    pub(super) _timer: PhantomData<T>,
}

impl<S> SetDeadline<S> {
    /// Wraps `inner` with a total budget of `timeout` per call, as
    /// [`SetDeadlineLayer::new`] (which says how `timeout` is clamped).
    pub fn new(inner: S, timeout: Duration) -> Self {
        SetDeadlineLayer::new(timeout).layer(inner)
    }

    /// The layer of [`SetDeadlineLayer::new`]`(timeout)`, whose services are `SetDeadline`s.
    pub fn layer(timeout: Duration) -> SetDeadlineLayer {
        SetDeadlineLayer::new(timeout)
    }
}

impl<S, T> SetDeadline<S, T> {
    inner_accessors!();
    crate::send::send_method!();
}

impl<S, T, Req> Service<Req> for SetDeadline<S, T>
where
    S: Service<Req>,
    S::Error: IntoError,
    Req: Envelope,
    T: Enforcement,
{
    type Response = S::Response;
    type Error = Error<<S::Error as IntoError>::Transport>;
    type Future = ResponseFuture<S::Future, Self::Error, T>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    #[inline]
    fn call(&mut self, mut req: Req) -> Self::Future {
        let mut ctx = Context::current();
        let Some(deadline) = self.resolve(&mut req, ctx.deadline()) else {
            return ResponseFuture::refused();
        };
        if deadline.is_some() && ctx.call.is_some() {
            // Tell the record layer outside (the one that set the call id) the call's deadline.
            CallTally::update(|t| t.deadline = deadline);
        }
        ctx.set_deadline(deadline);
        let inner = ctx.scope(|| self.inner.call(req));
        ResponseFuture {
            state: State::Running {
                inner,
                timer: Default::default(),
                ctx,
            },
            _error: PhantomData,
        }
    }
}

impl<S, T> SetDeadline<S, T> {
    /// The call's deadline, with its budget written on the wire; `None` if the call must be
    /// refused.
    ///
    /// The clock is read only for a deadline that is already an instant (from the request or
    /// an outer layer that anchored it); a budget of the layer's own, or an outer layer's not
    /// yet anchored, is passed on as a budget.
    #[inline]
    fn resolve<Req: Envelope>(
        &self,
        req: &mut Req,
        current: Option<CallDeadline>,
    ) -> Option<Option<CallDeadline>> {
        if let (Some(own), None) = (self.config.timeout, current)
            && req.deadline().is_none()
        {
            // The common case: no deadline from outside and none on the request, so the
            // call has this layer's own budget (checked against the reserve when built).
            return self
                .write_budget(req, own.saturating_sub(self.config.reserve), true)
                .then_some(Some(CallDeadline::Budget(own)));
        }
        let fixed = Deadline::earliest(req.deadline(), current.and_then(CallDeadline::fixed));
        let unanchored = match current {
            Some(CallDeadline::Budget(b)) => Some(b),
            _ => None,
        };
        let budget = match (self.config.timeout, unanchored) {
            (Some(own), Some(outer)) => Some(own.min(outer)),
            (own, outer) => own.or(outer),
        };
        let (deadline, remaining) = match (fixed, budget) {
            (None, None) => return Some(None),
            (None, Some(b)) => (CallDeadline::Budget(b), b),
            (Some(fixed), budget) => {
                let now = Instant::now();
                let d =
                    Deadline::earliest(Some(fixed), budget.map(|b| Deadline::after_from(now, b)))
                        .unwrap_or(fixed);
                (CallDeadline::At(d), d.remaining_at(now))
            }
        };
        if remaining <= self.config.reserve {
            return None;
        }
        let own = matches!(deadline, CallDeadline::Budget(b) if Some(b) == self.config.timeout);
        self.write_budget(req, remaining.saturating_sub(self.config.reserve), own)
            .then_some(Some(deadline))
    }

    /// Writes the budget on the wire; false if it would be written as zero (under a millisecond
    /// for the millisecond header), which the server would take as spent. `own` says the budget
    /// is the layer's own, whose encoding is kept.
    fn write_budget<Req: Envelope>(&self, req: &mut Req, budget: Duration, own: bool) -> bool {
        let grpc = req.is_grpc();
        let Some(headers) = req.headers_mut() else {
            return true;
        };
        let own_wire = self.config.own_wire.as_ref().filter(|_| own);
        if grpc {
            if self.config.grpc {
                let value =
                    own_wire.map_or_else(|| codec::encode_grpc_timeout(budget), |w| w.grpc.clone());
                headers.insert(GRPC_TIMEOUT, value);
            }
        } else if let Some(name) = &self.config.header {
            if budget < MIN_WIRE_MILLIS {
                return false;
            }
            let value = own_wire.map_or_else(|| codec::encode_millis(budget), |w| w.millis.clone());
            headers.insert(name.clone(), value);
            if *name != DEFAULT_HEADER {
                // Say where, so that retries inside lower it (one allocation for the request's
                // extensions; the default name needs none).
                if let Some(extensions) = req.extensions_mut() {
                    extensions.insert(WireHeader(name.clone()));
                }
            }
        }
        true
    }
}
