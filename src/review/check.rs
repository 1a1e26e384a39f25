//! The review itself: the chain as a graph of operations, the worst paths through it, the
//! findings and the answers.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::time::Duration;

use super::{
    Boundary, BudgetSettings, Chain, ClientSettings, Kind, Operation, ReviewError, ReviewErrorKind,
    Service, VersionPolicy,
};
use crate::Semantics;

/// How much a finding matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Severity {
    /// Worth knowing.
    Info,
    /// Bounded or caught at run time, but not what the settings say.
    Warning,
    /// A way to do something twice, lose it, or multiply an outage.
    Error,
}

impl Severity {
    /// The word for it: `info`, `warning`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }

    /// The severity a word names, if any.
    pub fn parse(word: &str) -> Option<Self> {
        [Severity::Info, Severity::Warning, Severity::Error]
            .into_iter()
            .find(|s| s.as_str() == word)
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a finding is about; its [`as_str`](Self::as_str) is stable across releases, for CI
/// and for the docs' list of findings ([`docs::review`](crate::docs::review#the-findings)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(into = "&'static str"))]
#[non_exhaustive]
pub enum FindingId {
    /// A path's worst case (the product of its attempts) is over the limit.
    Amplification,
    /// A child's deadline or per-try timeout is not below what its parent leaves it.
    DeadlineOutlivesParent,
    /// More than one hop of a path retries.
    RetryOwners,
    /// A write whose method makes the client send it again after a lost reply, without a key.
    WriteRetriedWithoutKey,
    /// A write sent again with a generated key that the server does not honour.
    KeyNotHonoured,
    /// A hedge that copies anything but a safe read.
    HedgeNotSafe,
    /// The attempts' timeouts add up to more than the call's budget.
    AttemptsExceedBudget,
    /// A write can end UNKNOWN, and nothing resolves it, queues it for a person, or alerts.
    UnknownUnowned,
    /// A money-moving write's idempotency record is not in the business write's transaction.
    RecordOutsideTransaction,
    /// An inbox applies change events without a version policy.
    InboxWithoutVersions,
}

impl FindingId {
    /// Every finding, in the order of the docs.
    pub const ALL: [FindingId; 10] = [
        FindingId::Amplification,
        FindingId::DeadlineOutlivesParent,
        FindingId::RetryOwners,
        FindingId::WriteRetriedWithoutKey,
        FindingId::KeyNotHonoured,
        FindingId::HedgeNotSafe,
        FindingId::AttemptsExceedBudget,
        FindingId::UnknownUnowned,
        FindingId::RecordOutsideTransaction,
        FindingId::InboxWithoutVersions,
    ];

    /// Its stable name: `amplification`, `deadline-outlives-parent`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            FindingId::Amplification => "amplification",
            FindingId::DeadlineOutlivesParent => "deadline-outlives-parent",
            FindingId::RetryOwners => "retry-owners",
            FindingId::WriteRetriedWithoutKey => "write-retried-without-key",
            FindingId::KeyNotHonoured => "key-not-honoured",
            FindingId::HedgeNotSafe => "hedge-not-safe",
            FindingId::AttemptsExceedBudget => "attempts-exceed-budget",
            FindingId::UnknownUnowned => "unknown-unowned",
            FindingId::RecordOutsideTransaction => "record-outside-transaction",
            FindingId::InboxWithoutVersions => "inbox-without-versions",
        }
    }
}

impl From<FindingId> for &'static str {
    fn from(id: FindingId) -> Self {
        id.as_str()
    }
}

impl fmt::Display for FindingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mistake the review found.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Finding {
    /// What it is about.
    pub id: FindingId,
    /// How much it matters.
    pub severity: Severity,
    /// Where: `service.operation` steps along the chain (or a service, for one of its parts).
    pub path: Vec<String>,
    /// What is wrong, with the figures.
    pub message: String,
    /// What to change.
    pub fix: String,
}

/// The worst case of one path from an entry to an operation that calls nothing.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct PathFigure {
    /// The path: `service.operation` steps.
    pub path: Vec<String>,
    /// Calls at its end per call at its start when every attempt fails: the product of the
    /// attempts (and hedge copies) of the hops that retry.
    pub worst: f64,
    /// The same, with each hop's retry budget's bound in a long outage: a ratio budget lets
    /// `1 + ratio` through (or `1 + reserve / rate` when that is more, if the chain says its
    /// rate), a token bucket runs dry.
    pub bounded: f64,
    /// The hops along it that retry.
    pub retry_owners: u32,
}

/// One of the seven questions of a review.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Question {
    /// Which factual states can a timeout leave?
    TimeoutStates,
    /// Who retries, how often, with what backoff and total deadline?
    Retries,
    /// Which business intent does the key stand for, and what does the same key with other
    /// parameters get?
    Key,
    /// Do the idempotency record and the business write share one atomic boundary?
    Boundary,
    /// Can events be duplicated, reordered or lost, and how do consumers deduplicate and check
    /// versions?
    Events,
    /// Does the external system accept the business key, and if not, how are receipts queried
    /// and reconciled?
    External,
    /// How long may an UNKNOWN wait before an alert, and who may compensate or confirm?
    Unknown,
}

impl Question {
    /// The seven, in order.
    pub const ALL: [Question; 7] = [
        Question::TimeoutStates,
        Question::Retries,
        Question::Key,
        Question::Boundary,
        Question::Events,
        Question::External,
        Question::Unknown,
    ];

    /// Its number, from 1.
    pub fn number(self) -> usize {
        self as usize + 1
    }

