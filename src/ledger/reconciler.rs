//! Working the ledger down.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use tokio::time::Instant;

use super::{Claim, EntryId, Filter, Ledger, LedgerError, Settled, Settlement, Verdict};
use crate::backoff::{Backoff, Jitter};
use crate::queue::worker;
use crate::resolve::{Resolution, Resolve};
use crate::ConfigError;

/// Settles the [ledger](super)'s open entries by asking the downstream.
///
/// Each round [claims](Ledger::claim) a batch of entries with a lease, and for each one asks
/// the resolver (the same [`Resolve`] hook the retry layer consults, given the entry's key,
/// semantics, attempts and last classification):
///
/// | the resolver says | the entry |
/// | --- | --- |
/// | [`Succeeded(res)`](Resolution::Succeeded) | settled succeeded, `res`'s `Debug` as the evidence |
/// | [`Failed`](Resolution::Failed) | settled failed |
/// | [`Unknown`](Resolution::Unknown), or no answer within the query timeout | tried again after a backoff; to the manual queue past the tries or the age |
/// | declines (`None`: it cannot query this call) | to the manual queue |
///
/// A settlement is fenced by the claim: two reconcilers, or one run twice, settle an entry
/// once, and the second gets the first's settlement back (counted as
/// [`already`](ReconcileRound::already); a verdict that disagrees is logged as an error). A
/// reconciler that dies between the downstream's answer and the settlement leaves the entry
/// claimed until its lease passes; the next round asks again and settles it then.
///
/// Several reconcilers may run over one ledger (the PostgreSQL one, across instances): each
/// claims its own entries. Entries older than the [alert](ReconcilerBuilder::alert_after)
/// limit are reported as `tracing` warnings.
pub struct Reconciler<L, R, Res> {
    ledger: L,
    resolver: R,
    config: Config,
    last_alert: Option<Instant>,
    last_sweep: Option<Instant>,
    _res: PhantomData<fn() -> Res>,
}

#[derive(Clone, Debug)]
struct Config {
    batch: usize,
    lease: Duration,
    query_timeout: Duration,
    backoff: Backoff,
    max_tries: u32,
    max_age: Duration,
    alert_after: Duration,
    alert_every: Duration,
    poll: Duration,
    retention: Option<Duration>,
}

/// How often [`Reconciler::run`] sweeps settled entries past their retention, at most.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// Builds a [`Reconciler`]; made by [`Reconciler::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct ReconcilerBuilder<L, R, Res> {
    ledger: L,
    resolver: R,
    config: Config,
    backoff: Option<Backoff>,
    _res: PhantomData<fn() -> Res>,
}

/// What one round did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReconcileRound {
    /// Entries claimed.
    pub claimed: usize,
    /// Settled as succeeded by this round.
    pub succeeded: usize,
    /// Settled as failed by this round.
    pub failed: usize,
    /// Already settled when this round came to settle them (by another reconciler, or a
    /// person).
    pub already: usize,
    /// Put back to be tried again after their backoff.
    pub retried: usize,
    /// Moved to the manual queue.
    pub to_manual: usize,
    /// Refused as stale: the lease passed and another reconciler holds them.
    pub stale: usize,
    /// Left alone: too little of the lease was left to query them; they come back after it.
    pub skipped: usize,
    /// Changes the ledger failed to make: those entries come back after their lease.
    pub errors: usize,
    /// Unsettled entries older than the alert limit, when this round looked (at most once per
    /// minute in [`run`](Reconciler::run); every round in [`run_once`](Reconciler::run_once)).
    pub overdue: Option<u64>,
}

