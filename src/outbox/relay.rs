//! The relay: claims events, publishes them, marks them.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use tower_service::Service;

use super::{Claimed, Event, Failed, OutboxError, OutboxStore, Wakeup};
use crate::classify::BoxError;
use crate::queue::worker;
use crate::record::{Recorder, RelayReport, RelayRound};
use crate::ConfigError;

/// Publishes an outbox's events through a `tower::Service<Event>` (the broker), at least once
/// each. See the [module docs](super).
///
/// A round ([`run_once`](Self::run_once)) claims a batch, publishes its events in order, and
/// marks each one published, or failed: a failed event is claimed again after a wait, and
/// quarantined after a limit. [`run`](Self::run) repeats rounds until told to stop, overlapping
/// them while there is a backlog ([pipelining](#pipelining)), and waiting a poll interval when
/// there was nothing to do.
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
///
/// # Pipelining
///
/// A round's three steps wait on two systems: the claim and the marks on the store, the
/// publish on the broker. One after the other, a round costs their sum, and on PostgreSQL and
/// NATS JetStream the claim and the mark of 100 events each take about as long as their
/// publish: a relay so run drains a backlog at about a third of what the broker takes. So
/// [`run`](Self::run) overlaps them: while batch *n* is published, batch *n − 1* is marked and
/// batch *n + 1* claimed, and a round costs about its slowest step, as far as the store and
/// the broker have CPU to spare (the relay, PostgreSQL and NATS on one 2-core machine
/// drained a backlog 1.24–1.40× faster than one round at a time: `benches/README.md`). All of
/// it runs in the relay's own task (nothing is spawned). What a round guarantees still
/// holds:
///
/// * one publish at a time, in the order of the claims: batch *n + 1* is not sent before
///   every acknowledgement of batch *n* is in, so events go out in the order they would one
///   round at a time;
/// * one batch marked at a time, in the same order, each reported to the
///   [recorder](RelayBuilder::recorder) as its own [`RelayRound`], with the sweep and the
///   stats as often as before;
/// * at least once: a failed publish is marked failed (retried, then quarantined) as in a
///   round, and an event is marked published only once its acknowledgement is in.
///
/// What changes: the relay holds up to [`pipeline_depth`](RelayBuilder::pipeline_depth)
/// batches at once (default 3) instead of one, and a batch is claimed before the publisher is
/// free for it, so its [lease](RelayBuilder::lease) must cover its wait in line. When the
/// store fails (a claim or a mark), the relay claims and publishes nothing more, still marks
/// the batch whose publish was in flight if the store answers, logs the error and waits as
/// after a failed round: a batch it claimed and did not publish, or published and could not
/// mark, is claimed again when its lease passes (and, if published, goes out again with the
/// same ids). A depth of 1 runs the rounds one after the other, as before.
pub struct Relay<St, P> {
    store: St,
    publisher: P,
    config: Config,
    wakeup: Option<Wakeup>,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
    timers: Timers,
}

/// When a relay last did its periodic work.
#[derive(Clone, Copy, Debug, Default)]
struct Timers {
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
    /// How many batches `run` holds at once, from the start of their claim to the end of
    /// their marks.
    depth: usize,
}

/// Builds a [`Relay`]; made by [`Relay::builder`].
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Clone)]
pub struct RelayBuilder<St, P> {
    store: St,
    publisher: P,
    config: Config,
    wakeup: Option<Wakeup>,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

impl<St, P> Relay<St, P> {
    /// Its settings, for a [review](crate::review) of the service: the polling relay.
    pub fn describe(&self) -> crate::review::OutboxSettings {
        crate::review::OutboxSettings {
            relay: crate::review::RelayKind::Polling,
        }
    }

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
                depth: 3,
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

