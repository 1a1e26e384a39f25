//! The replay layer's future, and the reading ahead it shares with the service.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::{HeaderMap, Request};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_service::Service;

use super::{NotReplayable, ReplayBody};
use crate::classify::BoxError;

/// A body being read ahead, and what it takes to make the call once it is: the rare part of
/// a [`ResponseFuture`], boxed so that the future of a body read at once is its inner future's
/// size.
pub(super) struct Reading<S, B> {
    pub(super) inner: S,
    pub(super) parts: http::request::Parts,
    pub(super) limit: usize,
    pub(super) body: B,
    pub(super) chunks: VecDeque<Bytes>,
    pub(super) read: usize,
}

pin_project! {
    /// The future of [`Replay`](super::Replay): reads the body (up to the limit) if it was not
    /// all there when the call was made, then runs the call.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        #[pin]
        pub(super) state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    pub(super) enum State<S, B>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        Reading { reading: Option<Box<Reading<S, B>>> },
        Calling { #[pin] future: S::Future },
    }
}

/// What reading the body ahead found.
pub(super) enum Read {
    Ended(Option<HeaderMap>),
    /// Over the limit, or an unknown frame: send what was read, then the rest, once.
    Once,
    /// The body failed: send what was read, then the error, once.
    Failed(BoxError),
}

/// Reads `body` into `chunks` until it ends, fails, or passes `limit`.
pub(super) fn read_ahead<B>(
    body: &mut B,
    chunks: &mut VecDeque<Bytes>,
    read: &mut usize,
    limit: usize,
    cx: &mut Context<'_>,
) -> Poll<Read>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    loop {
        match ready!(Pin::new(&mut *body).poll_frame(cx)) {
            None => return Poll::Ready(Read::Ended(None)),
            // The error is the transport's to report: the inner service reads what came before
            // it, then the error itself, once.
            Some(Err(e)) => return Poll::Ready(Read::Failed(e.into())),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(mut data) => {
                    let bytes = data.copy_to_bytes(data.remaining());
                    *read += bytes.len();
                    if !bytes.is_empty() {
                        chunks.push_back(bytes);
                    }
                    if *read > limit {
                        return Poll::Ready(Read::Once);
                    }
                }
                Err(frame) => {
                    return Poll::Ready(match frame.into_trailers() {
                        Ok(trailers) => Read::Ended(Some(trailers)),
                        // A frame of a kind this crate does not know: it cannot be replayed
                        // faithfully.
                        Err(_) => Read::Once,
                    });
                }
            },
        }
    }
}

/// The body to send, from what reading ahead found.
pub(super) fn replay_body<B>(read: Read, chunks: VecDeque<Bytes>, body: B) -> ReplayBody<B> {
    match read {
        Read::Ended(trailers) => ReplayBody::buffered(chunks, trailers),
        Read::Once => ReplayBody::once(chunks, Some(body), None),
        Read::Failed(e) => ReplayBody::once(chunks, None, Some(e)),
    }
}

/// Calls `inner` with the request of `parts` and `body`, marked [`NotReplayable`] when the body
/// is sent once.
pub(super) fn call_with<S, B>(
    inner: &mut S,
    mut parts: http::request::Parts,
    body: ReplayBody<B>,
) -> S::Future
where
    S: Service<Request<ReplayBody<B>>>,
{
    if body.is_once() {
        parts.extensions.insert(NotReplayable);
    }
    inner.call(Request::from_parts(parts, body))
}

impl<S, B> Future for ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let future = match state.as_mut().project() {
                StateProj::Calling { future } => return future.poll(cx),
                StateProj::Reading { reading } => {
                    let r = reading
                        .as_mut()
                        .expect("`ResponseFuture` polled after completion");
                    let ahead = ready!(read_ahead(
                        &mut r.body,
                        &mut r.chunks,
                        &mut r.read,
                        r.limit,
                        cx
                    ));
                    let Some(r) = reading.take() else {
                        unreachable!("checked above")
                    };
                    let Reading {
                        mut inner,
                        parts,
                        body,
                        chunks,
                        ..
                    } = *r;
                    call_with(&mut inner, parts, replay_body(ahead, chunks, body))
                }
            };
            state.set(State::Calling { future });
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Calling { .. } => "calling",
            State::Reading { .. } => "reading",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
