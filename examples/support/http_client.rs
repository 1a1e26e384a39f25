//! The client stack `surely::client::http()` builds over hyper-util, by what it is, for the
//! examples that pass one around.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use surely::record::WatchedBody;
use tower::Service;

/// A surely client stack over hyper-util: full bodies in, watched bodies out.
pub(crate) trait HttpClient:
    Service<
        Request<Full<Bytes>>,
        Response = Response<WatchedBody<Incoming>>,
        Error = surely::Error<hyper_util::client::legacy::Error>,
        Future: Send,
    > + Clone
    + Send
    + 'static
{
}

impl<S> HttpClient for S where
    S: Service<
            Request<Full<Bytes>>,
            Response = Response<WatchedBody<Incoming>>,
            Error = surely::Error<hyper_util::client::legacy::Error>,
            Future: Send,
        > + Clone
        + Send
        + 'static
{
}