    /// How long a claim holds its events (default 30 s): longer than a batch takes from its
    /// claim to its mark, or another relay claims them too and they go out twice (the late
    /// mark is then counted [stale](RelayRound::stale)). A relay that dies holding events lets
    /// them go when this passes.
    ///
    /// In [`run`](Relay::run) a batch waits in line: a claimed batch is published after the
    /// batches claimed before it, and marked after their marks. With a
    /// [pipeline depth](Self::pipeline_depth) of *d*, the lease must cover one claim and *d*
    /// publishes and marks, not one round: the default 30 s, 3 deep, leaves room for batches
    /// whose publish and mark take up to about 10 s together. A publisher that can take
    /// longer (long timeouts, retries inside it) needs a longer lease or a smaller depth.
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

    /// How many batches [`run`](Relay::run) holds at once, each from the start of its claim
    /// to the end of its marks (default 3). With 3, the next batch is claimed and the last one
    /// marked while a batch is published, and a round costs about its slowest step rather
    /// than the sum of the three ([pipelining](Relay#pipelining)); with 2, two of the steps
    /// overlap; 1 runs the rounds one after the other, as [`run_once`](Relay::run_once) does.
    /// More than 3 lets claimed batches wait in line, which evens out a store or a broker
    /// whose answers vary, and asks more of the [lease](Self::lease). Publishes stay one batch
    /// at a time, in order, whatever the depth.
    pub fn pipeline_depth(mut self, batches: usize) -> Self {
        self.config.depth = batches;
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting (`relay batch`, ...): a zero batch, lease, poll
    /// interval, stats interval, quarantine limit or pipeline depth, or a duration longer than
    /// [`MAX_DURATION`](crate::MAX_DURATION) (ten years).
    pub fn build(self) -> Result<Relay<St, P>, ConfigError> {
        let c = &self.config;
        worker::Claiming {
            batch: ("relay batch", c.batch),
            lease: ("relay lease", c.lease),
            timeout: None,
        }
        .check()?;
        ConfigError::at_most_max("relay retry wait", c.retry_after)?;
        ConfigError::positive_at_most_max("relay poll interval", c.poll)?;
        ConfigError::positive_at_most_max("relay stats interval", c.stats_every)?;
        if let Some(retention) = c.retention {
            ConfigError::at_most_max("relay retention", retention)?;
        }
        if c.depth == 0 {
            return Err(ConfigError::new(
                "relay pipeline depth",
                "must be at least 1 batch",
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
            timers: Timers::default(),
        })
    }
}

/// How often a relay sweeps published events, at most.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(60);

impl<St, P> Relay<St, P>
where
    St: OutboxStore,
    P: Service<Event>,
    P::Error: Into<BoxError>,
{
    /// One round: claims a batch, publishes its events (all sent in order, their
    /// acknowledgements awaited together), marks the published ones in one operation, and
    /// each failed one. The three steps run one after the other, whatever the
    /// [pipeline depth](RelayBuilder::pipeline_depth): that is for [`run`](Self::run).
    ///
    /// # Errors
    ///
    /// The store failed (claiming or marking); the events of the round it had not marked are
    /// claimed again when their lease passes.
    pub async fn run_once(&mut self) -> Result<RelayRound, OutboxError> {
        let stages = Stages {
            store: &self.store,
            config: self.config,
            recorder: self.recorder.as_deref(),
        };
        let published = match stages.claim().await {
            Ok(batch) => {
                let mut publishing = Publishing::new(batch);
                std::future::poll_fn(|cx| publishing.poll(&mut self.publisher, cx)).await;
                Ok(publishing.into_published())
            }
            Err(e) => Err(e),
        };
        let (timers, round) = stages.finish(self.timers, published).await;
        self.timers = timers;
        round
    }

    /// Runs rounds until `stop` completes: at once after a full batch; when there was nothing
    /// to do (or the store failed, which is logged), after the poll interval or at the
    /// [wakeup](RelayBuilder::wake_on), whichever comes first.
    ///
    /// While batches come back full, the rounds overlap as a pipeline (see the
    /// [type's docs](Relay#pipelining)): the next batch is claimed, and the last one marked,
    /// while a batch is being published.
    ///
    /// When `stop` completes, the relay claims nothing more, finishes what it holds (the
    /// batches it claimed are published and marked: at most the
    /// [pipeline depth](RelayBuilder::pipeline_depth) of them), and returns: a relay stopped
    /// this way leaves no event held by its lease (unless the store fails meanwhile). An idle
    /// relay returns at once. To stop without waiting for the publishes in flight, drop the
    /// future instead: the events it held come back when their lease passes, and those it had
    /// published and not yet marked go out again.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            if self.pipeline(stop.as_mut()).await == Ended::Stopped {
                return;
            }
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
        }
    }

