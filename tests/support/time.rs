//! Durations, written short.

use std::time::Duration;

pub(crate) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(crate) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
