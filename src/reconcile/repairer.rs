//! Applying repairs: claimed, applied through a service, marked under the claim's fence.

use std::fmt;
use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tower_service::Service;

use super::{DifferenceStore, Marked, ReconcileError, RepairClaim, RepairId, Seen};
use crate::backoff::{Backoff, Jitter};
use crate::classify::BoxError;
use crate::queue::worker;
use crate::ConfigError;

/// What a repair service is asked to do: the action its rule names, for this key, given what
/// each source held, under the repair's id.
///
/// **Deduplicate on [`id`](Self::id).** A repairer can apply a repair and die before it marks
/// it; when its lease passes, another repairer sends the same request again. A target that
/// keeps the ids it applied (a unique column, an inbox) answers the second one
/// [`Applied`](RepairAnswer::Applied) without doing it twice. The [`seen`](Self::seen)
/// versions let it refuse a repair planned against facts that have moved on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RepairRequest {
    /// The repair's id: the same for the same difference, every time it is sent.
    pub id: RepairId,
    /// The rule that found the difference.
    pub rule: String,
    /// The action the rule names.
    pub action: String,
    /// The business key.
    pub key: Bytes,
    /// What each of the rule's sources held.
    pub seen: Vec<Seen>,
    /// Which try this is, from 1.
    pub attempt: u32,
}

/// What a repair service answers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RepairAnswer {
    /// The repair is applied (now, or before: the id was seen).
    Applied,
    /// The repair cannot be applied, and trying again will not help (the facts moved on, the
    /// action is refused): the difference goes to the manual queue with this reason.
    Refused(String),
}

/// Applies the repairs of a [`DifferenceStore`] through a `tower::Service<RepairRequest>`, once
/// each. See the [module docs](super).
///
/// A round ([`run_once`](Self::run_once)) claims a batch of open differences with a lease, and
/// for each one:
///
/// | the service | the difference |
/// | --- | --- |
/// | answers [`Applied`](RepairAnswer::Applied) | marked repaired, under the claim's fencing token |
/// | answers [`Refused(why)`](RepairAnswer::Refused) | to the manual queue: this repairer, and `why` |
/// | fails, or takes longer than the [timeout](RepairerBuilder::timeout) | tried again after a backoff; to the manual queue after [`max_tries`](RepairerBuilder::max_tries) |
///
/// A difference without a repair is in the manual queue from the start; the repairer never
/// sees it.
///
/// A repairer whose lease passed cannot mark: the store refuses the stale claim (counted as
/// [`stale`](RepairRound::stale)). Several repairers may run over one store: each claims its
/// own differences.
///
/// ```
/// use std::time::Duration;
/// use surely::reconcile::{
///     Difference, DifferenceStore, ItemState, MemoryDifferences, RepairAnswer, RepairRequest,
///     Repairer,
/// };
/// use surely::retry::backoff::Backoff;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let store = MemoryDifferences::new();
/// let d = Difference::new("payment-order", "o-1", vec![], Some("mark-paid".to_owned()));
/// store.record(&d).await.unwrap();
///
/// // The order service refuses: the order was cancelled meanwhile.
/// let orders = tower::service_fn(|_req: RepairRequest| async {
///     Ok::<_, std::io::Error>(RepairAnswer::Refused("order o-1 is cancelled".to_owned()))
/// });
/// let mut repairer = Repairer::builder(store.clone(), orders)
///     .name("billing-1")
///     .lease(Duration::from_secs(30))
///     .timeout(Duration::from_secs(5))
///     .backoff(Backoff::constant(Duration::from_secs(10)))
///     .max_tries(3)
///     .build()
///     .unwrap();
/// assert_eq!(repairer.run_once().await.unwrap().to_manual, 1);
/// let item = store.get(&d.id).await.unwrap().unwrap();
/// assert_eq!(item.state, ItemState::Manual);
/// assert_eq!(item.who.as_deref(), Some("billing-1"));
/// # }
/// ```
///
/// # Readiness
///
/// The repairer waits for the service's `poll_ready` before each request, within the same
/// timeout as the call.
pub struct Repairer<St, S> {
    store: St,
    service: S,
    config: Config,
}

#[derive(Clone, Debug)]
struct Config {
    name: String,
    batch: usize,
    lease: Duration,
    timeout: Duration,
    backoff: Backoff,
    max_tries: u32,
}

