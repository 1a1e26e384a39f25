//! Why a task waits, and how long: the reasons a consumer's handler may answer instead of
//! success, and the policy each one has ([`docs::boundary`](crate::docs::boundary#why-a-task-waits)).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::Versions;
use crate::backoff::{Backoff, Jitter};
use crate::classify::BoxError;
use crate::ConfigError;

/// Why a task could not be done now: a small closed set, each with a stable code that the
/// stores keep. See [the reasons' table](crate::docs::boundary#why-a-task-waits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Reason {
    /// A system blip (a connection refused, a lock timeout): back off with jitter, a bounded
    /// number of times. Code `transient`.
    Transient,
    /// A downstream asked to be called later (`Retry-After`, gRPC pushback): never sooner than
    /// it asked. Code `paced`.
    Paced,
    /// The business is not ready (stock short, a document not uploaded yet): recheck slowly,
    /// and past an expiry hand the task to a person. Code `business`.
    Business,
    /// The task no longer applies (the aggregate moved past it, the order was cancelled):
    /// recorded as a no-op with the versions, never retried. Code `stale`.
    Stale,
    /// A rule refused the task: a person decides, now. Code `person`.
    Person,
}

impl Reason {
    /// Every reason, in code order.
    pub const ALL: [Reason; 5] = [
        Reason::Transient,
        Reason::Paced,
        Reason::Business,
        Reason::Stale,
        Reason::Person,
    ];

