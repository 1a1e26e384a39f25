//! The background work a deployment needs, started with one line: every table the crate writes
//! kept bounded, and the records whose owner died recovered without waiting for a request
//! ([`docs::operators`](crate::docs::operators), "What runs in the background").
//!
//! A [`Maintenance`] is fed [chores](Chore): the sweeps and recoveries that the components
//! hand out (the idempotency layer's, the inbox's, the outbox's, the ledger's, the
//! reconciliation differences' and the admin's audit log's). It runs each chore every
//! [`every`](MaintenanceBuilder::every), in batches of at most
//! [`batch_size`](MaintenanceBuilder::batch_size) rows, each batch within
//! [`batch_time`](MaintenanceBuilder::batch_time) and a chore's round within
//! [`round_time`](MaintenanceBuilder::round_time), so that a backlog is worked down a bounded
//! step at a time and never holds a lock or a connection for long. Of the instances that run
//! the same chores, one runs each per round: the chore's [lease](Leases) decides which
//! ([`PostgresLeases`] shares them through the database; [`LocalLeases`], the default, is for
//! one process).
//!
//! A round that fails (the database is down, an archive refused a batch) keeps what it could
//! not do for the next round and says why: a [report](crate::record::MaintenanceReport)
//! to the [recorder](MaintenanceBuilder::recorder) (a warning through
//! [`TracingRecorder`](crate::record::TracingRecorder), a count by outcome through
//! `OtelRecorder`), and the last report of each chore on the [handle](MaintenanceHandle). A chore
//! that panics is reported as failed; the task goes on.
//!
//! ```
//! use std::time::Duration;
//! use surely::maintenance::{Batch, BoxFuture, Chore, Maintenance};
//!
//! # struct Sweep;
//! # impl Chore for Sweep {
//! #     fn name(&self) -> &str { "sessions" }
//! #     fn run(&self, _: usize) -> BoxFuture<'_, Result<Batch, surely::classify::BoxError>> {
//! #         Box::pin(async { Ok(Batch::new(0, false)) })
//! #     }
//! # }
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), surely::ConfigError> {
//! let maintenance = Maintenance::builder()
//!     .chore(Sweep)
//!     .every(Duration::from_secs(60))
//!     .build()?
//!     .spawn();
//! // ... serve ...
//! let reports = maintenance.run_now().await; // a round now, and how each chore went
//! assert_eq!(reports[0].chore, "sessions");
//! maintenance.shutdown().await;
//! # Ok(()) }
//! ```
#![cfg_attr(
    not(all(any(feature = "server", feature = "durable"), feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "`PostgresLeases`",
    )
)]

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::evidence::{MaintenanceOutcome, MaintenanceReport, Recorder};
use crate::ConfigError;

mod chore;
mod lease;

pub use self::chore::{Batch, BoxFuture, Chore};
#[cfg(feature = "postgres")]
pub use self::lease::PostgresLeases;
#[cfg(feature = "postgres")]
pub(crate) use self::lease::POSTGRES_COMPONENT;
pub use self::lease::{Leases, LocalLeases};

/// How often each chore runs, by default.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(60);
/// The most rows a batch may do, by default.
pub const DEFAULT_BATCH_SIZE: usize = 1000;
/// How long a batch may take, by default.
pub const DEFAULT_BATCH_TIME: Duration = Duration::from_secs(10);
/// The share of a round's time its batches may take, by default: a batch rests as long as it
/// worked.
pub const DEFAULT_DUTY: f64 = 0.5;
/// How long a chore's round may take, by default.
pub const DEFAULT_ROUND_TIME: Duration = Duration::from_secs(30);

/// The shortest retention the sweeps of settled rows accept (the outbox's published events,
/// the ledger's settled entries, the repaired and resolved reconciliation differences, the
/// audit log's finished actions): one hour. What has just settled stays that long for an
/// operator to see: the entry an on-call settled by hand a minute ago, the event whose
/// consumer says it never arrived, the action the audit page should show. A retention below it
/// is a [`ConfigError`] naming both. The inbox's safety window is the broker's redelivery
/// window instead, which the caller states
/// ([`PostgresInbox::sweeper`][crate::inbox::PostgresInbox::sweeper]).
#[cfg_attr(
    not(all(feature = "durable", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "crate::inbox::PostgresInbox::sweeper",
    )
)]
pub const MIN_RETENTION: Duration = Duration::from_secs(3600);

