//! The idempotency-key layer.

use std::fmt;

use http::Method;
use tower_layer::Layer;

use super::{Always, Methods, NonIdempotent, SetIdempotencyKey};
use crate::Envelope;

/// Gives each call one idempotency key, the caller's or a fresh one. See the
/// [module docs](super).
#[derive(Clone)]
pub struct SetIdempotencyKeyLayer<P = NonIdempotent> {
    pub(super) policy: P,
    pub(super) honoured: bool,
}

impl SetIdempotencyKeyLayer {
    /// Keys the requests that are neither safe nor idempotent ([`NonIdempotent`]).
    pub fn new() -> Self {
        SetIdempotencyKeyLayer {
            policy: NonIdempotent,
            honoured: false,
        }
    }
}

impl Default for SetIdempotencyKeyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl SetIdempotencyKeyLayer<Always> {
    /// Keys every request that has headers, reads included.
    pub fn always() -> Self {
        SetIdempotencyKeyLayer {
            policy: Always,
            honoured: false,
        }
    }
}

impl SetIdempotencyKeyLayer<Methods> {
    /// Keys the requests whose method is one of `methods`.
    ///
    /// ```
    /// use surely::idempotency::SetIdempotencyKeyLayer;
    ///
    /// let layer = SetIdempotencyKeyLayer::for_methods([http::Method::POST, http::Method::PUT]);
    /// # let _ = layer;
    /// ```
    pub fn for_methods(methods: impl IntoIterator<Item = Method>) -> Self {
        SetIdempotencyKeyLayer {
            policy: Methods {
                methods: methods.into_iter().collect(),
            },
            honoured: false,
        }
    }
}

impl<F> SetIdempotencyKeyLayer<F>
where
    F: Fn(&dyn Envelope) -> bool,
{
    /// Keys the requests for which `predicate` returns true.
    ///
    /// ```
    /// use surely::idempotency::SetIdempotencyKeyLayer;
    /// use surely::Envelope;
    ///
    /// // Only the payments API honours keys.
    /// let layer = SetIdempotencyKeyLayer::when(|req: &dyn Envelope| {
    ///     req.method() == Some(&http::Method::POST)
    ///         && req.headers().is_some_and(|h| h.contains_key("x-payments"))
    /// });
    /// # let _ = layer;
    /// ```
    pub fn when(predicate: F) -> Self {
        SetIdempotencyKeyLayer {
            policy: predicate,
            honoured: false,
        }
    }
}

impl<P> SetIdempotencyKeyLayer<P> {
    /// A layer with any [`KeyPolicy`](super::KeyPolicy).
    pub fn with_policy(policy: P) -> Self {
        SetIdempotencyKeyLayer {
            policy,
            honoured: false,
        }
    }

    /// Declares that the server behind this client honours idempotency keys (it runs this
    /// crate's [server layer][crate::server::idempotency], or documents the `Idempotency-Key` header), so that a
    /// key the layer generates makes its request [`Keyed`](crate::Semantics::Keyed): retried with the
    /// same key after a lost reply.
    ///
    /// Without this word a generated key is still sent (a server that honours it is then
    /// protected against this client's retries of refused attempts), but the request keeps its
    /// semantics: a POST stays [`NonIdempotent`](crate::Semantics::NonIdempotent), and one whose reply
    /// was lost ends [`Unknown`](crate::Outcome::Unknown) instead of being sent again to a
    /// server that might run it twice. A key the caller set makes its request keyed either way.
    ///
    /// ```
    /// use surely::idempotency::SetIdempotencyKeyLayer;
    /// use surely::{Envelope, Semantics};
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let transport = service_fn(|req: http::Request<()>| async move {
    ///     Ok::<_, std::io::Error>(req.semantics())
    /// });
    /// let post = || http::Request::post("/orders").body(()).unwrap();
    ///
    /// let mut unknown_server = SetIdempotencyKeyLayer::new().layer(transport.clone());
    /// let semantics = unknown_server.ready().await.unwrap().call(post()).await.unwrap();
    /// assert_eq!(semantics, Semantics::NonIdempotent);
    ///
    /// let mut honouring = SetIdempotencyKeyLayer::new().server_honours_keys().layer(transport);
    /// let semantics = honouring.ready().await.unwrap().call(post()).await.unwrap();
    /// assert_eq!(semantics, Semantics::Keyed);
    /// # }
    /// ```
    #[cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::idempotency",
        )
    )]
    pub fn server_honours_keys(mut self) -> Self {
        self.honoured = true;
        self
    }

    /// Whether the layer was told that the server honours keys
    /// ([`server_honours_keys`](Self::server_honours_keys)).
    pub fn honours_keys(&self) -> bool {
        self.honoured
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }
}

impl<S, P: Clone> Layer<S> for SetIdempotencyKeyLayer<P> {
    type Service = SetIdempotencyKey<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        SetIdempotencyKey {
            inner,
            policy: self.policy.clone(),
            honoured: self.honoured,
        }
    }
}

impl<P> fmt::Debug for SetIdempotencyKeyLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetIdempotencyKeyLayer")
            .field("policy", &std::any::type_name::<P>())
            .field("server_honours_keys", &self.honoured)
            .finish()
    }
}
