//! Shared helpers for the retry-owner tests: a counter, request builders, and a hyper server on
//! 127.0.0.1.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;

/// A shared counter of calls.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counter(Arc<AtomicUsize>);

impl Counter {
    pub(crate) fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A retry layer with no backoff and no budget: 3 attempts, marking ownership or not.
pub(crate) fn retry(mark_owner: bool) -> RetryLayer {
    RetryLayer::builder()
        .backoff(Backoff::none())
        .no_budget()
        .mark_owner(mark_owner)
        .build()
        .unwrap()
}

pub(crate) use crate::support::serve::serve;