impl<L, R, Res> Reconciler<L, R, Res>
where
    L: Ledger,
    R: Resolve<Res>,
    Res: fmt::Debug,
{
    /// Starts a reconciler over `ledger` asking `resolver`. Defaults: batches of 16, a 60 s
    /// lease, a 10 s query timeout, a backoff from 1 s doubling to 5 minutes (equal jitter),
    /// the manual queue after 10 tries or 24 hours, an alert for entries older than an hour,
    /// a 1 s poll when idle, and settled entries kept 30 days.
    pub fn builder(ledger: L, resolver: R) -> ReconcilerBuilder<L, R, Res> {
        ReconcilerBuilder {
            ledger,
            resolver,
            config: Config {
                batch: 16,
                lease: Duration::from_secs(60),
                query_timeout: Duration::from_secs(10),
                backoff: Backoff::none(),
                max_tries: 10,
                max_age: Duration::from_secs(24 * 3600),
                alert_after: Duration::from_secs(3600),
                alert_every: Duration::from_secs(60),
                poll: Duration::from_secs(1),
                retention: Some(Duration::from_secs(30 * 24 * 3600)),
            },
            backoff: None,
            _res: PhantomData,
        }
    }

    /// The ledger.
    pub fn ledger(&self) -> &L {
        &self.ledger
    }

    /// Its settings, for a [review](crate::review) of the service: a resolver works the
    /// ledger down, entries it cannot settle go to the manual queue, and old ones raise an
    /// alert.
    pub fn describe(&self) -> crate::review::LedgerSettings {
        crate::review::LedgerSettings {
            resolver: true,
            alert_after: Some(self.config.alert_after),
            manual_queue: true,
        }
    }

    /// One round: claims a batch, queries and settles each entry, and reports the overdue
    /// ones.
    ///
    /// # Errors
    ///
    /// If the claim failed. A change that fails for one entry is counted in
    /// [`errors`](ReconcileRound::errors), logged, and the round goes on.
    pub async fn run_once(&mut self) -> Result<ReconcileRound, LedgerError> {
        let mut round = self.round().await?;
        round.overdue = Some(self.alert().await?);
        Ok(round)
    }

    async fn round(&mut self) -> Result<ReconcileRound, LedgerError> {
        let claimed_at = Instant::now();
        let claims = self
            .ledger
            .claim(self.config.batch, self.config.lease)
            .await?;
        let mut round = ReconcileRound {
            claimed: claims.len(),
            ..ReconcileRound::default()
        };
        for claim in claims {
            if !worker::time_left(claimed_at, self.config.query_timeout, self.config.lease) {
                round.skipped += 1;
                continue;
            }
            self.reconcile(&claim, &mut round).await;
        }
        Ok(round)
    }

    async fn reconcile(&self, claim: &Claim, round: &mut ReconcileRound) {
        let entry = &claim.entry;
        let id = &entry.evidence.id;
        let answer = match self.resolver.resolve(entry.evidence.query()) {
            None => None,
            Some(mut query) => Some(
                tokio::time::timeout(self.config.query_timeout, query.future())
                    .await
                    .unwrap_or(Resolution::Unknown),
            ),
        };
        let change = match answer {
            Some(Resolution::Succeeded(res)) => {
                let s = Settlement::reconciled(Verdict::Succeeded, format!("{res:?}"));
                self.settle(claim, &s, round).await
            }
            Some(Resolution::Failed) => {
                let s = Settlement::reconciled(
                    Verdict::Failed,
                    "the downstream answered that the call did not take effect",
                );
                self.settle(claim, &s, round).await
            }
            Some(Resolution::Unknown) => {
                let tries = entry.tries + 1;
                if tries >= self.config.max_tries || entry.age >= self.config.max_age {
                    let why = format!(
                        "still unknown after {tries} queries and {}s: a person must settle it",
                        entry.age.as_secs()
                    );
                    tracing::warn!(entry = %id, key = entry.evidence.key.as_deref().unwrap_or("-"), tries, "{why}");
                    self.ledger.to_manual(claim, &why).await.map(|()| {
                        round.to_manual += 1;
                    })
                } else {
                    let wait = worker::backoff_wait(&self.config.backoff, entry.tries);
                    self.ledger
                        .retry_later(claim, "the query left it unknown", wait)
                        .await
                        .map(|()| round.retried += 1)
                }
            }
            None => {
                let why = "the resolver cannot query this call: a person must settle it";
                tracing::warn!(entry = %id, key = entry.evidence.key.as_deref().unwrap_or("-"), "{why}");
                self.ledger
                    .to_manual(claim, why)
                    .await
                    .map(|()| round.to_manual += 1)
            }
        };
        match change {
            Ok(()) => {}
            Err(e) if e.is_stale() => round.stale += 1,
            Err(e) => {
                round.errors += 1;
                tracing::warn!(entry = %id, error = &e as &dyn std::error::Error, "ledger change failed; the entry comes back after its lease");
            }
        }
    }

    async fn settle(
        &self,
        claim: &Claim,
        settlement: &Settlement,
        round: &mut ReconcileRound,
    ) -> Result<(), LedgerError> {
        match self.ledger.settle(claim, settlement).await? {
            Settled::Now(s) => match s.verdict {
                Verdict::Succeeded => round.succeeded += 1,
                Verdict::Failed => round.failed += 1,
            },
            Settled::Already(kept) => {
                round.already += 1;
                if kept.verdict != settlement.verdict {
                    tracing::error!(
                        entry = %claim.entry.evidence.id,
                        kept = kept.verdict.as_str(),
                        found = settlement.verdict.as_str(),
                        "the downstream's answer disagrees with the entry's settlement; the settlement is kept"
                    );
                }
            }
        }
        Ok(())
    }

    /// Warns about the unsettled entries older than the alert limit; returns how many.
    async fn alert(&mut self) -> Result<u64, LedgerError> {
        self.last_alert = Some(Instant::now());
        let stats = self.ledger.stats().await?;
        if stats
            .oldest_unsettled
            .is_none_or(|age| age < self.config.alert_after)
        {
            return Ok(0);
        }
        let overdue = self
            .ledger
            .list(
                &Filter::new()
                    .older_than(self.config.alert_after)
                    .limit(1000),
            )
            .await?;
        let overdue: Vec<_> = overdue
            .into_iter()
            .filter(|e| e.state.is_unsettled())
            .collect();
        let shown: Vec<&EntryId> = overdue.iter().take(10).map(|e| &e.evidence.id).collect();
        tracing::warn!(
            overdue = overdue.len(),
            oldest_secs = stats.oldest_unsettled.map_or(0, |d| d.as_secs()),
            manual = stats.manual,
            first = ?shown,
            "unknown calls unsettled past the alert limit"
        );
        Ok(overdue.len() as u64)
    }

    /// Runs rounds until `stop` completes: at once after a full batch, else after the poll
    /// interval. A failed round is logged, and the next one comes after the poll interval.
    /// Overdue entries are reported at most once a minute, and settled entries past the
    /// [retention](ReconcilerBuilder::retention) swept at most once an hour.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            let busy = match self.round().await {
                Ok(round) => round.claimed >= self.config.batch && round.skipped == 0,
                Err(e) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "ledger reconciler round failed"
                    );
                    false
                }
            };
            let due = self
                .last_alert
                .is_none_or(|t| t.elapsed() >= self.config.alert_every);
            if due && let Err(e) = self.alert().await {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "ledger reconciler could not read the ledger's stats"
                );
            }
            if let Some(retention) = self.config.retention {
                let now = Instant::now();
                if self
                    .last_sweep
                    .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY)
                {
                    self.last_sweep = Some(now);
                    match self.ledger.sweep(retention).await {
                        Ok(0) => {}
                        Ok(n) => tracing::debug!(swept = n, "ledger: settled entries swept"),
                        Err(e) => tracing::warn!(
                            error = &e as &dyn std::error::Error,
                            "ledger sweep failed"
                        ),
                    }
                }
            }
            if !worker::pause(stop.as_mut(), busy, self.config.poll).await {
                return;
            }
        }
    }
}

