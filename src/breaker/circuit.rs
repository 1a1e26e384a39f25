//! The shared breaker: its state word, its window, its configuration.

use std::fmt;
#[cfg(surely_loom)]
use std::sync::atomic::Ordering::Release;
use std::sync::atomic::{Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::window::{Window, WindowCounts};
use super::BreakerState;
use super::{
    DEFAULT_BREAK, DEFAULT_BREAK_MULTIPLIER, DEFAULT_FAILURE_RATIO, DEFAULT_HALF_OPEN_PROBES,
    DEFAULT_JITTER, DEFAULT_MAX_BREAK, DEFAULT_MIN_THROUGHPUT, DEFAULT_MIN_TIMEOUT_EVIDENCE,
    DEFAULT_WINDOW_CALLS,
};
use crate::classify::{Classification, DeliveryPhase};
use crate::error::CircuitOpen;
use crate::record::{BreakerEvent, BreakerEventKind, TransitionReason};
use crate::record::{Recorder, TracingRecorder};
#[cfg(surely_loom)]
use crate::sync::mutation;
use crate::sync::{now as clock, AtomicU64, Mutex, MutexGuard};
use crate::time::later;
use crate::{ConfigError, Error};

/// The most half-open probes a breaker may allow.
const MAX_HALF_OPEN_PROBES: u32 = 1000;
/// The largest count window: a byte a call, so a megabyte at most.
const MAX_COUNT_WINDOW: u32 = 1_000_000;

/// The sliding window over which the failure rate is measured.
///
/// A count window costs two atomic operations per call; a time window one compare-and-swap
/// and a clock read, which on some virtual machines costs more than the rest of the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlidingWindow {
    /// The last `n` calls, however old (the default: the last 100): a ring of `n` bytes, `n`
    /// from 1 to 1 000 000.
    Count(u32),
    /// The calls of the last `length`, counted in `buckets` slices (the oldest slice leaves the
    /// window whole, so the window slides by `length / buckets`). Polly's sampling duration is
    /// such a window (30 s), Hystrix's too (10 s in 10 buckets).
    Time {
        /// How far back the window reaches: at least 1 ms per bucket, at most
        /// [`MAX_DURATION`](crate::MAX_DURATION).
        length: Duration,
        /// How many slices it is counted in.
        buckets: u32,
    },
}

impl Default for SlidingWindow {
    /// The last 100 calls.
    fn default() -> Self {
        SlidingWindow::Count(DEFAULT_WINDOW_CALLS)
    }
}

/// A circuit breaker's state, shared by every service that uses it: clones share it (it is an
/// `Arc` inside), so one breaker can guard several services that reach the same dependency.
/// See the [module docs](super) for how it decides.
///
/// ```
/// use std::time::Duration;
/// use surely::breaker::{BreakerState, CircuitBreaker, SlidingWindow};
///
/// let breaker = CircuitBreaker::builder()
///     .name("payments")
///     .failure_ratio(0.5)
///     .window(SlidingWindow::Count(50))
///     .min_throughput(20)
///     .break_duration(Duration::from_secs(5))
///     .build()
///     .unwrap();
/// assert_eq!(breaker.state(), BreakerState::Closed);
/// let shared = breaker.clone();
/// breaker.isolate();
/// assert_eq!(shared.state(), BreakerState::Isolated);
/// shared.reset();
/// assert_eq!(breaker.state(), BreakerState::Closed);
/// ```
#[derive(Clone)]
pub struct CircuitBreaker {
    shared: Arc<Shared>,
}

struct Config {
    name: Option<Arc<str>>,
    failure_ratio: f64,
    min_throughput: u32,
    slow_call: Option<Duration>,
    break_duration: Duration,
    break_multiplier: f64,
    max_break: Duration,
    jitter: f64,
    probes: u32,
    min_timeout_evidence: Duration,
}