    /// The reason's stable code, as the stores keep it and the metrics label it.
    pub fn code(self) -> &'static str {
        match self {
            Reason::Transient => "transient",
            Reason::Paced => "paced",
            Reason::Business => "business",
            Reason::Stale => "stale",
            Reason::Person => "person",
        }
    }

    /// The reason whose [code](Self::code) is `code`.
    ///
    /// ```
    /// use surely::inbox::Reason;
    ///
    /// assert_eq!(Reason::from_code("paced"), Ok(Reason::Paced));
    /// let err = Reason::from_code("snoozed").unwrap_err();
    /// assert_eq!(err.code(), "snoozed");
    /// ```
    ///
    /// # Errors
    ///
    /// [`UnknownReason`], naming the code, for one this version does not know (a store
    /// written by a later version): the task it belongs to is held, not dropped.
    pub fn from_code(code: &str) -> Result<Reason, UnknownReason> {
        Reason::ALL
            .into_iter()
            .find(|r| r.code() == code)
            .ok_or_else(|| UnknownReason {
                code: code.chars().take(64).collect(),
            })
    }

    /// Whether the task waits and comes back (transient, paced, business), rather than ending
    /// as a no-op (stale) or with a person (person).
    pub fn comes_back(self) -> bool {
        matches!(self, Reason::Transient | Reason::Paced | Reason::Business)
    }

    /// The index of a reason that comes back, in a consumer's policies.
    fn slot(self) -> Option<usize> {
        match self {
            Reason::Transient => Some(0),
            Reason::Paced => Some(1),
            Reason::Business => Some(2),
            Reason::Stale | Reason::Person => None,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl std::str::FromStr for Reason {
    type Err = UnknownReason;

    fn from_str(code: &str) -> Result<Reason, UnknownReason> {
        Reason::from_code(code)
    }
}

/// A reason code this version of the crate does not know (its first 64 characters).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown wait reason `{code}`")]
pub struct UnknownReason {
    code: String,
}

impl UnknownReason {
    /// The code read.
    pub fn code(&self) -> &str {
        &self.code
    }
}

/// The longest text a task keeps for a reason's explanation, or a person's name.
const MAX_WHY: usize = 1024;

/// A handler's answer when the task cannot be done now: why, and for some reasons when to come
/// back. The consumer's [policy](WaitPolicy) for the reason decides when the task really comes
/// back: a delay asked for is kept within the policy's bounds, and recorded as clamped when it
/// was not.
///
/// Any error converts to a [transient](Reason::Transient) wait (so `?` works in a handler), its
/// message kept as the explanation and the error as the [source](Self::source).
///
/// ```
/// use std::time::Duration;
/// use surely::inbox::{Reason, Wait};
///
/// let short = Wait::business("2 of sku-42 in stock, 5 needed");
/// assert_eq!(short.reason(), Reason::Business);
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("retry-after", "30".parse().unwrap());
/// let paced = Wait::paced_by(&headers);
/// assert_eq!((paced.reason(), paced.asked()), (Reason::Paced, Some(Duration::from_secs(30))));
///
/// // A malformed Retry-After falls back to the transient policy, and says so.
/// headers.insert("retry-after", "soon".parse().unwrap());
/// let blip = Wait::paced_by(&headers);
/// assert_eq!(blip.reason(), Reason::Transient);
/// assert!(blip.why().contains("Retry-After"));
/// ```
pub struct Wait {
    reason: Reason,
    asked: Option<Duration>,
    why: String,
    who: Option<String>,
    current: Option<i64>,
    source: Option<BoxError>,
}

impl Wait {
    fn new(reason: Reason, why: impl fmt::Display) -> Wait {
        Wait {
            reason,
            asked: None,
            why: bounded(why.to_string()),
            who: None,
            current: None,
            source: None,
        }
    }

    /// A system blip: the consumer's transient policy (backoff with jitter, bounded attempts).
    pub fn transient(why: impl fmt::Display) -> Wait {
        Wait::new(Reason::Transient, why)
    }

    /// A downstream asked to be called again in `after`: the task comes back no sooner. A pace
    /// beyond the paced policy's [`at_most`](WaitPolicy::at_most) is not shortened: the task
    /// goes to a person instead.
    pub fn paced(after: Duration) -> Wait {
        let mut wait = Wait::new(
            Reason::Paced,
            format_args!("the downstream asked for {after:?}"),
        );
        wait.asked = Some(after);
        wait
    }

    /// The pace a downstream's answer asks for: its `Retry-After` (seconds or an HTTP date) or
    /// its `grpc-retry-pushback-ms`, read by the crate's [pushback](crate::pushback) parsers.
    /// A missing or malformed value, or a gRPC pushback that says not to retry, is a
    /// [transient](Self::transient) wait that says why.
    pub fn paced_by(headers: &HeaderMap) -> Wait {
        if let Some(value) = headers.get(http::header::RETRY_AFTER) {
            return match crate::pushback::parse_retry_after(value, SystemTime::now()) {
                Ok(after) => Wait::paced(after),
                Err(_) => Wait::transient("malformed Retry-After: the transient policy instead"),
            };
        }
        if let Some(value) = headers.get("grpc-retry-pushback-ms") {
            return match crate::pushback::parse_grpc_pushback(value) {
                crate::pushback::Pushback::After(after) => Wait::paced(after),
                _ => Wait::transient(
                    "grpc-retry-pushback-ms says not to retry: the transient policy instead",
                ),
            };
        }
        Wait::transient("no Retry-After to pace by: the transient policy instead")
    }

    /// The business is not ready: the consumer's business policy (a slow recheck, and an
    /// expiry into a person's queue).
    pub fn business(why: impl fmt::Display) -> Wait {
        Wait::new(Reason::Business, why)
    }

    /// The task no longer applies: the business object is at `current`, past the task's
    /// version, or was cancelled (say so in `why`). Recorded as a no-op, with both versions;
    /// never retried.
    pub fn stale(current: i64, why: impl fmt::Display) -> Wait {
        let mut wait = Wait::new(Reason::Stale, why);
        wait.current = Some(current);
        wait
    }

    /// A rule (`who`: its name, or the person's) refused the task: it goes to the manual queue
    /// now, with who and why.
    pub fn person(who: impl fmt::Display, why: impl fmt::Display) -> Wait {
        let mut wait = Wait::new(Reason::Person, why);
        wait.who = Some(bounded(who.to_string()));
        wait
    }

    /// The same wait, asking to come back in `after` (transient and business): the policy's
    /// bounds still apply, and a clamp is recorded. A paced wait's pace is replaced.
    #[must_use]
    pub fn after(mut self, after: Duration) -> Wait {
        if self.reason.comes_back() {
            self.asked = Some(after);
        }
        self
    }

    /// The same wait, with `source` as its cause.
    #[must_use]
    pub fn caused_by(mut self, source: impl Into<BoxError>) -> Wait {
        self.source = Some(source.into());
        self
    }

    /// Why the task waits.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The delay asked for, if one was.
    pub fn asked(&self) -> Option<Duration> {
        self.asked
    }

    /// The explanation (at most 1 KiB, cut on a character boundary).
    pub fn why(&self) -> &str {
        &self.why
    }

    /// Who refused it ([`person`](Self::person)).
    pub fn who(&self) -> Option<&str> {
        self.who.as_deref()
    }

    /// The business object's version ([`stale`](Self::stale)).
    pub fn current(&self) -> Option<i64> {
        self.current
    }

    /// The error that caused it, if one did.
    pub fn source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for Wait {
    fn from(error: E) -> Wait {
        Wait::transient(&error).caused_by(error)
    }
}

impl fmt::Debug for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wait")
            .field("reason", &self.reason)
            .field("asked", &self.asked)
            .field("why", &self.why)
            .field("who", &self.who)
            .field("current", &self.current)
            .field("source", &self.source)
            .finish()
    }
}

/// `text`, cut to [`MAX_WHY`] bytes on a character boundary, control characters but newlines
/// and tabs replaced: what a task keeps of a handler's text.
fn bounded(text: String) -> String {
    let text: String = text
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                ' '
            } else {
                c
            }
        })
        .collect();
    crate::ledger::truncate(&text, MAX_WHY).to_owned()
}

