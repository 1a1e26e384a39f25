//! How the limit moves, and the state every clone of a limit shares.
//!
//! Everything on a request's path is an atomic read-modify-write on a few words: admission is a
//! `fetch_add` on the count in flight (undone if over the limit), release a `fetch_sub`, and the
//! limit moves by compare-and-swap. No lock is taken, so requests on every core go through at
//! once; at most one thread at a time updates a gradient window, the one whose sample closed
//! it.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;
use std::time::Duration;

use crate::evidence::{LimitEvent, LimitEventKind, Recorder, RefusalReason};
use crate::sync::AtomicU64;
use crate::{ConfigError, Criticality, Envelope};

/// How an [`AdaptiveLimitLayer`](super::AdaptiveLimitLayer) moves its limit.
///
/// * [`Gradient`] (the default) watches latency: when the requests of the last window took
///   longer than the long-run average by more than a tolerance, requests are queueing
///   somewhere, and the limit shrinks in proportion; otherwise it grows by a small queue
///   allowance. It needs no target and adapts to a service whose normal latency changes.
/// * [`Aimd`] grows the limit by one for each limit's worth of answers and cuts it by a ratio
///   when a request is *dropped*: answered `429`, `503` or `504` by the handler, finished after
///   its deadline (its caller had given up), or slower than an optional latency target. It
///   reads the clock only for a request that has a deadline, or with a latency target.
///
/// ```
/// use std::time::Duration;
/// use surely::server::limit::{Aimd, Algorithm, Gradient};
///
/// let gradient = Algorithm::from(Gradient::new().tolerance(2.0));
/// let aimd = Algorithm::from(Aimd::new().backoff(0.8).latency_target(Duration::from_millis(250)));
/// # let _ = (gradient, aimd);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Algorithm {
    /// Additive increase, multiplicative decrease on drops.
    Aimd(Aimd),
    /// The latency gradient.
    Gradient(Gradient),
}

impl Default for Algorithm {
    fn default() -> Self {
        Algorithm::Gradient(Gradient::new())
    }
}

impl From<Aimd> for Algorithm {
    fn from(a: Aimd) -> Self {
        Algorithm::Aimd(a)
    }
}

impl From<Gradient> for Algorithm {
    fn from(g: Gradient) -> Self {
        Algorithm::Gradient(g)
    }
}

/// Additive increase, multiplicative decrease: TCP's congestion window, applied to a server's
/// concurrency.
///
/// Each answer that was not a drop, while the limit is in use (at least half of it in flight),
/// adds `1 / limit`: one per limit's worth of answers. A drop multiplies the limit by the
/// [`backoff`](Aimd::backoff) ratio, at most once for the requests admitted under the same
/// limit (a burst of drops from one overload is one signal, not fifty).
#[derive(Clone, Debug, PartialEq)]
pub struct Aimd {
    pub(super) backoff: f64,
    pub(super) latency: Option<Duration>,
}

impl Aimd {
    /// A backoff ratio of 0.9 and no latency target.
    pub fn new() -> Self {
        Aimd {
            backoff: 0.9,
            latency: None,
        }
    }

    /// What a drop multiplies the limit by: in `[0.5, 1)` (default 0.9).
    pub fn backoff(mut self, ratio: f64) -> Self {
        self.backoff = ratio;
        self
    }

    /// A request whose handler took longer than this counts as a drop. Must be greater than
    /// zero. Without one (the default), only the handler's `429`, `503` and `504` and a missed
    /// deadline are drops.
    pub fn latency_target(mut self, target: Duration) -> Self {
        self.latency = Some(target);
        self
    }
}

impl Default for Aimd {
    fn default() -> Self {
        Self::new()
    }
}

