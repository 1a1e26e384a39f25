//! Idempotency keys, client side: one key per logical call, the same on every attempt.
//!
//! A POST whose reply was lost cannot be sent again: the server may have created the order,
//! and a second POST creates a second one. With an `Idempotency-Key` header (IETF draft
//! `draft-ietf-httpapi-idempotency-key-header`), a server that honours it remembers the key with
//! the first request's result, and answers a repeat with that result instead of doing the work
//! twice. The request becomes [`Semantics::Keyed`]: the retry layer may repeat it after a timeout
//! or a 502, and a lost reply no longer leaves the outcome unknown for good.
//!
//! [`IdempotencyKeyLayer`] gives each call its key: the caller's, if the request carries one (an
//! `Idempotency-Key` header, or an [`IdempotencyKey`] in its extensions), otherwise a fresh random
//! one ([`IdempotencyKey::generate`]), but only for requests that need it: by default those whose
//! semantics are neither safe nor idempotent (POST, PATCH, any method not in RFC 9110's lists; a
//! [`Semantics`] extension overrides the method, as everywhere in the crate). [`always`] and
//! [`for_methods`](IdempotencyKeyLayer::for_methods) choose differently, and
//! [`when`](IdempotencyKeyLayer::when) takes any predicate.
//!
//! # A key promises only what the server does with it
//!
//! A key the caller set makes the request [`Keyed`](Semantics::Keyed): the caller knows its
//! server. A key the layer generates does so only when the layer was told that the server honours
//! keys ([`server_honours_keys`](IdempotencyKeyLayer::server_honours_keys)); otherwise it is sent
//! all the same, but the request keeps the semantics of its method, and a POST whose reply was lost
//! is not sent again to a server that might run it twice. A [`Semantics`] extension set by the
//! caller always wins.
//!
//! # One key per intent, not per attempt
//!
//! The key names *what the caller wants done*, once. If each attempt had its own key, the server
//! would see two different requests and do the work twice: exactly what the key is for
//! preventing. So the key is made **outside** the retry layer, written into the request, and
//! every attempt sends a copy of that request, with the same key. That is also why the layer sits
//! *inside* the deadline layer: the deadline bounds the whole call, the key names it, and the
//! retries happen within both (see the crate's layer order):
//!
//! ```text
//! record::RecordCallLayer
//!   deadline::SetDeadlineLayer
//!     idempotency::IdempotencyKeyLayer     one key per call
//!       retry                              every attempt sends the same key
//!         ... attempt timeout, transport
//! ```
//!
//! # What the server does with it
//!
//! A server that honours keys (this crate's [server layer](crate::server::idempotency), or most payment APIs)
//! answers:
//!
//! * **a repeat of a finished request**: the stored response of the first one, without doing the
//!   work again;
//! * **a repeat while the first is still running**: `409 Conflict`, with `Retry-After` or the
//!   [`idempotency-key-in-flight`](crate::headers::KEY_IN_FLIGHT) header. The
//!   [`HttpClassifier`](crate::classify::HttpClassifier) classifies that as *rejected* for a keyed
//!   request: retry later, **with the same key**. A 409 without either marker is a business
//!   conflict, and is not retried;
//! * **the same key with a different payload**: `422 Unprocessable Content`, which is *final*: the
//!   caller reused a key for another intent.
//!
//! # Invalid keys
//!
//! A caller's key must be 1 to 255 bytes of visible ASCII (see [`IdempotencyKey`]) and the
//! header must appear once. Otherwise the call fails with [`InvalidKey`]
//! ([`Error::invalid_key`]), without calling the inner service; the error is classified *final*
//! and *not sent*.
//!
//! # Requests without headers
//!
//! The layer works on any [`Envelope`]: [`http::Request`] (so hyper, tonic, and any HTTP
//! transport), and request types of your own. A type whose [`Envelope::headers_mut`] returns
//! `None`, the default, has nowhere to put a key: the layer passes it through unchanged.
//!
//! # Allocations
//!
//! A generated key costs one allocation for its bytes, which the header and the extension share,
//! plus the extension insert (the request's extension map, if it had none yet, and the boxed
//! key), and, for a server not declared to honour keys, one more boxed extension that keeps the
//! request's semantics. A caller's key given as a header costs none: it is validated in place, kept as it is,
//! and not copied into the extensions. A caller's key given as an extension costs none either
//! (the header shares its bytes). A request that needs no key costs one look at its headers.
//!
//! # Example
//!
//! ```
//! use surely::idempotency::{IdempotencyKey, IdempotencyKeyLayer};
//! use surely::{Envelope, Semantics};
//! use surely::headers::IDEMPOTENCY_KEY;
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let server = service_fn(|req: http::Request<&'static str>| async move {
//!     // The transport sees a keyed request: this client was told its server honours keys.
//!     assert_eq!(req.semantics(), Semantics::Keyed);
//!     let key = req.headers()[IDEMPOTENCY_KEY].clone();
//!     // Layers in between find the same key in the extensions.
//!     assert_eq!(req.extensions().get::<IdempotencyKey>().unwrap().to_header_value(), key);
//!     Ok::<_, std::io::Error>(http::Response::new(()))
//! });
//! let mut client = IdempotencyKeyLayer::new().server_honours_keys().layer(server);
//!
//! let order = http::Request::post("/orders").body("o-1").unwrap();
//! client.ready().await.unwrap().call(order).await.unwrap();
//!
//! // A bad caller key never leaves the process.
//! let bad = http::Request::post("/orders").header(IDEMPOTENCY_KEY, "two words").body("o-2").unwrap();
//! let err = client.ready().await.unwrap().call(bad).await.unwrap_err();
//! assert_eq!(err.invalid_key().unwrap().invalid_byte(), Some((3, b' ')));
//! # }
//! ```
//!
//! # How this differs from a hand-written header
//!
//! tower has no such layer; a `SetRequestHeader` from tower-http with a random value would make a
//! key per *attempt* if placed under the retry layer, and would not validate a caller's key. This
//! layer makes one per call, keeps the caller's, refuses bad ones before they are sent, and
//! leaves requests that need no key alone.
//!
//! [`always`]: IdempotencyKeyLayer::always
//! [`Semantics`]: crate::Semantics
//! [`Semantics::Keyed`]: crate::Semantics::Keyed
//! [`Error::invalid_key`]: crate::Error::invalid_key
//! [`Envelope::headers_mut`]: crate::Envelope::headers_mut

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Method;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

pub use crate::ids::InvalidKey;

pub use crate::ids::IdempotencyKey;

use crate::context::CallTally;
use crate::context::Context as CallContext;
use crate::error::lift_poll;
use crate::headers::IDEMPOTENCY_KEY;
use crate::outcome::{CallOutcome, StopReason};
use crate::record::BusinessKey;
use crate::{Envelope, Error, IntoError, Semantics};

/// Which requests without a key of their own get a generated one.
///
/// Implemented by [`NonIdempotent`] (the default), [`Always`], [`Methods`], and any
/// `Fn(&dyn Envelope) -> bool`.
pub trait KeyPolicy {
    /// Whether `req`, which carries no key yet, needs one.
    fn needs_key(&self, req: &dyn Envelope) -> bool;
}

/// The default [`KeyPolicy`]: a key for requests that are neither safe nor idempotent, as
/// [`Envelope::semantics`] says (a [`Semantics`] extension, else the
/// method): POST, PATCH, and unknown methods get one; GET, HEAD, OPTIONS, TRACE, PUT and DELETE
/// do not.
///
/// gRPC calls are POSTs, so they get a key too; most gRPC servers ignore it. Mark a read-only
/// call [`Semantics::Safe`] in its extensions, or choose another policy, to skip it.
#[derive(Clone, Copy, Debug, Default)]
pub struct NonIdempotent;

impl KeyPolicy for NonIdempotent {
    fn needs_key(&self, req: &dyn Envelope) -> bool {
        matches!(req.semantics(), Semantics::NonIdempotent | Semantics::Keyed)
    }
}

/// A [`KeyPolicy`] that keys every request that has headers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Always;

impl KeyPolicy for Always {
    fn needs_key(&self, _: &dyn Envelope) -> bool {
        true
    }
}

/// A [`KeyPolicy`] that keys the requests whose method is in a list.
#[derive(Clone, Debug)]
pub struct Methods {
    methods: Arc<[Method]>,
}

impl KeyPolicy for Methods {
    fn needs_key(&self, req: &dyn Envelope) -> bool {
        req.method().is_some_and(|m| self.methods.contains(m))
    }
}

impl<F> KeyPolicy for F
where
    F: Fn(&dyn Envelope) -> bool,
{
    fn needs_key(&self, req: &dyn Envelope) -> bool {
        self(req)
    }
}

/// Gives each call one idempotency key, the caller's or a fresh one. See the
/// [module docs](self).
#[derive(Clone)]
pub struct IdempotencyKeyLayer<P = NonIdempotent> {
    policy: P,
    honoured: bool,
}

impl IdempotencyKeyLayer {
    /// Keys the requests that are neither safe nor idempotent ([`NonIdempotent`]).
    pub fn new() -> Self {
        IdempotencyKeyLayer {
            policy: NonIdempotent,
            honoured: false,
        }
    }
}

impl Default for IdempotencyKeyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotencyKeyLayer<Always> {
    /// Keys every request that has headers, reads included.
    pub fn always() -> Self {
        IdempotencyKeyLayer {
            policy: Always,
            honoured: false,
        }
    }
}

impl IdempotencyKeyLayer<Methods> {
    /// Keys the requests whose method is one of `methods`.
    ///
    /// ```
    /// use surely::idempotency::IdempotencyKeyLayer;
    ///
    /// let layer = IdempotencyKeyLayer::for_methods([http::Method::POST, http::Method::PUT]);
    /// # let _ = layer;
    /// ```
    pub fn for_methods(methods: impl IntoIterator<Item = Method>) -> Self {
        IdempotencyKeyLayer {
            policy: Methods {
                methods: methods.into_iter().collect(),
            },
            honoured: false,
        }
    }
}

impl<F> IdempotencyKeyLayer<F>
where
    F: Fn(&dyn Envelope) -> bool,
{
    /// Keys the requests for which `predicate` returns true.
    ///
    /// ```
    /// use surely::idempotency::IdempotencyKeyLayer;
    /// use surely::Envelope;
    ///
    /// // Only the payments API honours keys.
    /// let layer = IdempotencyKeyLayer::when(|req: &dyn Envelope| {
    ///     req.method() == Some(&http::Method::POST)
    ///         && req.headers().is_some_and(|h| h.contains_key("x-payments"))
    /// });
    /// # let _ = layer;
    /// ```
    pub fn when(predicate: F) -> Self {
        IdempotencyKeyLayer {
            policy: predicate,
            honoured: false,
        }
    }
}

impl<P> IdempotencyKeyLayer<P> {
    /// A layer with any [`KeyPolicy`].
    pub fn with_policy(policy: P) -> Self {
        IdempotencyKeyLayer {
            policy,
            honoured: false,
        }
    }

    /// Declares that the server behind this client honours idempotency keys (it runs this
    /// crate's [server layer](crate::server::idempotency), or documents the `Idempotency-Key` header), so that a
    /// key the layer generates makes its request [`Keyed`](Semantics::Keyed): retried with the
    /// same key after a lost reply.
    ///
    /// Without this word a generated key is still sent (a server that honours it is then
    /// protected against this client's retries of refused attempts), but the request keeps its
    /// semantics: a POST stays [`NonIdempotent`](Semantics::NonIdempotent), and one whose reply
    /// was lost ends [`Unknown`](crate::Outcome::Unknown) instead of being sent again to a
    /// server that might run it twice. A key the caller set makes its request keyed either way.
    ///
    /// ```
    /// use surely::idempotency::IdempotencyKeyLayer;
    /// use surely::{Envelope, Semantics};
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let transport = service_fn(|req: http::Request<()>| async move {
    ///     Ok::<_, std::io::Error>(req.semantics())
    /// });
    /// let post = || http::Request::post("/orders").body(()).unwrap();
    ///
    /// let mut unknown_server = IdempotencyKeyLayer::new().layer(transport.clone());
    /// let semantics = unknown_server.ready().await.unwrap().call(post()).await.unwrap();
    /// assert_eq!(semantics, Semantics::NonIdempotent);
    ///
    /// let mut honouring = IdempotencyKeyLayer::new().server_honours_keys().layer(transport);
    /// let semantics = honouring.ready().await.unwrap().call(post()).await.unwrap();
    /// assert_eq!(semantics, Semantics::Keyed);
    /// # }
    /// ```
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

impl<S, P: Clone> Layer<S> for IdempotencyKeyLayer<P> {
    type Service = IdempotencyKeyService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyKeyService {
            inner,
            policy: self.policy.clone(),
            honoured: self.honoured,
        }
    }
}

impl<P> fmt::Debug for IdempotencyKeyLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKeyLayer")
            .field("policy", &std::any::type_name::<P>())
            .field("server_honours_keys", &self.honoured)
            .finish()
    }
}

/// The service made by [`IdempotencyKeyLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's. A call with an invalid caller key fails without calling
/// the inner service, so the readiness it reserved (a concurrency permit, a buffer slot) stays
/// reserved for the next call, as with tower's `Filter`.
#[derive(Clone)]
pub struct IdempotencyKeyService<S, P = NonIdempotent> {
    inner: S,
    policy: P,
    honoured: bool,
}

impl<S, P: Clone> IdempotencyKeyService<S, P> {
    /// Wraps `inner` with the layer's settings.
    pub fn new(inner: S, layer: IdempotencyKeyLayer<P>) -> Self {
        IdempotencyKeyService {
            inner,
            policy: layer.policy,
            honoured: layer.honoured,
        }
    }
}

impl<S, P> IdempotencyKeyService<S, P> {
    inner_accessors!();
}

impl<S: fmt::Debug, P> fmt::Debug for IdempotencyKeyService<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKeyService")
            .field("inner", &self.inner)
            .field("policy", &std::any::type_name::<P>())
            .field("server_honours_keys", &self.honoured)
            .finish()
    }
}