/// The most attempts a policy may allow.
const MAX_ATTEMPTS: u32 = 10_000;

/// How a consumer waits for one [reason](Reason) that comes back: the delays (a backoff, or
/// what the handler or the downstream asked, kept within `at_least`..`at_most`), how many
/// attempts in a row answered with the reason, and how long the task may wait in all (its
/// expiry, counted from its first wait). Past either, the task goes to a person.
///
/// ```
/// use std::time::Duration;
/// use surely::inbox::WaitPolicy;
/// use surely::retry::backoff::Backoff;
///
/// let minutes = |m: u64| Duration::from_secs(60 * m);
/// let stock = WaitPolicy::new(Backoff::constant(minutes(5)))
///     .at_least(minutes(1))
///     .expire_after(minutes(24 * 60));
/// assert_eq!(stock.expiry(), minutes(24 * 60));
/// ```
#[derive(Clone, Debug)]
pub struct WaitPolicy {
    backoff: Backoff,
    min: Duration,
    max: Duration,
    attempts: u32,
    expiry: Duration,
}

impl WaitPolicy {
    /// A policy whose delays are `backoff`'s, capped at its cap; 20 attempts in a row; an
    /// expiry of a day.
    pub fn new(backoff: Backoff) -> WaitPolicy {
        WaitPolicy {
            max: backoff.cap(),
            backoff,
            min: Duration::ZERO,
            attempts: 20,
            expiry: Duration::from_secs(86_400),
        }
    }

    /// The crate's policy for `reason`, if it comes back:
    ///
    /// | reason | delays | bounds | attempts in a row | expiry |
    /// |---|---|---|---|---|
    /// | transient | 1 s doubling to 5 min, full jitter | 0 to 5 min | 10 | 1 h |
    /// | paced | as asked | 0 to 1 h | 20 | 6 h |
    /// | business | 5 min | 1 min to 1 h | 1 000 | 24 h |
    pub fn default_for(reason: Reason) -> Option<WaitPolicy> {
        let (minute, hour) = (Duration::from_secs(60), Duration::from_secs(3600));
        match reason {
            Reason::Transient => {
                let backoff = Backoff::exponential(Duration::from_secs(1))
                    .cap(5 * minute)
                    .jitter(Jitter::Full)
                    .build()
                    .ok()?;
                Some(WaitPolicy::new(backoff).attempts(10).expire_after(hour))
            }
            Reason::Paced => Some(
                WaitPolicy::new(Backoff::constant(Duration::from_secs(1)))
                    .at_most(hour)
                    .expire_after(6 * hour),
            ),
            Reason::Business => Some(
                WaitPolicy::new(Backoff::constant(5 * minute))
                    .at_least(minute)
                    .at_most(hour)
                    .attempts(1_000)
                    .expire_after(24 * hour),
            ),
            _ => None,
        }
    }

    /// No delay shorter than `min`: a shorter one asked for is raised to it, and recorded as
    /// clamped.
    #[must_use]
    pub fn at_least(mut self, min: Duration) -> WaitPolicy {
        self.min = min;
        self
    }

    /// No delay longer than `max`: a longer one asked for is lowered to it (for a paced wait,
    /// never: the task goes to a person), and recorded as clamped.
    #[must_use]
    pub fn at_most(mut self, max: Duration) -> WaitPolicy {
        self.max = max;
        self
    }

    /// At most `attempts` (1 to 10 000) attempts in a row answered with this reason; the
    /// last one's wait goes to a person.
    #[must_use]
    pub fn attempts(mut self, attempts: u32) -> WaitPolicy {
        self.attempts = attempts;
        self
    }