/// Builds a [`Repairer`]; made by [`Repairer::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct RepairerBuilder<St, S> {
    store: St,
    service: S,
    config: Config,
    backoff: Option<Backoff>,
}

/// What one round did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RepairRound {
    /// Differences claimed.
    pub claimed: usize,
    /// Repairs applied and marked.
    pub repaired: usize,
    /// Already repaired or resolved when this round came to mark them.
    pub already: usize,
    /// Failed, to be tried again after their backoff.
    pub retried: usize,
    /// Moved to the manual queue.
    pub to_manual: usize,
    /// Refused as stale: the lease passed and another repairer holds them.
    pub stale: usize,
    /// Left alone: too little of the lease was left to try them; they come back after it.
    pub skipped: usize,
    /// Changes the store failed to make: those differences come back after their lease.
    pub errors: usize,
}

impl<St, S> Repairer<St, S>
where
    St: DifferenceStore,
    S: Service<RepairRequest, Response = RepairAnswer>,
    S::Error: Into<BoxError>,
{
    /// A builder over `store`, applying through `service`. Defaults: named `repairer`, batches
    /// of 16, a 60 s lease, a 10 s timeout per repair, a backoff from 1 s doubling to 5
    /// minutes (equal jitter), the manual queue after 5 failed tries.
    pub fn builder(store: St, service: S) -> RepairerBuilder<St, S> {
        RepairerBuilder {
            store,
            service,
            config: Config {
                name: "repairer".to_owned(),
                batch: 16,
                lease: Duration::from_secs(60),
                timeout: Duration::from_secs(10),
                backoff: Backoff::none(),
                max_tries: 5,
            },
            backoff: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }

    /// The service.
    pub fn service(&self) -> &S {
        &self.service
    }

    /// One round: claims a batch and applies each repair.
    ///
    /// # Errors
    ///
    /// If the claim failed. A change that fails for one difference is counted in
    /// [`errors`](RepairRound::errors), logged, and the round goes on.
    pub async fn run_once(&mut self) -> Result<RepairRound, ReconcileError> {
        let claimed_at = Instant::now();
        let claims = self
            .store
            .claim(self.config.batch, self.config.lease)
            .await?;
        let mut round = RepairRound {
            claimed: claims.len(),
            ..RepairRound::default()
        };
        for claim in claims {
            if !worker::time_left(claimed_at, self.config.timeout, self.config.lease) {
                round.skipped += 1;
                continue;
            }
            self.repair(&claim, &mut round).await;
        }
        Ok(round)
    }

    /// Rounds until `stop` completes: at once after a full batch, else after `poll` (any
    /// duration: one past the timer's range waits until `stop`).
    pub async fn run(mut self, poll: Duration, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            let busy = match self.run_once().await {
                Ok(round) => round.claimed >= self.config.batch && round.skipped == 0,
                Err(e) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "repairer round failed"
                    );
                    false
                }
            };
            if !worker::pause(stop.as_mut(), busy, poll).await {
                return;
            }
        }
    }

    async fn repair(&mut self, claim: &RepairClaim, round: &mut RepairRound) {
        let item = &claim.item;
        let d = &item.difference;
        let Some(action) = d.action.clone() else {
            // Recorded in the manual queue; a store of your own may still hand it out.
            let change = self
                .store
                .to_manual(claim, &self.config.name, super::NO_REPAIR)
                .await
                .map(|()| round.to_manual += 1);
            return self.count(claim, change, round);
        };
        let request = RepairRequest {
            id: d.id.clone(),
            rule: d.rule.clone(),
            action,
            key: d.key.clone(),
            seen: d.seen.clone(),
            attempt: item.tries + 1,
        };
        let service = &mut self.service;
        let answer = tokio::time::timeout(self.config.timeout, async {
            poll_fn(|cx| service.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            service.call(request).await.map_err(Into::into)
        })
        .await
        .unwrap_or_else(|_| Err(BoxError::from("the repair took longer than its timeout")));
        let change = match answer {
            Ok(RepairAnswer::Applied) => match self.store.mark_repaired(claim, "applied").await {
                Ok(Marked::Now) => {
                    round.repaired += 1;
                    Ok(())
                }
                Ok(Marked::Already) => {
                    round.already += 1;
                    Ok(())
                }
                Err(e) => Err(e),
            },
            Ok(RepairAnswer::Refused(why)) => {
                let why = format!("the repair was refused: {why}");
                tracing::warn!(repair = %d.id, rule = %d.rule, key = %d.key_display(), "{why}");
                self.store
                    .to_manual(claim, &self.config.name, &why)
                    .await
                    .map(|()| round.to_manual += 1)
            }
            Err(e) => {
                let tries = item.tries + 1;
                if tries >= self.config.max_tries {
                    let why = format!("{tries} tries failed; the last: {e}");
                    tracing::warn!(repair = %d.id, rule = %d.rule, key = %d.key_display(), "{why}");
                    self.store
                        .to_manual(claim, &self.config.name, &why)
                        .await
                        .map(|()| round.to_manual += 1)
                } else {
                    let wait = worker::backoff_wait(&self.config.backoff, item.tries);
                    self.store
                        .retry_later(claim, &format!("the repair failed: {e}"), wait)
                        .await
                        .map(|()| round.retried += 1)
                }
            }
        };
        self.count(claim, change, round)
    }

    fn count(
        &self,
        claim: &RepairClaim,
        change: Result<(), ReconcileError>,
        round: &mut RepairRound,
    ) {
        match change {
            Ok(()) => {}
            Err(e) if e.is_stale() => round.stale += 1,
            Err(e) => {
                round.errors += 1;
                tracing::warn!(repair = %claim.item.difference.id, error = &e as &dyn std::error::Error, "difference store change failed; the difference comes back after its lease");
            }
        }
    }
}