    /// The question.
    pub fn text(self) -> &'static str {
        match self {
            Question::TimeoutStates => "Which factual states can a timeout leave?",
            Question::Retries => "Who retries, how often, with what backoff and total deadline?",
            Question::Key => {
                "Which business intent does the key stand for, and what does the same key with \
                 other parameters get?"
            }
            Question::Boundary => {
                "Do the idempotency record and the business write share one atomic boundary?"
            }
            Question::Events => {
                "Can events be duplicated, reordered or lost, and how do consumers deduplicate \
                 and check versions?"
            }
            Question::External => {
                "Does the external system accept the business key, and if not, how are receipts \
                 queried and reconciled?"
            }
            Question::Unknown => {
                "How long may an UNKNOWN wait before an alert, and who may compensate or confirm?"
            }
        }
    }
}

/// A question's answer: what the settings say, and what they do not (which a reviewer must
/// answer).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Answer {
    /// The question.
    pub question: Question,
    /// What the settings say, a sentence each.
    pub given: Vec<String>,
    /// What they do not say: the reviewer's part, if any.
    pub open: Option<String>,
}

/// The seven answers for one operation.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct OperationReview {
    /// Its service.
    pub service: String,
    /// The operation.
    pub operation: String,
    /// What it does.
    pub kind: Kind,
    /// Its method.
    pub method: String,
    /// The seven answers, in order.
    pub answers: Vec<Answer>,
}

/// The review of a [`Chain`]: the answers per operation, the worst paths, the findings.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Review {
    operations: Vec<OperationReview>,
    paths: Vec<PathFigure>,
    findings: Vec<Finding>,
    max_amplification: f64,
}

impl Review {
    /// The answers, per operation, in the chain's order.
    pub fn operations(&self) -> &[OperationReview] {
        &self.operations
    }

    /// The worst case of every path from an entry to an operation that calls nothing.
    pub fn paths(&self) -> &[PathFigure] {
        &self.paths
    }

    /// The findings, the most severe first.
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// The findings with this id.
    pub fn findings_of(&self, id: FindingId) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.id == id)
    }

    /// The limit of amplification the paths were held to.
    pub fn max_amplification(&self) -> f64 {
        self.max_amplification
    }

    /// Whether a finding is at or above `severity`: the `surely review` command's exit status
    /// with `--fail-on`.
    pub fn fails(&self, severity: Severity) -> bool {
        self.findings.iter().any(|f| f.severity >= severity)
    }
}

/// A call of the chain as the graph has it.
struct Edge<'a> {
    from: usize,
    to: usize,
    /// Its index among the calls of `from`.
    call: usize,
    client: &'a ClientSettings,
}

/// An operation as the graph has it.
struct Node<'a> {
    service: &'a Service,
    op: &'a Operation,
    /// What its callers' clients judge from its method.
    semantics: Semantics,
}

impl Node<'_> {
    fn name(&self) -> String {
        format!("{}.{}", self.service.name, self.op.name)
    }
}

struct Graph<'a> {
    nodes: Vec<Node<'a>>,
    edges: Vec<Edge<'a>>,
    out: Vec<Vec<usize>>,
    into: Vec<Vec<usize>>,
}

pub(super) fn review(chain: &Chain) -> Result<Review, ReviewError> {
    let limit = chain.max_amplification;
    if !(limit.is_finite() && limit >= 1.0) {
        return Err(ReviewError::new(
            ReviewErrorKind::Invalid,
            format!("max_amplification must be a finite number of at least 1, not {limit}"),
        ));
    }
    if let Some(rate) = chain.rate
        && !(rate.is_finite() && rate > 0.0)
    {
        return Err(ReviewError::new(
            ReviewErrorKind::Invalid,
            format!("rate must be a finite number above 0, not {rate}"),
        ));
    }
    let graph = graph(chain)?;
    let order = topological(&graph)?;
    let mut findings = Vec::new();
    let paths = worst_paths(&graph, &order, chain, &mut findings);
    calls(&graph, &mut findings);
    parts(chain, &graph, &mut findings);
    findings.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.id.cmp(&b.id)));
    // What every service's inbox does, said once for all the operations whose events it reads.
    let inboxes: Vec<String> = chain
        .services
        .iter()
        .filter_map(|s| {
            let inbox = s.inbox.as_ref()?;
            Some(format!(
                "`{}`'s inbox deduplicates by event id; versions: {}",
                s.name,
                match inbox.versions {
                    VersionPolicy::Any => "any (none checked)",
                    VersionPolicy::InOrder => "in order (older ones no-ops, gaps parked)",
                    VersionPolicy::Latest => "latest (older ones no-ops)",
                }
            ))
        })
        .collect();
    let operations = order
        .iter()
        .map(|&i| answers(&graph, &inboxes, i, &graph.nodes[i]))
        .collect();
    Ok(Review {
        operations,
        paths,
        findings,
        max_amplification: limit,
    })
}

