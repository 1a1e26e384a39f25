//! What each role's maintenance runs: one function per role lists its chores. When a component
//! hands out a new chore (a table's retention, the recovery of abandoned records), it is added
//! in its role's function here, and its table's bound in [`bounds`].

use std::sync::Arc;
use std::time::Duration;

use surely::ledger::{Ledger, PostgresLedger};
use surely::maintenance::{
    Batch, BoxFuture, Chore, Maintenance, MaintenanceHandle, PostgresLeases,
};
use surely::outbox::{OutboxStore, PostgresOutbox};
use surely::server::idempotency::IdempotencyLayer;

use crate::world::World;
use crate::{BoxError, LEASE};

/// The variables that carry the driver's settings to the roles.
const ENV_EVERY: &str = "SOAK_EVERY_MS";
const ENV_RETENTION: &str = "SOAK_RETENTION_MS";
const ENV_KEEP: &str = "SOAK_KEEP_EXPIRED_MS";
const ENV_BATCH: &str = "SOAK_BATCH";
const ENV_DUTY: &str = "SOAK_DUTY";

/// Whether the order service recovers abandoned `PROCESSING` records: it does, with the crash
/// harness's rounds (`IdempotencyLayer::recover_abandoned` every 250 ms, its hook asking the
/// payment provider; `examples/crash/order.rs`), so the invariant on them is checked.
pub(crate) const ORDER_RECOVERS_ABANDONED: bool = true;

/// The maintenance settings the driver hands its roles.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// How often each chore runs (and a round's limit).
    pub(crate) every: Duration,
    /// Each table's retention: completed idempotency records, published events, settled
    /// ledger entries.
    pub(crate) retention: Duration,
    /// The idempotency records' safety window past their retention (`410 Gone` meanwhile).
    pub(crate) keep_expired_for: Duration,
    /// The rows a batch does at most.
    pub(crate) batch_size: usize,
    /// The share of a round's time its batches work.
    pub(crate) duty: f64,
}

impl Settings {
    /// The settings for a retention: the safety window half of it, a round every fifth of it
    /// (at least a second); the batches' size and duty as given (`--batch`, `--duty`).
    pub(crate) fn new(retention: Duration, batch_size: usize, duty: f64) -> Settings {
        Settings {
            every: (retention / 5).max(Duration::from_secs(1)),
            retention,
            keep_expired_for: retention / 2,
            batch_size,
            duty,
        }
    }

    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let ms = |d: Duration| d.as_millis().to_string();
        vec![
            (ENV_EVERY, ms(self.every)),
            (ENV_RETENTION, ms(self.retention)),
            (ENV_KEEP, ms(self.keep_expired_for)),
            (ENV_BATCH, self.batch_size.to_string()),
            (ENV_DUTY, self.duty.to_string()),
        ]
    }

    pub(crate) fn from_env() -> Result<Settings, BoxError> {
        fn var<T: std::str::FromStr>(name: &str) -> Result<T, BoxError>
        where
            T::Err: std::fmt::Display,
        {
            let v = std::env::var(name).map_err(|_| format!("{name} is not set"))?;
            Ok(v.parse().map_err(|e| format!("{name}={v}: {e}"))?)
        }
        Ok(Settings {
            every: Duration::from_millis(var(ENV_EVERY)?),
            retention: Duration::from_millis(var(ENV_RETENTION)?),
            keep_expired_for: Duration::from_millis(var(ENV_KEEP)?),
            batch_size: var(ENV_BATCH)?,
            duty: var(ENV_DUTY)?,
        })
    }

    /// How long a row of a swept table may live at most: its retention, the safety window,
    /// and two rounds (one that just missed it, one that deletes it).
    fn horizon(&self, safety: Duration) -> Duration {
        self.retention + safety + self.every * 2
    }
}

/// The order service's chores: the idempotency records' sweep. Its rounds over abandoned
/// records run in the order service itself, with its hook ([`ORDER_RECOVERS_ABANDONED`]).
pub(crate) fn order(world: &World, s: &Settings) -> Result<Vec<Arc<dyn Chore>>, BoxError> {
    // The sweep needs the store alone: a layer of its own over the order service's store.
    let layer = IdempotencyLayer::builder(world.store()?)
        .lease(LEASE)
        .build()?;
    let sweep = layer
        .sweeper(s.keep_expired_for)?
        .named(format!("idempotency sweep {}", world.t("idem")));
    Ok(vec![Arc::new(sweep)])
}