impl<St, S> RepairerBuilder<St, S>
where
    St: DifferenceStore,
    S: Service<RepairRequest, Response = RepairAnswer>,
    S::Error: Into<BoxError>,
{
    /// The name the manual queue keeps as who moved a difference there (`repairer`): the
    /// host or the deployment, so a person knows where to look. 1 to 256 bytes, no control
    /// characters.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.config.name = name.into();
        self
    }

    /// Differences claimed per round (16). At least 1.
    pub fn batch(mut self, batch: usize) -> Self {
        self.config.batch = batch;
        self
    }

    /// How long a claim holds its differences (60 s): a repairer that dies holding them gives
    /// them up after it. Longer than the timeout.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long one repair may take, readiness included (10 s); one that takes longer counts
    /// as failed.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// The waits between the tries of one repair (1 s doubling to 5 minutes, equal jitter).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = Some(backoff);
        self
    }

    /// After this many failed tries a difference goes to the manual queue (5). At least 1.
    pub fn max_tries(mut self, tries: u32) -> Self {
        self.config.max_tries = tries;
        self
    }

    /// The repairer.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting (`repairer batch`, ...): a zero batch, tries,
    /// lease or timeout, a lease no longer than the timeout, a lease or timeout longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION) (ten years), or a name that is empty, over 256
    /// bytes or holds a control character.
    pub fn build(self) -> Result<Repairer<St, S>, ConfigError> {
        let c = &self.config;
        worker::Claiming {
            batch: ("repairer batch", c.batch),
            lease: ("repairer lease", c.lease),
            timeout: Some((
                "repairer timeout",
                c.timeout,
                "must be longer than the timeout, or a repair could outlast its claim",
            )),
        }
        .check()?;
        if c.max_tries == 0 {
            return Err(ConfigError::new("repairer max_tries", "must be at least 1"));
        }
        if c.name.trim().is_empty()
            || c.name.len() > super::MAX_WHO
            || c.name.chars().any(char::is_control)
        {
            return Err(ConfigError::new(
                "repairer name",
                "must be 1 to 256 bytes without control characters",
            ));
        }
        let backoff = match self.backoff {
            Some(b) => b,
            None => Backoff::exponential(Duration::from_secs(1))
                .cap(Duration::from_secs(300))
                .jitter(Jitter::Equal)
                .build()?,
        };
        Ok(Repairer {
            store: self.store,
            service: self.service,
            config: Config {
                backoff,
                ..self.config
            },
        })
    }
}

impl<St, S> fmt::Debug for Repairer<St, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Repairer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<St: Clone, S: Clone> Clone for RepairerBuilder<St, S> {
    fn clone(&self) -> Self {
        RepairerBuilder {
            store: self.store.clone(),
            service: self.service.clone(),
            config: self.config.clone(),
            backoff: self.backoff.clone(),
        }
    }
}

impl<St, S> fmt::Debug for RepairerBuilder<St, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RepairerBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