struct Shared {
    // The state word: generation | probe successes | probes admitted | state. Hot operations
    // (admitting a probe, counting a probe's success) are compare-and-swaps that keep the
    // generation; transitions happen under `slow` and start a new generation, so a result
    // from an earlier state can never count in a later one.
    word: AtomicU64,
    // The end of the current break, in nanoseconds after `epoch`.
    open_until: AtomicU64,
    epoch: Instant,
    window: Window,
    config: Config,
    slow: Mutex<Slow>,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

struct Slow {
    // Breaks in a row without the breaker closing in between, less one.
    reopens: u32,
    rng: SmallRng,
}

// The state word's fields.
const STATE_BITS: u32 = 2;
const COUNT_BITS: u32 = 12;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const ADMITTED_SHIFT: u32 = STATE_BITS;
const SUCCESS_SHIFT: u32 = STATE_BITS + COUNT_BITS;
const GEN_SHIFT: u32 = STATE_BITS + 2 * COUNT_BITS;
const ADMIT_ONE: u64 = 1 << ADMITTED_SHIFT;
const SUCCESS_ONE: u64 = 1 << SUCCESS_SHIFT;

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;
const ISOLATED: u64 = 3;

fn state_of(word: u64) -> u64 {
    word & STATE_MASK
}

fn gen_of(word: u64) -> u64 {
    word >> GEN_SHIFT
}

fn admitted_of(word: u64) -> u64 {
    (word >> ADMITTED_SHIFT) & COUNT_MASK
}

fn successes_of(word: u64) -> u64 {
    (word >> SUCCESS_SHIFT) & COUNT_MASK
}

fn public_state(state: u64) -> BreakerState {
    match state {
        CLOSED => BreakerState::Closed,
        OPEN => BreakerState::Open,
        HALF_OPEN => BreakerState::HalfOpen,
        _ => BreakerState::Isolated,
    }
}

fn code(state: BreakerState) -> u64 {
    match state {
        BreakerState::Closed => CLOSED,
        BreakerState::Open => OPEN,
        BreakerState::HalfOpen => HALF_OPEN,
        BreakerState::Isolated => ISOLATED,
    }
}

/// Leave to pass one call: a call counted in the closed state, or a half-open probe, each of
/// one generation of the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    Closed(u64),
    Probe(u64),
}

/// What a classified result says of the dependency: `Some(true)` a failure, `Some(false)` a
/// success, and `None` for a server's refusal of a request whose deadline it found spent, or
/// by its admission control.
pub(crate) fn health(c: &Classification) -> Option<bool> {
    (!c.is_deadline_refusal() && !c.is_overload_refusal()).then(|| c.is_health_failure())
}

impl CircuitBreaker {
    /// The breaker's settings, for a [review](crate::review).
    pub fn describe(&self) -> crate::review::BreakerSettings {
        let c = &self.shared.config;
        crate::review::BreakerSettings {
            name: c.name.as_deref().map(str::to_owned),
            failure_ratio: c.failure_ratio,
            min_throughput: c.min_throughput,
            break_duration: c.break_duration,
            max_break: c.max_break,
        }
    }

    /// A breaker with the defaults (see [`CircuitBreakerBuilder`]).
    pub fn new() -> Self {
        // Assembled without checking: a test builds the same defaults through `build`.
        Self::builder().assemble()
    }

    /// A builder, starting from the defaults.
    pub fn builder() -> CircuitBreakerBuilder {
        CircuitBreakerBuilder::default()
    }

    /// The breaker's state now. An open breaker whose break has ended reads
    /// [`Open`](BreakerState::Open) until the next call, which turns it half-open.
    pub fn state(&self) -> BreakerState {
        public_state(state_of(self.shared.word.load(Acquire)))
    }

    /// The calls and failures in the window now.
    pub fn window(&self) -> WindowCounts {
        self.shared.window.counts(Some(clock()))
    }