/// The latency gradient: compare the last window's latency with the long-run latency.
///
/// Every [`window`](Gradient::window) answers, the mean latency of the window (`short`) is
/// compared with an exponential average over about [`long_window`](Gradient::long_window)
/// windows (`long`):
///
/// ```text
/// gradient = clamp(tolerance × long / short, 0.5, 1)
/// limit'   = limit × gradient + √limit
/// limit    = limit × (1 − smoothing) + limit' × smoothing
/// ```
///
/// While latency stays within the tolerance the gradient is 1 and the limit grows by its
/// square root (a small queue); when requests start waiting, the gradient falls below 1 and the
/// limit shrinks until they no longer do. A limit that is not in use (never more than half of it
/// in flight during the window) does not grow. When the long-run average is more than twice the last window's, it is
/// pulled down (after a slow period, the service is fast again). A window in which the limit
/// refused requests moves the long-run average ten times slower than others: under a long
/// overload, the latency the limit itself holds the service at would otherwise become the
/// norm it compares with, and latency would creep up.
///
/// Latency is a sample: one answer in [`sample_every`](Gradient::sample_every) is timed
/// (counted over every request the limit admits), since timing one costs two reads of
/// the clock, more than everything else the limit does to a request. Samples are added without
/// a lock, so a window's mean may count a sample that raced with its end in the next window
/// instead: an estimate of a mean, not an exact one.
#[derive(Clone, Debug, PartialEq)]
pub struct Gradient {
    pub(super) tolerance: f64,
    pub(super) smoothing: f64,
    pub(super) window: u32,
    pub(super) long_window: u32,
    pub(super) sample_every: u32,
}

impl Gradient {
    /// A tolerance of 2, a smoothing of 0.2, windows of 16 timed answers, one answer in 8
    /// timed, a long-run average over about 600 windows.
    pub fn new() -> Self {
        Gradient {
            tolerance: 2.0,
            smoothing: 0.2,
            window: 16,
            long_window: 600,
            sample_every: 8,
        }
    }

    /// How much slower than the long-run latency a window may be before the limit shrinks:
    /// at least 1 (default 2).
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// How far each window moves the limit towards its new value: in `(0, 1]` (default 0.2).
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = smoothing;
        self
    }

    /// Timed answers per window: at least 1 (default 16).
    pub fn window(mut self, answers: u32) -> Self {
        self.window = answers;
        self
    }

    /// Times one answer in `n`: at least 1 (default 8; 1 times every answer).
    pub fn sample_every(mut self, n: u32) -> Self {
        self.sample_every = n;
        self
    }

    /// Windows the long-run average spans: at least 1 (default 600).
    pub fn long_window(mut self, windows: u32) -> Self {
        self.long_window = windows;
        self
    }
}

impl Default for Gradient {
    fn default() -> Self {
        Self::new()
    }
}

/// A predicate that puts a request in a partition.
pub(super) type Matcher = Arc<dyn Fn(&dyn Envelope) -> bool + Send + Sync>;

/// A partition as configured.
#[derive(Clone)]
pub(super) struct PartitionConfig {
    pub(super) name: Arc<str>,
    pub(super) share: f64,
    pub(super) matches: Matcher,
}

/// The settings of a limit, validated.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) algorithm: Algorithm,
    pub(super) initial: u32,
    pub(super) min: u32,
    pub(super) max: u32,
    /// The share of the limit each criticality may fill, in thousandths, least critical first.
    pub(super) shares: [u64; 4],
    pub(super) partitions: Vec<PartitionConfig>,
    pub(super) retry_after: Duration,
    pub(super) trust: Option<Matcher>,
    pub(super) recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |what, why| Err(ConfigError::new(what, why));
        if self.min == 0 {
            return bad("limit minimum", "must be at least 1");
        }
        if self.max < self.min {
            return bad("limit maximum", "must not be less than the minimum");
        }
        if self.initial < self.min || self.initial > self.max {
            return bad(
                "initial limit",
                "must be between the minimum and the maximum",
            );
        }
        if self.retry_after.is_zero() || self.retry_after > Duration::from_secs(3600) {
            return bad(
                "limit retry-after",
                "must be greater than zero and at most an hour",
            );
        }
        if self.shares.windows(2).any(|w| w[0] > w[1]) || self.shares[2] < 1000 {
            return bad(
                "criticality shares",
                "must not fall as criticality rises, and `critical` must fill the whole limit (1.0)",
            );
        }
        if self.shares[0] == 0 {
            return bad("criticality shares", "must be greater than zero");
        }
        let mut total = 0.0;
        for (i, p) in self.partitions.iter().enumerate() {
            if p.name.is_empty() {
                return bad("limit partition", "needs a name");
            }
            if self.partitions[..i].iter().any(|q| q.name == p.name) {
                return bad("limit partition", "names must be unique");
            }
            if !(p.share > 0.0 && p.share <= 1.0) {
                return bad("limit partition share", "must be in (0, 1]");
            }
            total += p.share;
        }
        if total > 1.0 + 1e-9 {
            return bad(
                "limit partition shares",
                "must not add up to more than 1 (the whole limit)",
            );
        }
        match &self.algorithm {
            Algorithm::Aimd(a) => {
                if !(a.backoff >= 0.5 && a.backoff < 1.0) {
                    return bad("aimd backoff", "must be in [0.5, 1)");
                }
                if a.latency.is_some_and(|l| l.is_zero()) {
                    return bad("aimd latency target", "must be greater than zero");
                }
            }
            Algorithm::Gradient(g) => {
                if !(g.tolerance >= 1.0 && g.tolerance.is_finite()) {
                    return bad(
                        "gradient tolerance",
                        "must be a finite number of at least 1",
                    );
                }
                if !(g.smoothing > 0.0 && g.smoothing <= 1.0) {
                    return bad("gradient smoothing", "must be in (0, 1]");
                }
                if g.window == 0 {
                    return bad("gradient window", "must be at least one answer");
                }
                if g.long_window == 0 {
                    return bad("gradient long window", "must be at least one window");
                }
                if g.sample_every == 0 {
                    return bad(
                        "gradient sampling",
                        "must time at least one answer in n (n ≥ 1)",
                    );
                }
            }
        }
        Ok(())
    }
}