    /// The task waits at most `expiry` from its first wait (of any reason) while this is its
    /// reason; a wait past it goes to a person, and a delay that would end past it is
    /// shortened to end there (recorded as clamped), but a paced one, which is never
    /// shortened: the task goes to a person instead.
    #[must_use]
    pub fn expire_after(mut self, expiry: Duration) -> WaitPolicy {
        self.expiry = expiry;
        self
    }

    /// The shortest delay.
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The longest delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The attempts in a row.
    pub fn max_attempts(&self) -> u32 {
        self.attempts
    }

    /// The expiry.
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    fn validate(&self, setting: &'static str) -> Result<(), ConfigError> {
        ConfigError::at_most_max(setting, self.expiry)?;
        ConfigError::at_most_max(setting, self.max)?;
        if self.expiry.is_zero() {
            return Err(ConfigError::new(
                setting,
                "the expiry must be more than zero",
            ));
        }
        if self.min > self.max {
            return Err(ConfigError::new(
                setting,
                format!(
                    "the shortest delay ({:?}) is over the longest ({:?})",
                    self.min, self.max
                ),
            ));
        }
        if self.max > self.expiry {
            return Err(ConfigError::new(
                setting,
                format!(
                    "the longest delay ({:?}) is over the expiry ({:?})",
                    self.max, self.expiry
                ),
            ));
        }
        if self.attempts == 0 || self.attempts > MAX_ATTEMPTS {
            return Err(ConfigError::new(
                setting,
                format!(
                    "attempts must be 1 to {MAX_ATTEMPTS}, not {}",
                    self.attempts
                ),
            ));
        }
        Ok(())
    }
}

/// A consumer of events: its name (the inbox records events per consumer), how it treats
/// versions, and a [policy](WaitPolicy) for each [reason](Reason) a task may wait for. Cheap to
/// clone.
///
/// ```
/// use std::time::Duration;
/// use surely::inbox::{Consumer, Reason, Versions, WaitPolicy};
/// use surely::retry::backoff::Backoff;
///
/// let stock = WaitPolicy::new(Backoff::constant(Duration::from_secs(600)))
///     .expire_after(Duration::from_secs(2 * 86_400));
/// let consumer = Consumer::builder("inventory")
///     .versions(Versions::InOrder)
///     .policy(Reason::Business, stock)
///     .build()?;
/// assert_eq!(consumer.name(), "inventory");
///
/// // A stale or refused task never comes back: it has no policy.
/// let err = Consumer::builder("inventory")
///     .policy(Reason::Stale, WaitPolicy::new(Backoff::none()))
///     .build()
///     .unwrap_err();
/// assert_eq!(err.setting(), "consumer policy");
/// # Ok::<(), surely::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Consumer {
    inner: Arc<ConsumerInner>,
}

#[derive(Debug)]
struct ConsumerInner {
    name: String,
    versions: Versions,
    policies: [WaitPolicy; 3],
    max_deliveries: u64,
}

impl Consumer {
    /// A builder for the consumer named `name`: [`Versions::Any`], and the crate's
    /// [policies](WaitPolicy::default_for).
    pub fn builder(name: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder {
            name: name.into(),
            versions: Versions::Any,
            policies: Vec::new(),
            max_deliveries: Consumer::DEFAULT_MAX_DELIVERIES,
        }
    }

    /// The deliveries of one message (JetStream's delivery count) past which a task goes to a
    /// person without running its handler, unless [set](ConsumerBuilder::max_deliveries).
    pub const DEFAULT_MAX_DELIVERIES: u64 = 10_000;

