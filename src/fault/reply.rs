//! Made-up replies: what a `Respond` fault answers with, and how it becomes a response.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

/// The status and headers a [`Respond`](super::Fault::Respond) or
/// [`RespondAfterSend`](super::Fault::RespondAfterSend) fault answers with.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use surely::fault::{Fault, Reply};
///
/// // An overloaded upstream: 503, come back in 2 seconds.
/// let overloaded = Fault::Respond(
///     Reply::new(StatusCode::SERVICE_UNAVAILABLE).retry_after(Duration::from_secs(2)),
/// );
/// // A gateway that gave up on the upstream after forwarding the request.
/// let gateway_timeout = Fault::RespondAfterSend(StatusCode::GATEWAY_TIMEOUT.into());
/// # let _ = (overloaded, gateway_timeout);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    status: StatusCode,
    headers: HeaderMap,
}

impl Reply {
    /// A reply with this status and no headers.
    pub fn new(status: StatusCode) -> Self {
        Reply {
            status,
            headers: HeaderMap::new(),
        }
    }

    /// This reply with one more header (appended: a name may repeat).
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.append(name, value);
        self
    }

    /// This reply with a `Retry-After` header in delay-seconds, rounded up to a whole second.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use surely::fault::Reply;
    /// let reply = Reply::new(http::StatusCode::TOO_MANY_REQUESTS)
    ///     .retry_after(Duration::from_millis(1500));
    /// assert_eq!(reply.headers()["retry-after"], "2");
    /// ```
    pub fn retry_after(mut self, delay: Duration) -> Self {
        let secs = delay
            .as_secs()
            .saturating_add(u64::from(delay.subsec_nanos() > 0));
        self.headers
            .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The headers, mutably.
    pub fn headers_mut(&mut self) -> &mut HeaderMap {
        &mut self.headers
    }
}

impl From<StatusCode> for Reply {
    fn from(status: StatusCode) -> Self {
        Reply::new(status)
    }
}

/// Turns a [`Reply`] into the service's response type, for the
/// [`Respond`](super::Fault::Respond) and [`RespondAfterSend`](super::Fault::RespondAfterSend)
/// faults.
///
/// An [`InjectFaultLayer`](super::InjectFaultLayer) uses [`EmptyBody`] unless told otherwise, which builds
/// any `http::Response<B>` whose body has a `Default` (hyper's `Full` and `Empty`,
/// http-body-util's boxed bodies, `String`, `Vec<u8>`, `()`). For other response
/// types choose one with [`InjectFaultLayer::responses`](super::InjectFaultLayer::responses):
///
/// * [`NoResponse`] for a service whose responses cannot be made up (a non-HTTP service, or
///   hyper's `Response<Incoming>`): every other fault still works, and a `Respond` fault
///   fails with an [`InjectedFault`](super::InjectedFault) of the same phase instead;
/// * a closure `Fn(&Reply) -> Option<Res>`, or your own implementation, to build your own
///   response type (returning `None` has the same effect as [`NoResponse`]).
///
/// The trait is implemented by a builder rather than by the response type so that it works for
/// response types from other crates.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot build a `{Res}` for a `Respond` fault",
    note = "`EmptyBody`, the default, builds `http::Response<B>` for `B: Default`; for another \
            response type call `InjectFaultLayer::responses` with `NoResponse` or a closure \
            `Fn(&Reply) -> Option<Res>`"
)]
pub trait MakeResponse<Res> {
    /// Builds the response for `reply`, or `None` if this response type cannot carry it.
    fn make_response(&self, reply: &Reply) -> Option<Res>;
}

/// Builds an `http::Response<B>` with the reply's status and headers and an empty body
/// (`B::default()`). The default [`MakeResponse`].
///
/// ```
/// use surely::fault::{EmptyBody, MakeResponse, Reply};
///
/// let reply = Reply::new(http::StatusCode::SERVICE_UNAVAILABLE);
/// let res: http::Response<String> = EmptyBody.make_response(&reply).unwrap();
/// assert_eq!(res.status(), 503);
/// assert!(res.body().is_empty());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct EmptyBody;

impl<B: Default> MakeResponse<http::Response<B>> for EmptyBody {
    fn make_response(&self, reply: &Reply) -> Option<http::Response<B>> {
        let mut res = http::Response::new(B::default());
        *res.status_mut() = reply.status;
        *res.headers_mut() = reply.headers.clone();
        Some(res)
    }
}

/// Builds no response: for services whose response type cannot be made up. A
/// [`Respond`](super::Fault::Respond) fault then fails like
/// [`RefuseBeforeSend`](super::Fault::RefuseBeforeSend), and a
/// [`RespondAfterSend`](super::Fault::RespondAfterSend) like
/// [`ResetAfterSend`](super::Fault::ResetAfterSend), with an error that says why.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoResponse;

impl<Res> MakeResponse<Res> for NoResponse {
    fn make_response(&self, _: &Reply) -> Option<Res> {
        None
    }
}

impl<F, Res> MakeResponse<Res> for F
where
    F: Fn(&Reply) -> Option<Res>,
{
    fn make_response(&self, reply: &Reply) -> Option<Res> {
        self(reply)
    }
}