/// A partition's live count.
pub(super) struct Partition {
    pub(super) config: PartitionConfig,
    in_flight: AtomicU64,
}

/// What an admitted request holds: given back when it ends.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ticket {
    pub(super) partition: Option<u32>,
    pub(super) epoch: u64,
    /// Requests in flight once this one was admitted.
    pub(super) in_flight: u64,
    /// Whether this request's answer is timed.
    pub(super) timed: bool,
}

/// One arrival in the word of [`Shared::flight`]: arrivals count in its high half.
const ARRIVAL: u64 = 1 << 32;
/// The requests in flight, in its low half.
const IN_FLIGHT: u64 = ARRIVAL - 1;

/// The state every clone of one limit shares.
pub(crate) struct Shared {
    pub(super) config: Config,
    /// Requests in flight (the low 32 bits) and arrivals (the high 32, wrapping), in one word
    /// so that admission counts both with one atomic addition: the arrivals say which answers
    /// the gradient times.
    flight: AtomicU64,
    /// The limit as an integer: what admission reads.
    cap: AtomicU64,
    /// The limit as a real number (`f64` bits): what the algorithm moves.
    estimate: AtomicU64,
    /// AIMD: bumped by each decrease, so that the requests admitted before it cannot decrease
    /// again.
    epoch: AtomicU64,
    /// Gradient: answers in the current window, and their latencies' sum in nanoseconds.
    samples: AtomicU64,
    rtt_sum: AtomicU64,
    /// Gradient: the long-run latency (`f64` bits, nanoseconds) and the windows seen. Written
    /// only by the thread that closes a window.
    long_rtt: AtomicU64,
    windows: AtomicU64,
    /// Gradient: the most requests in flight at once in the current window.
    window_peak: AtomicU64,
    /// Gradient: the refusals (limit and shed) counted when the last window closed.
    refused_before: AtomicU64,
    refused: [AtomicU64; 3],
    pub(super) partitions: Box<[Partition]>,
}

/// What the handler's answer says about load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Signal {
    /// Answered: a latency sample, not a drop.
    Answered,
    /// The handler said it was overloaded (`429`, `503`, `504`).
    Overloaded,
    /// Nothing to learn (the handler failed, or was dropped).
    Ignore,
}

impl Shared {
    pub(super) fn new(config: Config) -> Self {
        let partitions = config
            .partitions
            .iter()
            .map(|p| Partition {
                config: p.clone(),
                in_flight: AtomicU64::new(0),
            })
            .collect();
        let initial = config.initial;
        Shared {
            flight: AtomicU64::new(0),
            cap: AtomicU64::new(u64::from(initial)),
            estimate: AtomicU64::new(f64::from(initial).to_bits()),
            epoch: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            rtt_sum: AtomicU64::new(0),
            long_rtt: AtomicU64::new(0f64.to_bits()),
            windows: AtomicU64::new(0),
            window_peak: AtomicU64::new(0),
            refused_before: AtomicU64::new(0),
            refused: Default::default(),
            partitions,
            config,
        }
    }

