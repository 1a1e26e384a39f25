//! The token-bucket form: health failures drain tokens, successes refill them, and retries
//! stop while the bucket is half empty.

use std::fmt;
use std::sync::atomic::Ordering;

use super::{to_milli, BudgetExhausted, RetryBudget, MILLI};
use crate::classify::AttemptClass;
#[cfg(surely_loom)]
use crate::sync::mutation;
use crate::sync::AtomicU64;
use crate::ConfigError;

/// The default [`max_tokens`](TokenBucket::max_tokens): 10, the example of gRPC's retry
/// design (A6). Retries stop after five health failures more than successes can pay for.
const DEFAULT_MAX_TOKENS: u32 = 10;

/// The default [`token_ratio`](TokenBucket::token_ratio), in thousandths of a token: 0.1, the
/// example of gRPC's retry design (A6). Ten successes pay for one failure, the same 10% as
/// [`RatioBudget`](super::RatioBudget)'s default.
const DEFAULT_TOKEN_RATIO_MILLI: u64 = 100;

/// A retry budget of the token-bucket form, with the semantics of gRPC's `retryThrottling`
/// (gRPC design A6; the AWS SDKs' retry quota is the same idea).
///
/// The bucket holds up to `max_tokens` tokens and starts full.
///
/// - [`record_outcome`](RetryBudget::record_outcome) with a health failure
///   ([`Rejected`](AttemptClass::Rejected) or [`MaybeCommitted`](AttemptClass::MaybeCommitted))
///   takes one token, down to zero; with a [`Success`](AttemptClass::Success) it adds
///   `token_ratio` tokens, up to `max_tokens`. [`Final`](AttemptClass::Final) and
///   [`Conflict`](AttemptClass::Conflict) answers say nothing about the server's health and
///   leave the bucket alone.
/// - [`withdraw`](RetryBudget::withdraw) (each retry or hedge) is allowed only while the bucket
///   holds *more* than half of `max_tokens`. It takes nothing: the retry's own outcome will.
///   So callers that withdraw at the same moment may all be allowed.
/// - [`deposit`](RetryBudget::deposit) does nothing: the first attempt is counted by its
///   outcome.
///
/// Unlike [`RatioBudget`](super::RatioBudget), it has no clock: it refills only with successes,
/// so after an outage retries resume once enough first attempts have succeeded. Its refusals
/// carry no retry-after hint.
///
/// Tokens are kept in thousandths (as gRPC does), in one atomic integer updated with
/// compare-and-swap: lock-free, and always within `[0, max_tokens]`.
///
/// Not `Clone`, on purpose: a clone would be a second bucket. Share one with
/// [`Arc`](std::sync::Arc), as the [module docs](super) show.
///
/// ```
/// use surely::budget::{RetryBudget, TokenBucket};
/// use surely::classify::AttemptClass;
///
/// let bucket = TokenBucket::builder().max_tokens(10).token_ratio(0.5).build()?;
/// assert!(bucket.withdraw().is_ok());
/// // Five health failures take the bucket from 10 to 5 tokens: not more than half, so no retries.
/// for _ in 0..5 {
///     bucket.record_outcome(AttemptClass::MaybeCommitted);
/// }
/// assert!(bucket.withdraw().is_err());
/// // Business answers change nothing; successes refill.
/// bucket.record_outcome(AttemptClass::Conflict);
/// assert!(bucket.withdraw().is_err());
/// bucket.record_outcome(AttemptClass::Success);
/// assert_eq!(bucket.tokens(), 5.5);
/// assert!(bucket.withdraw().is_ok());
/// # Ok::<(), surely::ConfigError>(())
/// ```
pub struct TokenBucket {
    /// Milli-tokens, always within `[0, max]`.
    tokens: AtomicU64,
    /// `max_tokens` in milli-tokens.
    max: u64,
    /// Milli-tokens added by each success; within `[1, max]`.
    ratio: u64,
    /// Retries are allowed only above this many milli-tokens: half of `max`.
    threshold: u64,
}

impl TokenBucket {
    /// A full bucket with the defaults: 10 tokens, refilled by 0.1 per success, the example of
    /// gRPC's retry design (A6). Five health failures more than successes can pay for stop
    /// retries; ten successes pay for one failure.
    pub fn new() -> Self {
        TokenBucket::from_valid(DEFAULT_MAX_TOKENS, DEFAULT_TOKEN_RATIO_MILLI)
    }

    /// A builder, starting from [`new`](Self::new)'s settings.
    pub fn builder() -> TokenBucketBuilder {
        TokenBucketBuilder {
            max_tokens: DEFAULT_MAX_TOKENS,
            token_ratio: DEFAULT_TOKEN_RATIO_MILLI as f64 / MILLI as f64,
        }
    }

    fn from_valid(max_tokens: u32, ratio: u64) -> Self {
        let max = u64::from(max_tokens) * MILLI as u64;
        TokenBucket {
            tokens: AtomicU64::new(max),
            max,
            ratio,
            threshold: max / 2,
        }
    }

    /// The capacity of the bucket.
    pub fn max_tokens(&self) -> u32 {
        // At most 1000, so the conversion cannot fail.
        u32::try_from(self.max / MILLI as u64).unwrap_or(u32::MAX)
    }

