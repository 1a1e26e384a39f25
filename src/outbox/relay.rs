//! The relay: claims events, publishes them, marks them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use tower_service::Service;

use super::{Claimed, Event, Failed, OutboxError, OutboxStore, Wakeup};
use crate::classify::BoxError;
use crate::record::{Recorder, RelayReport, RelayRound};
use crate::ConfigError;

/// Publishes an outbox's events through a `tower::Service<Event>` (the broker), at least once
/// each. See the [module docs](super).
///
/// A round ([`run_once`](Self::run_once)) claims a batch, publishes its events in order, and
/// marks each one published, or failed: a failed event is claimed again after a wait, and
/// quarantined after a limit. [`run`](Self::run) repeats rounds until told to stop, waiting a
/// poll interval when there was nothing to do.
///
/// The publisher decides what success means: it answers `Ok` once the broker acknowledged the
/// event. Any error (a refusal, a timeout, an acknowledgement that never came) counts as a
/// failed publish, and the event goes out again later with the same id: a lost acknowledgement
/// is an unknown outcome, which the broker's deduplication or the consumer's inbox settles.
///
/// # Readiness
///
/// The relay waits for the publisher's `poll_ready` before each event, and drives the round's
/// publishes already sent meanwhile: a publisher behind a concurrency limit smaller than the
/// batch works (the batch then goes out as the limit allows).
pub struct Relay<St, P> {
    store: St,
    publisher: P,
    config: Config,
    wakeup: Option<Wakeup>,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
    /// When the store's stats were last reported.
    last_stats: Option<Instant>,
    /// When published events were last swept.
    last_sweep: Option<Instant>,
}

#[derive(Clone, Copy, Debug)]
struct Config {
    batch: usize,
    lease: Duration,
    retry_after: Duration,
    quarantine_after: u32,
    poll: Duration,
    stats_every: Duration,
    /// How long published events are kept; `None`: never swept by the relay.
    retention: Option<Duration>,
}

/// Builds a [`Relay`].
pub struct RelayBuilder<St, P> {
    store: St,
    publisher: P,
    config: Config,
    wakeup: Option<Wakeup>,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

impl<St, P> Relay<St, P> {
    /// A builder over `store`, publishing through `publisher`. Defaults: batches of 100, claims
    /// held for 30 s, a failed event retried after 1 s and quarantined after 10 failures, an
    /// idle relay polling every second.
    pub fn builder(store: St, publisher: P) -> RelayBuilder<St, P> {
        RelayBuilder {
            store,
            publisher,
            config: Config {
                batch: 100,
                lease: Duration::from_secs(30),
                retry_after: Duration::from_secs(1),
                quarantine_after: 10,
                poll: Duration::from_secs(1),
                stats_every: Duration::from_secs(10),
                retention: Some(Duration::from_secs(24 * 3600)),
            },
            wakeup: None,
            recorder: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }
}

impl<St, P> RelayBuilder<St, P> {
    /// At most this many events per round (default 100).
    pub fn batch(mut self, batch: usize) -> Self {
        self.config.batch = batch;
        self
    }

    /// How long a claim holds its events (default 30 s): longer than a round takes, or another
    /// relay claims them too and they go out twice. A relay that dies holding events lets them
    /// go when this passes.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How long a failed event waits before it is claimed again (default 1 s).
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.config.retry_after = wait;
        self
    }

    /// After how many failed publishes an event is quarantined (default 10).
    pub fn quarantine_after(mut self, failures: u32) -> Self {
        self.config.quarantine_after = failures;
        self
    }

    /// How long an idle relay waits before it looks again (default 1 s). With a
    /// [wakeup](Self::wake_on), the longest a lost wake can delay an event.
    pub fn poll(mut self, interval: Duration) -> Self {
        self.config.poll = interval;
        self
    }

    /// Wakes an idle relay when `wakeup` is woken (events were enqueued), before its poll
    /// interval has passed: [`MemoryOutbox::wakeup`](super::MemoryOutbox::wakeup), or
    /// `PostgresOutbox::listen` (`LISTEN/NOTIFY`). Polling goes on beside it.
    pub fn wake_on(mut self, wakeup: Wakeup) -> Self {
        self.wakeup = Some(wakeup);
        self
    }