    /// The breaker's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.shared.config.name.as_deref()
    }

    /// Shuts the breaker by hand: every call is refused with an [`Isolated`](BreakerState::Isolated)
    /// [`CircuitOpen`], which tells a retry layer not to retry, until [`reset`](Self::reset).
    pub fn isolate(&self) {
        self.shared
            .force(BreakerState::Isolated, TransitionReason::Isolated);
    }

    /// Closes the breaker by hand, whatever its state, with an empty window and the break
    /// duration back at its start.
    pub fn reset(&self) {
        self.shared
            .force(BreakerState::Closed, TransitionReason::Reset);
    }

    /// Whether a timeout ended by the call's deadline, after the attempt was given `given`,
    /// says nothing about the dependency.
    fn too_short_to_tell(&self, given: Duration) -> bool {
        given < self.shared.config.min_timeout_evidence
    }

    /// Whether the slow-call threshold is set, so a call must be timed.
    pub(crate) fn times_calls(&self) -> bool {
        self.shared.config.slow_call.is_some()
    }

    /// Asks to pass one call: leave, or the error to refuse it with.
    ///
    /// Inlined into the caller's future for the closed circuit, a load and a test; the other
    /// states take [`admit_slow`](Self::admit_slow). Kept apart so that whether the hot path
    /// is inlined does not depend on where the compiler happens to split the crate.
    #[inline]
    pub(crate) fn admit(&self) -> Result<Pass, CircuitOpen> {
        let word = self.shared.word.load(Acquire);
        if state_of(word) == CLOSED {
            return Ok(Pass::Closed(gen_of(word)));
        }
        self.admit_slow(word)
    }

    #[inline(never)]
    fn admit_slow(&self, mut word: u64) -> Result<Pass, CircuitOpen> {
        let shared = &*self.shared;
        loop {
            match state_of(word) {
                CLOSED => return Ok(Pass::Closed(gen_of(word))),
                OPEN => {
                    let now = clock();
                    let until = shared.open_until();
                    if now < until {
                        return Err(shared.reject(CircuitOpen::open(until), now));
                    }
                    shared.transition(word, BreakerState::HalfOpen, TransitionReason::BreakEnded);
                    word = shared.word.load(Acquire);
                }
                HALF_OPEN => {
                    if admitted_of(word) >= u64::from(shared.config.probes) {
                        return Err(shared.reject(CircuitOpen::half_open(), clock()));
                    }
                    #[cfg(surely_loom)]
                    if mutation("breaker_probe_admit_racy") {
                        // A read, then a write: two callers that read the same count both pass.
                        shared.word.store(word + ADMIT_ONE, Release);
                        return Ok(Pass::Probe(gen_of(word)));
                    }
                    match shared
                        .word
                        .compare_exchange_weak(word, word + ADMIT_ONE, AcqRel, Acquire)
                    {
                        Ok(_) => return Ok(Pass::Probe(gen_of(word))),
                        Err(actual) => word = actual,
                    }
                }
                _ => return Err(shared.reject(CircuitOpen::isolated(), clock())),
            }
        }
    }

    /// Whether an error says nothing about the dependency, whatever the classifier makes of
    /// it: another breaker's refusal, a deadline that left no time to send, or a timeout the
    /// call's deadline set on an attempt given too little time to tell.
    pub(crate) fn says_nothing<T>(&self, e: &Error<T>) -> bool {
        e.is_circuit_open()
            || e.deadline_exceeded()
                .is_some_and(|d| d.phase() == DeliveryPhase::NotSent)
            || e.elapsed().is_some_and(|t| {
                t.is_deadline() && t.given().is_some_and(|g| self.too_short_to_tell(g))
            })
    }

    /// Counts a passed call's result, as [`complete`](Self::complete) does, after timing it
    /// against the slow-call threshold when the call was timed from `started` and succeeded.
    #[inline]
    pub(crate) fn settle(&self, pass: Pass, failure: Option<bool>, started: Option<Instant>) {
        match (failure, started, self.shared.config.slow_call) {
            (Some(false), Some(started), Some(threshold)) => {
                let end = clock();
                let slow = end.saturating_duration_since(started) > threshold;
                self.complete(pass, Some(slow), Some(end));
            }
            (failure, _, _) => self.complete(pass, failure, None),
        }
    }

    /// Counts a passed call's result: `Some(true)` a failure, `Some(false)` a success, `None`
    /// neither (cancelled, or a refusal that says nothing about the server).
    ///
    /// A success through the closed circuit, the healthy dependency's path, is inlined into
    /// the caller; everything else takes [`complete_slow`](Self::complete_slow).
    #[inline]
    pub(crate) fn complete(&self, pass: Pass, failure: Option<bool>, now: Option<Instant>) {
        if let (Pass::Closed(generation), Some(false)) = (pass, failure) {
            let shared = &*self.shared;
            let word = shared.word.load(Acquire);
            if word & STATE_MASK != CLOSED || gen_of(word) != generation {
                return;
            }
            if !shared.window.needs_clock() {
                shared.window.record(false, now);
                return;
            }
        }
        self.complete_slow(pass, failure, now);
    }

    #[inline(never)]
    fn complete_slow(&self, pass: Pass, failure: Option<bool>, now: Option<Instant>) {
        let shared = &*self.shared;
        match (pass, failure) {
            (Pass::Closed(generation), Some(failure)) => {
                let word = shared.word.load(Acquire);
                if word & STATE_MASK != CLOSED || gen_of(word) != generation {
                    return;
                }
                let now = now.or_else(|| shared.window.needs_clock().then(clock));
                shared.window.record(failure, now);
                if failure {
                    let counts = shared.window.counts(now);
                    if counts.calls >= shared.config.min_throughput
                        && f64::from(counts.failures)
                            >= shared.config.failure_ratio * f64::from(counts.calls)
                    {
                        shared.transition(
                            word,
                            BreakerState::Open,
                            TransitionReason::FailureRate {
                                failures: counts.failures,
                                calls: counts.calls,
                            },
                        );
                    }
                }
            }
            (Pass::Closed(_), None) => {}
            (Pass::Probe(generation), Some(true)) => {
                let word = shared.word.load(Acquire);
                if state_of(word) == HALF_OPEN && gen_of(word) == generation {
                    shared.transition(word, BreakerState::Open, TransitionReason::ProbeFailed);
                }
            }
            (Pass::Probe(generation), Some(false)) => {
                let mut word = shared.word.load(Acquire);
                while state_of(word) == HALF_OPEN && gen_of(word) == generation {
                    let new = word + SUCCESS_ONE;
                    #[cfg(surely_loom)]
                    let new = if mutation("breaker_probe_counted_twice") {
                        new + SUCCESS_ONE
                    } else {
                        new
                    };
                    match shared
                        .word
                        .compare_exchange_weak(word, new, AcqRel, Acquire)
                    {
                        Ok(_) => {
                            if successes_of(new) >= u64::from(shared.config.probes) {
                                shared.transition(
                                    new,
                                    BreakerState::Closed,
                                    TransitionReason::ProbesSucceeded,
                                );
                            }
                            return;
                        }
                        Err(actual) => word = actual,
                    }
                }
            }
            (Pass::Probe(generation), None) => {
                // The probe said nothing: give its place back for another.
                let mut word = shared.word.load(Acquire);
                while state_of(word) == HALF_OPEN
                    && gen_of(word) == generation
                    && admitted_of(word) > 0
                {
                    match shared
                        .word
                        .compare_exchange_weak(word, word - ADMIT_ONE, AcqRel, Acquire)
                    {
                        Ok(_) => return,
                        Err(actual) => word = actual,
                    }
                }
            }
        }
    }
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        Self::new()
    }
}