    /// The limit now.
    pub(super) fn limit(&self) -> u32 {
        u32::try_from(self.cap.load(Relaxed)).unwrap_or(u32::MAX)
    }

    /// Requests in flight now.
    pub(super) fn in_flight(&self) -> u32 {
        u32::try_from(self.flight.load(Relaxed) & IN_FLIGHT).unwrap_or(u32::MAX)
    }

    /// Requests refused so far for `reason`.
    pub(super) fn refused(&self, reason: RefusalReason) -> u64 {
        self.refused[reason_index(reason)].load(Relaxed)
    }

    /// Whether the answer to the `arrival`-th request is timed.
    #[inline]
    fn times(&self, arrival: u64) -> bool {
        match &self.config.algorithm {
            Algorithm::Gradient(g) => arrival % u64::from(g.sample_every) == 0,
            Algorithm::Aimd(a) => a.latency.is_some(),
        }
    }

    /// Admits a request of `criticality` in `partition`, or says why not.
    #[inline]
    pub(super) fn acquire(
        &self,
        criticality: Criticality,
        partition: Option<u32>,
    ) -> Result<Ticket, RefusalReason> {
        let epoch = self.epoch.load(Relaxed);
        let cap = self.cap.load(Relaxed);
        let allowed = (cap * self.config.shares[criticality.rank()] / 1000).max(1);
        let word = self.flight.fetch_add(ARRIVAL + 1, AcqRel);
        let before = word & IN_FLIGHT;
        let part = partition.and_then(|i| self.partitions.get(i as usize));
        let part_before = part.map(|p| p.in_flight.fetch_add(1, AcqRel));
        let ticket = Ticket {
            partition,
            epoch,
            in_flight: before + 1,
            timed: self.times(word >> 32),
        };
        if before < allowed {
            return Ok(ticket);
        }
        if let (Some(p), Some(n)) = (part, part_before) {
            // A partition below its reserved share gets in even when the limit is full.
            let reserved = (cap as f64 * p.config.share).ceil() as u64;
            if n < reserved {
                return Ok(ticket);
            }
        }
        self.flight.fetch_sub(1, AcqRel);
        if let Some(p) = part {
            p.in_flight.fetch_sub(1, AcqRel);
        }
        Err(if before < cap {
            RefusalReason::Shed
        } else {
            RefusalReason::Limit
        })
    }

    /// Gives back what `ticket` took.
    #[inline]
    pub(super) fn release(&self, ticket: Ticket) {
        self.flight.fetch_sub(1, AcqRel);
        if let Some(p) = ticket
            .partition
            .and_then(|i| self.partitions.get(i as usize))
        {
            p.in_flight.fetch_sub(1, AcqRel);
        }
    }

    /// Counts and reports a refusal.
    pub(crate) fn refuse(
        &self,
        reason: RefusalReason,
        criticality: Criticality,
        partition: Option<u32>,
    ) {
        self.refused[reason_index(reason)].fetch_add(1, Relaxed);
        if let Some(recorder) = &self.config.recorder {
            let partition = partition
                .and_then(|i| self.partitions.get(i as usize))
                .map(|p| p.config.name.clone());
            recorder.record_limit(&LimitEvent::new(
                LimitEventKind::Refused {
                    reason,
                    criticality,
                    partition,
                },
                self.limit(),
                self.in_flight(),
            ));
        }
    }

