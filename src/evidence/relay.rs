//! What an outbox relay reports, as plain data: the records know the relay's rounds and the
//! outbox's stats without knowing the outbox.

use std::time::Duration;

/// How an outbox stands: what an operator watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Events not yet published (quarantined ones excluded).
    pub backlog: u64,
    /// How long the oldest of them has waited; `None` without any.
    pub oldest: Option<Duration>,
    /// Events quarantined: their publish failed past the limit.
    pub quarantined: u64,
    /// How far the slot of the slowest [log relay][crate::outbox::LogRelay] reading this
    /// outbox is behind the end of PostgreSQL's write-ahead log, in bytes: the log the server
    /// keeps for it. `None` without a log relay's slot.
    #[cfg_attr(
        not(feature = "postgres-log"),
        doc = crate::docs::links::to_features!("crate::outbox::LogRelay")
    )]
    pub log_lag_bytes: Option<u64>,
    /// How long ago that slot's relay last recorded that it had confirmed the log (at its
    /// heartbeat, while the broker takes what it sends): it grows while the relay is down or
    /// the broker refuses. `None` without a log relay's slot.
    pub log_lag: Option<Duration>,
}

/// What one round of a relay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayRound {
    /// Events claimed.
    pub claimed: usize,
    /// Events published and marked.
    pub published: usize,
    /// Publishes that failed (their events wait and go again, or were quarantined).
    pub failed: usize,
    /// Events quarantined in this round.
    pub quarantined: usize,
    /// Events published whose mark came too late: another relay had claimed them meanwhile
    /// (they went out more than once, as the outbox allows).
    pub stale: usize,
    /// Published events swept after their [retention][crate::outbox::RelayBuilder::retention].
    #[cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::outbox::RelayBuilder::retention",
        )
    )]
    pub swept: u64,
}

/// What a relay reports to its [recorder][crate::outbox::RelayBuilder::recorder].
#[cfg_attr(
    not(feature = "durable"),
    doc = crate::docs::links::to_features!(
        "crate::outbox::RelayBuilder::recorder",
    )
)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// The round, if it claimed or swept events.
    pub round: Option<RelayRound>,
    /// The outbox's stats, read after the round, when they were due.
    pub stats: Option<OutboxStats>,
}