impl Shared {
    fn open_until(&self) -> Instant {
        let since = Duration::from_nanos(self.open_until.load(Acquire));
        // Past what the clock can hold: far enough.
        later(self.epoch, since)
    }

    fn lock(&self) -> MutexGuard<'_, Slow> {
        self.slow.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reject(&self, err: CircuitOpen, now: Instant) -> CircuitOpen {
        self.emit(
            now,
            BreakerEventKind::Rejected {
                state: err.state(),
                retry_after: err.retry_after(),
            },
        );
        err
    }

    fn emit(&self, at: Instant, kind: BreakerEventKind) {
        if let Some(recorder) = &self.recorder {
            let event = BreakerEvent {
                breaker: self.config.name.clone(),
                at,
                kind,
            };
            recorder.record_breaker(&event);
        }
    }

    /// Moves from the state of `seen` to `to`, if no one else moved it since `seen` was read.
    fn transition(&self, seen: u64, to: BreakerState, reason: TransitionReason) {
        let mut slow = self.lock();
        let mut word = self.word.load(Acquire);
        let moved = state_of(word) != state_of(seen) || gen_of(word) != gen_of(seen);
        #[cfg(surely_loom)]
        let moved = moved && !mutation("breaker_no_generation_check");
        if moved {
            return;
        }
        let now = clock();
        let from = public_state(state_of(word));
        let break_duration = self.prepare(&mut slow, from, to, now);
        let new = ((gen_of(word) + 1) << GEN_SHIFT) | code(to);
        // Probes may be admitted or counted meanwhile (same generation): try again with them.
        while let Err(actual) = self.word.compare_exchange(word, new, AcqRel, Acquire) {
            if gen_of(actual) != gen_of(seen) || state_of(actual) != state_of(seen) {
                return;
            }
            word = actual;
        }
        drop(slow);
        self.announce(now, from, to, reason, break_duration);
    }

