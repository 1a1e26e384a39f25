//! Which requests without a key of their own get a generated one.

use std::sync::Arc;

use http::Method;

use crate::{Envelope, Semantics};

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
    pub(super) methods: Arc<[Method]>,
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
