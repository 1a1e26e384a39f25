use tower_layer::Layer;

use super::InjectServerFault;
#[cfg(doc)]
use crate::fault::Fault;
#[cfg(doc)]
use std::convert::Infallible;

/// Injects faults into the requests of a server's own service, whose error is
/// [`Infallible`] (an axum `Router` or route, a hyper service): the layer of
/// [`InjectServerFault`]. Each fault becomes what a server can do to its client, and the
/// service never fails, so that `Router::layer` takes it.
///
/// | [`Fault`] | the handler | the client gets |
/// | --- | --- | --- |
/// | [`RefuseBeforeSend`](Fault::RefuseBeforeSend) | not called | `503` with `surely-not-processed: injected-fault`: not processed, which the crate's client classifies *rejected*, as it does a refused connection |
/// | [`ResetAfterSend`](Fault::ResetAfterSend) | runs to completion | the handler's status and headers, and a body that fails at its first read: hyper then closes the connection (HTTP/1: before any byte of the answer is sent) or resets the stream (HTTP/2) |
/// | [`Delay(d)`](Fault::Delay) | runs after `d` | its answer |
/// | [`DelayReply(d)`](Fault::DelayReply) | runs at once, its answer held `d` | its answer, late |
/// | [`Respond(reply)`](Fault::Respond) | not called | `reply`, with an empty body |
/// | [`RespondAfterSend(reply)`](Fault::RespondAfterSend) | runs to completion, its answer dropped | `reply`, with an empty body |
///
/// Two faults have no exact form on a server, and these are the choices made:
///
/// * **A refusal before send** means the request never reached the server, which a server
///   that has read it cannot make true. What it can say honestly is the part the client acts
///   on: the handler did not run, so the request may be sent again. The answer says so with
///   [`NOT_PROCESSED`](crate::headers::NOT_PROCESSED), the header the crate's servers put on their own refusals.
/// * **A reset after commit** has no HTTP status: a status would be an answer. The handler's
///   answer goes out with a body that fails, and the server drops the connection while sending
///   it, which is what a client sees of a server that dies or loses its connection after the
///   work is done. Over HTTP/1, hyper fails before it writes the head, so the client sees the
///   connection close with no answer; over HTTP/2, hyper resets the stream, and the head may
///   reach the client before the reset, as its connection had sent it or not. A layer outside
///   this one that reads the body sees the failure first: mount this one outermost to test what
///   clients see.
///
/// ```
/// use std::convert::Infallible;
///
/// use axum::routing::post;
/// use axum::Router;
/// use http::StatusCode;
/// use surely::fault::{Fault, InjectServerFaultLayer, Schedule};
///
/// // The second request commits its order, then the connection is dropped: its client cannot
/// // know the order exists.
/// let faults = Schedule::new().at(1, Fault::ResetAfterSend);
/// let app: Router = Router::new()
///     .route("/orders", post(|| async { (StatusCode::CREATED, "o-1") }))
///     .layer(InjectServerFaultLayer::new(faults));
/// # let _ = app;
/// ```
///
/// An [`InjectFaultLayer`](crate::fault::InjectFaultLayer) is for a service whose error can carry the
/// fault (a client's transport, or a hyper service whose error hyper answers by closing the
/// connection).
#[derive(Clone, Debug)]
pub struct InjectServerFaultLayer<P> {
    policy: P,
}

impl<P> InjectServerFaultLayer<P> {
    /// A layer that asks `policy` which fault each request gets.
    pub fn new(policy: P) -> Self {
        InjectServerFaultLayer { policy }
    }
}

impl<S, P: Clone> Layer<S> for InjectServerFaultLayer<P> {
    type Service = InjectServerFault<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        InjectServerFault::new(inner, self.policy.clone())
    }
}
