//! The body of a response from a layer that can answer by itself: the handler's body, or the
//! layer's own problem details.

use std::fmt;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a response from [`ServerDeadline`](super::deadline::ServerDeadline),
    /// [`Recheck`](super::deadline::Recheck) or [`AdaptiveLimit`](super::limit::AdaptiveLimit):
    /// the handler's body as it was, or, when the layer answered by itself, its
    /// [problem details](super::problem) (empty for gRPC, which says it all in headers).
    ///
    /// The handler's body type needs nothing (not even `Default`): a layer's own answer never
    /// makes one. A stack of such layers nests (`ResponseBody<ResponseBody<B>>`), as
    /// tower-http's bodies do; `axum`, `hyper` and `tonic` serve it like any body whose data is
    /// [`Bytes`].
    ///
    /// Where two services must answer one type (tower's `option_layer`, `Either`, `Steer`),
    /// wrap the other's body too: `MapResponseLayer::new(|res: Response<B>|
    /// res.map(ResponseBody::new))` beside the layer.
    ///
    /// ```
    /// use http_body_util::BodyExt;
    /// use surely::server::ResponseBody;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let body = ResponseBody::new(http_body_util::Full::new(bytes::Bytes::from("ok")));
    /// assert!(!body.is_refusal());
    /// assert_eq!(body.collect().await.unwrap().to_bytes(), "ok");
    /// # }
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Handler { #[pin] body: B },
        Layer { bytes: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The handler's `body`, passed through.
    pub fn new(body: B) -> Self {
        ResponseBody {
            kind: Kind::Handler { body },
        }
    }

    /// A layer's own answer: `bytes`, in one frame (none when empty).
    pub(crate) fn layers(bytes: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Layer {
                bytes: (!bytes.is_empty()).then_some(bytes),
            },
        }
    }

    /// Whether the layer answered by itself, with a refusal: the handler never ran.
    pub fn is_refusal(&self) -> bool {
        matches!(self.kind, Kind::Layer { .. })
    }

    /// The handler's body, or `None` for a refusal.
    pub fn handler(&self) -> Option<&B> {
        match &self.kind {
            Kind::Handler { body } => Some(body),
            Kind::Layer { .. } => None,
        }
    }

    /// The handler's body, or `None` for a refusal.
    pub fn into_handler(self) -> Option<B> {
        match self.kind {
            Kind::Handler { body } => Some(body),
            Kind::Layer { .. } => None,
        }
    }
}

impl<B: Default> Default for ResponseBody<B> {
    /// The handler's default body: what a layer above that needs `Default` makes.
    fn default() -> Self {
        Self::new(B::default())
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Handler { .. } => f.write_str("ResponseBody::Handler"),
            Kind::Layer { bytes } => f
                .debug_struct("ResponseBody::Layer")
                .field("len", &bytes.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Handler { body } => body.poll_frame(cx),
            KindProj::Layer { bytes } => {
                Poll::Ready(bytes.take().map(|b| Ok(Frame::data(B::Data::from(b)))))
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Handler { body } => body.is_end_stream(),
            Kind::Layer { bytes } => bytes.is_none(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Handler { body } => body.size_hint(),
            Kind::Layer { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty, Full};

    #[tokio::test]
    async fn a_layers_body_is_its_bytes_once() {
        let body = ResponseBody::<Empty<Bytes>>::layers(Bytes::from_static(b"{}"));
        assert!(body.is_refusal());
        assert_eq!(body.size_hint().exact(), Some(2));
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "{}");
        let empty = ResponseBody::<Full<Bytes>>::layers(Bytes::new());
        assert!(empty.is_end_stream());
        assert_eq!(empty.size_hint().exact(), Some(0));
        assert!(empty.into_handler().is_none());
    }

    #[tokio::test]
    async fn a_handlers_body_passes_through() {
        let body = ResponseBody::new(Full::new(Bytes::from_static(b"abc")));
        assert_eq!(body.size_hint().exact(), Some(3));
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abc");
        let d: ResponseBody<Full<Bytes>> = ResponseBody::default();
        assert!(!d.is_refusal());
    }
}
