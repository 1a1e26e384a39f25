//! How the limit moves, and the state every clone of a limit shares.
//!
//! Everything on a request's path is an atomic read-modify-write on a few words, and no lock is
//! taken, so requests on every core go through at once; the limit moves by compare-and-swap, and
//! at most one thread at a time updates a gradient window, the one whose sample closed it.
//!
//! **The count in flight is the shared state's reference count.** An admitted request holds a
//! clone of the `Arc` of the shared state until it ends (its future needs it then anyway);
//! every other holder (the layer, each service it made, their clones) is counted in
//! `holders`. The requests in flight are the strong count less the holders: admission is the
//! one atomic increment of the `Arc`'s clone, release its decrement, where a separate counter
//! would cost two more. A holder is counted a moment after its clone and uncounted a moment
//! before its drop, so a read racing with one counts one request too many, never one too few:
//! the limit may refuse one request early, never admit one too many.

use std::cell::Cell;
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
/// // The default: the gradient, a tolerance of 2, windows of 16 timed answers, one answer in 8
/// // timed.
/// assert_eq!(Algorithm::default(), Gradient::new().tolerance(2.0).window(16).sample_every(8).into());
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
/// Each answer that was not a drop, to a request admitted while the limit was in use (at least
/// half of it in flight), adds `1 / limit`: one per limit's worth of answers. A drop multiplies the limit by the
/// [`backoff`](Aimd::backoff) ratio, at most once for the requests admitted under the same
/// limit (a burst of drops from one overload is one signal, not fifty).
#[derive(Clone, Debug, PartialEq)]
#[must_use]
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

    /// A request whose handler took longer than this counts as a drop. Greater than zero, at
    /// most [`MAX_DURATION`](crate::MAX_DURATION). Without one (the default), only the handler's `429`, `503` and `504` and a missed
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
#[must_use]
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

    /// Timed answers per window: 1 to 65535 (default 16).
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
    /// Where the refusal's problem type points.
    pub(super) problems: crate::server::problem::Problems,
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
                if let Some(target) = a.latency {
                    ConfigError::positive_at_most_max("aimd latency target", target)?;
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
                if g.window == 0 || g.window > u32::from(u16::MAX) {
                    return bad("gradient window", "must be between 1 and 65535 answers");
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

/// What an admitted request holds besides its reference: given back when it ends.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ticket {
    pub(super) partition: Option<u32>,
    /// Whether this request's answer is timed.
    pub(super) timed: bool,
    /// AIMD: the limit was in use when this request was admitted (at least half of it in
    /// flight), so that its answer grows the limit.
    pub(super) grows: bool,
    /// Requests in flight once this one was admitted.
    pub(super) in_flight: u32,
    pub(super) epoch: u64,
}

/// One sample in [`Shared::window_acc`]'s count.
const ONE_SAMPLE: u64 = 1 << 48;
/// The sum of latencies in [`Shared::window_acc`].
const SUM_MASK: u64 = ONE_SAMPLE - 1;

thread_local! {
    /// Requests this thread may admit before it times the next answer (one in `sample_every`
    /// on each thread), without a shared counter.
    static ARRIVALS: Cell<u32> = const { Cell::new(0) };
}

/// The layer's and its services' hold on the shared state: counted in `holders`, so that the
/// rest of the `Arc`'s strong count is the requests in flight.
pub(crate) struct Handle(Arc<Shared>);

impl Handle {
    pub(super) fn new(config: Config) -> Self {
        Handle(Arc::new(Shared::new(config)))
    }
}

impl Clone for Handle {
    fn clone(&self) -> Self {
        let arc = Arc::clone(&self.0);
        arc.holders.fetch_add(1, AcqRel);
        Handle(arc)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Uncounted first, released after (when the field drops): a racing read counts one
        // request too many, never one too few.
        self.0.holders.fetch_sub(1, AcqRel);
    }
}

impl std::ops::Deref for Handle {
    type Target = Arc<Shared>;

    fn deref(&self) -> &Arc<Shared> {
        &self.0
    }
}

/// The state every clone of one limit shares.
pub(crate) struct Shared {
    pub(super) config: Config,
    /// The strong references that are not requests in flight: the layer, its services, their
    /// clones ([`Handle`]s).
    holders: AtomicU64,
    /// The limit as an integer: what admission reads.
    cap: AtomicU64,
    /// The limit as a real number (`f64` bits): what the algorithm moves.
    estimate: AtomicU64,
    /// AIMD: bumped by each decrease, so that the requests admitted before it cannot decrease
    /// again.
    epoch: AtomicU64,
    /// Gradient: the timed answers of the current window (the high 16 bits) and the sum of
    /// their latencies in microseconds (the low 48), added with one atomic operation.
    window_acc: AtomicU64,
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
            holders: AtomicU64::new(1),
            cap: AtomicU64::new(u64::from(initial)),
            estimate: AtomicU64::new(f64::from(initial).to_bits()),
            epoch: AtomicU64::new(0),
            window_acc: AtomicU64::new(0),
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

    /// Requests in flight now: the strong references that are not [`Handle`]s.
    pub(super) fn in_flight(this: &Arc<Self>) -> u32 {
        let strong = Arc::strong_count(this) as u64;
        let n = strong.saturating_sub(this.holders.load(Acquire));
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Requests refused so far for `reason`.
    pub(super) fn refused(&self, reason: RefusalReason) -> u64 {
        self.refused[reason_index(reason)].load(Relaxed)
    }

    /// Whether a missed deadline teaches the algorithm anything (AIMD's drops; the gradient
    /// reads latency only).
    #[inline]
    pub(super) fn learns_from_deadlines(&self) -> bool {
        matches!(self.config.algorithm, Algorithm::Aimd(_))
    }

    /// Whether the answer to the request admitted now is timed.
    #[inline]
    fn times(&self) -> bool {
        match &self.config.algorithm {
            Algorithm::Gradient(g) if g.sample_every <= 1 => true,
            // A countdown, not a modulo: no division on the path.
            Algorithm::Gradient(g) => ARRIVALS.with(|left| match left.get() {
                0 => {
                    left.set(g.sample_every - 1);
                    true
                }
                n => {
                    left.set(n - 1);
                    false
                }
            }),
            Algorithm::Aimd(a) => a.latency.is_some(),
        }
    }

    /// Admits a request in `partition`, handing back its reference (which counts it in flight
    /// until dropped) and ticket, or says why not, with the request's criticality.
    ///
    /// The criticality is asked for only when the limit is nearly full: below the least
    /// critical level's share every request gets in, whatever it says, and most requests of a
    /// server that is not overloaded never have their headers read for it.
    #[inline]
    pub(super) fn acquire(
        this: &Arc<Self>,
        partition: Option<u32>,
        criticality: impl FnOnce() -> Criticality,
    ) -> Result<(Arc<Self>, Ticket), (RefusalReason, Criticality)> {
        let epoch = this.epoch.load(Relaxed);
        let cap = this.cap.load(Relaxed);
        // The admission: one more strong reference, counted before it is read.
        let held = Arc::clone(this);
        let now = u64::from(Shared::in_flight(this));
        let before = now.saturating_sub(1);
        let part = partition.and_then(|i| this.partitions.get(i as usize));
        let part_before = part.map(|p| p.in_flight.fetch_add(1, AcqRel));
        let ticket = Ticket {
            partition,
            timed: this.times(),
            // AIMD grows a limit in use: at least half of it in flight.
            grows: this.grows_when_answered() && now.saturating_mul(2).saturating_add(2) >= cap,
            in_flight: u32::try_from(now).unwrap_or(u32::MAX),
            epoch,
        };
        // The least critical level's share (the shares rise with criticality).
        if before < Shared::allowed(cap, this.config.shares[0]) {
            return Ok((held, ticket));
        }
        let criticality = criticality();
        if before < Shared::allowed(cap, this.config.shares[criticality.rank()]) {
            return Ok((held, ticket));
        }
        if let (Some(p), Some(n)) = (part, part_before) {
            // A partition below its reserved share gets in even when the limit is full.
            let reserved = (cap as f64 * p.config.share).ceil() as u64;
            if n < reserved {
                return Ok((held, ticket));
            }
        }
        drop(held);
        if let Some(p) = part {
            p.in_flight.fetch_sub(1, AcqRel);
        }
        let reason = if before < cap {
            RefusalReason::Shed
        } else {
            RefusalReason::Limit
        };
        Err((reason, criticality))
    }

    /// How many requests a level whose share is `permille` thousandths may have in flight
    /// under a limit of `cap`: at least one.
    #[inline]
    fn allowed(cap: u64, permille: u64) -> u64 {
        (cap * permille / 1000).max(1)
    }

    /// Whether an ordinary answer may grow the limit (AIMD), so that the ticket says it.
    #[inline]
    fn grows_when_answered(&self) -> bool {
        matches!(self.config.algorithm, Algorithm::Aimd(_))
    }

    /// Gives back what `ticket` took besides its reference (which its holder drops).
    #[inline]
    pub(super) fn release(&self, ticket: Ticket) {
        if let Some(p) = ticket
            .partition
            .and_then(|i| self.partitions.get(i as usize))
        {
            p.in_flight.fetch_sub(1, AcqRel);
        }
    }

    /// Counts and reports a refusal.
    pub(crate) fn refuse(
        this: &Arc<Self>,
        reason: RefusalReason,
        criticality: Criticality,
        partition: Option<u32>,
    ) {
        this.refused[reason_index(reason)].fetch_add(1, Relaxed);
        if let Some(recorder) = this.config.recorder.as_ref().filter(|r| r.enabled()) {
            let partition = partition
                .and_then(|i| this.partitions.get(i as usize))
                .map(|p| p.config.name.clone());
            recorder.record_limit(&LimitEvent::new(
                LimitEventKind::Refused {
                    reason,
                    criticality,
                    partition,
                },
                this.limit(),
                Shared::in_flight(this),
            ));
        }
    }

    /// Learns from an answer: `rtt` is how long the handler took (when measured), `dropped`
    /// whether the answer was a drop.
    pub(super) fn learn(this: &Arc<Self>, ticket: Ticket, rtt: Option<Duration>, dropped: bool) {
        match &this.config.algorithm {
            Algorithm::Aimd(a) => {
                let dropped = dropped || rtt.zip(a.latency).is_some_and(|(r, t)| r > t);
                if dropped {
                    // One decrease per epoch: the requests admitted under the old limit do not
                    // cut it again.
                    if this
                        .epoch
                        .compare_exchange(ticket.epoch, ticket.epoch + 1, AcqRel, Relaxed)
                        .is_ok()
                    {
                        let backoff = a.backoff;
                        Shared::move_limit(this, |l| l * backoff);
                    }
                } else if ticket.grows {
                    // In use: grow by one per limit's worth of answers.
                    Shared::move_limit(this, |l| l + 1.0 / l);
                }
            }
            Algorithm::Gradient(g) => {
                let Some(rtt) = rtt else { return };
                // At most 2^32 µs (71 minutes) a sample, at most 2^16 samples a window: the
                // sum fits in 48 bits.
                let micros = u64::try_from(rtt.as_micros())
                    .unwrap_or(u64::MAX)
                    .clamp(1, u64::from(u32::MAX));
                this.window_peak
                    .fetch_max(u64::from(ticket.in_flight), AcqRel);
                let acc = this.window_acc.fetch_add(ONE_SAMPLE | micros, AcqRel);
                let n = (acc >> 48) + 1;
                // `fetch_add` hands out each count once: one thread closes each window, with
                // every sample added by then (a few more than the window, if others raced).
                if n == u64::from(g.window) {
                    let acc = this.window_acc.swap(0, AcqRel);
                    let (count, sum) = ((acc >> 48).max(1), acc & SUM_MASK);
                    Shared::close_window(this, g, 1000.0 * sum as f64 / count as f64);
                }
            }
        }
    }

    /// The gradient's update at the end of a window whose mean latency was `short`
    /// nanoseconds.
    fn close_window(this: &Arc<Self>, g: &Gradient, short: f64) {
        let short = short.max(1.0);
        let windows = this.windows.fetch_add(1, AcqRel) + 1;
        let mut long = f64::from_bits(this.long_rtt.load(Acquire));
        let refused = this.refused[0].load(Relaxed) + this.refused[1].load(Relaxed);
        let saturated = this.refused_before.swap(refused, AcqRel) != refused;
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
        this.long_rtt.store(long.to_bits(), Release);
        let peak = this.window_peak.swap(0, AcqRel) as f64;
        let (tolerance, smoothing) = (g.tolerance, g.smoothing);
        Shared::move_limit(this, |l| {
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
    fn move_limit(this: &Arc<Self>, f: impl Fn(f64) -> f64) {
        let (min, max) = (f64::from(this.config.min), f64::from(this.config.max));
        let mut current = this.estimate.load(Acquire);
        let next = loop {
            let next = f(f64::from_bits(current)).clamp(min, max);
            let next = if next.is_finite() { next } else { min };
            match this
                .estimate
                .compare_exchange_weak(current, next.to_bits(), AcqRel, Acquire)
            {
                Ok(_) => break next,
                Err(seen) => current = seen,
            }
        };
        let cap = next.floor() as u64;
        let from = this.cap.swap(cap, AcqRel);
        if from != cap
            && let Some(recorder) = this.config.recorder.as_ref().filter(|r| r.enabled())
        {
            recorder.record_limit(&LimitEvent::new(
                LimitEventKind::Changed {
                    from: u32::try_from(from).unwrap_or(u32::MAX),
                },
                u32::try_from(cap).unwrap_or(u32::MAX),
                Shared::in_flight(this),
            ));
        }
    }

    /// Reports the limit and the requests in flight now.
    pub(super) fn report(this: &Arc<Self>) {
        if let Some(recorder) = this.config.recorder.as_ref().filter(|r| r.enabled()) {
            recorder.record_limit(&LimitEvent::new(
                LimitEventKind::Snapshot,
                this.limit(),
                Shared::in_flight(this),
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