    /// Moves to `to` whatever the state (isolate, reset).
    fn force(&self, to: BreakerState, reason: TransitionReason) {
        let mut slow = self.lock();
        let now = clock();
        let word = self.word.load(Acquire);
        let from = public_state(state_of(word));
        let break_duration = self.prepare(&mut slow, from, to, now);
        if to == BreakerState::Closed {
            slow.reopens = 0;
        }
        // Under the lock no transition races; hot operations keep the generation, so the
        // loop only picks up their changes, which the new generation then wipes.
        let mut word = word;
        let new = |w: u64| ((gen_of(w) + 1) << GEN_SHIFT) | code(to);
        while let Err(actual) = self.word.compare_exchange(word, new(word), AcqRel, Acquire) {
            word = actual;
        }
        drop(slow);
        self.announce(now, from, to, reason, break_duration);
    }

    /// Gets the breaker ready for `to`: the window emptied before closing, the break's end set
    /// before opening.
    fn prepare(
        &self,
        slow: &mut Slow,
        from: BreakerState,
        to: BreakerState,
        now: Instant,
    ) -> Option<Duration> {
        match to {
            BreakerState::Closed => {
                self.window.clear();
                slow.reopens = 0;
                None
            }
            BreakerState::Open => {
                let d = self.next_break(slow, from == BreakerState::HalfOpen);
                let since = later(now, d).saturating_duration_since(self.epoch);
                let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
                self.open_until.store(nanos, Relaxed);
                Some(d)
            }
            BreakerState::HalfOpen | BreakerState::Isolated => None,
        }
    }

    /// The next break: the first after closed is `break_duration`; each one after a failed
    /// probe is `multiplier` times the last, up to `max_break`; then jittered.
    fn next_break(&self, slow: &mut Slow, after_probe: bool) -> Duration {
        let c = &self.config;
        if after_probe {
            slow.reopens = slow.reopens.saturating_add(1);
        } else {
            slow.reopens = 0;
        }
        let exp = i32::try_from(slow.reopens.min(64)).unwrap_or(64);
        let grown = c.break_duration.as_secs_f64() * c.break_multiplier.powi(exp);
        let max = c.max_break.as_secs_f64();
        let mut secs = if grown.is_finite() {
            grown.min(max)
        } else {
            max
        };
        if c.jitter > 0.0 {
            secs *= 1.0 + slow.rng.random_range(-c.jitter..=c.jitter);
        }
        Duration::try_from_secs_f64(secs.clamp(0.0, max)).unwrap_or(c.max_break)
    }

    fn announce(
        &self,
        at: Instant,
        from: BreakerState,
        to: BreakerState,
        reason: TransitionReason,
        break_duration: Option<Duration>,
    ) {
        self.emit(
            at,
            BreakerEventKind::Transition {
                from,
                to,
                reason,
                break_duration,
            },
        );
    }
}