/// The relay's chores: the published events' retention.
///
/// The crate's [`OutboxSweeper`](surely::outbox::OutboxSweeper) refuses a retention under its
/// one-hour safety window, and a soak compresses months into minutes with retentions of
/// seconds: [`OutboxSweep`] runs the same bounded statement (`OutboxStore::sweep_batch`) as a
/// chore of the soak's own.
pub(crate) fn relay(world: &World, s: &Settings) -> Result<Vec<Arc<dyn Chore>>, BoxError> {
    Ok(vec![Arc::new(OutboxSweep {
        name: format!("outbox {}", world.t("outbox")),
        outbox: world.outbox()?,
        retention: s.retention,
    })])
}

/// The consumer's chores: the inbox's retention, past the broker's redelivery window (a
/// delivery whose acknowledgement was lost comes again within an ack wait or two; three are
/// allowed).
pub(crate) fn consumer(world: &World, s: &Settings) -> Result<Vec<Arc<dyn Chore>>, BoxError> {
    let inbox = world.inbox()?;
    Ok(vec![Arc::new(
        inbox.sweeper(s.retention, crate::ACK_WAIT * 3)?,
    )])
}

/// The reconciler's chores: the settled ledger entries' retention, through the ledger's
/// bounded statement (`Ledger::sweep_batch`) as for the outbox: the crate's
/// [`LedgerSweeper`](surely::ledger::LedgerSweeper) keeps an hour at least.
pub(crate) fn reconciler(world: &World, s: &Settings) -> Result<Vec<Arc<dyn Chore>>, BoxError> {
    Ok(vec![Arc::new(LedgerSweep {
        name: format!("ledger {}", world.t("ledger")),
        ledger: world.ledger()?,
        retention: s.retention,
    })])
}

/// A table with a retention, and the bound on its rows.
pub(crate) struct Bound {
    /// The table's suffix in the run (`idem`).
    pub(crate) table: &'static str,
    /// The share of the calls that write a row to it.
    pub(crate) share: f64,
    /// How long a row lives at most.
    pub(crate) horizon: Duration,
    /// Whether the broker's outages add to it (rows wait for the broker).
    pub(crate) waits_for_broker: bool,
}

/// The tables the roles above keep bounded. A table with a new chore gets its line here.
pub(crate) fn bounds(s: &Settings) -> Vec<Bound> {
    vec![
        // Every keyed call (70 %) leaves one record.
        Bound {
            table: "idem",
            share: 0.7,
            horizon: s.horizon(s.keep_expired_for),
            waits_for_broker: false,
        },
        // Every order one event, published then kept for the retention.
        Bound {
            table: "outbox",
            share: 1.0,
            horizon: s.horizon(Duration::ZERO),
            waits_for_broker: true,
        },
        // Every call journals an entry, forgotten when it ends definitively; the unknown ones
        // are settled and kept for the retention: the call rate bounds it from above.
        Bound {
            table: "ledger",
            share: 1.0,
            horizon: s.horizon(Duration::ZERO),
            waits_for_broker: false,
        },
        // Every order's event, applied once by the consumer, kept for the retention.
        Bound {
            table: "inbox",
            share: 1.0,
            horizon: s.horizon(Duration::ZERO),
            waits_for_broker: true,
        },
    ]
}

/// Starts a role's maintenance (leases in the run's own table), if it has chores.
pub(crate) fn start(
    world: &World,
    s: &Settings,
    chores: Vec<Arc<dyn Chore>>,
) -> Result<Option<MaintenanceHandle>, BoxError> {
    if chores.is_empty() {
        return Ok(None);
    }
    let leases = PostgresLeases::new(world.pool.clone()).with_table(&world.t("leases"))?;
    let mut builder = Maintenance::builder()
        .leases(leases)
        .every(s.every)
        .round_time(s.every)
        .batch_size(s.batch_size)
        .duty(s.duty);
    for chore in chores {
        builder = builder.shared_chore(chore);
    }
    Ok(Some(builder.build()?.spawn()))
}

/// The outbox's published events past the retention, a bounded batch at a time.
struct OutboxSweep {
    name: String,
    outbox: PostgresOutbox,
    retention: Duration,
}

impl Chore for OutboxSweep {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, surely::classify::BoxError>> {
        Box::pin(async move {
            let deleted = self.outbox.sweep_batch(self.retention, limit).await?;
            Ok(Batch::new(deleted, deleted >= limit as u64))
        })
    }
}

/// The ledger's settled entries past the retention, a bounded batch at a time.
struct LedgerSweep {
    name: String,
    ledger: PostgresLedger,
    retention: Duration,
}

impl Chore for LedgerSweep {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, surely::classify::BoxError>> {
        Box::pin(async move {
            let deleted = self.ledger.sweep_batch(self.retention, limit).await?;
            Ok(Batch::new(deleted, deleted >= limit as u64))
        })
    }
}
