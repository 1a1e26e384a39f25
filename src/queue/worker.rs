//! What the workers over the queue share: the ledger's reconciler and the differences'
//! repairer claim a batch, work each item within the claim's lease, and put back what failed
//! after a backoff; both, and the relay, check their settings the same way and pause the same
//! way between rounds.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::ConfigError;

/// Whether a piece of work that may take `timeout` still ends within the lease of a claim made
/// at `claimed_at`: work that could outlast the lease would race the next claimer.
pub(crate) fn time_left(claimed_at: Instant, timeout: Duration, lease: Duration) -> bool {
    claimed_at.elapsed().saturating_add(timeout) < lease
}

/// The wait before the try that follows `tries` failed ones.
pub(crate) fn backoff_wait(backoff: &Backoff, tries: u32) -> Duration {
    backoff
        .iter()
        .nth(usize::try_from(tries).unwrap_or(usize::MAX))
        .unwrap_or(Duration::ZERO)
}

/// Waits before a worker's next round: not at all after a busy one (a full batch), else
/// `poll`. Returns false once `stop` has completed.
pub(crate) async fn pause<F: Future<Output = ()>>(
    stop: Pin<&mut F>,
    busy: bool,
    poll: Duration,
) -> bool {
    let wait = if busy { Duration::ZERO } else { poll };
    tokio::select! {
        _ = stop => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

/// The settings every worker that claims has, and their names in its errors.
pub(crate) struct Claiming {
    /// Items claimed per round; at least 1.
    pub(crate) batch: (&'static str, usize),
    /// How long a claim holds them; greater than zero, at most
    /// [`MAX_DURATION`](crate::MAX_DURATION), and longer than the work's timeout (if any).
    pub(crate) lease: (&'static str, Duration),
    /// How long the work on one item may take, if it has a timeout: greater than zero, at most
    /// `MAX_DURATION`; and what the lease's error calls it.
    pub(crate) timeout: Option<(&'static str, Duration, &'static str)>,
}

impl Claiming {
    /// The first setting that is out of range, as a [`ConfigError`] naming it.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let (batch_name, batch) = self.batch;
        if batch == 0 {
            return Err(ConfigError::new(batch_name, "must be at least 1"));
        }
        let (lease_name, lease) = self.lease;
        ConfigError::positive_at_most_max(lease_name, lease)?;
        if let Some((name, timeout, why)) = self.timeout {
            ConfigError::positive_at_most_max(name, timeout)?;
            if lease <= timeout {
                return Err(ConfigError::new(lease_name, why));
            }
        }
        Ok(())
    }
}
