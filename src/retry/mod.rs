//! Retries that cannot make things worse: capped exponential backoff with jitter, so that
//! clients that failed together do not come back together.
//!
//! This module holds the backoff schedule, [`backoff::Backoff`]. The retry layer, which decides
//! whether an attempt may be repeated at all and spends a retry budget to do so, is coming.

pub mod backoff;
