//! Settling an unknown outcome by asking the server.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::classify::Classification;
use crate::ids::BusinessKey;
use crate::Semantics;

/// What a [`Resolve`]r found out about a call whose outcome was unknown.
#[derive(Debug)]
#[non_exhaustive]
pub enum Resolution<Res> {
    /// The server did the work: the call succeeds with this response (for instance, the order
    /// as the server holds it).
    Succeeded(Res),
    /// The server did not do it: the call fails, with the last attempt's result.
    Failed,
    /// Still unknown (the query failed, or the server cannot tell yet): the call stays unknown.
    Unknown,
}

/// A query in flight, as a [`Resolve`]r returns it.
pub struct Resolving<Res>(Pin<Box<dyn Future<Output = Resolution<Res>> + Send>>);

impl<Res> Resolving<Res> {
    /// Wraps a query's future.
    pub fn new(future: impl Future<Output = Resolution<Res>> + Send + 'static) -> Self {
        Resolving(Box::pin(future))
    }

    pub(crate) fn future(&mut self) -> Pin<&mut (dyn Future<Output = Resolution<Res>> + Send)> {
        self.0.as_mut()
    }
}

impl<Res> fmt::Debug for Resolving<Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolving").finish_non_exhaustive()
    }
}

/// What a resolver is told about the call it is asked to settle.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Query {
    /// The call's business key: a [`BusinessKey`] extension on the request, or its
    /// `Idempotency-Key`.
    pub key: Option<BusinessKey>,
    /// What the call did ([`Operation`](crate::ids::Operation)): which downstream to ask,
    /// for a resolver (or a [reconciler][crate::ledger::Reconciler]) that serves several.
    #[cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::ledger::Reconciler",
        )
    )]
    pub operation: Option<crate::ids::Operation>,
    /// The request's semantics.
    pub semantics: Semantics,
    /// How many attempts were made.
    pub attempts: u32,
    /// The last attempt's classification: how far it got, and what came back.
    pub last: Classification,
}

/// Settles a call whose outcome is unknown, by asking the server what became of it.
///
/// A POST without an idempotency key that timed out after it was sent may have committed: the
/// retry layer must not send it again, and the call's outcome is unknown. When the request
/// carries a business key (an order number, say, as a [`BusinessKey`] extension), a resolver
/// can look it up — `GET /orders/o-2` — and turn the unknown into a success (with the order it
/// found) or a failure (no such order). The retry layer consults it once, before the call
/// returns, and the call's record shows the query and its answer
/// ([`CallRecord::resolution`](crate::record::CallRecord::resolution)).
///
/// A keyed request does not need one: sending it again with the same key is itself the query,
/// and the retry layer does that. A resolver is still consulted if a keyed call ends unknown
/// (its retries were refused or ran out).
///
/// The query runs inside the call's deadline; give it a short timeout of its own. A resolver
/// may decline by returning `None` (no key, say), and the outcome stays unknown.
///
/// Implemented by closures `Fn(Query) -> impl Future<Output = Resolution<Res>>` and by
/// [`NoResolver`], the default.
///
/// ```
/// use surely::fault::{Fault, InjectFaultLayer, Schedule};
/// use surely::record::BusinessKey;
/// use surely::retry::{Query, Resolution, RetryLayer};
/// use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// // Ask the order service whether the order exists (here: it does).
/// let lookup = |q: Query| async move {
///     match q.key {
///         Some(order) => Resolution::Succeeded(http::Response::new(format!("{order} exists"))),
///         None => Resolution::Unknown,
///     }
/// };
/// let mut client = ServiceBuilder::new()
///     .layer(RetryLayer::builder().resolver(lookup).build().unwrap())
///     // The order is created, and the reply is lost.
///     .layer(InjectFaultLayer::new(Schedule::new().at(0, Fault::ResetAfterSend)))
///     .service(service_fn(|_req: http::Request<String>| async {
///         Ok::<_, std::io::Error>(http::Response::new(String::from("created")))
///     }));
///
/// let mut order = http::Request::post("/orders").body("o-2".to_owned()).unwrap();
/// order.extensions_mut().insert(BusinessKey::new("o-2"));
/// let res = client.ready().await.unwrap().call(order).await.unwrap();
/// // Not sent twice: settled by the query.
/// assert_eq!(res.body(), "o-2 exists");
/// # }
/// ```
pub trait Resolve<Res> {
    /// Whether the resolver is ever consulted; `false` lets the retry layer skip gathering the
    /// query.
    fn enabled(&self) -> bool {
        true
    }

    /// Starts the query for a call that would end unknown, or declines.
    fn resolve(&self, query: Query) -> Option<Resolving<Res>>;
}

/// No resolver: an unknown outcome stays unknown. The retry layer's default.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct NoResolver;

impl<Res> Resolve<Res> for NoResolver {
    fn enabled(&self) -> bool {
        false
    }

    fn resolve(&self, _: Query) -> Option<Resolving<Res>> {
        None
    }
}

impl<F, Fut, Res> Resolve<Res> for F
where
    F: Fn(Query) -> Fut,
    Fut: Future<Output = Resolution<Res>> + Send + 'static,
{
    fn resolve(&self, query: Query) -> Option<Resolving<Res>> {
        Some(Resolving::new(self(query)))
    }
}