/// Builds a [`CircuitBreaker`], validating its settings. The defaults and why they are what
/// they are are in the [module docs](super#defaults).
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct CircuitBreakerBuilder {
    name: Option<Arc<str>>,
    failure_ratio: f64,
    window: SlidingWindow,
    min_throughput: u32,
    slow_call: Option<Duration>,
    break_duration: Duration,
    break_multiplier: f64,
    max_break: Duration,
    jitter: f64,
    seed: Option<u64>,
    probes: u32,
    min_timeout_evidence: Duration,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

impl Default for CircuitBreakerBuilder {
    fn default() -> Self {
        CircuitBreakerBuilder {
            name: None,
            failure_ratio: DEFAULT_FAILURE_RATIO,
            window: SlidingWindow::default(),
            min_throughput: DEFAULT_MIN_THROUGHPUT,
            slow_call: None,
            break_duration: DEFAULT_BREAK,
            break_multiplier: DEFAULT_BREAK_MULTIPLIER,
            max_break: DEFAULT_MAX_BREAK,
            jitter: DEFAULT_JITTER,
            seed: None,
            probes: DEFAULT_HALF_OPEN_PROBES,
            min_timeout_evidence: DEFAULT_MIN_TIMEOUT_EVIDENCE,
            recorder: Some(Arc::new(TracingRecorder::new())),
        }
    }
}

impl CircuitBreakerBuilder {
    /// A name for the records and logs (default none).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Open when at least this share of the calls in the window failed (default 0.5). In
    /// `(0, 1]`.
    pub fn failure_ratio(mut self, ratio: f64) -> Self {
        self.failure_ratio = ratio;
        self
    }

    /// The window the failure ratio is measured over (default the last 100 calls).
    pub fn window(mut self, window: SlidingWindow) -> Self {
        self.window = window;
        self
    }

    /// Never open with fewer calls than this in the window (default 20). At least 1, and at
    /// most the size of a count window.
    pub fn min_throughput(mut self, calls: u32) -> Self {
        self.min_throughput = calls;
        self
    }

    /// Count a call that took longer than this as a failure, whatever its answer (default off).
    /// Greater than zero and at most [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn slow_call_threshold(mut self, threshold: Option<Duration>) -> Self {
        self.slow_call = threshold;
        self
    }

    /// The first break (default 5 s). Greater than zero and at most
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn break_duration(mut self, duration: Duration) -> Self {
        self.break_duration = duration;
        self
    }

    /// Each break after a failed probe lasts `multiplier` times the one before (default 2.0;
    /// 1.0 for a fixed break), up to `max` (default 60 s; at least the first break, at most
    /// [`MAX_DURATION`](crate::MAX_DURATION)).
    pub fn break_growth(mut self, multiplier: f64, max: Duration) -> Self {
        self.break_multiplier = multiplier;
        self.max_break = max;
        self
    }

    /// Spread each break by up to this share either way (default 0.1: ±10%), so that clients
    /// that opened together do not probe together. In `[0, 1)`.
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Seed the jitter, for reproducible tests (default: seeded from the OS).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// How many probes a half-open breaker lets through (default 1): it closes when they all
    /// succeed, opens again as soon as one fails, and refuses other calls meanwhile. From 1 to
    /// 1000; outside that, [`build`](Self::build) returns a [`ConfigError`].
    pub fn half_open_probes(mut self, probes: u32) -> Self {
        self.probes = probes;
        self
    }

    /// An attempt that the call's deadline ended counts as a failure only if it was given at
    /// least this long (default 100 ms). A call refused by an open breaker waits out the break
    /// if its deadline allows, so calls wake together when it ends, some with almost no budget
    /// left; their attempts run out of time whatever the dependency's health, and counting them
    /// would open the breaker again on every probe. Timeouts of the per-try limit always count.
    /// At most [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn min_timeout_evidence(mut self, given: Duration) -> Self {
        self.min_timeout_evidence = given;
        self
    }

    /// Where state changes and rejections are recorded (default [`TracingRecorder`]);
    /// [`Recorder::record_breaker`] receives them. `()` records nothing.
    pub fn recorder<R: Recorder + Send + Sync + 'static>(mut self, recorder: R) -> Self {
        self.recorder = Some(Arc::new(recorder));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting that is out of its range; a duration (the
    /// slow-call threshold, the break, the longest break, a time window's length, the least
    /// time of a timeout that counts) past [`MAX_DURATION`](crate::MAX_DURATION) among them.
    pub fn build(self) -> Result<CircuitBreaker, ConfigError> {
        self.validate()?;
        Ok(self.assemble())
    }

    /// Checks the settings, as [`build`](Self::build) does.
    fn validate(&self) -> Result<(), ConfigError> {
        let ratio = self.failure_ratio;
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(ConfigError::new(
                "breaker failure ratio",
                "must be greater than 0 and at most 1",
            ));
        }
        if self.min_throughput == 0 {
            return Err(ConfigError::new(
                "breaker minimum throughput",
                "must be at least 1 call",
            ));
        }
        if let Some(slow_call) = self.slow_call {
            ConfigError::positive_at_most_max("breaker slow-call threshold", slow_call)?;
        }
        ConfigError::positive_at_most_max("breaker break duration", self.break_duration)?;
        if !(self.break_multiplier >= 1.0 && self.break_multiplier.is_finite()) {
            return Err(ConfigError::new(
                "breaker break multiplier",
                "must be a finite number of at least 1",
            ));
        }
        if self.max_break < self.break_duration {
            return Err(ConfigError::new(
                "breaker maximum break",
                "must be at least the break duration",
            ));
        }
        ConfigError::at_most_max("breaker maximum break", self.max_break)?;
        if !(self.jitter >= 0.0 && self.jitter < 1.0) {
            return Err(ConfigError::new(
                "breaker jitter",
                "must be at least 0 and less than 1",
            ));
        }
        if self.probes == 0 || self.probes > MAX_HALF_OPEN_PROBES {
            return Err(ConfigError::new(
                "breaker half-open probes",
                "must be from 1 to 1000",
            ));
        }
        ConfigError::at_most_max(
            "breaker minimum timeout evidence",
            self.min_timeout_evidence,
        )?;
        match self.window {
            SlidingWindow::Count(0) => {
                return Err(ConfigError::new(
                    "breaker count window",
                    "must hold at least 1 call",
                ))
            }
            SlidingWindow::Count(n) if n > MAX_COUNT_WINDOW => {
                return Err(ConfigError::new(
                    "breaker count window",
                    "must hold at most 1000000 calls",
                ))
            }
            SlidingWindow::Count(n) if n < self.min_throughput => {
                return Err(ConfigError::new(
                    "breaker minimum throughput",
                    "must not exceed the count window, or the breaker could never open",
                ))
            }
            SlidingWindow::Count(_) => {}
            SlidingWindow::Time { length, buckets } => {
                if buckets == 0 || buckets > 1000 {
                    return Err(ConfigError::new(
                        "breaker time window buckets",
                        "must be from 1 to 1000",
                    ));
                }
                if length < Duration::from_millis(u64::from(buckets)) {
                    return Err(ConfigError::new(
                        "breaker time window",
                        "must be at least 1 ms per bucket",
                    ));
                }
                ConfigError::at_most_max("breaker time window", length)?;
            }
        }
        Ok(())
    }

    /// The breaker of these settings, which the caller has checked (or which are the
    /// defaults).
    fn assemble(self) -> CircuitBreaker {
        let epoch = clock();
        let window = match self.window {
            SlidingWindow::Count(n) => Window::count(n),
            SlidingWindow::Time { length, buckets } => Window::time(epoch, length, buckets),
        };
        let rng = match self.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_os_rng(),
        };
        CircuitBreaker {
            shared: Arc::new(Shared {
                word: AtomicU64::new(CLOSED),
                open_until: AtomicU64::new(0),
                epoch,
                window,
                config: Config {
                    name: self.name,
                    failure_ratio: self.failure_ratio,
                    min_throughput: self.min_throughput,
                    slow_call: self.slow_call,
                    break_duration: self.break_duration,
                    break_multiplier: self.break_multiplier,
                    max_break: self.max_break,
                    jitter: self.jitter,
                    probes: self.probes,
                    min_timeout_evidence: self.min_timeout_evidence,
                },
                slow: Mutex::new(Slow { reopens: 0, rng }),
                recorder: self.recorder,
            }),
        }
    }
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.shared.config;
        f.debug_struct("CircuitBreaker")
            .field("name", &c.name)
            .field("state", &self.state())
            .field("failure_ratio", &c.failure_ratio)
            .field("min_throughput", &c.min_throughput)
            .field("break_duration", &c.break_duration)
            .field("half_open_probes", &c.probes)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for CircuitBreakerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreakerBuilder")
            .field("name", &self.name)
            .field("failure_ratio", &self.failure_ratio)
            .field("window", &self.window)
            .field("min_throughput", &self.min_throughput)
            .field("break_duration", &self.break_duration)
            .field("half_open_probes", &self.probes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults `new` assembles without checking are the ones `build` accepts.
    #[tokio::test(start_paused = true)]
    async fn the_defaults_build() {
        let built = CircuitBreaker::builder().build().unwrap();
        let new = CircuitBreaker::new();
        assert_eq!(format!("{built:?}"), format!("{new:?}"));
        let (b, n) = (&built.shared.config, &new.shared.config);
        assert_eq!(
            (b.slow_call, b.max_break, b.jitter, b.min_timeout_evidence),
            (n.slow_call, n.max_break, n.jitter, n.min_timeout_evidence)
        );
        assert_eq!(built.window(), new.window());
    }

    /// A count window is a ring of its size, whatever the calls: a million into a window of
    /// 1 000 count 1 000. Its size is bounded when built.
    #[test]
    fn a_count_window_holds_its_size_and_its_size_is_bounded() {
        let window = Window::count(1_000);
        for n in 0..1_000_000 {
            window.record(n % 3 == 0, None);
        }
        assert_eq!(window.counts(None).calls, 1_000);
        let at = |n| {
            CircuitBreaker::builder()
                .window(SlidingWindow::Count(n))
                .build()
        };
        assert!(at(MAX_COUNT_WINDOW).is_ok());
        let too_big = at(MAX_COUNT_WINDOW + 1).unwrap_err();
        assert!(
            too_big.to_string().contains("breaker count window"),
            "{too_big}"
        );
    }
}
