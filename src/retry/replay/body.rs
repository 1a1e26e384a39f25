//! The replayable request body, and the mark of a request whose body is not.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use crate::classify::BoxError;
use crate::error::BodyNotReplayable;

/// Marks a request whose body could not be buffered (too large, or it failed while being read):
/// it can be sent once. [`RetryLayer`](crate::retry::RetryLayer) does not retry such a request, and the
/// call's record says [`NotReplayable`](crate::StopReason::NotReplayable) when a retry
/// was wanted.
///
/// Insert it yourself for a request that must not be sent twice for reasons of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotReplayable;

/// A request body that can be sent again: the body of a request that went through a
/// [`ReplayLayer`](super::ReplayLayer).
///
/// A buffered body is replayed by every copy of the request (cloning it copies no bytes). A body
/// that could not be buffered is sent as it comes by the original request; its copies have
/// nothing to send and fail with an error if polled (the request carries [`NotReplayable`], so
/// the retry layer makes no copies).
pub struct ReplayBody<B> {
    kind: Kind<B>,
}

// Small (48 bytes over an `Empty` body, against 128 with the trailers and the rare variant
// inline): every copy of the request carries it, and every layer moves the request.
enum Kind<B> {
    /// Nothing to send (a GET's body): copied and dropped without touching any bytes.
    Empty,
    Buffered {
        data: Bytes,
        trailers: Option<Box<HeaderMap>>,
    },
    Once(Box<Once<B>>),
    Gone,
}

/// What [`ReplayBody::buffered_bytes`] lends for an empty body.
static NO_BYTES: Bytes = Bytes::new();

/// A body sent as it comes, once.
struct Once<B> {
    prefix: VecDeque<Bytes>,
    /// The rest of the body; `None` once it failed.
    rest: Option<B>,
    /// The error the body failed with while it was read ahead, to be given after `prefix`.
    error: Option<BoxError>,
}

impl<B> ReplayBody<B> {
    pub(super) fn buffered(mut chunks: VecDeque<Bytes>, trailers: Option<HeaderMap>) -> Self {
        let data = match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.pop_front().unwrap_or_default(),
            _ => {
                let len = chunks.iter().map(Bytes::len).sum();
                let mut all = Vec::with_capacity(len);
                for chunk in chunks {
                    all.extend_from_slice(&chunk);
                }
                Bytes::from(all)
            }
        };
        ReplayBody {
            kind: Kind::Buffered {
                data,
                trailers: trailers.map(Box::new),
            },
        }
    }

    pub(crate) fn once(prefix: VecDeque<Bytes>, rest: Option<B>, error: Option<BoxError>) -> Self {
        ReplayBody {
            kind: Kind::Once(Box::new(Once {
                prefix,
                rest,
                error,
            })),
        }
    }

    /// The replay of a body that had ended before anything was read from it: nothing.
    pub(super) fn ended(_: B) -> Self {
        ReplayBody { kind: Kind::Empty }
    }

    /// A body of these bytes, replayable.
    pub fn from_bytes(data: impl Into<Bytes>) -> Self {
        ReplayBody {
            kind: Kind::Buffered {
                data: data.into(),
                trailers: None,
            },
        }
    }

    /// Whether the body was buffered, so that copies of it send the same bytes.
    pub fn is_replayable(&self) -> bool {
        matches!(self.kind, Kind::Buffered { .. } | Kind::Empty)
    }

    /// The buffered bytes, for a replayable body.
    pub fn buffered_bytes(&self) -> Option<&Bytes> {
        match &self.kind {
            Kind::Buffered { data, .. } => Some(data),
            Kind::Empty => Some(&NO_BYTES),
            _ => None,
        }
    }

    pub(super) fn is_once(&self) -> bool {
        matches!(self.kind, Kind::Once(_))
    }
}

impl<B> Clone for ReplayBody<B> {
    fn clone(&self) -> Self {
        let kind = match &self.kind {
            Kind::Empty => Kind::Empty,
            Kind::Buffered { data, trailers } => Kind::Buffered {
                data: data.clone(),
                trailers: trailers.clone(),
            },
            Kind::Once(_) | Kind::Gone => Kind::Gone,
        };
        ReplayBody { kind }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Empty => f.debug_struct("ReplayBody").field("buffered", &0).finish(),
            Kind::Buffered { data, .. } => f
                .debug_struct("ReplayBody")
                .field("buffered", &data.len())
                .finish(),
            Kind::Once(_) => f.debug_struct("ReplayBody").field("once", &true).finish(),
            Kind::Gone => f.debug_struct("ReplayBody").field("gone", &true).finish(),
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Empty => Poll::Ready(None),
            Kind::Buffered { data, trailers } => {
                if !data.is_empty() {
                    return Poll::Ready(Some(Ok(Frame::data(std::mem::take(data)))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(*t))))
            }
            Kind::Once(once) => {
                let Once {
                    prefix,
                    rest,
                    error,
                } = &mut **once;
                if let Some(chunk) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                if let Some(e) = error.take() {
                    return Poll::Ready(Some(Err(e)));
                }
                let Some(rest) = rest else {
                    return Poll::Ready(None);
                };
                let frame = ready!(Pin::new(rest).poll_frame(cx));
                Poll::Ready(frame.map(|r| {
                    r.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                        .map_err(Into::into)
                }))
            }
            Kind::Gone => Poll::Ready(Some(Err(BodyNotReplayable.into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Buffered { data, trailers } => data.is_empty() && trailers.is_none(),
            Kind::Once(once) => {
                once.prefix.is_empty()
                    && once.error.is_none()
                    && once.rest.as_ref().is_none_or(B::is_end_stream)
            }
            Kind::Gone => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Buffered { data, .. } => SizeHint::with_exact(data.len() as u64),
            Kind::Once(once) => {
                let read: u64 = once.prefix.iter().map(|c| c.len() as u64).sum();
                let rest = once.rest.as_ref().map(B::size_hint).unwrap_or_default();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
            Kind::Gone => SizeHint::default(),
        }
    }
}