    /// Its [`max_deliveries`](ConsumerBuilder::max_deliveries).
    pub fn max_deliveries(&self) -> u64 {
        self.inner.max_deliveries
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// How it treats versions.
    pub fn versions(&self) -> Versions {
        self.inner.versions
    }

    /// Its settings, for a [review](crate::review) of the service. Whether its events are
    /// changes of an aggregate or facts is the caller's to say
    /// ([`InboxSettings::change_events`](crate::review::InboxSettings::change_events)).
    ///
    /// ```
    /// use surely::inbox::{Consumer, Versions};
    /// use surely::review::VersionPolicy;
    ///
    /// let consumer = Consumer::builder("shipping").versions(Versions::InOrder).build().unwrap();
    /// assert_eq!(consumer.describe().versions, VersionPolicy::InOrder);
    /// ```
    pub fn describe(&self) -> crate::review::InboxSettings {
        use crate::review::VersionPolicy;
        crate::review::InboxSettings {
            name: self.inner.name.clone(),
            versions: match self.inner.versions {
                Versions::Any => VersionPolicy::Any,
                Versions::InOrder => VersionPolicy::InOrder,
                Versions::Latest => VersionPolicy::Latest,
            },
            change_events: None,
        }
    }

    /// Its policy for `reason`, if the reason comes back.
    pub fn policy(&self, reason: Reason) -> Option<&WaitPolicy> {
        reason.slot().map(|i| &self.inner.policies[i])
    }
}

/// Builds a [`Consumer`]; [`build`](Self::build) checks every policy.
#[derive(Debug)]
#[must_use]
pub struct ConsumerBuilder {
    name: String,
    versions: Versions,
    policies: Vec<(Reason, WaitPolicy)>,
    max_deliveries: u64,
}

impl ConsumerBuilder {
    /// How it treats versions (default [`Versions::Any`]).
    pub fn versions(mut self, versions: Versions) -> Self {
        self.versions = versions;
        self
    }

    /// Its policy for `reason` (transient, paced or business), in place of the crate's.
    pub fn policy(mut self, reason: Reason, policy: WaitPolicy) -> Self {
        self.policies.push((reason, policy));
        self
    }

    /// A message the broker delivered more than `deliveries` times (JetStream's delivery
    /// count) goes to a person before its handler runs (default 10 000). The policies bound
    /// the attempts that answer; this bounds the deliveries that never answer: a handler that
    /// kills its consumer (a poison message) is redelivered after each crash, and without it
    /// would run for ever. Early deliveries count too: leave room for them above the
    /// policies' attempts.
    pub fn max_deliveries(mut self, deliveries: u64) -> Self {
        self.max_deliveries = deliveries;
        self
    }

    /// The consumer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a name that is empty, over 255 bytes or holds a control character
    /// (`consumer name`); a policy for a reason that does not come back (stale, person), or
    /// one whose bounds do not hold: a shortest delay over the longest, a longest delay over
    /// the expiry, a zero expiry or one over ten years, attempts not 1 to 10 000
    /// (`consumer policy`, the reason named).
    pub fn build(self) -> Result<Consumer, ConfigError> {
        if self.max_deliveries == 0 {
            return Err(ConfigError::new(
                "consumer max deliveries",
                "must be at least 1",
            ));
        }
        if self.name.is_empty() || self.name.len() > 255 || self.name.chars().any(char::is_control)
        {
            return Err(ConfigError::new(
                "consumer name",
                "must be 1 to 255 bytes without a control character",
            ));
        }
        let defaults = [Reason::Transient, Reason::Paced, Reason::Business]
            .map(|r| WaitPolicy::default_for(r).ok_or(r));
        let mut policies = match defaults {
            [Ok(t), Ok(p), Ok(b)] => [t, p, b],
            _ => return Err(ConfigError::new("consumer policy", "no default policy")),
        };
        for (reason, policy) in self.policies {
            let Some(slot) = reason.slot() else {
                return Err(ConfigError::new(
                    "consumer policy",
                    format!("a {reason} task never comes back: it has no policy"),
                ));
            };
            policy.validate("consumer policy").map_err(|e| {
                ConfigError::new("consumer policy", format!("{reason}: {}", e.reason()))
            })?;
            policies[slot] = policy;
        }
        Ok(Consumer {
            inner: Arc::new(ConsumerInner {
                name: self.name,
                versions: self.versions,
                policies,
                max_deliveries: self.max_deliveries,
            }),
        })
    }
}

/// A task waiting: not done, not recorded as processed; to come back in
/// [`delay`](Self::delay). Acknowledge the delivery negatively with that delay (the JetStream
/// consumer does).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiting {
    /// Why.
    pub reason: Reason,
    /// The attempts made so far (the handler's runs that answered with a wait).
    pub attempts: u32,
    /// How long until it comes back.
    pub delay: Duration,
    /// The delay asked for, when one was and the policy changed it.
    pub clamped_from: Option<Duration>,
    /// The delivery came before the task's time: the handler did not run.
    pub early: bool,
    /// The handler's explanation (for an early delivery, the one it gave last).
    pub why: String,
}