fn graph(chain: &Chain) -> Result<Graph<'_>, ReviewError> {
    let mut services: HashMap<&str, usize> = HashMap::new();
    for (i, s) in chain.services.iter().enumerate() {
        if services.insert(s.name.as_str(), i).is_some() {
            return Err(ReviewError::new(
                ReviewErrorKind::Duplicate,
                format!("two services are named `{}`", s.name),
            ));
        }
    }
    let mut nodes = Vec::new();
    let mut index: HashMap<(&str, &str), usize> = HashMap::new();
    for s in &chain.services {
        for op in &s.operations {
            let method = http::Method::from_bytes(op.method.as_bytes()).map_err(|_| {
                ReviewError::new(
                    ReviewErrorKind::Invalid,
                    format!(
                        "{}.{}: `{}` is not an HTTP method",
                        s.name, op.name, op.method
                    ),
                )
            })?;
            if index
                .insert((s.name.as_str(), op.name.as_str()), nodes.len())
                .is_some()
            {
                return Err(ReviewError::new(
                    ReviewErrorKind::Duplicate,
                    format!(
                        "service `{}` has two operations named `{}`",
                        s.name, op.name
                    ),
                ));
            }
            nodes.push(Node {
                service: s,
                op,
                semantics: Semantics::from_method(&method),
            });
        }
    }
    let mut edges = Vec::new();
    let mut out = vec![Vec::new(); nodes.len()];
    let mut into = vec![Vec::new(); nodes.len()];
    for (from, node) in nodes.iter().enumerate() {
        for (call_index, call) in node.op.calls.iter().enumerate() {
            let site = |e: ReviewError| e.about(&node.service.name, &node.op.name, call_index);
            if !services.contains_key(call.service.as_str()) {
                return Err(site(ReviewError::new(
                    ReviewErrorKind::UnknownService,
                    format!(
                        "{} calls `{}`, which is not a service of the chain",
                        node.name(),
                        call.service
                    ),
                )));
            }
            let Some(&to) = index.get(&(call.service.as_str(), call.operation.as_str())) else {
                return Err(site(ReviewError::new(
                    ReviewErrorKind::UnknownOperation,
                    format!(
                        "{} calls `{}.{}`, which is not an operation of `{}`",
                        node.name(),
                        call.service,
                        call.operation,
                        call.service
                    ),
                )));
            };
            let Some(client) = node.service.clients.get(&call.service) else {
                return Err(site(ReviewError::new(
                    ReviewErrorKind::NoClient,
                    format!(
                        "{} calls `{}.{}`, but `{}` has no client for `{}`",
                        node.name(),
                        call.service,
                        call.operation,
                        node.service.name,
                        call.service
                    ),
                )));
            };
            out[from].push(edges.len());
            into[to].push(edges.len());
            edges.push(Edge {
                from,
                to,
                call: call_index,
                client,
            });
        }
    }
    Ok(Graph {
        nodes,
        edges,
        out,
        into,
    })
}

/// The operations, callers before callees; a cycle is an error that names it. Iterative, so a
/// chain of any depth is walked without recursion.
fn topological(g: &Graph<'_>) -> Result<Vec<usize>, ReviewError> {
    let mut indegree: Vec<usize> = g.into.iter().map(Vec::len).collect();
    let mut ready: Vec<usize> = (0..g.nodes.len()).filter(|&i| indegree[i] == 0).collect();
    ready.reverse();
    let mut order = Vec::with_capacity(g.nodes.len());
    while let Some(v) = ready.pop() {
        order.push(v);
        for &e in g.out[v].iter().rev() {
            let w = g.edges[e].to;
            indegree[w] -= 1;
            if indegree[w] == 0 {
                ready.push(w);
            }
        }
    }
    if order.len() == g.nodes.len() {
        return Ok(order);
    }
    // Every node left is on a cycle or after one; walk back from one of them until a node
    // repeats, which is on a cycle.
    let start = (0..g.nodes.len())
        .find(|&i| indegree[i] > 0)
        .unwrap_or_default();
    let mut seen = vec![usize::MAX; g.nodes.len()];
    let mut walk = Vec::new();
    let mut back = Vec::new();
    let mut v = start;
    while seen[v] == usize::MAX {
        seen[v] = walk.len();
        walk.push(v);
        let Some(&e) = g.into[v].iter().find(|&&e| indegree[g.edges[e].from] > 0) else {
            break;
        };
        back.push(e);
        v = g.edges[e].from;
    }
    // The call that closes the cycle: the last one walked back over.
    let closing = back.last().map(|&e| &g.edges[e]);
    let mut cycle: Vec<String> = walk[seen[v].min(walk.len())..]
        .iter()
        .rev()
        .map(|&i| g.nodes[i].name())
        .collect();
    if let Some(first) = cycle.first().cloned() {
        cycle.push(first);
    }
    let err = ReviewError::new(
        ReviewErrorKind::Cycle,
        format!("the calls run in a cycle: {}", cycle.join(" -> ")),
    );
    Err(match closing {
        Some(e) => {
            let n = &g.nodes[e.from];
            err.about(&n.service.name, &n.op.name, e.call)
        }
        None => err,
    })
}

/// Whether `client` sends the request to `node` again after it went out.
fn resent_after_send(client: &ClientSettings, node: &Node<'_>) -> bool {
    match node.semantics {
        Semantics::Safe | Semantics::Idempotent => true,
        _ => client.generates_keys && client.server_honours_keys,
    }
}

/// Whether the client's hedge copies requests to `node`.
fn hedged(client: &ClientSettings, node: &Node<'_>) -> bool {
    client.hedge.as_ref().is_some_and(|h| {
        h.max_attempts > 1
            && (node.semantics == Semantics::Safe
                || (node.semantics == Semantics::Idempotent && h.hedges_idempotent))
    })
}

/// Whether a service's server leaves retries to callers that mark themselves owners.
fn trusts(service: &Service) -> bool {
    service
        .server
        .as_ref()
        .and_then(|s| s.deadline.as_ref())
        .is_some_and(|d| d.trusts_retry_signals)
}