    /// Reports to `recorder` ([`Recorder::record_relay`]): every round that claimed events,
    /// and the outbox's [stats](OutboxStore::stats) (backlog, oldest, quarantined) every
    /// [`stats_every`](Self::stats_every), idle or not. Without one, the relay only logs
    /// failures and quarantines to `tracing`.
    pub fn recorder(mut self, recorder: impl Recorder + Send + Sync + 'static) -> Self {
        self.recorder = Some(Arc::new(recorder));
        self
    }

    /// How long published events are kept (default 24 hours): at most once a minute, a round
    /// also [sweeps](OutboxStore::sweep) the published events older than this. Quarantined
    /// and unpublished events are never swept.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = Some(retention);
        self
    }

    /// Leaves published events where they are: something else sweeps them (or keeps them).
    pub fn no_sweep(mut self) -> Self {
        self.config.retention = None;
        self
    }

    /// How often a relay with a [recorder](Self::recorder) reads and reports its outbox's
    /// stats (default 10 s): one query of the store each time.
    pub fn stats_every(mut self, interval: Duration) -> Self {
        self.config.stats_every = interval;
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    ///
    /// A zero batch, lease, poll interval, stats interval or quarantine limit.
    pub fn build(self) -> Result<Relay<St, P>, ConfigError> {
        let c = &self.config;
        if c.batch == 0 {
            return Err(ConfigError::new("relay batch", "must be at least 1"));
        }
        if c.lease.is_zero() {
            return Err(ConfigError::new("relay lease", "must be greater than zero"));
        }
        if c.poll.is_zero() {
            return Err(ConfigError::new(
                "relay poll interval",
                "must be greater than zero",
            ));
        }
        if c.stats_every.is_zero() {
            return Err(ConfigError::new(
                "relay stats interval",
                "must be greater than zero",
            ));
        }
        if c.quarantine_after == 0 {
            return Err(ConfigError::new(
                "relay quarantine limit",
                "must be at least 1 failure",
            ));
        }
        Ok(Relay {
            store: self.store,
            publisher: self.publisher,
            config: self.config,
            wakeup: self.wakeup,
            recorder: self.recorder,
            last_stats: None,
            last_sweep: None,
        })
    }
}

/// How often a relay sweeps published events, at most.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

impl<St, P> Relay<St, P>
where
    St: OutboxStore,
    P: Service<Event>,
    P::Error: Into<BoxError>,
{
    /// One round: claims a batch, publishes its events (all sent in order, their
    /// acknowledgements awaited together), marks the published ones in one operation, and
    /// each failed one.
    ///
    /// # Errors
    ///
    /// The store failed (claiming or marking); the events of the round it had not marked are
    /// claimed again when their lease passes.
    pub async fn run_once(&mut self) -> Result<RelayRound, OutboxError> {
        let mut round = self.round().await;
        if let (Ok(round), Some(retention)) = (&mut round, self.config.retention) {
            let now = Instant::now();
            if self
                .last_sweep
                .is_none_or(|last| now.saturating_duration_since(last) >= SWEEP_EVERY)
            {
                self.last_sweep = Some(now);
                match self.store.sweep(retention).await {
                    Ok(swept) => round.swept = swept,
                    // Published events wait for the next sweep: nothing is lost.
                    Err(e) => tracing::warn!(error = %e, "outbox sweep failed"),
                }
            }
        }
        if let Some(recorder) = self.recorder.clone() {
            self.report(&*recorder, round.as_ref().ok()).await;
        }
        round
    }

    /// Reports a round (if it claimed anything) and, when due, the store's stats.
    async fn report(
        &mut self,
        recorder: &(dyn Recorder + Send + Sync),
        round: Option<&RelayRound>,
    ) {
        let now = Instant::now();
        let due = self
            .last_stats
            .is_none_or(|last| now.saturating_duration_since(last) >= self.config.stats_every);
        let stats = if due {
            self.last_stats = Some(now);
            match self.store.stats().await {
                Ok(stats) => Some(stats),
                Err(e) => {
                    tracing::warn!(error = %e, "outbox stats could not be read");
                    None
                }
            }
        } else {
            None
        };
        let round = round.copied().filter(|r| r.claimed > 0 || r.swept > 0);
        if round.is_some() || stats.is_some() {
            recorder.record_relay(&RelayReport { round, stats });
        }
    }

    async fn round(&mut self) -> Result<RelayRound, OutboxError> {
        let c = self.config;
        let batch = self.store.claim(c.batch, c.lease).await?;
        let mut round = RelayRound {
            claimed: batch.len(),
            ..RelayRound::default()
        };
        let outcomes = self.publish_all(&batch).await;
        let mut published = Vec::with_capacity(batch.len());
        for (claimed, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                Ok(()) => published.push(claimed),
                Err(error) => {
                    round.failed += 1;
                    let id = claimed.event.id().clone();
                    tracing::info!(event = %id, failures = claimed.failures + 1, %error, "outbox publish failed");
                    match self
                        .store
                        .failed(
                            &claimed,
                            &error.to_string(),
                            c.retry_after,
                            c.quarantine_after,
                        )
                        .await
                    {
                        Ok(Failed::Retry) => {}
                        Ok(Failed::Quarantined) => {
                            round.quarantined += 1;
                            tracing::warn!(event = %id, %error, "outbox event quarantined");
                        }
                        Err(e) if e.is_stale() => round.stale += 1,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        let marked = self.store.published_all(&published).await?;
        round.published = marked;
        round.stale += published.len().saturating_sub(marked);
        Ok(round)
    }

    /// Sends every event of the batch, in order, as the publisher is ready, and awaits their
    /// acknowledgements together; the outcomes in the batch's order. The publishes already
    /// sent are driven while the publisher is not ready: a publisher that takes one event at a
    /// time (a concurrency limit of 1) gets its readiness back from them.
    async fn publish_all(&mut self, batch: &[Claimed]) -> Vec<Result<(), BoxError>> {
        let mut sending: Vec<Sending<P::Future>> = Vec::with_capacity(batch.len());
        let publisher = &mut self.publisher;
        std::future::poll_fn(|cx| {
            while sending.len() < batch.len() {
                match publisher.poll_ready(cx) {
                    Poll::Ready(Ok(())) => {
                        let event = batch[sending.len()].event.clone();
                        sending.push(Sending::Going(Box::pin(publisher.call(event))));
                    }
                    Poll::Ready(Err(e)) => {
                        // The publisher is broken: the rest of the batch fails the same way.
                        let why = e.into().to_string();
                        while sending.len() < batch.len() {
                            sending.push(Sending::Done(Err(why.clone().into())));
                        }
                    }
                    Poll::Pending => break,
                }
            }
            let mut waiting = sending.len() < batch.len();
            for s in &mut sending {
                if let Sending::Going(f) = s {
                    match f.as_mut().poll(cx) {
                        Poll::Ready(out) => *s = Sending::Done(out.map(drop).map_err(Into::into)),
                        Poll::Pending => waiting = true,
                    }
                }
            }
            if waiting {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        sending
            .into_iter()
            .map(|s| match s {
                Sending::Done(out) => out,
                // Every publish finished before the poll above returned.
                Sending::Going(_) => Err("the publish did not finish".into()),
            })
            .collect()
    }

    /// Runs rounds until `stop` completes: at once after a full batch; when there was nothing
    /// to do (or the store failed, which is logged), after the poll interval or at the
    /// [wakeup](RelayBuilder::wake_on), whichever comes first.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            let idle = match self.run_once().await {
                Ok(round) => round.claimed < self.config.batch,
                Err(e) => {
                    tracing::warn!(error = %e, "outbox relay round failed");
                    true
                }
            };
            if idle {
                let woken = async {
                    match &self.wakeup {
                        Some(w) => w.woken().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(self.config.poll) => {}
                    _ = woken => {}
                }
            } else if futures_poll_ready(&mut stop) {
                return;
            }
        }
    }
}

/// One event's publish within a round.
enum Sending<F> {
    Going(std::pin::Pin<Box<F>>),
    Done(Result<(), BoxError>),
}

/// Whether `stop` has completed, without waiting for it.
fn futures_poll_ready(stop: &mut std::pin::Pin<&mut impl Future<Output = ()>>) -> bool {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    stop.as_mut().poll(&mut cx).is_ready()
}

impl<St: fmt::Debug, P> fmt::Debug for Relay<St, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("store", &self.store)
            .field("config", &self.config)
            .field("wakeup", &self.wakeup.is_some())
            .field("recorder", &self.recorder.is_some())
            .finish_non_exhaustive()
    }
}

impl<St, P> fmt::Debug for RelayBuilder<St, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RelayBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
