//! The comparison: sources merged by key, rules applied, differences recorded.

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use super::rule::{check, Rule, RuleError};
use super::source::{ErasedSource, Merge};
use super::Difference;
use super::{DifferenceStore, Fact, ReconcileError, Seen, SeenFact};
use crate::record::Recorder;

/// Compares its sources key by key under its rules, and records every difference in its
/// store. See the [module docs](super).
///
/// A pass ([`run_once`](Self::run_once)) reads every source in pages of ascending keys and
/// merges them, so it holds one page per source at a time, whatever the number of keys. For
/// each key and each rule it takes the rule's sources' facts; a key none of them holds is not
/// the rule's business, a key with a fact changed within the rule's grace window is in flight,
/// and any other key is matched against the rule's combinations. A difference is
/// [recorded](DifferenceStore::record) with its [`RepairId`](super::RepairId): a pass over the
/// same facts records the same ids, so a second pass adds nothing, and several reconcilers over
/// one store record each difference once.
///
/// After a pass, the store's [stats](DifferenceStore::stats) go to the
/// [recorder](ReconcilerBuilder::recorder), when there is one.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use surely::reconcile::{MemoryDifferences, MemorySource, Reconciler, Rule, Want};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
/// let (events, projection) = (MemorySource::new(), MemorySource::new());
/// events.put("e-1", "published", 1, SystemTime::UNIX_EPOCH);
/// let mut reconciler = Reconciler::builder(MemoryDifferences::new())
///     .source("events", events)
///     .source("projection", projection)
///     .rule(
///         Rule::new("event-projection", ["events", "projection"])
///             .grace(Duration::from_secs(60))
///             .consistent([Want::is("published"), Want::is("applied")])
///             .repair([Want::is("published"), Want::Missing], "replay-event"),
///     )
///     .page_size(500)
///     .build()
///     .unwrap();
/// let pass = reconciler.run_once(SystemTime::now()).await.unwrap();
/// assert_eq!((pass.keys, pass.new), (1, 1));
/// // Passes every ten minutes until the service stops:
/// // tokio::spawn(reconciler.run(Duration::from_secs(600), shutdown));
/// # }
/// ```
pub struct Reconciler<St> {
    store: St,
    names: Vec<String>,
    sources: Vec<Arc<dyn ErasedSource>>,
    rules: Vec<(Rule, Vec<usize>)>,
    page_size: usize,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

/// Builds a [`Reconciler`]; made by [`Reconciler::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct ReconcilerBuilder<St> {
    store: St,
    names: Vec<String>,
    sources: Vec<Arc<dyn ErasedSource>>,
    rules: Vec<Rule>,
    page_size: usize,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

/// What one pass found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Pass {
    /// Keys read (each key once, whatever the number of sources holding it).
    pub keys: u64,
    /// Rule checks that found the facts consistent.
    pub consistent: u64,
    /// Rule checks left alone: a fact changed within the rule's grace window.
    pub in_flight: u64,
    /// Differences found (new and known).
    pub differences: u64,
    /// Of those, recorded now for the first time.
    pub new: u64,
    /// Of those, already in the store (from an earlier pass or another reconciler).
    pub known: u64,
}

impl<St: DifferenceStore> Reconciler<St> {
    /// A builder over `store`. Pages of 1,000 facts, no recorder; add sources and rules.
    pub fn builder(store: St) -> ReconcilerBuilder<St> {
        ReconcilerBuilder {
            store,
            names: Vec::new(),
            sources: Vec::new(),
            rules: Vec::new(),
            page_size: 1000,
            recorder: None,
        }
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.store
    }

    /// One pass over every key of every source, as of `as_of` (usually now): records the
    /// differences, and reports the store's stats to the recorder, if there is one.
    ///
    /// # Errors
    ///
    /// A source failed or broke the key order ([`ReconcileError::is_source`]), or the store
    /// failed. The differences recorded before the failure stay; the next pass finds them
    /// known.
    pub async fn run_once(&mut self, as_of: SystemTime) -> Result<Pass, ReconcileError> {
        let mut pass = Pass::default();
        let mut merge = Merge::new(&self.sources, &self.names, self.page_size, as_of);
        // Differences are recorded a page at a time: one round trip for the known ones.
        let mut found = Vec::new();
        while let Some((key, facts)) = merge.next().await? {
            pass.keys += 1;
            for (rule, own) in &self.rules {
                if let Some(d) = judge(rule, own, &self.names, &key, &facts, as_of, &mut pass) {
                    found.push(d);
                }
            }
            if found.len() >= self.page_size {
                record(&self.store, &mut found, &mut pass).await?;
            }
        }
        record(&self.store, &mut found, &mut pass).await?;
        if self.recorder.is_some() {
            self.report().await?;
        }
        Ok(pass)
    }

    /// Passes until `stop` completes, one every `every` (the first at once; at least 1 ms
    /// apart, and any duration: one past the timer's range waits until `stop`), each as of the
    /// time it starts. A failed pass is logged (`tracing` warning), and the next one comes on
    /// schedule: the differences it recorded stay.
    pub async fn run(
        mut self,
        every: std::time::Duration,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let mut stop = std::pin::pin!(stop);
        // A zero interval would never give the runtime back between passes.
        let every = every.max(std::time::Duration::from_millis(1));
        let mut next = tokio::time::Instant::now();
        loop {
            match self.run_once(SystemTime::now()).await {
                Ok(pass) => tracing::debug!(
                    keys = pass.keys,
                    in_flight = pass.in_flight,
                    differences = pass.differences,
                    new = pass.new,
                    "reconciliation pass"
                ),
                Err(e) => tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "reconciliation pass failed"
                ),
            }
            // A pass longer than the interval is followed by the next at once, not by a
            // burst of the ones it overran.
            next = crate::time::later(next, every).max(tokio::time::Instant::now());
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }

    /// Reads the store's stats and sends them to the recorder (if any); returns them.
    ///
    /// # Errors
    ///
    /// The store failed.
    pub async fn report(&self) -> Result<super::DifferenceStats, ReconcileError> {
        let stats = self.store.stats().await?;
        if let Some(recorder) = &self.recorder {
            recorder.record_reconcile(&stats.report());
        }
        Ok(stats)
    }
}

/// Records `found` (and empties it), counting in `pass`.
async fn record<St: DifferenceStore>(
    store: &St,
    found: &mut Vec<Difference>,
    pass: &mut Pass,
) -> Result<(), ReconcileError> {
    if found.is_empty() {
        return Ok(());
    }
    let new = store.record_many(found).await?;
    for (d, new) in found.iter().zip(new) {
        pass.differences += 1;
        if new {
            pass.new += 1;
            tracing::info!(
                rule = %d.rule,
                key = %d.key_display(),
                repair = %d.id,
                action = d.action.as_deref().unwrap_or("-"),
                "reconciliation found a difference"
            );
        } else {
            pass.known += 1;
        }
    }
    found.clear();
    Ok(())
}

/// What `rule` makes of `key`'s facts: a difference, or nothing (counted in `pass`).
fn judge(
    rule: &Rule,
    own: &[usize],
    names: &[String],
    key: &bytes::Bytes,
    facts: &[Option<Fact>],
    as_of: SystemTime,
    pass: &mut Pass,
) -> Option<Difference> {
    let mine = || own.iter().map(|&i| facts[i].as_ref());
    if mine().all(|f| f.is_none()) {
        return None;
    }
    // In flight: changed after `as_of - grace` (or after `as_of` itself).
    let settled_before = as_of
        .checked_sub(rule.grace)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    if mine().flatten().any(|f| f.at > settled_before) {
        pass.in_flight += 1;
        return None;
    }
    let case = rule
        .cases
        .iter()
        .find(|c| c.wants.iter().zip(mine()).all(|(w, f)| w.matches(f)));
    let action = match case {
        Some(c) if c.repair.is_none() => {
            pass.consistent += 1;
            return None;
        }
        Some(c) => c.repair.clone(),
        None => None,
    };
    let seen = own
        .iter()
        .map(|&i| {
            Seen::new(
                names[i].clone(),
                facts[i]
                    .as_ref()
                    .map(|f| SeenFact::new(f.value.clone(), f.version, f.at)),
            )
        })
        .collect();
    Some(Difference::new(
        rule.name.clone(),
        key.clone(),
        seen,
        action,
    ))
}

impl<St> ReconcilerBuilder<St> {
    /// A source, under the name its rules use (1 to 64 characters of `[A-Za-z0-9_.:-]`).
    pub fn source(mut self, name: impl Into<String>, source: impl super::Source) -> Self {
        self.names.push(name.into());
        self.sources.push(Arc::new(source));
        self
    }

    /// A rule.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// How many facts a source's page holds (1,000): the memory a pass needs is one page per
    /// source. At least 1.
    pub fn page_size(mut self, size: usize) -> Self {
        self.page_size = size;
        self
    }

    /// Where the store's stats go after each pass: a
    /// [`ReconcileReport`](crate::record::ReconcileReport).
    pub fn recorder(mut self, recorder: impl Recorder + Send + Sync + 'static) -> Self {
        self.recorder = Some(Arc::new(recorder));
        self
    }

    /// The reconciler.
    ///
    /// # Errors
    ///
    /// A [`RuleError`]: no source or no rule, a name that is not 1 to 64 characters of
    /// `[A-Za-z0-9_.:-]`, two sources or two rules with one name, a rule over fewer than two
    /// sources, over a source the reconciler lacks or over one source twice, a rule without
    /// combinations or with a grace window longer than ten years, a combination without one
    /// want per source or wanting every fact missing, or a zero page size.
    pub fn build(self) -> Result<Reconciler<St>, RuleError> {
        if self.page_size == 0 {
            return Err(RuleError::Setting {
                setting: "page_size",
                why: "must be at least 1",
            });
        }
        let indexes = check(&self.names, &self.rules)?;
        Ok(Reconciler {
            store: self.store,
            names: self.names,
            sources: self.sources,
            rules: self.rules.into_iter().zip(indexes).collect(),
            page_size: self.page_size,
            recorder: self.recorder,
        })
    }
}

impl<St> fmt::Debug for Reconciler<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reconciler")
            .field("sources", &self.names)
            .field(
                "rules",
                &self.rules.iter().map(|(r, _)| r.name()).collect::<Vec<_>>(),
            )
            .field("page_size", &self.page_size)
            .finish_non_exhaustive()
    }
}

impl<St> fmt::Debug for ReconcilerBuilder<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcilerBuilder")
            .field("sources", &self.names)
            .field("rules", &self.rules.len())
            .field("page_size", &self.page_size)
            .finish_non_exhaustive()
    }
}