/// Whether a service honours an idempotency key.
fn honours_keys(service: &Service) -> bool {
    if service.external {
        service.accepts_key == Some(true)
    } else {
        service
            .server
            .as_ref()
            .is_some_and(|s| s.idempotency.is_some())
    }
}

/// The best value of one measure reaching a node in one state, and the edge it came by.
#[derive(Clone, Copy)]
struct Best {
    value: f64,
    /// The edge and the state of its start.
    pred: Option<(usize, bool)>,
}

/// Per node, per state (whether the hop into it carries a trusted owner marker), the worst
/// amplification, bounded amplification and owner count reaching it.
#[derive(Clone, Copy, Default)]
struct Reach {
    worst: Option<Best>,
    bounded: Option<Best>,
    owners: Option<Best>,
}

fn better(slot: &mut Option<Best>, value: f64, pred: Option<(usize, bool)>) {
    if slot.is_none_or(|b| value > b.value) {
        *slot = Some(Best { value, pred });
    }
}

fn worst_paths(
    g: &Graph<'_>,
    order: &[usize],
    chain: &Chain,
    findings: &mut Vec<Finding>,
) -> Vec<PathFigure> {
    let mut reach = vec![[Reach::default(); 2]; g.nodes.len()];
    for &v in order {
        if g.into[v].is_empty() {
            let start = Some(Best {
                value: 1.0,
                pred: None,
            });
            reach[v][0] = Reach {
                worst: start,
                bounded: start,
                owners: Some(Best {
                    value: 0.0,
                    pred: None,
                }),
            };
        }
        for m in [false, true] {
            let here = reach[v][usize::from(m)];
            for &e in &g.out[v] {
                let edge = &g.edges[e];
                let to = &g.nodes[edge.to];
                let attempts = if m {
                    1.0
                } else {
                    f64::from(edge.client.retry.max_attempts.max(1))
                };
                let copies = if hedged(edge.client, to) {
                    f64::from(edge.client.hedge.as_ref().map_or(1, |h| h.max_attempts))
                } else {
                    1.0
                };
                let load = attempts * copies;
                let m2 = edge.client.retry.marks_owner && trusts(to.service);
                let slot = &mut reach[edge.to][usize::from(m2)];
                if let Some(b) = here.worst {
                    better(&mut slot.worst, b.value * load, Some((e, m)));
                }
                if let Some(b) = here.bounded {
                    let rate = chain.rate.map(|r| r * b.value);
                    let bound = budget_bound(&edge.client.retry.budget, rate).min(load);
                    better(&mut slot.bounded, b.value * bound, Some((e, m)));
                }
                if let Some(b) = here.owners {
                    let retries = !m && edge.client.retry.max_attempts > 1;
                    better(
                        &mut slot.owners,
                        b.value + f64::from(u8::from(retries)),
                        Some((e, m)),
                    );
                }
            }
        }
    }
    let mut figures = Vec::new();
    for &v in order {
        if !g.out[v].is_empty() || g.into[v].is_empty() {
            continue;
        }
        let pick = |f: fn(&Reach) -> Option<Best>| -> Option<(Best, bool)> {
            let a = f(&reach[v][0]).map(|b| (b, false));
            let b = f(&reach[v][1]).map(|b| (b, true));
            match (a, b) {
                (Some(x), Some(y)) => Some(if y.0.value > x.0.value { y } else { x }),
                (x, y) => x.or(y),
            }
        };
        let (Some(worst), Some(bounded), Some(owners)) =
            (pick(|r| r.worst), pick(|r| r.bounded), pick(|r| r.owners))
        else {
            continue;
        };
        let worst_path = path(g, &reach, v, worst.1, |r| r.worst);
        let figure = PathFigure {
            path: names(g, &worst_path),
            worst: worst.0.value,
            bounded: bounded.0.value,
            retry_owners: owners.0.value as u32,
        };
        if figure.worst > chain.max_amplification {
            let factors: Vec<String> = hops(g, &reach, v, worst.1, |r| r.worst)
                .iter()
                .map(|&(e, m)| {
                    let edge = &g.edges[e];
                    let c = edge.client;
                    let attempts = if m {
                        "1 (left to the caller)".to_owned()
                    } else {
                        c.retry.max_attempts.to_string()
                    };
                    match &c.hedge {
                        Some(h) if hedged(c, &g.nodes[edge.to]) => {
                            format!("{attempts} x {} hedged copies", h.max_attempts)
                        }
                        _ => attempts,
                    }
                })
                .collect();
            let severity = if figure.bounded > chain.max_amplification {
                Severity::Error
            } else {
                Severity::Warning
            };
            findings.push(Finding {
                id: FindingId::Amplification,
                severity,
                path: figure.path.clone(),
                message: format!(
                    "when the end fails, each call at the start becomes {} calls at the end \
                     (attempts: {}), over the limit of {}; {} with the retry budgets' bound",
                    figure_text(figure.worst),
                    factors.join(" x "),
                    figure_text(chain.max_amplification),
                    figure_text(figure.bounded),
                ),
                fix: "retry at one hop only: keep the retry-owner marker on (internal headers) \
                      and trust the caller's retry signals in the next hop's \
                      ServerDeadlineLayer, or lower max_attempts; give every retrying client a \
                      retry budget"
                    .to_owned(),
            });
        }
        if figure.retry_owners > 1 {
            let owners_path = path(g, &reach, v, owners.1, |r| r.owners);
            let retrying: Vec<String> = hops(g, &reach, v, owners.1, |r| r.owners)
                .iter()
                .filter(|&&(e, m)| !m && g.edges[e].client.retry.max_attempts > 1)
                .map(|&(e, _)| {
                    let edge = &g.edges[e];
                    format!(
                        "{} ({} attempts)",
                        g.nodes[edge.from].service.name, edge.client.retry.max_attempts
                    )
                })
                .collect();
            findings.push(Finding {
                id: FindingId::RetryOwners,
                severity: Severity::Error,
                path: names(g, &owners_path),
                message: format!(
                    "{} hops retry on this path: {}",
                    retrying.len(),
                    retrying.join(", ")
                ),
                fix: "let one hop own the retries: the callers keep their retry-owner marker \
                      (internal headers on) and each callee's ServerDeadlineLayer trusts their \
                      retry signals, or the inner hops retry only what was not sent \
                      (max_attempts = 1)"
                    .to_owned(),
            });
        }
        figures.push(figure);
    }
    figures
}

