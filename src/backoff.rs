//! Backoff between attempts: the code behind [`retry::backoff`](crate::retry::backoff), in
//! plumbing so that the ledger's reconciler paces itself without the retry layer.

use std::fmt;
use std::iter::FusedIterator;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::ConfigError;

/// The default [multiplier](BackoffBuilder::multiplier): each delay doubles.
pub(crate) const DEFAULT_MULTIPLIER: f64 = 2.0;

/// The default [cap](BackoffBuilder::cap): no single wait is longer than 20 seconds (or the base
/// delay, if that is longer). Why 20 s is said on [`BackoffBuilder::cap`].
pub(crate) const DEFAULT_CAP: Duration = Duration::from_secs(20);

/// The growth of [`Jitter::Decorrelated`]: each wait is at most this many times the previous.
const DECORRELATED_GROWTH: u128 = 3;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// How the exponential delay is randomised. Every formula uses `exp`, the capped exponential
/// delay before retry `n` (counting from zero):
///
/// ```text
/// exp(n) = min(cap, base * multiplier^n)
/// ```
///
/// The formulas are those of the AWS Architecture blog's "Exponential Backoff And Jitter". The
/// [module docs](crate::retry::backoff) explain why jitter matters and which one to choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize, serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Jitter {
    /// No randomness: `exp(n)`, exactly. Non-decreasing, and constant once it reaches the cap.
    /// For tests, and for a client that competes with nobody.
    None,
    /// `random_between(0, exp(n))`. The default: it spreads retries over the whole window, which
    /// the AWS post found to cost competing clients the least work in total.
    #[default]
    Full,
    /// `exp(n) / 2 + random_between(0, exp(n) / 2)`: always at least half the exponential
    /// delay, at most all of it.
    Equal,
    /// `min(cap, random_between(base, previous * 3))`, where `previous` starts at `base`. Each
    /// wait depends on the last one, not on `n`, so it is always between `base` and `cap` and
    /// the multiplier is not used.
    Decorrelated,
}

/// A validated backoff schedule: base delay, multiplier, cap, and [`Jitter`]. Build one with
/// [`Backoff::exponential`], or take [`Backoff::constant`] or [`Backoff::none`]; then
/// [`iter`](Backoff::iter) over its delays. See the [module docs](crate::retry::backoff).
///
/// Cloning is cheap, and clones share the stream counter of an unseeded `Backoff`, so their
/// iterators still draw from distinct streams.
#[derive(Clone)]
pub struct Backoff {
    base: Duration,
    multiplier: f64,
    cap: Duration,
    jitter: Jitter,
    streams: Streams,
}

/// Where each [`Delays`] iterator's generator comes from.
#[derive(Clone)]
enum Streams {
    /// Seeded: every iterator starts from the same seed, and replays the same sequence.
    Fixed(u64),
    /// From entropy: a key taken once, and a counter so that every iterator differs.
    Entropy { key: u64, next: Arc<AtomicU64> },
}

impl Backoff {
    /// Starts an exponential schedule whose first retry waits about `base` (before jitter).
    ///
    /// Defaults: multiplier 2 (each delay doubles), cap 20 s (or `base` if that is longer),
    /// [`Jitter::Full`], and a generator seeded from the operating system.
    /// `base` must be greater than zero; [`BackoffBuilder::build`] says so if it is not.
    pub fn exponential(base: Duration) -> BackoffBuilder {
        BackoffBuilder {
            base,
            multiplier: DEFAULT_MULTIPLIER,
            cap: None,
            jitter: Jitter::default(),
            seed: None,
        }
    }

    /// Waits exactly `delay` before every retry, without jitter. A zero `delay` is allowed and
    /// means [`Backoff::none`].
    ///
    /// For a constant delay *with* jitter, build `exponential(delay)` with multiplier 1.0 and
    /// cap `delay`.
    pub fn constant(delay: Duration) -> Backoff {
        Backoff {
            base: delay,
            multiplier: 1.0,
            cap: delay,
            jitter: Jitter::None,
            streams: Streams::Fixed(0),
        }
    }

    /// Retries at once: every delay is zero. For tests, and for retries that wait for something
    /// else (a server's pushback, a new connection) rather than for time.
    pub fn none() -> Backoff {
        Backoff::constant(Duration::ZERO)
    }