    /// The tokens added by each success, to three decimal places.
    pub fn token_ratio(&self) -> f64 {
        self.ratio as f64 / MILLI as f64
    }

    /// The tokens in the bucket now, to three decimal places: from 0 to
    /// [`max_tokens`](TokenBucket::max_tokens).
    pub fn tokens(&self) -> f64 {
        self.tokens.load(Ordering::SeqCst) as f64 / MILLI as f64
    }

    fn update(&self, f: impl Fn(u64) -> u64) {
        #[cfg(surely_loom)]
        if mutation("token_bucket_lost_update") {
            // A read, then a write: an outcome counted in between is lost.
            let t = self.tokens.load(Ordering::SeqCst);
            self.tokens.store(f(t), Ordering::SeqCst);
            return;
        }
        // The closure always returns `Some`, so this cannot fail.
        let _ = self
            .tokens
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(f(t)));
    }
}

impl RetryBudget for TokenBucket {
    fn describe(&self) -> crate::review::BudgetSettings {
        crate::review::BudgetSettings::TokenBucket {
            max_tokens: u32::try_from(self.max / MILLI as u64).unwrap_or(u32::MAX),
            token_ratio: self.ratio as f64 / MILLI as f64,
        }
    }

    /// Does nothing: the first attempt counts through its outcome.
    fn deposit(&self) {}

    /// Allowed while the bucket holds more than half of `max_tokens`; takes nothing. A refusal
    /// carries no retry-after hint: only successes refill the bucket.
    fn withdraw(&self) -> Result<(), BudgetExhausted> {
        if self.tokens.load(Ordering::SeqCst) > self.threshold {
            Ok(())
        } else {
            Err(BudgetExhausted::new(None))
        }
    }

    /// A health failure takes one token (down to zero), a success adds `token_ratio` (up to
    /// `max_tokens`); final answers and conflicts change nothing.
    fn record_outcome(&self, class: AttemptClass) {
        if class.is_health_failure() {
            self.update(|t| t.saturating_sub(MILLI as u64));
        } else if class == AttemptClass::Success {
            let (ratio, max) = (self.ratio, self.max);
            self.update(|t| t.saturating_add(ratio).min(max));
        }
    }
}

impl Default for TokenBucket {
    /// [`TokenBucket::new`]: 10 tokens, refilled by 0.1 per success.
    fn default() -> Self {
        TokenBucket::new()
    }
}

/// Builds a [`TokenBucket`]; made by [`TokenBucket::builder`]. Nothing is checked until
/// [`build`](TokenBucketBuilder::build), which returns an error rather than panicking.
#[derive(Clone, Copy, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct TokenBucketBuilder {
    max_tokens: u32,
    token_ratio: f64,
}

impl TokenBucketBuilder {
    /// The capacity of the bucket, which starts full: from 1 to 1000 (gRPC's range). Default:
    /// 10.
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// The tokens each success puts back: a finite number from 0.001 to `max_tokens`. Default:
    /// 0.1. Like gRPC, it is kept to three decimal places (rounding down), so a ratio below
    /// 0.001 is refused.
    pub fn token_ratio(mut self, token_ratio: f64) -> Self {
        self.token_ratio = token_ratio;
        self
    }

    /// Validates the configuration.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if `max_tokens` is not from 1 to 1000, or `token_ratio` is not a
    /// finite number from 0.001 to `max_tokens`.
    ///
    /// ```
    /// use surely::budget::TokenBucket;
    ///
    /// let err = TokenBucket::builder().max_tokens(0).build().unwrap_err();
    /// assert_eq!(err.to_string(), "invalid retry token bucket max_tokens: must be between 1 and 1000");
    /// assert!(TokenBucket::builder().token_ratio(f64::INFINITY).build().is_err());
    /// ```
    pub fn build(self) -> Result<TokenBucket, ConfigError> {
        const RATIO: &str = "retry token bucket token_ratio";
        let (max_tokens, token_ratio) = (self.max_tokens, self.token_ratio);
        if !(1..=1000).contains(&max_tokens) {
            return Err(ConfigError::new(
                "retry token bucket max_tokens",
                "must be between 1 and 1000",
            ));
        }
        if !token_ratio.is_finite() {
            return Err(ConfigError::new(RATIO, "must be a finite number"));
        }
        if token_ratio > f64::from(max_tokens) {
            return Err(ConfigError::new(RATIO, "must not exceed max_tokens"));
        }
        // Finite and at most 1000, so at most 1_000_000 after scaling.
        let ratio = to_milli(token_ratio.max(0.0)) as u64;
        if ratio == 0 {
            return Err(ConfigError::new(RATIO, "must be at least 0.001"));
        }
        Ok(TokenBucket::from_valid(max_tokens, ratio))
    }
}

impl fmt::Debug for TokenBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBucket")
            .field("max_tokens", &self.max_tokens())
            .field("token_ratio", &self.token_ratio())
            .field("tokens", &self.tokens())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults `new` assembles without checking are the ones `build` accepts.
    #[test]
    fn the_defaults_build() {
        let built = TokenBucket::builder().build().unwrap();
        let new = TokenBucket::new();
        assert_eq!(
            (built.max_tokens(), built.token_ratio(), built.tokens()),
            (new.max_tokens(), new.token_ratio(), new.tokens())
        );
    }
}
