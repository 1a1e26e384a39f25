//! The story's settings and one helper, shared by the crash harness and the soak (which
//! includes the harness's roles, and these with them).

use std::time::Duration;

/// How long an order service owns a key's record before a request may take it over; the owner
/// renews it while its handler runs, for at most [`RENEW_FOR`].
pub(crate) const LEASE: Duration = Duration::from_secs(1);
pub(crate) const RENEW_FOR: Duration = Duration::from_secs(10);
/// How often the order service runs a round over abandoned records
/// (`IdempotencyLayer::recover_abandoned`): records whose owner died with its client.
pub(crate) const ABANDONED_ROUND: Duration = Duration::from_millis(250);
/// The abandoned-record hook's limit (its question to the payment provider, and a margin).
pub(crate) const ABANDONED_TIMEOUT: Duration = Duration::from_millis(500);
/// The client's budget per call.
pub(crate) const CALL_DEADLINE: Duration = Duration::from_secs(4);
/// How long after a call's entry the reconciler may say "it did not happen" of an order it
/// does not find: past the call's deadline and a margin, no handler still runs for it.
pub(crate) const GRACE: Duration = Duration::from_secs(6);
/// How long a relay's claim holds its events.
pub(crate) const RELAY_LEASE: Duration = Duration::from_secs(1);
/// How long JetStream waits for the consumer's acknowledgement before it delivers again.
pub(crate) const ACK_WAIT: Duration = Duration::from_secs(2);

/// An error and its sources, on one line.
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}