impl<L, R, Res> ReconcilerBuilder<L, R, Res>
where
    L: Ledger,
    R: Resolve<Res>,
    Res: fmt::Debug,
{
    /// Entries claimed per round (16). At least 1.
    pub fn batch(mut self, batch: usize) -> Self {
        self.config.batch = batch;
        self
    }

    /// How long a claim holds its entries (60 s): a reconciler that dies holding them gives
    /// them up after it. Longer than the query timeout.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long one query may take (10 s); one that takes longer leaves the entry unknown.
    pub fn query_timeout(mut self, timeout: Duration) -> Self {
        self.config.query_timeout = timeout;
        self
    }

    /// The waits between the queries of one entry (1 s doubling to 5 minutes, equal jitter).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// After this many queries leave an entry unknown, it goes to the manual queue (10). At
    /// least 1.
    pub fn max_tries(mut self, tries: u32) -> Self {
        self.config.max_tries = tries;
        self
    }

    /// An entry this old that a query leaves unknown goes to the manual queue (24 hours).
    pub fn max_age(mut self, age: Duration) -> Self {
        self.config.max_age = age;
        self
    }

    /// Unsettled entries older than this are reported (1 hour).
    pub fn alert_after(mut self, age: Duration) -> Self {
        self.config.alert_after = age;
        self
    }

    /// How long [`run`](Reconciler::run) waits when there was nothing to do (1 s).
    pub fn poll(mut self, poll: Duration) -> Self {
        self.config.poll = poll;
        self
    }

    /// How long [`run`](Reconciler::run) keeps settled entries before it sweeps them (30
    /// days). Unsettled entries are never swept.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = Some(retention);
        self
    }

    /// Sweeps nothing: settled entries stay until [`Ledger::sweep`] is called.
    pub fn no_sweep(mut self) -> Self {
        self.config.retention = None;
        self
    }

    /// The reconciler.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting (`reconciler batch`, ...): a zero batch, tries,
    /// lease or query timeout, a lease no longer than the query timeout, or a duration longer
    /// than [`MAX_DURATION`](crate::MAX_DURATION) (ten years).
    pub fn build(self) -> Result<Reconciler<L, R, Res>, ConfigError> {
        let c = &self.config;
        worker::Claiming {
            batch: ("reconciler batch", c.batch),
            lease: ("reconciler lease", c.lease),
            timeout: Some((
                "reconciler query_timeout",
                c.query_timeout,
                "must be longer than the query timeout, or a query could outlast its claim",
            )),
        }
        .check()?;
        if c.max_tries == 0 {
            return Err(ConfigError::new(
                "reconciler max_tries",
                "must be at least 1",
            ));
        }
        ConfigError::at_most_max("reconciler max_age", c.max_age)?;
        ConfigError::at_most_max("reconciler alert_after", c.alert_after)?;
        ConfigError::at_most_max("reconciler poll", c.poll)?;
        if let Some(retention) = c.retention {
            ConfigError::at_most_max("reconciler retention", retention)?;
        }
        let backoff = match self.backoff {
            Some(b) => b,
            None => Backoff::exponential(Duration::from_secs(1))
                .cap(Duration::from_secs(300))
                .jitter(Jitter::Equal)
                .build()?,
        };
        Ok(Reconciler {
            ledger: self.ledger,
            resolver: self.resolver,
            config: Config {
                backoff,
                ..self.config
            },
            last_alert: None,
            last_sweep: None,
            _res: PhantomData,
        })
    }
}

