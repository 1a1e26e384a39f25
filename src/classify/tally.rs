use super::{AttemptClass, Outcome};
use crate::Semantics;

/// Folds the classes of a call's attempts into the call's [`Outcome`].
///
/// The rules (the paragraph under the attempt table in
/// [`docs::outcomes`](crate::docs::outcomes)):
/// * one successful attempt makes the call [`Succeeded`](Outcome::Succeeded);
/// * a maybe-committed attempt of a request with effects makes it [`Unknown`](Outcome::Unknown),
///   and only a later success settles that, or, for a [`Keyed`](Semantics::Keyed) request, a later
///   final answer (the server answers for the key, so that answer covers the earlier attempt too);
/// * otherwise the call [`Failed`](Outcome::Failed): every attempt was confirmed not to have taken
///   effect, or the request is [`Safe`](Semantics::Safe).
///
/// Observing the same attempt twice does not change the result, so two layers may both report it.
///
/// ```
/// use surely::classify::{AttemptClass, OutcomeTally};
/// use surely::Outcome;
/// use surely::Semantics;
///
/// // A keyed POST: the first reply was lost, every retry was refused.
/// let mut tally = OutcomeTally::new(Semantics::Keyed);
/// tally.observe(AttemptClass::MaybeCommitted);
/// tally.observe(AttemptClass::Rejected);
/// tally.observe(AttemptClass::Rejected);
/// assert_eq!(tally.outcome(), Some(Outcome::Unknown));
///
/// // The same POST where a retry with the same key got the stored result.
/// tally.observe(AttemptClass::Success);
/// assert_eq!(tally.outcome(), Some(Outcome::Succeeded));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutcomeTally {
    semantics: Semantics,
    outcome: Option<Outcome>,
}

impl OutcomeTally {
    /// A tally with no attempts, for a request with these semantics.
    pub fn new(semantics: Semantics) -> Self {
        OutcomeTally {
            semantics,
            outcome: None,
        }
    }

    /// The semantics the tally was made for.
    pub fn semantics(&self) -> Semantics {
        self.semantics
    }

    /// Adds one attempt's class.
    pub fn observe(&mut self, class: AttemptClass) {
        let semantics = self.semantics;
        self.outcome = Some(match (self.outcome, class) {
            (Some(Outcome::Succeeded), _) | (_, AttemptClass::Success) => Outcome::Succeeded,
            (Some(Outcome::Unknown), AttemptClass::Final | AttemptClass::Conflict)
                if semantics != Semantics::Keyed =>
            {
                Outcome::Unknown
            }
            (_, AttemptClass::Final | AttemptClass::Conflict) => Outcome::Failed,
            (Some(Outcome::Unknown), AttemptClass::Rejected) => Outcome::Unknown,
            (_, AttemptClass::Rejected) => Outcome::Failed,
            (_, AttemptClass::MaybeCommitted) if semantics.is_safe() => Outcome::Failed,
            (_, AttemptClass::MaybeCommitted) => Outcome::Unknown,
        });
    }

    /// The call's outcome so far; `None` before any attempt was observed.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }
}