/// Where a task stands in its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskState {
    /// It waits for its next time.
    Waiting,
    /// A person must decide: retry it, or discard it.
    Manual,
}

impl TaskState {
    /// The state's stable code.
    pub fn code(self) -> &'static str {
        match self {
            TaskState::Waiting => "waiting",
            TaskState::Manual => "manual",
        }
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn from_code(code: &str) -> Option<TaskState> {
        [TaskState::Waiting, TaskState::Manual]
            .into_iter()
            .find(|s| s.code() == code)
    }
}

/// One attempt of a task that answered with a wait, as its store keeps it: the evidence a
/// person reads.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Step {
    /// The attempt's number, from 1.
    pub attempt: u32,
    /// When it answered (wall clock).
    pub at: SystemTime,
    /// Why it waited.
    pub reason: Reason,
    /// The handler's explanation.
    pub why: String,
    /// The delay it was given (zero when it went to a person).
    pub delay: Duration,
    /// The delay asked for, when the policy changed it.
    pub clamped_from: Option<Duration>,
}

/// A task that waits or is in the manual queue, as its inbox keeps it: what a person reads.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Task {
    /// The consumer it belongs to.
    pub consumer: String,
    /// Its event.
    pub event: crate::outbox::Event,
    /// Where it stands.
    pub state: TaskState,
    /// Why it waited last.
    pub reason: Reason,
    /// The attempts that answered with a wait.
    pub attempts: u32,
    /// How long ago it first waited (or a person last retried it).
    pub age: Duration,
    /// For a waiting task, how long until it comes back (zero: it is due).
    pub due_in: Option<Duration>,
    /// The last explanation: the handler's, why it went to a person, or the person's note.
    pub why: String,
    /// Its attempts' evidence, the oldest first.
    pub steps: Vec<Step>,
}

/// What a task that waited so far knows about itself, for [`decide`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prior {
    pub(crate) reason: Reason,
    pub(crate) attempts: u32,
    pub(crate) streak: u32,
}

/// What becomes of a task whose handler answered `wait`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// It comes back after `delay`.
    Retry {
        reason: Reason,
        attempts: u32,
        streak: u32,
        delay: Duration,
        clamped_from: Option<Duration>,
    },
    /// It goes to a person, for `why`.
    Manual {
        reason: Reason,
        attempts: u32,
        streak: u32,
        why: String,
    },
    /// It is a recorded no-op: the business object is at `current`.
    Stale { current: i64, why: String },
}

impl Decision {
    /// The step a store keeps for this decision.
    pub(crate) fn step(&self, wait: &Wait) -> Option<Step> {
        let (reason, attempt, delay, clamped_from) = match self {
            Decision::Retry {
                reason,
                attempts,
                delay,
                clamped_from,
                ..
            } => (*reason, *attempts, *delay, *clamped_from),
            Decision::Manual {
                reason, attempts, ..
            } => (*reason, *attempts, Duration::ZERO, None),
            Decision::Stale { .. } => return None,
        };
        Some(Step {
            attempt,
            at: SystemTime::now(),
            reason,
            why: wait.why.clone(),
            delay,
            clamped_from,
        })
    }
}