impl<S, P, Req> Service<Req> for IdempotencyKeyService<S, P>
where
    S: Service<Req>,
    S::Error: IntoError,
    P: KeyPolicy,
    Req: Envelope,
{
    type Response = S::Response;
    type Error = Error<<S::Error as IntoError>::Transport>;
    type Future = ResponseFuture<S::Future, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(IntoError::into_error)
    }

    #[inline]
    fn call(&mut self, mut req: Req) -> Self::Future {
        match attach_key(&self.policy, self.honoured, &mut req) {
            Ok(()) => {
                report_key(&req);
                ResponseFuture {
                    state: State::Call {
                        future: self.inner.call(req),
                    },
                    _error: PhantomData,
                }
            }
            Err(error) => ResponseFuture {
                state: State::Invalid { error },
                _error: PhantomData,
            },
        }
    }
}

/// Tells a call record outside the key this call goes out with, and that it is keyed: the
/// record layer saw the request before the key was written.
fn report_key<Req: Envelope>(req: &Req) {
    if CallContext::current().call.is_none() {
        return;
    }
    let Some(key) = req.headers().and_then(|h| h.get(IDEMPOTENCY_KEY)) else {
        return;
    };
    let header = key.clone();
    let key = BusinessKey::new(String::from_utf8_lossy(key.as_bytes()));
    let semantics = req.semantics();
    CallTally::update(|t| t.keyed(key, header, semantics));
}

