//! Budgets lent by retry layers to the hedges inside them.
//!
//! A retry layer registers its budget here once, when it is built, and lends its id to the
//! attempts it sends (through the call context, `context::lend`); a hedge layer inside that
//! was given no budget of its own finds the budget by that id, and pays its hedges from it. So
//! a hand-built retry layer over a hedge layer spends one budget, as
//! [`client()`](crate::client()) always did. The registry holds the budgets weakly: a budget
//! goes when its last layer does, and its place in the registry at the next registration, so
//! that the registry holds at most the live retry layers' budgets, one each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::RetryBudget;

/// The next id; 0 means "no lender".
static NEXT: AtomicU64 = AtomicU64::new(1);

/// The budgets registered, by id.
static LENDERS: Mutex<Vec<(u64, Weak<dyn RetryBudget>)>> = Mutex::new(Vec::new());

/// Registers `budget`, to be lent by its id.
pub(crate) fn register(budget: &Arc<dyn RetryBudget>) -> u64 {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut lenders = LENDERS.lock().unwrap_or_else(PoisonError::into_inner);
    lenders.retain(|(_, b)| b.strong_count() > 0);
    lenders.push((id, Arc::downgrade(budget)));
    id
}

/// The budget registered as `id`, while a layer that lends it lives.
pub(crate) fn lender(id: u64) -> Option<Arc<dyn RetryBudget>> {
    if id == 0 {
        return None;
    }
    let lenders = LENDERS.lock().unwrap_or_else(PoisonError::into_inner);
    lenders
        .iter()
        .find(|(i, _)| *i == id)
        .and_then(|(_, b)| b.upgrade())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::TokenBucket;

    #[test]
    fn a_lender_is_found_by_its_id_while_it_lives() {
        let budget: Arc<dyn RetryBudget> = Arc::new(TokenBucket::new());
        let id = register(&budget);
        assert!(lender(id).is_some_and(|b| Arc::ptr_eq(&b, &budget)));
        assert!(lender(0).is_none());
        drop(budget);
        assert!(lender(id).is_none());
    }

    /// The registry holds the lenders alive, not every one ever registered: a million retry
    /// layers built and dropped leave it as small as the live ones (other tests' among them).
    #[test]
    fn a_million_lenders_come_and_go_and_the_registry_stays_small() {
        for _ in 0..1_000_000 {
            let budget: Arc<dyn RetryBudget> = Arc::new(TokenBucket::new());
            register(&budget);
        }
        let held = LENDERS.lock().unwrap_or_else(PoisonError::into_inner).len();
        assert!(held <= 1_000, "{held} lenders held");
    }
}