/// Decides what becomes of a task whose handler answered `wait` after `prior` (none: its first
/// wait), the task being `age` old (since its first wait; zero for a first one).
pub(crate) fn decide(
    consumer: &Consumer,
    prior: Option<Prior>,
    age: Duration,
    wait: &Wait,
) -> Decision {
    let attempts = prior.map_or(0, |p| p.attempts).saturating_add(1);
    let reason = wait.reason;
    let streak = match prior {
        Some(p) if p.reason == reason => p.streak.saturating_add(1),
        _ => 1,
    };
    let manual = |why: String| Decision::Manual {
        reason,
        attempts,
        streak,
        why,
    };
    let policy = match reason {
        Reason::Stale => {
            return Decision::Stale {
                current: wait.current.unwrap_or(i64::MAX),
                why: wait.why.clone(),
            }
        }
        Reason::Person => {
            let who = wait.who.as_deref().unwrap_or("a rule");
            return manual(format!("refused by {who}: {}", wait.why));
        }
        _ => match consumer.policy(reason) {
            Some(policy) => policy,
            None => return manual(format!("no policy for {reason}")),
        },
    };
    let remaining = policy.expiry.saturating_sub(age);
    if remaining.is_zero() {
        return manual(format!(
            "expired: waited {age:?} ({reason}: {}), the policy's expiry is {:?}",
            wait.why, policy.expiry
        ));
    }
    if streak >= policy.attempts {
        return manual(format!(
            "{streak} attempts in a row waited ({reason}: {}), the policy's limit",
            wait.why
        ));
    }
    let planned = match wait.asked {
        Some(asked) => asked,
        None => policy
            .backoff
            .iter()
            .nth(streak.saturating_sub(1) as usize)
            .unwrap_or(policy.max),
    };
    if reason == Reason::Paced && planned > policy.max {
        return manual(format!(
            "the downstream asked for {planned:?}, over the paced policy's {:?}: never sooner \
             than asked, so a person decides",
            policy.max
        ));
    }
    if reason == Reason::Paced && planned.max(policy.min) > remaining {
        return manual(format!(
            "the downstream asked for {planned:?}, past the task's expiry in {remaining:?}: \
             never sooner than asked, so a person decides"
        ));
    }
    let delay = planned.clamp(policy.min, policy.max).min(remaining);
    let clamped_from = match wait.asked {
        Some(asked) if asked != delay => Some(asked),
        _ => None,
    };
    Decision::Retry {
        reason,
        attempts,
        streak,
        delay,
        clamped_from,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer() -> Consumer {
        Consumer::builder("c").build().unwrap()
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_paced_wait_is_never_sooner_than_asked_and_one_past_the_bound_goes_to_a_person() {
        let c = consumer();
        let d = decide(&c, None, Duration::ZERO, &Wait::paced(S(30)));
        assert!(matches!(d, Decision::Retry { delay, clamped_from: None, .. } if delay == S(30)));
        let d = decide(&c, None, Duration::ZERO, &Wait::paced(S(7200)));
        assert!(
            matches!(
                d,
                Decision::Manual {
                    reason: Reason::Paced,
                    ..
                }
            ),
            "{d:?}"
        );
    }

    #[test]
    fn a_business_ask_below_the_recheck_floor_is_raised_and_recorded() {
        let c = consumer();
        let wait = Wait::business("short").after(Duration::from_millis(5));
        let d = decide(&c, None, Duration::ZERO, &wait);
        assert_eq!(
            d,
            Decision::Retry {
                reason: Reason::Business,
                attempts: 1,
                streak: 1,
                delay: S(60),
                clamped_from: Some(Duration::from_millis(5)),
            }
        );
    }

    #[test]
    fn a_delay_past_the_expiry_ends_there_and_a_wait_past_it_goes_to_a_person() {
        let c = consumer();
        let prior = Some(Prior {
            reason: Reason::Business,
            attempts: 3,
            streak: 3,
        });
        let d = decide(&c, prior, S(86_400 - 10), &Wait::business("short"));
        assert!(
            matches!(d, Decision::Retry { delay, .. } if delay == S(10)),
            "{d:?}"
        );
        let d = decide(&c, prior, S(86_400), &Wait::business("short"));
        assert!(matches!(d, Decision::Manual { attempts: 4, .. }), "{d:?}");
    }

    #[test]
    fn transient_attempts_are_bounded_and_a_new_reason_starts_a_new_streak() {
        let c = consumer();
        let prior = Some(Prior {
            reason: Reason::Transient,
            attempts: 9,
            streak: 9,
        });
        let d = decide(&c, prior, S(1), &Wait::transient("blip"));
        assert!(matches!(d, Decision::Manual { streak: 10, .. }), "{d:?}");
        let d = decide(&c, prior, S(1), &Wait::business("short"));
        assert!(
            matches!(
                d,
                Decision::Retry {
                    streak: 1,
                    attempts: 10,
                    ..
                }
            ),
            "{d:?}"
        );
    }

    #[test]
    fn stale_and_person_never_come_back() {
        let c = consumer();
        let d = decide(&c, None, Duration::ZERO, &Wait::stale(4, "cancelled"));
        assert!(matches!(d, Decision::Stale { current: 4, .. }));
        let d = decide(
            &c,
            None,
            Duration::ZERO,
            &Wait::person("fraud rule", "amount"),
        );
        assert!(
            matches!(d, Decision::Manual { reason: Reason::Person, ref why, .. } if why.contains("fraud rule"))
        );
    }

    #[test]
    fn bad_policies_are_typed_errors() {
        let b = || WaitPolicy::new(Backoff::constant(S(1)));
        for (policy, says) in [
            (b().expire_after(Duration::ZERO), "more than zero"),
            (b().expire_after(Duration::MAX), "ten years"),
            (b().at_least(S(5)).at_most(S(2)), "over the longest"),
            (b().at_most(S(100)).expire_after(S(10)), "over the expiry"),
            (b().attempts(0), "attempts"),
        ] {
            let err = Consumer::builder("c")
                .policy(Reason::Transient, policy)
                .build()
                .unwrap_err();
            assert_eq!(err.setting(), "consumer policy");
            assert!(err.reason().contains(says), "{}", err.reason());
        }
        assert!(Consumer::builder("").build().is_err());
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Any duration, the extremes often.
        fn duration() -> impl Strategy<Value = Duration> {
            prop_oneof![
                Just(Duration::ZERO),
                Just(Duration::MAX),
                Just(crate::MAX_DURATION),
                (0u64..10_000_000).prop_map(Duration::from_millis),
                any::<u64>().prop_map(Duration::from_secs),
                (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
            ]
        }

        fn reason() -> impl Strategy<Value = Reason> {
            proptest::sample::select(Reason::ALL.to_vec())
        }

        proptest! {
            /// No policy, asked delay, age or history panics; a policy that builds bounds every
            /// delay; a paced task never comes back sooner than asked.
            #[test]
            fn no_input_panics_and_every_delay_is_within_its_policy(
                (min, max, expiry, attempts) in (duration(), duration(), duration(), any::<u32>()),
                base in duration(),
                asked in proptest::option::of(duration()),
                age in duration(),
                reason in reason(),
                prior in proptest::option::of((reason(), any::<u32>(), any::<u32>())),
                current in any::<i64>(),
            ) {
                let backoff = Backoff::constant(base);
                let policy = WaitPolicy::new(backoff).at_least(min).at_most(max)
                    .attempts(attempts).expire_after(expiry);
                let Ok(consumer) = Consumer::builder("c").policy(reason, policy.clone()).build()
                else {
                    return Ok(());
                };
                let mut wait = match reason {
                    Reason::Stale => Wait::stale(current, "moved on"),
                    Reason::Person => Wait::person("rule", "no"),
                    Reason::Paced => Wait::paced(asked.unwrap_or(Duration::ZERO)),
                    _ => Wait::business("x"),
                };
                if reason != Reason::Paced
                    && let Some(a) = asked {
                        wait = Wait::new(reason, "x").after(a);
                    }
                let prior = prior.map(|(reason, attempts, streak)| Prior { reason, attempts, streak });
                match decide(&consumer, prior, age, &wait) {
                    Decision::Retry { delay, clamped_from, reason: r, .. } => {
                        prop_assert_eq!(r, reason);
                        prop_assert!(delay <= policy.max());
                        prop_assert!(delay <= policy.expiry().saturating_sub(age));
                        prop_assert!(delay >= policy.min() || delay == policy.expiry().saturating_sub(age));
                        if reason == Reason::Paced {
                            // Never sooner than asked, not even at the expiry.
                            prop_assert!(delay >= wait.asked().unwrap_or_default());
                        }
                        if let Some(from) = clamped_from {
                            prop_assert_ne!(from, delay);
                        }
                    }
                    Decision::Manual { why, .. } => prop_assert!(!why.is_empty()),
                    Decision::Stale { current: c, .. } => prop_assert_eq!(c, current),
                }
            }

            /// Any bytes as a `Retry-After` or a gRPC pushback: a paced wait or a transient
            /// one, never a panic.
            #[test]
            fn any_pushback_header_is_paced_or_transient(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
                for name in ["retry-after", "grpc-retry-pushback-ms"] {
                    let Ok(value) = http::HeaderValue::from_bytes(&bytes) else { continue };
                    let mut headers = HeaderMap::new();
                    headers.insert(name, value);
                    let wait = Wait::paced_by(&headers);
                    prop_assert!(matches!(wait.reason(), Reason::Paced | Reason::Transient));
                    prop_assert_eq!(wait.reason() == Reason::Paced, wait.asked().is_some());
                }
            }

            /// Any text a handler gives is kept bounded and without control characters (but
            /// newlines and tabs).
            #[test]
            fn a_handlers_text_is_bounded(text in ".{0,3000}") {
                let wait = Wait::business(&text);
                prop_assert!(wait.why().len() <= MAX_WHY);
                prop_assert!(!wait.why().chars().any(|c| c.is_control() && c != '\n' && c != '\t'));
            }
        }
    }
}