    /// Runs rounds as a pipeline until a claim comes back short (nothing more to do now), the
    /// store fails (logged), or `stop` completes; returns once every batch it holds is
    /// finished (or, after a store error, left to its lease).
    ///
    /// Each stage works on one batch at a time, in the order of the claims: a claim, a
    /// publish, a finish (the marks, the sweep when due, the report). A claim starts while
    /// fewer than the depth's batches are held, a batch held from the start of its claim to
    /// the end of its finish. One task, no spawned work: every future is polled here.
    async fn pipeline(&mut self, mut stop: Pin<&mut impl Future<Output = ()>>) -> Ended {
        let Relay {
            store,
            publisher,
            config,
            recorder,
            timers,
            ..
        } = self;
        let config = *config;
        let stages = Stages {
            store: &*store,
            config,
            recorder: recorder.as_deref(),
        };
        let mut claiming = std::pin::pin!(empty_slot(|| stages.claim()));
        let mut finishing = std::pin::pin!(empty_slot(
            || stages.finish(*timers, Ok(Published::default()))
        ));
        // Claimed (or the claim's error), waiting for the publisher, in the order claimed.
        let mut claimed: VecDeque<Result<Vec<Claimed>, OutboxError>> = VecDeque::new();
        let mut publishing: Option<Publishing<P::Future>> = None;
        // Published (or a claim's error), waiting for the finish, in the order claimed.
        let mut published: VecDeque<Result<Published, OutboxError>> = VecDeque::new();
        // Batches between the start of their claim and the end of their finish.
        let mut held = 0_usize;
        let mut claim_more = true;
        let mut publish_more = true;
        let mut ended = Ended::Idle;
        std::future::poll_fn(|cx| {
            if ended == Ended::Idle && stop.as_mut().poll(cx).is_ready() {
                ended = Ended::Stopped;
                claim_more = false;
            }
            loop {
                let mut moved = false;
                if let Some(finish) = finishing.as_mut().as_pin_mut()
                    && let Poll::Ready((t, round)) = finish.poll(cx)
                {
                    finishing.set(None);
                    *timers = t;
                    held -= 1;
                    moved = true;
                    if let Err(e) = round {
                        tracing::warn!(
                            error = &e as &dyn std::error::Error,
                            "outbox relay round failed"
                        );
                        // The store is failing: nothing more is claimed or published. A
                        // batch already published is still marked, if the store answers.
                        claim_more = false;
                        publish_more = false;
                    }
                }
                if finishing.is_none()
                    && let Some(next) = published.pop_front()
                {
                    finishing.set(Some(stages.finish(*timers, next)));
                    moved = true;
                }
                if let Some(mut p) = publishing.take() {
                    if p.poll(publisher, cx).is_ready() {
                        published.push_back(Ok(p.into_published()));
                        moved = true;
                    } else {
                        publishing = Some(p);
                    }
                }
                if publishing.is_none() {
                    match claimed.pop_front() {
                        Some(Ok(batch)) if publish_more => {
                            publishing = Some(Publishing::new(batch));
                            moved = true;
                        }
                        // Not published while the store fails: claimed again after the lease.
                        Some(Ok(_)) => {
                            held -= 1;
                            moved = true;
                        }
                        Some(Err(e)) => {
                            published.push_back(Err(e));
                            moved = true;
                        }
                        None => {}
                    }
                }
                if let Some(claim) = claiming.as_mut().as_pin_mut()
                    && let Poll::Ready(out) = claim.poll(cx)
                {
                    claiming.set(None);
                    moved = true;
                    if !matches!(&out, Ok(batch) if batch.len() >= config.batch) {
                        // Short (nothing more to do now) or failed: the burst ends here.
                        claim_more = false;
                    }
                    claimed.push_back(out);
                }
                if claim_more && claiming.is_none() && held < config.depth {
                    claiming.set(Some(stages.claim()));
                    held += 1;
                    moved = true;
                }
                if !moved {
                    break;
                }
            }
            // Every batch is held from its claim to its finish: none held, none in flight.
            if held == 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        ended
    }
}

/// `None`, of the type `stage` returns: the empty slot of a stage's future (never called).
fn empty_slot<F>(_stage: impl FnOnce() -> F) -> Option<F> {
    None
}

/// How a pipeline's burst ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// A claim came back short, or the store failed: wait, then look again.
    Idle,
    /// `stop` completed.
    Stopped,
}

/// What the stages of a round read, borrowed from the relay; copied into each stage's future.
struct Stages<'a, St> {
    store: &'a St,
    config: Config,
    recorder: Option<&'a (dyn Recorder + Send + Sync)>,
}