/// `retention`, if it is at most [`MAX_DURATION`](crate::MAX_DURATION) and at least
/// [`MIN_RETENTION`]; else the error that names `setting` and both values.
#[cfg_attr(not(feature = "durable"), allow(dead_code))]
pub(crate) fn check_retention(
    setting: &'static str,
    retention: Duration,
) -> Result<Duration, ConfigError> {
    ConfigError::at_most_max(setting, retention)?;
    if retention < MIN_RETENTION {
        return Err(ConfigError::new(
            setting,
            format!(
                "{retention:?} is shorter than the safety window ({MIN_RETENTION:?}): what just \
                 settled must stay for an operator to see"
            ),
        ));
    }
    Ok(retention)
}

/// What a sweep's batch that deleted `done` of at most `limit` rows says: more while it was
/// full.
#[cfg_attr(not(feature = "durable"), allow(dead_code))]
pub(crate) fn swept(done: u64, limit: usize) -> Batch {
    Batch::new(done, limit > 0 && done >= limit as u64)
}

/// The name of a chore over a store in this process's memory (`"inbox memory 4242-..."`):
/// its own to this process, so that leases shared with other instances never keep a process
/// from sweeping its own memory.
#[cfg_attr(not(feature = "durable"), allow(dead_code))]
pub(crate) fn memory_chore_name(component: &str) -> String {
    format!("{component} memory {}", default_holder())
}

/// The background work of a deployment: its chores, how often and in what steps they run, and
/// who runs them. See the [module docs](self).
pub struct Maintenance {
    chores: Vec<Arc<dyn Chore>>,
    settings: Settings,
}