/// Validates the caller's key, or writes one if the policy wants it. A generated key makes its
/// request keyed only when the server is known to honour keys (`honoured`).
fn attach_key<Req: Envelope>(
    policy: &impl KeyPolicy,
    honoured: bool,
    req: &mut Req,
) -> Result<(), InvalidKey> {
    let Some(headers) = req.headers() else {
        // Nowhere to put a key.
        return Ok(());
    };
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    if let Some(value) = values.next() {
        if values.next().is_some() {
            return Err(InvalidKey::repeated());
        }
        // The caller's header, kept as it is.
        return crate::ids::validate_key(value.as_bytes());
    }
    let value = match req.extensions().and_then(|e| e.get::<IdempotencyKey>()) {
        Some(caller) => caller.to_header_value(),
        None => {
            if !policy.needs_key(&*req) {
                return Ok(());
            }
            // Nobody said the server honours the key: the header must not make a request that
            // is not idempotent keyed. (Its semantics come from the method here: an explicit
            // `Semantics` extension is left as the caller set it, and always wins.)
            let pin = !honoured
                && req.semantics() == Semantics::NonIdempotent
                && req
                    .extensions()
                    .is_some_and(|e| e.get::<Semantics>().is_none());
            let key = IdempotencyKey::generate();
            // The header and the extension share the key's bytes.
            let value = key.to_header_value();
            if let Some(extensions) = req.extensions_mut() {
                if pin {
                    extensions.insert(Semantics::NonIdempotent);
                }
                extensions.insert(key);
            }
            value
        }
    };
    if let Some(headers) = req.headers_mut() {
        headers.insert(IDEMPOTENCY_KEY, value);
    }
    Ok(())
}