    /// The delay before the first retry, before jitter.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// How much each delay grows over the previous one, before jitter.
    pub fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The longest single delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The jitter.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The seed given to the builder, if any.
    pub fn seed(&self) -> Option<u64> {
        match self.streams {
            Streams::Fixed(seed) => Some(seed),
            Streams::Entropy { .. } => None,
        }
    }

    /// The delays, starting with the wait before the first retry. Infinite: bound it with
    /// [`Iterator::take`], or let the retry layer decide when to stop.
    ///
    /// With a [seed](BackoffBuilder::seed), every call returns an iterator that replays the same
    /// sequence. Without one, each call returns a fresh stream.
    pub fn iter(&self) -> Delays {
        let seed = match &self.streams {
            Streams::Fixed(seed) => *seed,
            Streams::Entropy { key, next } => {
                key.wrapping_add(next.fetch_add(1, Ordering::Relaxed))
            }
        };
        self.iter_with_rng(SmallRng::seed_from_u64(seed))
    }

    /// The delays, drawing jitter from `rng` instead of the `Backoff`'s own generator (and
    /// ignoring its seed).
    ///
    /// ```
    /// use std::time::Duration;
    /// use rand::SeedableRng;
    /// use surely::retry::backoff::{Backoff, Jitter};
    ///
    /// let backoff = Backoff::exponential(Duration::from_millis(50))
    ///     .jitter(Jitter::Equal)
    ///     .build()?;
    /// let rng = rand::rngs::StdRng::seed_from_u64(42);
    /// let first = backoff.iter_with_rng(rng).next().unwrap();
    /// assert!(first >= Duration::from_millis(25) && first <= Duration::from_millis(50));
    /// # Ok::<(), surely::ConfigError>(())
    /// ```
    pub fn iter_with_rng<R: RngCore>(&self, rng: R) -> Delays<R> {
        let base = self.base.as_nanos();
        Delays {
            base,
            cap: self.cap.as_nanos(),
            multiplier: self.multiplier,
            jitter: self.jitter,
            exp: base as f64,
            previous: base,
            rng,
        }
    }
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("base", &self.base)
            .field("multiplier", &self.multiplier)
            .field("cap", &self.cap)
            .field("jitter", &self.jitter)
            .field("seed", &self.seed())
            .finish()
    }
}

impl IntoIterator for &Backoff {
    type Item = Duration;
    type IntoIter = Delays;

    fn into_iter(self) -> Delays {
        self.iter()
    }
}

/// Builds a [`Backoff`]; made by [`Backoff::exponential`]. Nothing is checked until
/// [`build`](BackoffBuilder::build), which returns an error rather than panicking.
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct BackoffBuilder {
    base: Duration,
    multiplier: f64,
    cap: Option<Duration>,
    jitter: Jitter,
    seed: Option<u64>,
}

impl BackoffBuilder {
    /// How much each delay grows over the previous one: finite and at least 1.0 (1.0 makes a
    /// constant delay). Default: 2.0, each delay doubles. [`Jitter::Decorrelated`] does not use
    /// it.
    pub fn multiplier(mut self, multiplier: f64) -> Self {
        self.multiplier = multiplier;
        self
    }

    /// The longest single delay; at least the base delay. Default: 20 s, or the base delay if
    /// that is longer.
    ///
    /// 20 s is the AWS SDKs' maximum backoff. gRPC's default retry policy caps at 120 s, which
    /// is long for a call that has a deadline; in practice the call's remaining budget usually
    /// cuts the wait shorter than either.
    pub fn cap(mut self, cap: Duration) -> Self {
        self.cap = Some(cap);
        self
    }

