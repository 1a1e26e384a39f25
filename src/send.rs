//! The typed call: `client.send(req)`, which waits for the stack to be ready, calls it, and
//! hands back the answer with the call's outcome ([`Reply`]), whatever the answer's type.
//!
//! An HTTP response carries its [`CallOutcome`] in its extensions. A plain answer (a `u64`, a
//! type of your own) has nowhere to carry one, so while `send` polls the call, the layer that
//! folds the attempts hands the outcome to it instead (`outcome::catch_handed`).

use std::future::{poll_fn, Future};
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use crate::outcome::{sealed, CallOutcome, Outcome, OutcomeExt};
use crate::{Envelope, Error};

/// The answer of a call made with `send`, and what the call came to.
///
/// It dereferences to the answer (`reply.status()` on an HTTP response, a field of a type of
/// your own); [`into_inner`](Self::into_inner) takes it out. The call's outcome, its attempts
/// and whether the answer was a stored replay are read through [`OutcomeExt`], on the reply
/// or on the whole `Result` that `send` returns:
///
/// ```
/// use surely::{Envelope, Outcome, OutcomeExt};
/// use tower::service_fn;
///
/// #[derive(Clone)]
/// struct GetPrice(u64);
/// impl Envelope for GetPrice {}
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let prices = service_fn(|req: GetPrice| async move { Ok::<_, std::io::Error>(req.0 * 100) });
/// let mut client = surely::client().build(prices).unwrap();
///
/// let res = client.send(GetPrice(7)).await;
/// assert_eq!(res.outcome(), Outcome::Succeeded);
/// assert_eq!(res.attempts(), 1);
/// let price: u64 = res.unwrap().into_inner();
/// assert_eq!(price, 700);
/// # }
/// ```
///
/// A stack without a layer that folds the attempts (a deadline layer alone) hands back no
/// outcome: [`call_outcome`](OutcomeExt::call_outcome) is then `None`, and the outcome says
/// [`Unknown`](Outcome::Unknown), as for a response no surely layer vouched for.
#[derive(Clone, Debug)]
pub struct Reply<T> {
    answer: T,
    call: Option<CallOutcome>,
}

impl<T> Reply<T> {
    /// The answer.
    pub fn get_ref(&self) -> &T {
        &self.answer
    }

    /// The answer, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.answer
    }

    /// Takes the answer out, leaving the outcome.
    pub fn into_inner(self) -> T {
        self.answer
    }

    /// The answer and the call's outcome, apart.
    pub fn into_parts(self) -> (T, Option<CallOutcome>) {
        (self.answer, self.call)
    }
}

impl<T> Deref for Reply<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.answer
    }
}

impl<T> DerefMut for Reply<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.answer
    }
}

impl<T> OutcomeExt for Reply<T> {
    fn call_outcome(&self) -> Option<&CallOutcome> {
        self.call.as_ref()
    }

    fn outcome(&self) -> Outcome {
        self.call
            .as_ref()
            .map_or(Outcome::Unknown, CallOutcome::outcome)
    }
}

impl<T> sealed::Sealed for Reply<T> {}

impl<T, E> OutcomeExt for Result<Reply<T>, Error<E>> {
    fn call_outcome(&self) -> Option<&CallOutcome> {
        match self {
            Ok(reply) => reply.call_outcome(),
            Err(e) => e.call_outcome(),
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            Ok(reply) => reply.outcome(),
            Err(e) => e.outcome(),
        }
    }

    fn attempts(&self) -> u32 {
        match self {
            Ok(reply) => reply.attempts(),
            Err(e) => e.attempts(),
        }
    }
}

impl<T, E> sealed::Sealed for Result<Reply<T>, Error<E>> {}

/// `send` for any service whose error is the crate's: ready, call, and the answer with its
/// outcome.
pub(crate) async fn send<S, Req, E>(
    service: &mut S,
    req: Req,
) -> Result<Reply<S::Response>, Error<E>>
where
    S: Service<Req, Error = Error<E>>,
    S::Response: Envelope,
{
    poll_fn(|cx| service.poll_ready(cx)).await?;
    let (out, handed) = Captured {
        inner: service.call(req),
        handed: None,
    }
    .await;
    let answer = out?;
    let call = answer
        .extensions()
        .and_then(|e| e.get::<CallOutcome>())
        .cloned()
        .or(handed);
    Ok(Reply { answer, call })
}

pin_project! {
    /// A call's future, polled with the slot that catches an outcome handed back on an answer
    /// without extensions.
    struct Captured<F> {
        #[pin]
        inner: F,
        handed: Option<CallOutcome>,
    }
}

impl<F: Future> Future for Captured<F> {
    type Output = (F::Output, Option<CallOutcome>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (out, handed) = crate::outcome::catch_handed(|| this.inner.poll(cx));
        match out {
            // Only the poll that ends the call: an outcome handed back earlier was a nested
            // call's, made inside an attempt.
            Poll::Ready(out) => Poll::Ready((out, handed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The typed call on a stack's outermost layer: `send` in the layer's own docs.
macro_rules! send_method {
    () => {
        /// Waits until the stack is ready, sends `req`, and hands back the answer with the
        /// call's outcome ([`Reply`](crate::Reply)): the same as `ready().await?.call(req)`,
        /// without naming the request's type, and with the outcome and the attempts on a
        /// success of any type, read through [`OutcomeExt`](crate::OutcomeExt).
        ///
        /// A request or an answer the stack cannot take is named by the compiler here (for
        /// example "`Price` is not a `surely::Envelope`"), with what to implement.
        ///
        /// ```
        /// use surely::{Outcome, OutcomeExt};
        /// use tower::service_fn;
        ///
        /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
        /// let echo = service_fn(|req: http::Request<String>| async move {
        ///     Ok::<_, std::io::Error>(http::Response::new(req.into_body()))
        /// });
        /// let mut client = surely::client().build(echo).unwrap();
        /// let req = http::Request::get("http://127.0.0.1/ping").body("ping".to_owned()).unwrap();
        /// let res = client.send(req).await;
        /// assert_eq!((res.outcome(), res.attempts()), (Outcome::Succeeded, 1));
        /// assert_eq!(res.unwrap().body(), "ping");
        /// # }
        /// ```
        pub async fn send<Req, E>(
            &mut self,
            req: Req,
        ) -> Result<crate::Reply<<Self as tower_service::Service<Req>>::Response>, crate::Error<E>>
        where
            Self: tower_service::Service<Req, Error = crate::Error<E>>,
            <Self as tower_service::Service<Req>>::Response: crate::Envelope,
        {
            crate::send::send(self, req).await
        }
    };
}

pub(crate) use send_method;
