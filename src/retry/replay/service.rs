//! The replay layer's service.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use http::Request;
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use super::future::{call_with, read_ahead, replay_body, Read, Reading, ResponseFuture, State};
use super::{ReplayBody, ReplayLayer};
use crate::classify::BoxError;

/// The service made by [`ReplayLayer`]: reads each request's body ahead, up to the limit, and
/// sends it on as a [`ReplayBody`].
#[derive(Clone, Debug)]
pub struct Replay<S> {
    pub(super) inner: S,
    pub(super) limit: usize,
}

impl<S> Replay<S> {
    /// Wraps `inner`, buffering bodies of up to 64 KiB, as [`ReplayLayer::new`].
    pub fn new(inner: S) -> Self {
        ReplayLayer::new().layer(inner)
    }

    /// [`ReplayLayer::new`], whose services are `Replay`s.
    pub fn layer() -> ReplayLayer {
        ReplayLayer::new()
    }

    inner_accessors!();
}

impl<S, B> Service<Request<B>> for Replay<S>
where
    S: Service<Request<ReplayBody<B>>> + Clone,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    #[inline]
    fn call(&mut self, req: Request<B>) -> Self::Future {
        if req.body().is_end_stream() {
            // The usual case of a GET: an empty body (`Empty`, or a `Full` of nothing) has
            // nothing to read ahead and replays as nothing; the request goes on as it is.
            return ResponseFuture {
                state: State::Calling {
                    future: self.inner.call(req.map(ReplayBody::ended)),
                },
            };
        }
        self.read_and_call(req)
    }
}

impl<S> Replay<S> {
    /// The call of a request whose body has not ended yet: read it ahead, up to the limit.
    fn read_and_call<B>(&mut self, req: Request<B>) -> ResponseFuture<S, B>
    where
        S: Service<Request<ReplayBody<B>>> + Clone,
        B: Body + Unpin,
        B::Error: Into<BoxError>,
    {
        let (parts, mut body) = req.into_parts();
        let mut chunks = VecDeque::new();
        let mut read = 0;
        let ahead = if body.size_hint().lower() > self.limit as u64 {
            // Known to be too large: read nothing ahead, send it as it comes.
            Poll::Ready(Read::Once)
        } else {
            // A body that is all there (`Full`, a buffered body) is read now, without waiting:
            // polled with a waker that does nothing, a body that must wait says so, and the
            // future reads it on, with its task's waker.
            let mut cx = Context::from_waker(Waker::noop());
            read_ahead(&mut body, &mut chunks, &mut read, self.limit, &mut cx)
        };
        let state = match ahead {
            // The usual case: the service that was made ready is called at once, and the
            // future is its future.
            Poll::Ready(ahead) => State::Calling {
                future: call_with(&mut self.inner, parts, replay_body(ahead, chunks, body)),
            },
            // The service that was made ready takes the call once the body is read; a fresh
            // clone stays behind, as in tower's `Buffer` and `Steer`.
            Poll::Pending => {
                let clone = self.inner.clone();
                State::Reading {
                    reading: Some(Box::new(Reading {
                        inner: std::mem::replace(&mut self.inner, clone),
                        parts,
                        limit: self.limit,
                        body,
                        chunks,
                        read,
                    })),
                }
            }
        };
        ResponseFuture { state }
    }
}