    /// How delays are randomised. Default [`Jitter::Full`].
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Seeds the jitter, so that every iterator of the built [`Backoff`] yields the same
    /// sequence. For tests: in production, clients that share a seed retry in lockstep, which is
    /// what jitter is there to prevent.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if the base delay is zero, the multiplier is not a finite number or is
    /// less than 1.0, or the cap is less than the base delay. Any duration is a schedule (its
    /// arithmetic saturates); a [`RetryLayer`](crate::retry::RetryLayer) takes one whose base
    /// and cap are at most [`MAX_DURATION`](crate::MAX_DURATION).
    ///
    /// ```
    /// use std::time::Duration;
    /// use surely::retry::backoff::Backoff;
    ///
    /// let err = Backoff::exponential(Duration::from_millis(100))
    ///     .multiplier(0.5)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.to_string(), "invalid backoff multiplier: must be at least 1.0");
    /// ```
    pub fn build(self) -> Result<Backoff, ConfigError> {
        if self.base.is_zero() {
            return Err(ConfigError::new(
                "backoff base delay",
                "must be greater than zero",
            ));
        }
        if !self.multiplier.is_finite() {
            return Err(ConfigError::new(
                "backoff multiplier",
                "must be a finite number",
            ));
        }
        if self.multiplier < 1.0 {
            return Err(ConfigError::new(
                "backoff multiplier",
                "must be at least 1.0",
            ));
        }
        if self.cap.is_some_and(|cap| cap < self.base) {
            return Err(ConfigError::new(
                "backoff cap",
                "must not be less than the base delay",
            ));
        }
        Ok(self.assemble())
    }

    /// The schedule of these settings, which the caller has checked (the retry layer's
    /// defaults, which a test builds through [`build`](Self::build)).
    pub(crate) fn assemble(self) -> Backoff {
        let streams = match self.seed {
            Some(seed) => Streams::Fixed(seed),
            None => Streams::Entropy {
                key: entropy_key(),
                next: Arc::new(AtomicU64::new(0)),
            },
        };
        Backoff {
            base: self.base,
            multiplier: self.multiplier,
            cap: self.cap.unwrap_or(DEFAULT_CAP.max(self.base)),
            jitter: self.jitter,
            streams,
        }
    }
}

/// The delays of a [`Backoff`]: an infinite `Iterator<Item = Duration>`, made by
/// [`Backoff::iter`] (with the `Backoff`'s own generator) or [`Backoff::iter_with_rng`].
///
/// Never panics and never overflows, however long it runs and however large the durations: the
/// arithmetic saturates at the cap.
#[derive(Clone, Debug)]
pub struct Delays<R = SmallRng> {
    // Nanoseconds, which hold any `Duration`.
    base: u128,
    cap: u128,
    multiplier: f64,
    jitter: Jitter,
    /// The next exponential delay before capping, in nanoseconds; may grow to infinity.
    exp: f64,
    /// The previous delay, for decorrelated jitter.
    previous: u128,
    rng: R,
}

impl<R: RngCore> Delays<R> {
    /// The capped exponential delay for this step, and advances to the next step.
    fn next_exp(&mut self) -> u128 {
        let exp = if self.exp >= self.cap as f64 {
            self.cap
        } else {
            // `as` saturates (and maps NaN to zero); the clamp keeps rounding of huge bases
            // within bounds.
            (self.exp as u128).clamp(self.base, self.cap)
        };
        // Multiplying by at least 1.0 never decreases, so the sequence is non-decreasing; once
        // past the cap it stays there (or at infinity, which is still past the cap).
        if self.exp < self.cap as f64 {
            self.exp *= self.multiplier;
        }
        exp
    }
}

impl<R: RngCore> Iterator for Delays<R> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let nanos = match self.jitter {
            Jitter::None => self.next_exp(),
            Jitter::Full => {
                let exp = self.next_exp();
                self.rng.random_range(0..=exp)
            }
            Jitter::Equal => {
                let exp = self.next_exp();
                let half = exp / 2;
                (exp - half) + self.rng.random_range(0..=half)
            }
            Jitter::Decorrelated => {
                let high = self.previous.saturating_mul(DECORRELATED_GROWTH);
                let delay = if high > self.base {
                    self.rng.random_range(self.base..=high)
                } else {
                    self.base
                };
                let delay = delay.min(self.cap);
                self.previous = delay;
                delay
            }
        };
        Some(from_nanos(nanos))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX, None)
    }
}

impl<R: RngCore> FusedIterator for Delays<R> {}

/// A key from the operating system's entropy; should that fail, from std's hasher keys (which
/// are themselves random per thread), rather than panicking.
fn entropy_key() -> u64 {
    match SmallRng::try_from_os_rng() {
        Ok(mut rng) => rng.next_u64(),
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        }
    }
}

/// A `Duration` of `nanos` nanoseconds, saturating at `Duration::MAX`.
fn from_nanos(nanos: u128) -> Duration {
    match u64::try_from(nanos / NANOS_PER_SEC) {
        // The remainder is below one second, so it fits and does not carry.
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}