impl<L, R, Res> fmt::Debug for Reconciler<L, R, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<L: Clone, R: Clone, Res> Clone for ReconcilerBuilder<L, R, Res> {
    fn clone(&self) -> Self {
        ReconcilerBuilder {
            ledger: self.ledger.clone(),
            resolver: self.resolver.clone(),
            config: self.config.clone(),
            backoff: self.backoff.clone(),
            _res: PhantomData,
        }
    }
}

impl<L, R, Res> fmt::Debug for ReconcilerBuilder<L, R, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcilerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "server")]
impl<L, R> Reconciler<L, R, http::Response<bytes::Bytes>>
where
    L: Ledger,
    R: Resolve<http::Response<bytes::Bytes>>,
{
    /// Settles a server's `UNKNOWN` idempotency records with this reconciler's resolver, its
    /// query timeout and its batch size: the unknowns of both halves worked down by one
    /// reconciler and one [`Resolve`] hook. What the resolver finds is stored on the record
    /// and replayed to the client's next request (or, when the work did not happen, the record
    /// is released and that request runs it); see
    /// [`IdempotencyLayer::settle_unknowns`](crate::server::idempotency::IdempotencyLayer::settle_unknowns).
    /// A record the resolver cannot settle stays `UNKNOWN`, listed by
    /// [`IdempotencyStore::unknowns`](crate::server::store::IdempotencyStore::unknowns), for the
    /// next round or a person. Call it beside [`run_once`](Self::run_once), on the same
    /// schedule.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use surely::ledger::{MemoryLedger, Reconciler};
    /// use surely::retry::{Query, Resolution};
    /// use surely::server::idempotency::IdempotencyLayer;
    /// use surely::server::store::MemoryStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = IdempotencyLayer::new(MemoryStore::new());
    /// let ask = |_q: Query| async { Resolution::<http::Response<Bytes>>::Unknown };
    /// let reconciler = Reconciler::builder(MemoryLedger::new(), ask).build().unwrap();
    /// let round = reconciler.settle_server(&layer).await.unwrap();
    /// assert_eq!(round.seen, 0);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The idempotency store failed.
    pub async fn settle_server<St: crate::server::store::IdempotencyStore>(
        &self,
        layer: &crate::server::idempotency::IdempotencyLayer<St>,
    ) -> Result<crate::server::idempotency::SettleRound, crate::server::store::StoreError> {
        layer
            .settle_unknowns(&self.resolver, self.config.query_timeout, self.config.batch)
            .await
    }
}