/// The bound a retry budget puts on one hop's load in a long outage, at `rate` calls a second
/// into it if known.
fn budget_bound(budget: &BudgetSettings, rate: Option<f64>) -> f64 {
    match budget {
        BudgetSettings::Ratio {
            ratio, min_per_sec, ..
        } => {
            // The reserve is what the budget allows when it is more than the ratio's share.
            let reserve = rate.map_or(0.0, |r| min_per_sec / r);
            1.0 + ratio.max(reserve)
        }
        BudgetSettings::TokenBucket { .. } => 1.0,
        BudgetSettings::None | BudgetSettings::Custom => f64::INFINITY,
    }
}

/// The edges (with the state of their start) of the best path into `v` in state `m`.
fn hops(
    g: &Graph<'_>,
    reach: &[[Reach; 2]],
    v: usize,
    m: bool,
    f: fn(&Reach) -> Option<Best>,
) -> Vec<(usize, bool)> {
    let mut hops = Vec::new();
    let (mut v, mut m) = (v, m);
    while let Some((e, m0)) = f(&reach[v][usize::from(m)]).and_then(|b| b.pred) {
        hops.push((e, m0));
        v = g.edges[e].from;
        m = m0;
        if hops.len() > g.edges.len() {
            break; // cannot happen in a graph without cycles
        }
    }
    hops.reverse();
    hops
}

fn path(
    g: &Graph<'_>,
    reach: &[[Reach; 2]],
    v: usize,
    m: bool,
    f: fn(&Reach) -> Option<Best>,
) -> Vec<usize> {
    let hops = hops(g, reach, v, m, f);
    let mut nodes: Vec<usize> = hops.iter().map(|&(e, _)| g.edges[e].from).collect();
    nodes.push(v);
    nodes
}

fn names(g: &Graph<'_>, nodes: &[usize]) -> Vec<String> {
    nodes.iter().map(|&i| g.nodes[i].name()).collect()
}

/// A figure as the review writes it: `27x`, `1.33x`.
pub(super) fn figure_text(x: f64) -> String {
    if x.is_infinite() {
        "unbounded".to_owned()
    } else if (x - x.round()).abs() < 0.005 {
        format!("{}x", x.round())
    } else {
        format!("{x:.2}x")
    }
}

/// A duration as the review writes it: `2s`, `250ms`.
pub(super) fn secs(d: Duration) -> String {
    let ms = d.as_millis();
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{d:?}")
    } else if ms < 1000 {
        format!("{ms}ms")
    } else if !ms.is_multiple_of(1000) {
        format!("{}s", ms as f64 / 1000.0)
    } else if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1000)
    }
}

