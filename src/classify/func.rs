use std::fmt;

use super::{Classification, Classified, Classify, DeliveryPhase, MakeClassifier, NeverEos};
use crate::{Envelope, Semantics};

/// What an attempt produced, as a closure classifier sees it.
#[derive(Debug)]
pub enum Attempted<'a, Res, E> {
    /// A response.
    Response(&'a Res),
    /// An error, and how far the layer that saw it knows the request got.
    Error(&'a E, DeliveryPhase),
}

/// A classifier from a closure: see [`from_fn`].
#[derive(Clone, Copy)]
pub struct ClassifyFn<F> {
    f: F,
}

/// The per-request classifier made by [`ClassifyFn`]: the closure and the request's semantics.
#[derive(Clone, Copy)]
pub struct FnClassifier<F> {
    f: F,
    semantics: Semantics,
}

/// A classifier from a closure `Fn(Attempted<'_, Res, E>, Semantics) -> Classification`, for a
/// service whose answers can themselves say "failed" or "try later" (the default
/// [`HttpClassifier`](super::HttpClassifier) takes an answer without an HTTP status as a
/// success), or that means something else by its statuses. Behind surely's layers (a
/// [`client()`](crate::client()) stack), `E` is the crate's [`Error<T>`](crate::Error) around
/// the transport's error `T`.
///
/// ```
/// use surely::classify::{self, AttemptClass, Attempted, Classification, Classify, DeliveryPhase, MakeClassifier};
/// use surely::{Envelope, Semantics};
///
/// struct Reply { ok: bool }
/// struct Transfer;
/// impl Envelope for Transfer {}
///
/// let make = classify::from_fn(|attempt: Attempted<'_, Reply, std::io::Error>, _: Semantics| {
///     match attempt {
///         Attempted::Response(r) if r.ok => Classification::success(),
///         Attempted::Response(_) => Classification::new(AttemptClass::Final, DeliveryPhase::ResponseStarted),
///         Attempted::Error(_, phase) => Classification::failure_at(phase),
///     }
/// });
/// let c = make.make_classifier(&Transfer).classify_error(&std::io::ErrorKind::TimedOut.into(), DeliveryPhase::Sent);
/// assert_eq!(c.class(), AttemptClass::MaybeCommitted);
/// ```
pub fn from_fn<F>(f: F) -> ClassifyFn<F> {
    ClassifyFn { f }
}

impl<F: Clone, Req: Envelope> MakeClassifier<Req> for ClassifyFn<F> {
    type Classifier = FnClassifier<F>;

    fn make_classifier(&self, req: &Req) -> FnClassifier<F> {
        FnClassifier {
            f: self.f.clone(),
            semantics: req.semantics(),
        }
    }
}

impl<F, Res, E> Classify<Res, E> for FnClassifier<F>
where
    F: Fn(Attempted<'_, Res, E>, Semantics) -> Classification,
{
    type ClassifyEos = NeverEos;

    fn classify_response(self, res: &Res) -> Classified<NeverEos> {
        Classified::Ready((self.f)(Attempted::Response(res), self.semantics))
    }

    fn classify_error(self, error: &E, phase: DeliveryPhase) -> Classification {
        (self.f)(Attempted::Error(error, phase), self.semantics)
    }
}

impl<F> fmt::Debug for ClassifyFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifyFn").finish_non_exhaustive()
    }
}

impl<F> fmt::Debug for FnClassifier<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnClassifier")
            .field("semantics", &self.semantics)
            .finish_non_exhaustive()
    }
}