impl<St> Clone for Stages<'_, St> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<St> Copy for Stages<'_, St> {}

impl<'a, St: OutboxStore> Stages<'a, St> {
    /// Claims a batch.
    fn claim(self) -> impl Future<Output = Result<Vec<Claimed>, OutboxError>> + Send + 'a {
        self.store.claim(self.config.batch, self.config.lease)
    }

    /// Ends a round: marks its batch (or takes its claim's error), sweeps when due, and
    /// reports; returns the timers, updated, with the round.
    async fn finish(
        self,
        mut timers: Timers,
        published: Result<Published, OutboxError>,
    ) -> (Timers, Result<RelayRound, OutboxError>) {
        let mut round = match published {
            Ok(published) => self.mark(published).await,
            Err(e) => Err(e),
        };
        if let (Ok(round), Some(retention)) = (&mut round, self.config.retention) {
            let now = Instant::now();
            if timers
                .last_sweep
                .is_none_or(|last| now.saturating_duration_since(last) >= SWEEP_EVERY)
            {
                timers.last_sweep = Some(now);
                match self.store.sweep(retention).await {
                    Ok(swept) => round.swept = swept,
                    // Published events wait for the next sweep: nothing is lost.
                    Err(e) => {
                        tracing::warn!(error = &e as &dyn std::error::Error, "outbox sweep failed")
                    }
                }
            }
        }
        if let Some(recorder) = self.recorder {
            self.report(recorder, &mut timers, round.as_ref().ok())
                .await;
        }
        (timers, round)
    }

    /// Marks each failed event, then the published ones in one operation.
    async fn mark(self, published: Published) -> Result<RelayRound, OutboxError> {
        let c = self.config;
        let Published { batch, outcomes } = published;
        let mut round = RelayRound {
            claimed: batch.len(),
            ..RelayRound::default()
        };
        let mut published = Vec::with_capacity(batch.len());
        for (claimed, outcome) in batch.into_iter().zip(outcomes) {
            match outcome {
                Ok(()) => published.push(claimed),
                Err(error) => {
                    round.failed = round.failed.saturating_add(1);
                    let id = claimed.event.id().clone();
                    // Kept with its sources: the publisher's error says each cause once.
                    let error = with_sources(&*error);
                    let failures = claimed.failures.saturating_add(1);
                    tracing::info!(event = %id, failures, %error, "outbox publish failed");
                    match self
                        .store
                        .failed(&claimed, &error, c.retry_after, c.quarantine_after)
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

    /// Reports a round (if it claimed anything) and, when due, the store's stats.
    async fn report(
        self,
        recorder: &(dyn Recorder + Send + Sync),
        timers: &mut Timers,
        round: Option<&RelayRound>,
    ) {
        let now = Instant::now();
        let due = timers
            .last_stats
            .is_none_or(|last| now.saturating_duration_since(last) >= self.config.stats_every);
        let stats = if due {
            timers.last_stats = Some(now);
            match self.store.stats().await {
                Ok(stats) => Some(stats),
                Err(e) => {
                    tracing::warn!(
                        error = &e as &dyn std::error::Error,
                        "outbox stats could not be read"
                    );
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
}

/// An error and its sources, `: `-separated: what a failed publish is kept as (the event's
/// last error) and logged as. An error that says its cause once, in its source (the crate's,
/// hyper-util's: `client error (SendRequest)` is only what failed), would otherwise lose it; a
/// source that the message already ends with (an error that also prints its source, as
/// async-nats's do) is not said twice.
pub(super) fn with_sources(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let said = e.to_string();
        if !out.ends_with(&said) {
            out.push_str(": ");
            out.push_str(&said);
        }
        source = e.source();
    }
    out
}

/// A batch after its publish: its events and their outcomes, in the batch's order.
#[derive(Default)]
struct Published {
    batch: Vec<Claimed>,
    outcomes: Vec<Result<(), BoxError>>,
}

/// A batch being published: its events, and each one's publish once sent.
struct Publishing<F> {
    batch: Vec<Claimed>,
    sending: Vec<Sending<F>>,
}

impl<F> Publishing<F> {
    fn new(batch: Vec<Claimed>) -> Self {
        Publishing {
            sending: Vec::with_capacity(batch.len()),
            batch,
        }
    }

    /// Sends every event of the batch, in order, as the publisher is ready, and drives their
    /// acknowledgements together; ready once every publish has finished. The publishes
    /// already sent are driven while the publisher is not ready: a publisher that takes one
    /// event at a time (a concurrency limit of 1) gets its readiness back from them.
    fn poll<P>(&mut self, publisher: &mut P, cx: &mut Context<'_>) -> Poll<()>
    where
        P: Service<Event, Future = F>,
        P::Error: Into<BoxError>,
        F: Future<Output = Result<P::Response, P::Error>>,
    {
        let (batch, sending) = (&self.batch, &mut self.sending);
        while sending.len() < batch.len() {
            match publisher.poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    let event = batch[sending.len()].event.clone();
                    sending.push(Sending::Going(Box::pin(publisher.call(event))));
                }
                Poll::Ready(Err(e)) => {
                    // The publisher is broken: the rest of the batch fails the same way.
                    let why = with_sources(&*e.into());
                    while sending.len() < batch.len() {
                        sending.push(Sending::Done(Err(why.clone().into())));
                    }
                }
                Poll::Pending => break,
            }
        }
        let mut waiting = sending.len() < batch.len();
        for s in sending.iter_mut() {
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
    }

    /// The outcomes, once [`poll`](Self::poll) is ready.
    fn into_published(self) -> Published {
        let outcomes = self
            .sending
            .into_iter()
            .map(|s| match s {
                Sending::Done(out) => out,
                // Every publish finished before the poll returned ready.
                Sending::Going(_) => Err("the publish did not finish".into()),
            })
            .collect();
        Published {
            batch: self.batch,
            outcomes,
        }
    }
}

/// One event's publish within a round.
enum Sending<F> {
    Going(Pin<Box<F>>),
    Done(Result<(), BoxError>),
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

#[cfg(test)]
mod tests {
    use super::with_sources;

    #[derive(Debug, thiserror::Error)]
    enum E {
        #[error("webhook call failed")]
        Once(#[source] std::io::Error),
        #[error("publish failed: {0}")]
        Twice(#[source] std::io::Error),
    }

    #[test]
    fn a_failed_publish_is_kept_with_each_cause_once() {
        let refused = || std::io::Error::other("connection refused");
        assert_eq!(
            with_sources(&E::Once(refused())),
            "webhook call failed: connection refused"
        );
        assert_eq!(
            with_sources(&E::Twice(refused())),
            "publish failed: connection refused"
        );
    }
}
