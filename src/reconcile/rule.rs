//! Rules: which combinations of facts are consistent, and which repair each difference needs.

use std::collections::HashSet;
use std::time::Duration;

use super::Fact;

/// What a rule wants of one source's fact for a combination to match.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Want {
    /// Anything: a fact with any value, or none.
    Any,
    /// No fact for the key.
    Missing,
    /// A fact, with any value.
    Present,
    /// A fact with this value.
    Is(String),
    /// A fact with one of these values.
    OneOf(Vec<String>),
}

impl Want {
    /// A fact with this value.
    pub fn is(value: impl Into<String>) -> Self {
        Want::Is(value.into())
    }

    /// A fact with one of these values.
    pub fn one_of<I, V>(values: I) -> Self
    where
        I: IntoIterator<Item = V>,
        V: Into<String>,
    {
        Want::OneOf(values.into_iter().map(Into::into).collect())
    }

    pub(crate) fn matches(&self, fact: Option<&Fact>) -> bool {
        match (self, fact) {
            (Want::Any, _) => true,
            (Want::Missing, f) => f.is_none(),
            (Want::Present, f) => f.is_some(),
            (Want::Is(v), Some(f)) => f.value == *v,
            (Want::OneOf(vs), Some(f)) => vs.contains(&f.value),
            (Want::Is(_) | Want::OneOf(_), None) => false,
        }
    }
}

/// One declared combination: the facts it wants, and its repair (`None`: consistent).
#[derive(Clone, Debug)]
pub(crate) struct Case {
    pub(crate) wants: Vec<Want>,
    pub(crate) repair: Option<String>,
}

/// A reconciliation rule: the sources it compares, in order, the combinations of their facts
/// that are consistent, and the repair each known difference needs.
///
/// For every key that at least one of its sources holds, the rule takes the sources' facts
/// (a source without the key gives none) and tries its combinations in the order they were
/// declared: the first that matches decides. A [consistent](Self::consistent) one means
/// nothing to do; a [repair](Self::repair) one makes a difference with that repair's action. A
/// key that no combination matches is a difference with no repair: it goes to the manual
/// queue, for a person.
///
/// A key whose facts (any of the rule's sources) changed less than the [grace](Self::grace)
/// window before the comparison's as-of time is **in flight**: the rule leaves it alone this
/// time. Without a grace window, an order paid a millisecond before the comparison and not yet
/// in the ledger of payments would be flagged.
///
/// ```
/// use std::time::Duration;
/// use surely::reconcile::{Rule, Want};
///
/// let rule = Rule::new("inventory-follows-order", ["orders", "inventory"])
///     .grace(Duration::from_secs(120))
///     .consistent([Want::is("processing"), Want::is("reserved")])
///     .consistent([Want::is("cancelled"), Want::is("released")])
///     .repair([Want::is("cancelling"), Want::is("released")], "finish-cancel")
///     .repair([Want::is("processing"), Want::Missing], "reserve-stock");
/// # let _ = rule;
/// ```
///
/// A rule is checked when the [`Reconciler`](super::Reconciler) that holds it is built: see
/// [`RuleError`].
#[derive(Clone, Debug)]
#[must_use = "a rule does nothing until a reconciler is built with it"]
pub struct Rule {
    pub(crate) name: String,
    pub(crate) sources: Vec<String>,
    pub(crate) grace: Duration,
    pub(crate) cases: Vec<Case>,
}

impl Rule {
    /// A rule named `name` (1 to 64 characters of `[A-Za-z0-9_.:-]`) over `sources`, by the
    /// names they are given to the reconciler; at least two. No grace window, and no
    /// combination yet.
    pub fn new<I, S>(name: impl Into<String>, sources: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Rule {
            name: name.into(),
            sources: sources.into_iter().map(Into::into).collect(),
            grace: Duration::ZERO,
            cases: Vec::new(),
        }
    }

    /// Keys whose facts changed less than `grace` before the comparison are in flight, and not
    /// compared (no grace window unless set). At most [`MAX_DURATION`](crate::MAX_DURATION)
    /// (ten years): a longer one is refused when the reconciler is built
    /// ([`RuleError::GraceTooLong`]).
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// A consistent combination: one [`Want`] per source, in the rule's order.
    pub fn consistent(mut self, wants: impl IntoIterator<Item = Want>) -> Self {
        self.cases.push(Case {
            wants: wants.into_iter().collect(),
            repair: None,
        });
        self
    }