#[derive(Clone)]
struct Settings {
    leases: Arc<dyn Leases>,
    holder: Arc<str>,
    every: Duration,
    batch_size: usize,
    batch_time: Duration,
    round_time: Duration,
    duty: f64,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

impl fmt::Debug for Maintenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Maintenance")
            .field(
                "chores",
                &self.chores.iter().map(|c| c.name()).collect::<Vec<_>>(),
            )
            .field("holder", &self.settings.holder)
            .field("every", &self.settings.every)
            .field("batch_size", &self.settings.batch_size)
            .field("batch_time", &self.settings.batch_time)
            .field("round_time", &self.settings.round_time)
            .field("duty", &self.settings.duty)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Maintenance`]: [`Maintenance::builder`].
#[must_use]
pub struct MaintenanceBuilder {
    chores: Vec<Arc<dyn Chore>>,
    settings: Settings,
}

impl fmt::Debug for MaintenanceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaintenanceBuilder")
            .field(
                "chores",
                &self.chores.iter().map(|c| c.name()).collect::<Vec<_>>(),
            )
            .field("holder", &self.settings.holder)
            .field("every", &self.settings.every)
            .finish_non_exhaustive()
    }
}

impl Maintenance {
    /// A maintenance with no chore yet, [`LocalLeases`], and the defaults: every
    /// [`DEFAULT_EVERY`], batches of [`DEFAULT_BATCH_SIZE`] within [`DEFAULT_BATCH_TIME`], a
    /// chore's round within [`DEFAULT_ROUND_TIME`], and a holder name made of the process id and
    /// a random number.
    pub fn builder() -> MaintenanceBuilder {
        MaintenanceBuilder {
            chores: Vec::new(),
            settings: Settings {
                leases: Arc::new(LocalLeases::new()),
                holder: default_holder().into(),
                every: DEFAULT_EVERY,
                batch_size: DEFAULT_BATCH_SIZE,
                batch_time: DEFAULT_BATCH_TIME,
                round_time: DEFAULT_ROUND_TIME,
                duty: DEFAULT_DUTY,
                recorder: None,
            },
        }
    }

    /// The task, to run on an executor, and its handle. The task runs a round of every chore at
    /// once, then one every [`every`](MaintenanceBuilder::every), until
    /// [`shutdown`](MaintenanceHandle::shutdown) or until every handle is dropped.
    pub fn start(self) -> (impl Future<Output = ()> + Send + 'static, MaintenanceHandle) {
        let (tx, rx) = mpsc::channel(8);
        let last = Arc::new(Mutex::new(Vec::new()));
        let task = run(self.chores, self.settings, rx, Arc::clone(&last));
        (task, MaintenanceHandle { tx, last })
    }

    /// Starts the task on the current tokio runtime, and returns its handle.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`tokio::spawn`] does.
    pub fn spawn(self) -> MaintenanceHandle {
        let (task, handle) = self.start();
        tokio::spawn(task);
        handle
    }
}

impl MaintenanceBuilder {
    /// Adds a chore. Each chore's [name](Chore::name) must be its own.
    pub fn chore(mut self, chore: impl Chore) -> Self {
        self.chores.push(Arc::new(chore));
        self
    }

    /// Adds a chore already shared.
    pub fn shared_chore(mut self, chore: Arc<dyn Chore>) -> Self {
        self.chores.push(chore);
        self
    }

    /// Who decides which instance runs a chore this round (default [`LocalLeases`]: this
    /// process alone).
    pub fn leases(mut self, leases: impl Leases) -> Self {
        self.settings.leases = Arc::new(leases);
        self
    }

    /// This instance's name as a lease holder (default: the process id and a random number).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.settings.holder = holder.into().into();
        self
    }

    /// How often each chore runs (default [`DEFAULT_EVERY`]); also how long an instance holds
    /// a chore's lease, so that another instance takes the chore over one round after this one
    /// stops.
    pub fn every(mut self, every: Duration) -> Self {
        self.settings.every = every;
        self
    }

    /// The most rows (or records) a batch may do (default [`DEFAULT_BATCH_SIZE`]).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.settings.batch_size = batch_size;
        self
    }

    /// How long a batch may take (default [`DEFAULT_BATCH_TIME`]): a batch still running then
    /// is given up (what it did not do stays for the next round) and reported as failed.
    pub fn batch_time(mut self, batch_time: Duration) -> Self {
        self.settings.batch_time = batch_time;
        self
    }

    /// How long a chore's round may take (default [`DEFAULT_ROUND_TIME`]): no new batch starts
    /// after it, and the rest waits for the next round.
    pub fn round_time(mut self, round_time: Duration) -> Self {
        self.settings.round_time = round_time;
        self
    }

    /// The share of a round's time that its batches may work (default [`DEFAULT_DUTY`], a
    /// half): after a batch that took `t`, the next starts `t x (1 / duty - 1)` later. A
    /// backlog is then worked down at a pace that leaves the database to the online path most
    /// of the time (a heavier batch rests longer), and a round's time bounds it all the same.
    /// `1.0` runs batches back to back.
    pub fn duty(mut self, duty: f64) -> Self {
        self.settings.duty = duty;
        self
    }

    /// Where each chore's [`MaintenanceReport`] goes ([`Recorder::record_maintenance`]).
    pub fn recorder(mut self, recorder: impl Recorder + Send + Sync + 'static) -> Self {
        self.settings.recorder = Some(Arc::new(recorder));
        self
    }

    /// The maintenance.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting: `every`, `batch_time` or `round_time` zero or over
    /// [`MAX_DURATION`](crate::MAX_DURATION); `batch_size` zero; `round_time` longer than
    /// `every` (a round would outlive its lease); `duty` not in `(0, 1]`; `holder` empty; two
    /// chores with one name.
    pub fn build(self) -> Result<Maintenance, ConfigError> {
        let s = &self.settings;
        for (setting, d) in [
            ("every", s.every),
            ("batch_time", s.batch_time),
            ("round_time", s.round_time),
        ] {
            ConfigError::positive_at_most_max(setting, d)?;
        }
        if !(s.duty > 0.0 && s.duty <= 1.0) {
            return Err(ConfigError::new(
                "duty",
                format!(
                    "{} is not a share of the time: more than 0, at most 1",
                    s.duty
                ),
            ));
        }
        if s.batch_size == 0 {
            return Err(ConfigError::new("batch_size", "must be at least 1"));
        }
        if s.round_time > s.every {
            return Err(ConfigError::new(
                "round_time",
                format!(
                    "{:?} is longer than every ({:?}): a round would outlive its lease",
                    s.round_time, s.every
                ),
            ));
        }
        if s.holder.is_empty() {
            return Err(ConfigError::new("holder", "must not be empty"));
        }
        let mut names = std::collections::HashSet::new();
        for c in &self.chores {
            if !names.insert(c.name()) {
                return Err(ConfigError::new(
                    "chore",
                    format!(
                        "two chores are named {:?}: each needs its own lease",
                        c.name()
                    ),
                ));
            }
        }
        Ok(Maintenance {
            chores: self.chores,
            settings: self.settings,
        })
    }
}

/// The handle of a running [`Maintenance`]: a round on demand, the last reports, and the way
/// to stop it. Clones share the task.
#[derive(Clone)]
pub struct MaintenanceHandle {
    tx: mpsc::Sender<Command>,
    last: Arc<Mutex<Vec<MaintenanceReport>>>,
}

impl fmt::Debug for MaintenanceHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaintenanceHandle")
            .field("running", &!self.tx.is_closed())
            .finish_non_exhaustive()
    }
}

enum Command {
    Round(oneshot::Sender<Vec<MaintenanceReport>>),
    Stop(oneshot::Sender<()>),
}

impl MaintenanceHandle {
    /// Runs a round of every chore now (after the one running, if any), and returns its reports,
    /// in the chores' order; empty if the task has stopped. The next round on the schedule comes
    /// [`every`](MaintenanceBuilder::every) after this one.
    pub async fn run_now(&self) -> Vec<MaintenanceReport> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Round(tx)).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// The last report of each chore that has run, in the chores' order.
    pub fn last_reports(&self) -> Vec<MaintenanceReport> {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the task is still running.
    pub fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Stops the task once the chore it is running finishes, and waits for it.
    pub async fn shutdown(self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Stop(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

async fn run(
    chores: Vec<Arc<dyn Chore>>,
    settings: Settings,
    mut commands: mpsc::Receiver<Command>,
    last: Arc<Mutex<Vec<MaintenanceReport>>>,
) {
    let mut next = Instant::now();
    loop {
        let reply = tokio::select! {
            // A round due goes first: one asked for then runs after it.
            biased;
            _ = tokio::time::sleep_until(next) => None,
            command = commands.recv() => match command {
                Some(Command::Round(reply)) => Some(reply),
                Some(Command::Stop(done)) => {
                    let _ = done.send(());
                    return;
                }
                None => return,
            },
        };
        let mut reports = Vec::with_capacity(chores.len());
        for chore in &chores {
            let report = round(chore, &settings).await;
            if let Some(r) = &settings.recorder {
                r.record_maintenance(&report);
            }
            reports.push(report);
        }
        *last.lock().unwrap_or_else(PoisonError::into_inner) = reports.clone();
        // A round asked for counts as one: the next comes `every` after it.
        next = crate::time::later(Instant::now(), settings.every);
        if let Some(reply) = reply {
            let _ = reply.send(reports);
        }
    }
}

/// The process id and a random number: two processes, even on two machines, never share it.
fn default_holder() -> String {
    use rand::TryRngCore;
    let n = rand::rngs::OsRng.try_next_u64().unwrap_or_else(|_| {
        // No randomness from the system: the time is different enough between two processes
        // that share a pid (on two machines).
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    format!("{}-{n:016x}", std::process::id())
}

/// One chore's round: its lease, then batches while there is more and time.
async fn round(chore: &Arc<dyn Chore>, s: &Settings) -> MaintenanceReport {
    let started = Instant::now();
    let name = chore.name().to_owned();
    let report = |done, batches, outcome| {
        MaintenanceReport::new(name.clone(), done, batches, started.elapsed(), outcome)
    };
    let taken = tokio::time::timeout(s.batch_time, s.leases.take(&name, &s.holder, s.every)).await;
    match taken {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return report(0, 0, MaintenanceOutcome::HeldElsewhere),
        Ok(Err(e)) => {
            let why = format!("taking the lease: {}", crate::error::said(&*e));
            return report(0, 0, MaintenanceOutcome::Failed(why));
        }
        Err(_) => {
            let why = format!("taking the lease took more than {:?}", s.batch_time);
            return report(0, 0, MaintenanceOutcome::Failed(why));
        }
    }
    let (mut done, mut batches) = (0u64, 0u32);
    loop {
        if started.elapsed() >= s.round_time {
            return report(done, batches, MaintenanceOutcome::OutOfTime);
        }
        let c = Arc::clone(chore);
        let limit = s.batch_size;
        // On a task of its own, so that a panic in the chore is a failed batch, not the end of
        // the maintenance.
        let began = Instant::now();
        let mut batch = tokio::spawn(async move { c.run(limit).await });
        let ran = tokio::time::timeout(s.batch_time, &mut batch).await;
        let worked = began.elapsed();
        let outcome = match ran {
            Ok(Ok(Ok(b))) => {
                done = done.saturating_add(b.done);
                batches = batches.saturating_add(1);
                if b.more {
                    rest(worked, s).await;
                    continue;
                }
                MaintenanceOutcome::Done
            }
            Ok(Ok(Err(e))) => MaintenanceOutcome::Failed(crate::error::said(&*e)),
            Ok(Err(join)) => MaintenanceOutcome::Failed(if join.is_panic() {
                "the chore panicked".to_owned()
            } else {
                "the chore was cancelled".to_owned()
            }),
            Err(_) => {
                batch.abort();
                MaintenanceOutcome::Failed(format!("a batch did not finish in {:?}", s.batch_time))
            }
        };
        return report(done, batches, outcome);
    }
}

/// The rest after a batch that took `worked`, for the round's batches to work `duty` of the
/// time; never past the round's end.
async fn rest(worked: Duration, s: &Settings) {
    if s.duty >= 1.0 {
        return;
    }
    // A duty near zero asks for a rest past any duration: the round's time bounds it.
    let pause = Duration::try_from_secs_f64(worked.as_secs_f64() * (1.0 / s.duty - 1.0))
        .unwrap_or(s.round_time)
        .min(s.round_time);
    tokio::time::sleep(pause).await;
}
