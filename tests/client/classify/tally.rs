//! The call outcome over several attempts (`surely::docs::outcomes`, the paragraph under the
//! attempt table).

use proptest::prelude::*;
use surely::classify::AttemptClass::{self, Conflict, Final, MaybeCommitted, Rejected, Success};
use surely::classify::OutcomeTally;
use surely::Outcome::{self, Failed, Succeeded, Unknown};
use surely::Semantics;

use super::support::{outcome_of, SEMANTICS};

const ALL_CLASSES: [AttemptClass; 5] = [Success, Final, Conflict, Rejected, MaybeCommitted];

#[test]
fn no_attempt_no_outcome() {
    for semantics in SEMANTICS {
        assert_eq!(OutcomeTally::new(semantics).outcome(), None);
    }
}

#[test]
fn keyed_post_lost_reply_then_refused_retries_is_unknown_until_a_success() {
    let mut tally = OutcomeTally::new(Semantics::Keyed);
    tally.observe(MaybeCommitted);
    assert_eq!(tally.outcome(), Some(Unknown));
    tally.observe(Rejected);
    tally.observe(Rejected);
    assert_eq!(tally.outcome(), Some(Unknown), "refusals settle nothing");
    tally.observe(Success);
    assert_eq!(
        tally.outcome(),
        Some(Succeeded),
        "the stored result came back"
    );
    // Nothing after a success undoes it.
    for class in ALL_CLASSES {
        tally.observe(class);
        assert_eq!(tally.outcome(), Some(Succeeded));
    }
}

#[test]
fn safe_get_that_may_have_committed_failed() {
    assert_eq!(outcome_of(Semantics::Safe, &[MaybeCommitted]), Some(Failed));
    assert_eq!(
        outcome_of(Semantics::Safe, &[MaybeCommitted, Rejected, MaybeCommitted]),
        Some(Failed)
    );
}

#[test]
fn non_idempotent_rejected_twice_failed() {
    assert_eq!(
        outcome_of(Semantics::NonIdempotent, &[Rejected, Rejected]),
        Some(Failed)
    );
}

#[test]
fn idempotent_lost_reply_then_final_stays_unknown() {
    // A DELETE whose reply was lost, retried, gets 404: maybe the first one deleted it.
    assert_eq!(
        outcome_of(Semantics::Idempotent, &[MaybeCommitted, Final]),
        Some(Unknown)
    );
    assert_eq!(
        outcome_of(Semantics::Idempotent, &[MaybeCommitted, Conflict]),
        Some(Unknown)
    );
    assert_eq!(
        outcome_of(Semantics::NonIdempotent, &[MaybeCommitted, Final]),
        Some(Unknown)
    );
}

#[test]
fn keyed_lost_reply_then_final_failed() {
    // The server answers for the key: its final answer covers the first attempt too.
    assert_eq!(
        outcome_of(Semantics::Keyed, &[MaybeCommitted, Final]),
        Some(Failed)
    );
    assert_eq!(
        outcome_of(Semantics::Keyed, &[MaybeCommitted, Rejected, Final]),
        Some(Failed)
    );
    // ... but a later lost reply reopens the question.
    assert_eq!(
        outcome_of(Semantics::Keyed, &[MaybeCommitted, Final, MaybeCommitted]),
        Some(Unknown)
    );
}

#[test]
fn confirmed_failures_fail_for_every_semantics() {
    for semantics in SEMANTICS {
        for seq in [
            &[Rejected][..],
            &[Final],
            &[Conflict],
            &[Rejected, Rejected, Final],
            &[Rejected, Conflict],
        ] {
            assert_eq!(
                outcome_of(semantics, seq),
                Some(Failed),
                "{semantics:?} {seq:?}"
            );
        }
    }
}

#[test]
fn a_success_after_anything_succeeds() {
    for semantics in SEMANTICS {
        for first in ALL_CLASSES {
            assert_eq!(
                outcome_of(semantics, &[first, Success]),
                Some(Succeeded),
                "{semantics:?} {first:?}"
            );
        }
    }
}

#[test]
fn observing_the_same_class_twice_changes_nothing() {
    for semantics in SEMANTICS {
        for prefix in ALL_CLASSES {
            for class in ALL_CLASSES {
                let once = outcome_of(semantics, &[prefix, class]);
                let twice = outcome_of(semantics, &[prefix, class, class]);
                assert_eq!(once, twice, "{semantics:?} {prefix:?} {class:?}");
            }
        }
    }
}

fn class() -> impl Strategy<Value = AttemptClass> {
    prop::sample::select(ALL_CLASSES.to_vec())
}

fn semantics() -> impl Strategy<Value = Semantics> {
    prop::sample::select(SEMANTICS.to_vec())
}

/// That paragraph written as a reference model over the whole history.
fn model(semantics: Semantics, classes: &[AttemptClass]) -> Option<Outcome> {
    if classes.is_empty() {
        return None;
    }
    if classes.contains(&Success) {
        return Some(Succeeded);
    }
    if semantics == Semantics::Safe {
        return Some(Failed);
    }
    let last_maybe = classes.iter().rposition(|&c| c == MaybeCommitted);
    let Some(last_maybe) = last_maybe else {
        return Some(Failed);
    };
    // Only a keyed request's later final answer settles a lost reply.
    let settled = semantics == Semantics::Keyed
        && classes[last_maybe..]
            .iter()
            .any(|&c| matches!(c, Final | Conflict));
    Some(if settled { Failed } else { Unknown })
}

proptest! {
    #[test]
    fn succeeded_iff_any_success(s in semantics(), seq in prop::collection::vec(class(), 1..16)) {
        let outcome = outcome_of(s, &seq);
        prop_assert_eq!(outcome == Some(Succeeded), seq.contains(&Success));
    }

    #[test]
    fn safe_is_never_unknown(seq in prop::collection::vec(class(), 0..16)) {
        prop_assert_ne!(outcome_of(Semantics::Safe, &seq), Some(Unknown));
    }

    #[test]
    fn unknown_only_after_a_maybe_committed(s in semantics(), seq in prop::collection::vec(class(), 0..16)) {
        if outcome_of(s, &seq) == Some(Unknown) {
            prop_assert!(seq.contains(&MaybeCommitted));
        }
    }

    #[test]
    fn some_outcome_iff_some_attempt(s in semantics(), seq in prop::collection::vec(class(), 0..16)) {
        prop_assert_eq!(outcome_of(s, &seq).is_some(), !seq.is_empty());
    }

    #[test]
    fn duplicate_observations_are_idempotent(s in semantics(), seq in prop::collection::vec(class(), 0..16)) {
        let doubled: Vec<_> = seq.iter().flat_map(|&c| [c, c]).collect();
        prop_assert_eq!(outcome_of(s, &seq), outcome_of(s, &doubled));
    }

    #[test]
    fn matches_the_design_model(s in semantics(), seq in prop::collection::vec(class(), 0..16)) {
        prop_assert_eq!(outcome_of(s, &seq), model(s, &seq), "{:?} {:?}", s, seq);
    }
}
