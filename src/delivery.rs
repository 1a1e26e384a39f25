//! How a transport reports how far a request got.
//!
//! Whether a failed attempt may be retried often turns on one fact: did any byte of the request
//! leave? Layers learn it from three kinds of evidence, strongest first:
//!
//! 1. **The transport's error.** A refused connection, hyper-util's `is_connect()`, hyper's
//!    `is_canceled()` prove the request was not sent; the classifiers read them
//!    ([`ClassifyError`](crate::classify::ClassifyError)).
//! 2. **A [`Progress`] handle** in the request's extensions, which the transport marks as the
//!    request moves. For hyper, wrap the request body in [`TrackBody`]: hyper inspects the body
//!    (its size, whether it is empty) before it writes the request head, so a body never touched
//!    proves nothing was written. A timeout that fires while the handle still says
//!    [`NotSent`](DeliveryPhase::NotSent) (waiting for a pooled connection, connecting) is then
//!    classified *rejected, not sent*, and even a POST without a key may be retried.
//! 3. **Nothing.** A timeout after the inner service was called is *maybe committed*. Layers never
//!    assume "not sent" without evidence.
//!
//! ```
//! use surely::classify::DeliveryPhase;
//! use surely::delivery::{Progress, TrackBody};
//!
//! let progress = Progress::new();
//! let body = TrackBody::new(http_body_util::Full::new(bytes::Bytes::from("order")), progress.clone());
//! let mut req = http::Request::post("/orders").body(body).unwrap();
//! req.extensions_mut().insert(progress.clone());
//! assert_eq!(progress.phase(), DeliveryPhase::NotSent);
//! // ... hyper sends `req`; as soon as it looks at the body, the progress says `Sent`.
//! ```

use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::classify::DeliveryPhase;

/// A shared record of how far one request got, marked by the transport and read by the layers.
///
/// Cloning shares it. It only moves forward: marking an earlier phase than the current one does
/// nothing.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<AtomicU8>);

impl Progress {
    /// A new handle at [`NotSent`](DeliveryPhase::NotSent).
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that the request reached `phase`.
    ///
    /// ```
    /// use surely::classify::DeliveryPhase;
    /// let p = surely::delivery::Progress::new();
    /// p.mark(DeliveryPhase::ResponseStarted);
    /// p.mark(DeliveryPhase::Sent);
    /// assert_eq!(p.phase(), DeliveryPhase::ResponseStarted);
    /// ```
    pub fn mark(&self, phase: DeliveryPhase) {
        self.0.fetch_max(phase as u8, Ordering::AcqRel);
    }

    /// The furthest phase marked.
    pub fn phase(&self) -> DeliveryPhase {
        match self.0.load(Ordering::Acquire) {
            0 => DeliveryPhase::NotSent,
            1 => DeliveryPhase::Sent,
            _ => DeliveryPhase::ResponseStarted,
        }
    }
}

pin_project! {
    /// A request body that marks its [`Progress`] as [`Sent`](DeliveryPhase::Sent) the first
    /// time the transport looks at it (`poll_frame`, `is_end_stream` or `size_hint`).
    #[derive(Debug)]
    pub struct TrackBody<B> {
        #[pin]
        inner: B,
        progress: Progress,
        // Whether `size_hint` counts as a look: not for reqwest, whose redirect layer asks for
        // the size before there is a connection.
        sized_is_sent: bool,
    }
}

impl<B> TrackBody<B> {
    /// Wraps `inner`, reporting to `progress`.
    pub fn new(inner: B, progress: Progress) -> Self {
        TrackBody {
            inner,
            progress,
            sized_is_sent: true,
        }
    }

    /// The same, but asking for the body's size is not sending it: only `poll_frame` and
    /// `is_end_stream` mark it sent.
    #[cfg(feature = "reqwest")]
    pub(crate) fn sent_when_read(inner: B, progress: Progress) -> Self {
        TrackBody {
            inner,
            progress,
            sized_is_sent: false,
        }
    }

    /// The wrapped body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for TrackBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        this.progress.mark(DeliveryPhase::Sent);
        this.inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.progress.mark(DeliveryPhase::Sent);
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.sized_is_sent {
            self.progress.mark(DeliveryPhase::Sent);
        }
        self.inner.size_hint()
    }
}
