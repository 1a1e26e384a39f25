//! Shared helpers for the deadline tests.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::{HeaderMap, Request, Response};
use surely::deadline::Deadline;
use tower::{service_fn, Service};

pub(crate) use crate::support::call;
pub(crate) use crate::support::time::{ms, secs};

/// What an inner service saw of one request.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) headers: HeaderMap,
    /// The current deadline while the inner service's `call` ran.
    pub(crate) current_at_call: Option<Deadline>,
    /// The current deadline while the inner future was polled.
    pub(crate) current_at_poll: Option<Deadline>,
    /// The `Deadline` extension of the request.
    pub(crate) extension: Option<Deadline>,
}

/// Everything an inner service saw, shared with the test.
#[derive(Clone, Debug, Default)]
pub(crate) struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    pub(crate) fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The only request seen; panics unless exactly one was.
    pub(crate) fn only(&self) -> Seen {
        let all = self.all();
        assert_eq!(all.len(), 1, "expected exactly one call, saw {}", all.len());
        all.into_iter().next().unwrap()
    }

    /// The one header `name` of the only request, as a string, or `None`.
    pub(crate) fn header(&self, name: &str) -> Option<String> {
        self.only()
            .headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    fn push(&self, seen: Seen) {
        self.0.lock().unwrap().push(seen);
    }
}

/// A client transport that records what it saw and answers 200 at once.
pub(crate) fn recording(
    log: Log,
) -> impl Service<
    Request<()>,
    Response = Response<()>,
    Error = io::Error,
    Future = impl Future<Output = io::Result<Response<()>>>,
> + Clone {
    service_fn(move |req: Request<()>| {
        let log = log.clone();
        let headers = req.headers().clone();
        let extension = req.extensions().get::<Deadline>().copied();
        let current_at_call = surely::deadline::current();
        async move {
            log.push(Seen {
                headers,
                current_at_call,
                current_at_poll: surely::deadline::current(),
                extension,
            });
            Ok(Response::new(()))
        }
    })
}

/// A transport that is called (counted) and then never answers.
pub(crate) fn hanging(
    calls: Arc<AtomicUsize>,
) -> impl Service<Request<()>, Response = Response<()>, Error = io::Error> + Clone {
    service_fn(move |_req: Request<()>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async {
            std::future::pending::<()>().await;
            Ok(Response::new(()))
        }
    })
}

/// A server handler that records what it saw and answers 200 with an empty body.
pub(crate) fn handler(
    log: Log,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible> + Clone {
    service_fn(move |req: Request<()>| {
        let log = log.clone();
        let headers = req.headers().clone();
        let extension = req.extensions().get::<Deadline>().copied();
        let current_at_call = surely::deadline::current();
        async move {
            log.push(Seen {
                headers,
                current_at_call,
                current_at_poll: surely::deadline::current(),
                extension,
            });
            Ok(Response::new(String::new()))
        }
    })
}

pub(crate) fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

pub(crate) fn get(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}
