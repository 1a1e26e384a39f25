//! The idempotency-key layer's service.

use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use super::future::{ResponseFuture, State};
use super::{IdempotencyKey, InvalidKey, KeyPolicy, NonIdempotent, SetIdempotencyKeyLayer};
use crate::context::CallTally;
use crate::context::Context as CallContext;
use crate::headers::IDEMPOTENCY_KEY;
use crate::record::BusinessKey;
use crate::{Envelope, Error, IntoError, Semantics};

/// The service made by [`SetIdempotencyKeyLayer`].
///
/// # Readiness
///
/// `poll_ready` is the inner service's. A call with an invalid caller key fails without calling
/// the inner service, so the readiness it reserved (a concurrency permit, a buffer slot) stays
/// reserved for the next call, as with tower's `Filter`.
#[derive(Clone)]
pub struct SetIdempotencyKey<S, P = NonIdempotent> {
    pub(super) inner: S,
    pub(super) policy: P,
    pub(super) honoured: bool,
}

impl<S> SetIdempotencyKey<S> {
    /// Wraps `inner`, keying the requests that are neither safe nor idempotent, as
    /// [`SetIdempotencyKeyLayer::new`].
    pub fn new(inner: S) -> Self {
        SetIdempotencyKeyLayer::new().layer(inner)
    }

    /// [`SetIdempotencyKeyLayer::new`], whose services are `SetIdempotencyKey`s.
    pub fn layer() -> SetIdempotencyKeyLayer {
        SetIdempotencyKeyLayer::new()
    }
}

impl<S, P> SetIdempotencyKey<S, P> {
    inner_accessors!();
}

impl<S: fmt::Debug, P> fmt::Debug for SetIdempotencyKey<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SetIdempotencyKey")
            .field("inner", &self.inner)
            .field("policy", &std::any::type_name::<P>())
            .field("server_honours_keys", &self.honoured)
            .finish()
    }
}

impl<S, P, Req> Service<Req> for SetIdempotencyKey<S, P>
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
    // The caller's key, if any (most requests carry none: a scan of their few names says so).
    let mut values = crate::headers::may_hold(headers, &IDEMPOTENCY_KEY)
        .then(|| headers.get_all(IDEMPOTENCY_KEY).iter())
        .into_iter()
        .flatten();
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