    /// Learns from an answer: `rtt` is how long the handler took (when measured), `dropped`
    /// whether the answer was a drop.
    pub(super) fn learn(&self, ticket: Ticket, rtt: Option<Duration>, dropped: bool) {
        match &self.config.algorithm {
            Algorithm::Aimd(a) => {
                let dropped = dropped || rtt.zip(a.latency).is_some_and(|(r, t)| r > t);
                if dropped {
                    // One decrease per epoch: the requests admitted under the old limit do not
                    // cut it again.
                    if self
                        .epoch
                        .compare_exchange(ticket.epoch, ticket.epoch + 1, AcqRel, Relaxed)
                        .is_ok()
                    {
                        let backoff = a.backoff;
                        self.move_limit(|l| l * backoff);
                    }
                } else if u64::from(self.in_flight()) * 2 + 2 >= self.cap.load(Relaxed) {
                    // In use: grow by one per limit's worth of answers.
                    self.move_limit(|l| l + 1.0 / l);
                }
            }
            Algorithm::Gradient(g) => {
                let Some(rtt) = rtt else { return };
                let nanos = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX).max(1);
                self.window_peak.fetch_max(ticket.in_flight, AcqRel);
                self.rtt_sum.fetch_add(nanos, AcqRel);
                let n = self.samples.fetch_add(1, AcqRel) + 1;
                let window = u64::from(g.window);
                // `fetch_add` hands out each count once: one thread closes each window.
                if n == window {
                    let sum = self.rtt_sum.swap(0, AcqRel);
                    self.samples.fetch_sub(window, AcqRel);
                    self.close_window(g, sum as f64 / window as f64);
                }
            }
        }
    }

    /// The gradient's update at the end of a window whose mean latency was `short`
    /// nanoseconds.
    fn close_window(&self, g: &Gradient, short: f64) {
        let short = short.max(1.0);
        let windows = self.windows.fetch_add(1, AcqRel) + 1;
        let mut long = f64::from_bits(self.long_rtt.load(Acquire));
        let refused = self.refused[0].load(Relaxed) + self.refused[1].load(Relaxed);
        let saturated = self.refused_before.swap(refused, AcqRel) != refused;
        // A plain mean over the first ten windows, then an exponential average. A window in
        // which the limit refused requests is the limit's own doing, not the service's normal
        // latency: it moves the average ten times slower, or a long overload would teach the
        // limit that queueing is normal.
        let weight = if windows <= 10 {
            1.0 / windows as f64
        } else if saturated {
            0.2 / (f64::from(g.long_window) + 1.0)
        } else {
            2.0 / (f64::from(g.long_window) + 1.0)
        };
        long += (short - long) * weight;
        if long > 2.0 * short {
            // The service got faster: do not wait hundreds of windows to believe it.
            long = (long * 0.95).max(short);
        }
        self.long_rtt.store(long.to_bits(), Release);
        let peak = self.window_peak.swap(0, AcqRel) as f64;
        let (tolerance, smoothing) = (g.tolerance, g.smoothing);
        self.move_limit(|l| {
            let gradient = (tolerance * long / short).clamp(0.5, 1.0);
            if gradient >= 1.0 && peak < l / 2.0 {
                // Not in use: nothing says it could take more.
                return l;
            }
            let target = l * gradient + l.sqrt();
            l * (1.0 - smoothing) + target * smoothing
        });
    }

    /// Moves the limit by `f`, within the minimum and the maximum, and reports a change of its
    /// integer value.
    fn move_limit(&self, f: impl Fn(f64) -> f64) {
        let (min, max) = (f64::from(self.config.min), f64::from(self.config.max));
        let mut current = self.estimate.load(Acquire);
        let next = loop {
            let next = f(f64::from_bits(current)).clamp(min, max);
            let next = if next.is_finite() { next } else { min };
            match self
                .estimate
                .compare_exchange_weak(current, next.to_bits(), AcqRel, Acquire)
            {
                Ok(_) => break next,
                Err(seen) => current = seen,
            }
        };
        let cap = next.floor() as u64;
        let from = self.cap.swap(cap, AcqRel);
        if from != cap {
            if let Some(recorder) = &self.config.recorder {
                recorder.record_limit(&LimitEvent::new(
                    LimitEventKind::Changed {
                        from: u32::try_from(from).unwrap_or(u32::MAX),
                    },
                    u32::try_from(cap).unwrap_or(u32::MAX),
                    self.in_flight(),
                ));
            }
        }
    }

    /// Reports the limit and the requests in flight now.
    pub(super) fn report(&self) {
        if let Some(recorder) = &self.config.recorder {
            recorder.record_limit(&LimitEvent::new(
                LimitEventKind::Snapshot,
                self.limit(),
                self.in_flight(),
            ));
        }
    }
}

fn reason_index(reason: RefusalReason) -> usize {
    match reason {
        RefusalReason::Limit => 0,
        RefusalReason::Shed => 1,
        RefusalReason::Deadline => 2,
    }
}
