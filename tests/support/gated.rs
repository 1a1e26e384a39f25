//! An inner service with a readiness and a state of its own, to see what each attempt of a
//! layer that sends more than one (a retry, a hedge) is sent through.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

/// What a [`Gated`] answers.
pub(crate) type Answer = Pin<Box<dyn Future<Output = Result<Response<()>, std::io::Error>> + Send>>;

/// A fresh service (and every clone) is not ready until polled twice: it says `Pending` once,
/// and wakes its task; at the second poll it fails instead while [`fail_readiness`] has
/// failures left. `call` panics on a service not made ready, and records the `label` the
/// service had; the answer is the one `answer` makes of the call's number (from 0, across
/// clones). `B` is the requests' body type.
///
/// [`fail_readiness`]: Gated::fail_readiness
pub(crate) struct Gated<B> {
    pub(crate) label: u32,
    ready: bool,
    polled: bool,
    calls: Arc<AtomicU32>,
    unready: Arc<AtomicU32>,
    labels: Arc<Mutex<Vec<u32>>>,
    answer: Arc<dyn Fn(u32) -> Answer + Send + Sync>,
    body: PhantomData<fn(B)>,
}

impl<B> Gated<B> {
    pub(crate) fn new(label: u32, answer: impl Fn(u32) -> Answer + Send + Sync + 'static) -> Self {
        Gated {
            label,
            ready: false,
            polled: false,
            calls: Arc::default(),
            unready: Arc::default(),
            labels: Arc::default(),
            answer: Arc::new(answer),
            body: PhantomData,
        }
    }

    /// The next `n` readiness checks that reach their second poll fail (across clones), with an
    /// error of kind `NotConnected`.
    pub(crate) fn fail_readiness(&self, n: u32) {
        self.unready.store(n, Ordering::SeqCst);
    }

    /// The readiness failures still to come.
    pub(crate) fn readiness_failures_left(&self) -> u32 {
        self.unready.load(Ordering::SeqCst)
    }

    /// The labels of the calls so far, in order, across clones.
    pub(crate) fn labels(&self) -> Arc<Mutex<Vec<u32>>> {
        self.labels.clone()
    }
}

impl<B> Clone for Gated<B> {
    fn clone(&self) -> Self {
        Gated {
            label: self.label,
            ready: false,
            polled: false,
            calls: self.calls.clone(),
            unready: self.unready.clone(),
            labels: self.labels.clone(),
            answer: self.answer.clone(),
            body: PhantomData,
        }
    }
}

impl<B> Service<Request<B>> for Gated<B> {
    type Response = Response<()>;
    type Error = std::io::Error;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.polled {
            self.polled = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if self
            .unready
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            // A fresh start after the failure: the next check says `Pending` again.
            self.polled = false;
            return Poll::Ready(Err(std::io::ErrorKind::NotConnected.into()));
        }
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        assert!(self.ready, "called without being made ready");
        self.ready = false;
        self.labels.lock().unwrap().push(self.label);
        (self.answer)(self.calls.fetch_add(1, Ordering::SeqCst))
    }
}