/// The future, public in a private module: named by the service's `Future` type only.
mod future {
    use super::*;

    pin_project! {
        /// The future of [`IdempotencyKeyService`]: the inner service's, or the caller's invalid key.
        pub struct ResponseFuture<F, E> {
            #[pin]
            pub(super) state: State<F>,
            pub(super) _error: PhantomData<fn() -> E>,
        }
    }

    pin_project! {
        #[project = StateProj]
        pub(super) enum State<F> {
            Call { #[pin] future: F },
            Invalid { error: InvalidKey },
        }
    }

    impl<F, T, E0> Future for ResponseFuture<F, Error<E0::Transport>>
    where
        F: Future<Output = Result<T, E0>>,
        E0: IntoError,
    {
        type Output = Result<T, Error<E0::Transport>>;

        // Inlined, so that the inner future's answer is not returned through memory once more.
        #[inline]
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match self.project().state.project() {
                StateProj::Call { future } => lift_poll(future.poll(cx)),
                StateProj::Invalid { error } => Poll::Ready(Err(invalid_key(*error))),
            }
        }
    }

    /// A call refused before any attempt: the key never left the process.
    #[cold]
    #[inline(never)]
    fn invalid_key<T>(error: InvalidKey) -> Error<T> {
        let mut err: Error<T> = error.into();
        err.set_call_outcome(CallOutcome::refused(
            StopReason::Final,
            crate::context::budget_left_now(),
        ));
        err
    }

    impl<F, E> fmt::Debug for ResponseFuture<F, E> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let state = match &self.state {
                State::Call { .. } => "call",
                State::Invalid { .. } => "invalid key",
            };
            f.debug_struct("ResponseFuture")
                .field("state", &state)
                .finish()
        }
    }
}

use self::future::{ResponseFuture, State};
