//! The body of the server fault layer's answers.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

#[cfg(doc)]
use super::InjectServerFault;
use crate::classify::BoxError;
use crate::fault::InjectedFault;

pin_project! {
    /// The body of an [`InjectServerFault`]'s answers: the handler's own, an empty one (a
    /// made-up reply), or one that fails at its first read (a reset after the handler ran),
    /// which makes the server drop the connection.
    pub struct FaultBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Empty,
        Reset,
    }
}

impl<B> FaultBody<B> {
    /// The handler's own body, passed through.
    pub(super) fn inner(body: B) -> Self {
        FaultBody {
            kind: Kind::Inner { body },
        }
    }

    /// No body.
    pub(super) fn empty() -> Self {
        FaultBody { kind: Kind::Empty }
    }

    /// A body that fails at its first read.
    pub(super) fn reset() -> Self {
        FaultBody { kind: Kind::Reset }
    }
}

impl<B> Body for FaultBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Empty => Poll::Ready(None),
            KindProj::Reset => Poll::Ready(Some(Err(InjectedFault::reset().into()))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Empty => true,
            // Never: the server must read it to fail.
            Kind::Reset => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Reset => SizeHint::default(),
        }
    }
}

impl<B> std::fmt::Debug for FaultBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Empty => "empty",
            Kind::Reset => "reset",
        };
        f.debug_tuple("FaultBody").field(&kind).finish()
    }
}