    /// A combination that is a difference, and the repair it needs: an action name (1 to 64
    /// characters of `[A-Za-z0-9_.:-]`) your repair service understands.
    pub fn repair(
        mut self,
        wants: impl IntoIterator<Item = Want>,
        action: impl Into<String>,
    ) -> Self {
        self.cases.push(Case {
            wants: wants.into_iter().collect(),
            repair: Some(action.into()),
        });
        self
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// A name the crate accepts for a rule, a source or an action.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// A name cut for an error message: never the whole of a hostile one.
fn shown(name: &str) -> String {
    let mut s: String = name.chars().take(64).collect();
    if s.len() < name.len() {
        s.push('…');
    }
    format!("{s:?}")
}

/// A reconciler's configuration was refused: its sources, its rules, or a setting.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// No source was given.
    #[error("a reconciler needs sources to compare; it has none")]
    NoSources,
    /// No rule was given.
    #[error("a reconciler needs at least one rule; it has none")]
    NoRules,
    /// A name is not 1 to 64 characters of `[A-Za-z0-9_.:-]`.
    #[error("{what} name {name} is not 1 to 64 characters of [A-Za-z0-9_.:-]")]
    InvalidName {
        /// `rule`, `source` or `action`.
        what: &'static str,
        /// The name (its first 64 characters, quoted).
        name: String,
    },
    /// Two sources have one name.
    #[error("two sources are named {0}")]
    DuplicateSource(String),
    /// Two rules have one name.
    #[error("two rules are named {0}")]
    DuplicateRule(String),
    /// A rule compares fewer than two sources.
    #[error("rule {rule} compares {got} source(s); a rule compares at least two")]
    TooFewSources {
        /// The rule.
        rule: String,
        /// How many it names.
        got: usize,
    },
    /// A rule names a source the reconciler does not have.
    #[error("rule {rule} names source {source_name}, which the reconciler does not have")]
    UnknownSource {
        /// The rule.
        rule: String,
        /// The source it names.
        source_name: String,
    },
    /// A rule names one source twice.
    #[error("rule {rule} names source {source_name} twice")]
    SourceTwice {
        /// The rule.
        rule: String,
        /// The source.
        source_name: String,
    },
    /// A rule declares no combination.
    #[error("rule {0} declares no combination: neither consistent nor with a repair")]
    NoCombinations(String),
    /// A combination has not one want per source.
    #[error("rule {rule}'s combination {index} has {got} wants for {expected} sources")]
    Arity {
        /// The rule.
        rule: String,
        /// The combination's position, from 0.
        index: usize,
        /// The rule's number of sources.
        expected: usize,
        /// The combination's number of wants.
        got: usize,
    },
    /// A combination matches keys that no source holds (every want is `Missing`): it could
    /// never be reached, and a repair of nothing is a mistake.
    #[error("rule {rule}'s combination {index} wants every fact missing; no key has no fact")]
    NothingThere {
        /// The rule.
        rule: String,
        /// The combination's position, from 0.
        index: usize,
    },
    /// A rule's grace window is longer than [`MAX_DURATION`](crate::MAX_DURATION) (ten
    /// years).
    #[error("rule {0}'s grace window is longer than ten years")]
    GraceTooLong(String),
    /// A setting is out of range.
    #[error("reconciler {setting} {why}")]
    Setting {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
}

/// Checks `sources` (their names) and `rules` together; returns each rule's sources' indexes.
pub(crate) fn check(sources: &[String], rules: &[Rule]) -> Result<Vec<Vec<usize>>, RuleError> {
    if sources.is_empty() {
        return Err(RuleError::NoSources);
    }
    let mut names = HashSet::new();
    for s in sources {
        if !valid_name(s) {
            return Err(RuleError::InvalidName {
                what: "source",
                name: shown(s),
            });
        }
        if !names.insert(s.as_str()) {
            return Err(RuleError::DuplicateSource(shown(s)));
        }
    }
    if rules.is_empty() {
        return Err(RuleError::NoRules);
    }
    let mut rule_names = HashSet::new();
    let mut indexes = Vec::with_capacity(rules.len());
    for rule in rules {
        if !valid_name(&rule.name) {
            return Err(RuleError::InvalidName {
                what: "rule",
                name: shown(&rule.name),
            });
        }
        if !rule_names.insert(rule.name.as_str()) {
            return Err(RuleError::DuplicateRule(shown(&rule.name)));
        }
        if rule.sources.len() < 2 {
            return Err(RuleError::TooFewSources {
                rule: rule.name.clone(),
                got: rule.sources.len(),
            });
        }
        let mut own = Vec::with_capacity(rule.sources.len());
        for s in &rule.sources {
            let Some(i) = sources.iter().position(|n| n == s) else {
                return Err(RuleError::UnknownSource {
                    rule: rule.name.clone(),
                    source_name: shown(s),
                });
            };
            if own.contains(&i) {
                return Err(RuleError::SourceTwice {
                    rule: rule.name.clone(),
                    source_name: shown(s),
                });
            }
            own.push(i);
        }
        if rule.cases.is_empty() {
            return Err(RuleError::NoCombinations(rule.name.clone()));
        }
        if rule.grace > crate::MAX_DURATION {
            return Err(RuleError::GraceTooLong(rule.name.clone()));
        }
        for (index, case) in rule.cases.iter().enumerate() {
            if case.wants.len() != rule.sources.len() {
                return Err(RuleError::Arity {
                    rule: rule.name.clone(),
                    index,
                    expected: rule.sources.len(),
                    got: case.wants.len(),
                });
            }
            if case.wants.iter().all(|w| *w == Want::Missing) {
                return Err(RuleError::NothingThere {
                    rule: rule.name.clone(),
                    index,
                });
            }
            if let Some(action) = &case.repair
                && !valid_name(action)
            {
                return Err(RuleError::InvalidName {
                    what: "action",
                    name: shown(action),
                });
            }
        }
        indexes.push(own);
    }
    Ok(indexes)
}
