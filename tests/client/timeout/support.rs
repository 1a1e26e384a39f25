//! Shared helpers for the attempt timeout tests.

use std::io;

use http::{Request, Response};
use tower::{service_fn, Service};

pub(crate) use crate::support::call;
pub(crate) use crate::support::serve::closed_port;
pub(crate) use crate::support::serve::serve;
pub(crate) use crate::support::time::{ms, secs};

/// A transport that never answers.
pub(crate) fn hanging<B>() -> impl Service<Request<B>, Response = Response<()>, Error = io::Error> {
    service_fn(|_req: Request<B>| async {
        std::future::pending::<()>().await;
        Ok(Response::new(()))
    })
}