/// The findings about single calls: deadlines, keys, hedges, attempts, UNKNOWN owners.
fn calls(g: &Graph<'_>, findings: &mut Vec<Finding>) {
    // Deadlines: what the tightest caller leaves an operation, against each call it makes.
    for (v, node) in g.nodes.iter().enumerate() {
        let leave = g.into[v]
            .iter()
            .filter_map(|&e| {
                let c = g.edges[e].client;
                c.per_try_timeout.or(c.timeout).map(|d| (d, Some(e)))
            })
            .min_by_key(|&(d, _)| d)
            .or_else(|| {
                if !g.into[v].is_empty() {
                    return None;
                }
                let max = node.service.server.as_ref()?.deadline.as_ref()?.max?;
                Some((max, None))
            });
        let Some((leave, from)) = leave else { continue };
        let propagated = match from {
            Some(e) => {
                g.edges[e].client.propagates_deadline
                    && node
                        .service
                        .server
                        .as_ref()
                        .is_some_and(|s| s.deadline.is_some())
            }
            None => true,
        };
        for &e in &g.out[v] {
            let child = g.edges[e].client;
            let mut over = Vec::new();
            if let Some(t) = child.timeout.filter(|&t| t >= leave) {
                over.push(format!("its total timeout {}", secs(t)));
            }
            if let Some(p) = child.per_try_timeout.filter(|&p| p >= leave) {
                over.push(format!("its per-try timeout {}", secs(p)));
            }
            if over.is_empty() {
                continue;
            }
            let mut p: Vec<usize> = from.map(|e| g.edges[e].from).into_iter().collect();
            p.extend([v, g.edges[e].to]);
            let (severity, how) = if propagated {
                (
                    Severity::Warning,
                    "the propagated deadline cuts it at run time, but the child's retry plan \
                     counts on time it will not have",
                )
            } else {
                (
                    Severity::Error,
                    "the deadline does not reach the child, which keeps working after the \
                     parent gave up",
                )
            };
            let parent = match from {
                Some(_) => "its caller leaves it",
                None => "its server's deadline allows",
            };
            findings.push(Finding {
                id: FindingId::DeadlineOutlivesParent,
                severity,
                path: names(g, &p),
                message: format!(
                    "{} calls {} with {}, not below the {} {parent}: {how}",
                    node.name(),
                    g.nodes[g.edges[e].to].name(),
                    over.join(" and "),
                    secs(leave),
                ),
                fix: "give each child a budget below what its parent leaves (or inherit the \
                      deadline), and keep the deadline on the wire with a ServerDeadlineLayer \
                      at every hop"
                    .to_owned(),
            });
        }
    }

    let mut seen_budget = BTreeSet::new();
    let mut seen_unknown = BTreeSet::new();
    for edge in &g.edges {
        let from = &g.nodes[edge.from];
        let to = &g.nodes[edge.to];
        let c = edge.client;
        let p = names(g, &[edge.from, edge.to]);
        let retries = c.retry.max_attempts > 1;
        if to.op.kind == Kind::Write
            && retries
            && matches!(to.semantics, Semantics::Safe | Semantics::Idempotent)
        {
            findings.push(Finding {
                id: FindingId::WriteRetriedWithoutKey,
                severity: Severity::Error,
                path: p.clone(),
                message: format!(
                    "{} is a write, but its method {} makes the client in `{}` send it again \
                     after a lost reply ({} attempts), without a key: a lost reply can make it \
                     happen twice",
                    to.name(),
                    to.op.method,
                    from.service.name,
                    c.retry.max_attempts
                ),
                fix: "send it as a POST with an idempotency key the server honours, or make \
                      the operation idempotent in truth"
                    .to_owned(),
            });
        }
        if to.op.kind != Kind::Read
            && retries
            && !matches!(to.semantics, Semantics::Safe | Semantics::Idempotent)
            && c.generates_keys
            && c.server_honours_keys
            && !honours_keys(to.service)
        {
            let (why, fix) = if to.service.external {
                (
                    "does not say it accepts one",
                    "drop server_honours_keys from this client, so that a lost reply ends \
                     UNKNOWN (for the ledger) instead of a second run, or send the provider's \
                     own idempotency key if it has one (accepts_key = true)"
                        .to_owned(),
                )
            } else {
                (
                    "runs no idempotency layer",
                    format!(
                        "run the IdempotencyLayer in `{}`, or drop server_honours_keys from the \
                         client so that a lost reply ends UNKNOWN instead",
                        to.service.name
                    ),
                )
            };
            findings.push(Finding {
                id: FindingId::KeyNotHonoured,
                severity: Severity::Error,
                path: p.clone(),
                message: format!(
                    "the client in `{}` sends {} again with a generated key after a lost reply \
                     (server_honours_keys), but `{}` {why}: the retry can do it twice",
                    from.service.name,
                    to.name(),
                    to.service.name
                ),
                fix,
            });
        }
        if hedged(c, to) && to.op.kind != Kind::Read {
            findings.push(Finding {
                id: FindingId::HedgeNotSafe,
                severity: if to.op.kind == Kind::Write {
                    Severity::Error
                } else {
                    Severity::Warning
                },
                path: p.clone(),
                message: format!(
                    "the client in `{}` hedges {} ({}, sent as {}): the copies run it more than \
                     once",
                    from.service.name,
                    to.name(),
                    to.op.kind,
                    to.op.method
                ),
                fix: "hedge safe reads only: a client of its own without a hedge for this \
                      operation, or hedge_idempotent off"
                    .to_owned(),
            });
        }
        if let (Some(per_try), Some(total)) = (c.per_try_timeout, c.timeout) {
            let need = per_try.saturating_mul(c.retry.max_attempts);
            if retries && need > total && seen_budget.insert((edge.from, edge.to)) {
                findings.push(Finding {
                    id: FindingId::AttemptsExceedBudget,
                    severity: Severity::Warning,
                    path: p.clone(),
                    message: format!(
                        "the client in `{}` gives each of {} attempts up to {}: {} in all, \
                         more than the call's budget of {}; the last attempts get only what is \
                         left",
                        from.service.name,
                        c.retry.max_attempts,
                        secs(per_try),
                        secs(need),
                        secs(total)
                    ),
                    fix: "per_try_timeout at most the budget divided by max_attempts (less the \
                          backoff), or fewer attempts"
                        .to_owned(),
                });
            }
        }
        if to.op.kind == Kind::Write {
            let resolved = c.retry.resolver
                || from
                    .service
                    .ledger
                    .as_ref()
                    .is_some_and(|l| l.resolver || l.manual_queue || l.alert_after.is_some());
            if !resolved && seen_unknown.insert((from.service.name.as_str(), edge.to)) {
                findings.push(Finding {
                    id: FindingId::UnknownUnowned,
                    severity: Severity::Error,
                    path: p.clone(),
                    message: format!(
                        "a call to {} can end UNKNOWN (a lost reply, a deadline), and `{}` has \
                         no resolver, no ledger with a manual queue and no alert: the unknown \
                         ends in a log line",
                        to.name(),
                        from.service.name
                    ),
                    fix: "give the client a resolver, or record its calls in a ledger whose \
                          reconciler settles them, with a manual queue and an alert"
                        .to_owned(),
                });
            }
        }
    }
}

