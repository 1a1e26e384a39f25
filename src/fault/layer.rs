use tower_layer::Layer;

use super::{EmptyBody, InjectFault};

/// Injects faults into the requests of the service it wraps: the layer of [`InjectFault`].
///
/// See the [module docs](super) for what each fault does and an example.
#[derive(Clone, Debug)]
pub struct InjectFaultLayer<P, M = EmptyBody> {
    policy: P,
    make_response: M,
}

impl<P> InjectFaultLayer<P> {
    /// A layer that asks `policy` which fault each request gets, and builds the responses of
    /// [`Respond`](super::Fault::Respond) faults with [`EmptyBody`] (any `http::Response<B>`
    /// with `B: Default`).
    pub fn new(policy: P) -> Self {
        InjectFaultLayer {
            policy,
            make_response: EmptyBody,
        }
    }
}

impl<P, M> InjectFaultLayer<P, M> {
    /// This layer, building the responses of [`Respond`](super::Fault::Respond) and
    /// [`RespondAfterSend`](super::Fault::RespondAfterSend) faults with `make_response`
    /// instead: [`NoResponse`](super::NoResponse) for a service whose responses cannot be made
    /// up, or a closure `Fn(&Reply) -> Option<Res>`.
    pub fn responses<M2>(self, make_response: M2) -> InjectFaultLayer<P, M2> {
        InjectFaultLayer {
            policy: self.policy,
            make_response,
        }
    }
}

impl<S, P: Clone, M: Clone> Layer<S> for InjectFaultLayer<P, M> {
    type Service = InjectFault<S, P, M>;

    fn layer(&self, inner: S) -> Self::Service {
        InjectFault::new(inner, self.policy.clone()).responses(self.make_response.clone())
    }
}