/// The findings about a service's parts: the record's boundary, the inbox's versions.
fn parts(chain: &Chain, g: &Graph<'_>, findings: &mut Vec<Finding>) {
    for node in &g.nodes {
        if !(node.op.money && node.op.kind == Kind::Write) || node.service.external {
            continue;
        }
        let idem = node
            .service
            .server
            .as_ref()
            .and_then(|s| s.idempotency.as_ref());
        let message = match idem.map(|i| i.boundary) {
            None => format!(
                "{} moves money and `{}` keeps no idempotency record: a retry with the same \
                 intent is a second payment",
                node.name(),
                node.service.name
            ),
            Some(Boundary::Separate) => format!(
                "{} moves money, and its idempotency record is kept apart from the business \
                 write: a crash between them leaves the payment committed and the record \
                 in progress",
                node.name()
            ),
            Some(Boundary::CompleteIn | Boundary::InTransaction) => continue,
        };
        findings.push(Finding {
            id: FindingId::RecordOutsideTransaction,
            severity: Severity::Error,
            path: vec![node.name()],
            message,
            fix: "keep the record in the business write's transaction: the PostgreSQL store \
                  with in_transaction() (or complete_in in the handler)"
                .to_owned(),
        });
    }
    for s in &chain.services {
        let Some(inbox) = &s.inbox else { continue };
        if inbox.versions != VersionPolicy::Any || inbox.change_events == Some(false) {
            continue;
        }
        let (severity, said) = match inbox.change_events {
            Some(_) => (Severity::Error, "applies change events and"),
            None => (
                Severity::Warning,
                "does not say whether its events are changes or facts, and",
            ),
        };
        findings.push(Finding {
            id: FindingId::InboxWithoutVersions,
            severity,
            path: vec![s.name.clone()],
            message: format!(
                "`{}`'s inbox {said} checks no version: a redelivered or reordered older change \
                 overwrites a newer one",
                s.name
            ),
            fix: "versions = \"in_order\" (or \"latest\" for a snapshot), or say that the events \
                  are facts (change_events = false)"
                .to_owned(),
        });
    }
}

/// The seven answers for one operation.
fn answers(g: &Graph<'_>, inboxes: &[String], v: usize, node: &Node<'_>) -> OperationReview {
    let callers: Vec<&Edge<'_>> = g.into[v].iter().map(|&e| &g.edges[e]).collect();
    let caller = |e: &Edge<'_>| g.nodes[e.from].service.name.clone();
    let kind = node.op.kind;
    let service = node.service;
    let mut answers = Vec::with_capacity(7);
    let nobody = "nobody in the chain calls it: who calls it from outside, and how?";

    // 1. The states a timeout can leave.
    let mut given = Vec::new();
    let mut open = None;
    match kind {
        Kind::Read => given.push("none changed: a read has no effect to leave".to_owned()),
        Kind::Idempotent => given.push(
            "not run, or run (once or more, to the effect of once): sending it again is safe"
                .to_owned(),
        ),
        Kind::Write => {
            for e in &callers {
                let resent = resent_after_send(e.client, node);
                let keyed = resent && e.client.generates_keys && honours_keys(service);
                given.push(if keyed && service.external {
                    format!(
                        "from {}: not run, committed with the reply lost, or still running; it \
                         is sent again with the same key, which the provider honours",
                        caller(e)
                    )
                } else if keyed {
                    format!(
                        "from {}: not run, committed with the reply lost, or still running; it \
                         is sent again with the same key, and the record answers with the \
                         first outcome (or 409 while it runs)",
                        caller(e)
                    )
                } else if resent {
                    format!(
                        "from {}: not run, or run once or more: it is sent again after a lost \
                         reply, and nothing makes a second run a no-op",
                        caller(e)
                    )
                } else {
                    format!(
                        "from {}: not run, committed with the reply lost, or still running; \
                         the call ends UNKNOWN, since it is not sent again once sent",
                        caller(e)
                    )
                });
            }
            if callers.is_empty() {
                open = Some(nobody.to_owned());
            }
        }
    }
    answers.push(answer(crate::review::Question::TimeoutStates, given, open));

    // 2. Who retries.
    let mut given = Vec::new();
    for e in &callers {
        let c = e.client;
        let r = &c.retry;
        let left = r.max_attempts > 1
            && g.into[e.from]
                .iter()
                .any(|&i| g.edges[i].client.retry.marks_owner)
            && trusts(g.nodes[e.from].service);
        given.push(format!(
            "{}: {} attempt(s){}, backoff {} to {} (x{}, {} jitter), budget {}, total {}, \
             per try {}{}",
            caller(e),
            r.max_attempts,
            if resent_after_send(c, node) || r.max_attempts == 1 {
                ""
            } else {
                " (after sending only if provably not processed)"
            },
            secs(r.backoff.base),
            secs(r.backoff.max),
            r.backoff.multiplier,
            format!("{:?}", r.backoff.jitter).to_lowercase(),
            budget_text(&r.budget),
            c.timeout.map_or("inherited".to_owned(), secs),
            c.per_try_timeout
                .map_or("what the budget leaves".to_owned(), secs),
            if left {
                "; left to its caller when the caller marks itself owner"
            } else {
                ""
            },
        ));
    }
    let open = callers.is_empty().then(|| nobody.to_owned());
    answers.push(answer(crate::review::Question::Retries, given, open));

    // 3. The key.
    let mut given = Vec::new();
    let mut open = Vec::new();
    if kind == Kind::Read {
        given.push("no key: a read".to_owned());
    } else {
        match &node.op.key {
            Some(intent) => given.push(format!("the key stands for: {intent}")),
            None => open.push("which business intent does the key stand for?"),
        }
        for e in &callers {
            given.push(if e.client.generates_keys {
                format!(
                    "{} generates one key per call, and every attempt of the call reuses it",
                    caller(e)
                )
            } else {
                format!("{} sends no key of its own", caller(e))
            });
        }
        if service.external {
            match service.accepts_key {
                Some(true) => {
                    open.push("what does it answer to the same key with other parameters?")
                }
                _ => given.push("it takes no key".to_owned()),
            }
        } else if honours_keys(service) {
            given.push(
                "the same key with other parameters gets 422; while the first runs, 409".to_owned(),
            );
        } else {
            given.push(format!("`{}` runs no idempotency layer", service.name));
        }
    }
    let open = (!open.is_empty()).then(|| open.join(" "));
    answers.push(answer(crate::review::Question::Key, given, open));

    // 4. The boundary.
    let mut open = None;
    let given = if kind == Kind::Read {
        vec!["nothing to keep: a read".to_owned()]
    } else if service.external {
        open = Some("it is not ours: how does it keep its record?".to_owned());
        Vec::new()
    } else {
        let idem = service.server.as_ref().and_then(|s| s.idempotency.as_ref());
        vec![match idem {
            None => "no idempotency record".to_owned(),
            Some(i) => format!(
                "the record is kept in the {} store, {}",
                i.store,
                match i.boundary {
                    Boundary::Separate => "apart from the business write",
                    Boundary::CompleteIn =>
                        "completed in the business write's transaction (complete_in)",
                    Boundary::InTransaction =>
                        "claimed, written and completed in the business write's transaction",
                }
            ),
        }]
    };
    answers.push(answer(crate::review::Question::Boundary, given, open));

    // 5. Events.
    let mut given = Vec::new();
    let mut open = None;
    match &service.outbox {
        Some(o) => given.push(format!(
            "`{}` publishes through its outbox ({} relay): at least once, so a consumer may see \
             an event twice, each time with its event id",
            service.name,
            match o.relay {
                super::RelayKind::Polling => "polling",
                super::RelayKind::Log => "log",
            }
        )),
        None => {
            open = Some(format!(
                "does `{}` publish events for it, and how?",
                service.name
            ))
        }
    }
    if service.outbox.is_some() {
        given.extend(inboxes.iter().cloned());
    }
    answers.push(answer(crate::review::Question::Events, given, open));

    // 6. The external system.
    let mut given = Vec::new();
    let mut open = None;
    if service.external {
        match service.accepts_key {
            Some(true) => given.push("it accepts the key".to_owned()),
            Some(false) => given.push("it does not accept a key".to_owned()),
            None => open = Some("does it accept a key?".to_owned()),
        }
        if service.accepts_key != Some(true) {
            for e in &callers {
                let s = g.nodes[e.from].service;
                given.push(if e.client.retry.resolver {
                    format!(
                        "the resolver in `{}` asks it what became of a call",
                        caller(e)
                    )
                } else if s.ledger.as_ref().is_some_and(|l| l.resolver) {
                    format!(
                        "the reconciler in `{}` queries it for the ledger's entries",
                        caller(e)
                    )
                } else {
                    format!("{} has no way to query its receipts", caller(e))
                });
            }
        }
    } else {
        given.push(format!("not external: `{}` is ours", service.name));
    }
    answers.push(answer(crate::review::Question::External, given, open));

    // 7. The UNKNOWN.
    let mut given = Vec::new();
    let open = if kind == Kind::Write {
        for e in &callers {
            let s = g.nodes[e.from].service;
            given.push(match &s.ledger {
                Some(l) => format!(
                    "from {}: into its ledger{}{}{}",
                    caller(e),
                    if l.resolver {
                        ", settled by its reconciler"
                    } else {
                        ""
                    },
                    if l.manual_queue {
                        ", the manual queue for the rest"
                    } else {
                        ""
                    },
                    l.alert_after
                        .map(|a| format!(", an alert after {}", secs(a)))
                        .unwrap_or_default(),
                ),
                None if e.client.retry.resolver => {
                    format!("from {}: its resolver asks, with no alert", caller(e))
                }
                None => format!("from {}: nothing keeps it", caller(e)),
            });
        }
        Some("who may compensate or confirm an UNKNOWN by hand?".to_owned())
    } else {
        given.push(format!(
            "none: {} is sent again, not left UNKNOWN",
            match kind {
                Kind::Read => "a read",
                _ => "an idempotent operation",
            }
        ));
        None
    };
    answers.push(answer(crate::review::Question::Unknown, given, open));

    OperationReview {
        service: service.name.clone(),
        operation: node.op.name.clone(),
        kind,
        method: node.op.method.clone(),
        answers,
    }
}

fn answer(question: Question, given: Vec<String>, open: Option<String>) -> Answer {
    Answer {
        question,
        given,
        open,
    }
}

fn budget_text(budget: &BudgetSettings) -> String {
    match budget {
        BudgetSettings::None => "none".to_owned(),
        BudgetSettings::Ratio {
            ratio, min_per_sec, ..
        } => format!("{ratio} of first attempts (+{min_per_sec}/s)"),
        BudgetSettings::TokenBucket {
            max_tokens,
            token_ratio,
        } => format!("token bucket of {max_tokens} (+{token_ratio} per success)"),
        BudgetSettings::Custom => "a budget of its own".to_owned(),
    }
}
