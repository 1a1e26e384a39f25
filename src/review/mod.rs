//! The review of a call chain: the seven questions to ask of every operation, answered from
//! the stacks' settings, and the classic mistakes found before an incident finds them.
//!
//! A [`Chain`] names services, their operations, their clients, their server layers and their
//! durable parts, and who calls whom. Its settings come from the stacks themselves: every
//! builder says what it would build ([`ClientBuilder::describe`], the server layers' and the
//! durable components' `describe`), so a service can review the stacks it built, at start-up or
//! in a test. The `surely review` command reads the same chain from a TOML file (feature
//! `review`, [`Chain::from_toml`][crate::review::Chain::from_toml]).
//!
//! [`Chain::review`] gives a [`Review`]: per operation, the seven questions of
//! [`docs::review`](crate::docs::review) with the answer the settings give, or what a reviewer
//! must answer where they do not say; and the [`Finding`]s, each with a stable
//! [`FindingId`], a [`Severity`], the path through the chain and the fix.
//!
//! ```
//! use std::time::Duration;
//! use surely::review::{Chain, FindingId, Operation, Service};
//!
//! // Three services, each retrying three times, and nobody leaving retries to the caller.
//! let client = surely::client().describe();
//! let chain = Chain::new()
//!     .service(Service::new("gateway").client("orders", client.clone())
//!         .operation(Operation::read("show").calls("orders", "get")))
//!     .service(Service::new("orders").client("stock", client.clone())
//!         .operation(Operation::read("get").calls("stock", "get")))
//!     .service(Service::new("stock").client("db", client)
//!         .operation(Operation::read("get").calls("db", "get")))
//!     .service(Service::new("db").operation(Operation::read("get")));
//! let review = chain.review().unwrap();
//! assert_eq!(review.paths()[0].worst, 27.0);
//! assert!(review.findings().iter().any(|f| f.id == FindingId::Amplification));
//! assert!(review.findings().iter().any(|f| f.id == FindingId::RetryOwners));
//! ```
//!
//! [`ClientBuilder::describe`]: crate::client::ClientBuilder::describe
#![cfg_attr(
    not(feature = "review"),
    doc = crate::docs::links::to_features!(
        "crate::review::Chain::from_toml",
    )
)]

mod check;
mod settings;
mod text;

use std::collections::BTreeMap;
use std::fmt;

pub use self::check::{
    Answer, Finding, FindingId, OperationReview, PathFigure, Question, Review, Severity,
};
pub use self::settings::{
    BackoffSettings, Boundary, BreakerSettings, BudgetSettings, ClientSettings, HedgeSettings,
    IdempotencySettings, InboxSettings, LedgerSettings, OutboxSettings, RelayKind, RetrySettings,
    ServerDeadlineSettings, ServerSettings, VersionPolicy,
};

/// The default limit of amplification: calls at the bottom of a path per call at its top.
pub const DEFAULT_MAX_AMPLIFICATION: f64 = 10.0;

/// A call chain to review: its services and the limit its amplification must stay under.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Chain {
    /// The services, in the order given.
    pub services: Vec<Service>,
    /// The limit of amplification along any path (default [`DEFAULT_MAX_AMPLIFICATION`]).
    pub max_amplification: f64,
    /// Calls a second at each entry, if known: the retry budgets' reserves (retries a second
    /// whatever the traffic) are then counted in the bounded figure.
    pub rate: Option<f64>,
}

impl Default for Chain {
    fn default() -> Self {
        Self::new()
    }
}

impl Chain {
    /// An empty chain with the default limit.
    pub fn new() -> Self {
        Self {
            services: Vec::new(),
            max_amplification: DEFAULT_MAX_AMPLIFICATION,
            rate: None,
        }
    }

    /// Adds a service.
    pub fn service(mut self, service: Service) -> Self {
        self.services.push(service);
        self
    }

    /// The limit of amplification along any path; [`review`](Self::review) refuses one that is
    /// not a finite number of at least 1.
    pub fn max_amplification(mut self, limit: f64) -> Self {
        self.max_amplification = limit;
        self
    }

    /// Calls a second at each entry; [`review`](Self::review) refuses one that is not a finite
    /// number above 0.
    pub fn rate(mut self, per_sec: f64) -> Self {
        self.rate = Some(per_sec);
        self
    }

    /// The review of the chain.
    ///
    /// # Errors
    ///
    /// A [`ReviewError`] when the chain cannot be reviewed: two services of one name, a call to
    /// a service or an operation the chain does not have, a call through a client the caller
    /// does not have, a cycle, a limit or a rate out of range.
    pub fn review(&self) -> Result<Review, ReviewError> {
        check::review(self)
    }
}

/// A service of the chain: its server layers, its clients (one per service it calls), its
/// operations and its durable parts.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Service {
    /// Its name.
    pub name: String,
    /// Whether it is not ours (a payment provider, a partner's API): the chain cannot see its
    /// settings.
    pub external: bool,
    /// For an external service: whether it accepts an idempotency key (`None`: nobody said).
    pub accepts_key: Option<bool>,
    /// Its server layers (`None`: it runs none of this crate's).
    pub server: Option<ServerSettings>,
    /// Its clients, by the name of the service each calls.
    pub clients: BTreeMap<String, ClientSettings>,
    /// Its operations.
    pub operations: Vec<Operation>,
    /// Its inbox, if it consumes events.
    pub inbox: Option<InboxSettings>,
    /// Its outbox, if it publishes events.
    pub outbox: Option<OutboxSettings>,
    /// Its UNKNOWN ledger and reconciler, if it has them.
    pub ledger: Option<LedgerSettings>,
}

impl Service {
    /// A service of ours with nothing yet.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            external: false,
            accepts_key: None,
            server: None,
            clients: BTreeMap::new(),
            operations: Vec::new(),
            inbox: None,
            outbox: None,
            ledger: None,
        }
    }

    /// A service that is not ours; `accepts_key` says whether it honours an idempotency key.
    pub fn external(name: impl Into<String>, accepts_key: bool) -> Self {
        let mut service = Self::new(name);
        service.external = true;
        service.accepts_key = Some(accepts_key);
        service
    }

    /// Its server layers.
    pub fn server(mut self, server: ServerSettings) -> Self {
        self.server = Some(server);
        self
    }

    /// Its client for the service `callee`.
    pub fn client(mut self, callee: impl Into<String>, settings: ClientSettings) -> Self {
        self.clients.insert(callee.into(), settings);
        self
    }

    /// Adds an operation.
    pub fn operation(mut self, operation: Operation) -> Self {
        self.operations.push(operation);
        self
    }

    /// Its inbox.
    pub fn inbox(mut self, inbox: InboxSettings) -> Self {
        self.inbox = Some(inbox);
        self
    }

    /// Its outbox.
    pub fn outbox(mut self, outbox: OutboxSettings) -> Self {
        self.outbox = Some(outbox);
        self
    }

    /// Its ledger.
    pub fn ledger(mut self, ledger: LedgerSettings) -> Self {
        self.ledger = Some(ledger);
        self
    }
}

/// What an operation does, in truth (the method says what a client will assume).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Kind {
    /// No side effects.
    Read,
    /// Doing it twice has the effect of doing it once.
    Idempotent,
    /// Doing it twice does it twice, unless a key says it is the same intent.
    Write,
}

impl Kind {
    /// The word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Idempotent => "idempotent",
            Kind::Write => "write",
        }
    }

    /// The method a client would send for it, by default.
    fn default_method(self) -> &'static str {
        match self {
            Kind::Read => "GET",
            Kind::Idempotent => "PUT",
            Kind::Write => "POST",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation of a service.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Operation {
    /// Its name.
    pub name: String,
    /// What it does, in truth.
    pub kind: Kind,
    /// The HTTP method its callers send, from which their clients judge whether a request may
    /// be sent twice (default: `GET`, `PUT` or `POST` for a read, an idempotent operation or a
    /// write).
    pub method: String,
    /// Whether it moves money (or anything that must not happen twice or be lost).
    pub money: bool,
    /// The business intent its idempotency key stands for (`None`: nobody said).
    pub key: Option<String>,
    /// The operations it calls, in order.
    pub calls: Vec<Call>,
}

impl Operation {
    fn new(name: impl Into<String>, kind: Kind) -> Self {
        Self {
            name: name.into(),
            kind,
            method: kind.default_method().to_owned(),
            money: false,
            key: None,
            calls: Vec::new(),
        }
    }

    /// A read (`GET`).
    pub fn read(name: impl Into<String>) -> Self {
        Self::new(name, Kind::Read)
    }

    /// An idempotent operation (`PUT`).
    pub fn idempotent(name: impl Into<String>) -> Self {
        Self::new(name, Kind::Idempotent)
    }

    /// A write (`POST`).
    pub fn write(name: impl Into<String>) -> Self {
        Self::new(name, Kind::Write)
    }

    /// The method its callers send.
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.method = method.into();
        self
    }

    /// Marks it as moving money.
    pub fn money(mut self) -> Self {
        self.money = true;
        self
    }

    /// The business intent its key stands for: "one order per cart".
    pub fn key(mut self, intent: impl Into<String>) -> Self {
        self.key = Some(intent.into());
        self
    }

    /// Adds a call to `operation` of `service`, through this service's client for `service`.
    pub fn calls(mut self, service: impl Into<String>, operation: impl Into<String>) -> Self {
        self.calls.push(Call {
            service: service.into(),
            operation: operation.into(),
        });
        self
    }
}

/// A call from an operation to another service's operation.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Call {
    /// The service called.
    pub service: String,
    /// Its operation.
    pub operation: String,
}

/// Why a chain cannot be reviewed, with the place in its file when it came from one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", at(*.line, *.column))]
pub struct ReviewError {
    kind: ReviewErrorKind,
    message: String,
    line: Option<usize>,
    column: Option<usize>,
    /// The call it is about, as (service, operation, index of the call), for a file to place.
    site: Option<(String, String, usize)>,
}

fn at(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("line {l}, column {c}: "),
        _ => String::new(),
    }
}

/// What kind of [`ReviewError`] it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReviewErrorKind {
    /// The file is not TOML, or not the chain file's format: a setting it does not know, a
    /// value of the wrong type, a value a builder refuses.
    Parse,
    /// A call names a service the chain does not have.
    UnknownService,
    /// A call names an operation its service does not have.
    UnknownOperation,
    /// A call goes through a client the caller does not have.
    NoClient,
    /// Two services, or two operations of a service, have one name.
    Duplicate,
    /// The calls run in a cycle.
    Cycle,
    /// A limit or a rate out of range.
    Invalid,
}

impl ReviewError {
    pub(crate) fn new(kind: ReviewErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            line: None,
            column: None,
            site: None,
        }
    }

    /// The same error, about the `index`th call of `operation` of `service`.
    pub(crate) fn about(mut self, service: &str, operation: &str, index: usize) -> Self {
        self.site = Some((service.to_owned(), operation.to_owned(), index));
        self
    }

    /// The call it is about, if any.
    #[cfg_attr(not(feature = "review"), allow(dead_code))]
    pub(crate) fn site(&self) -> Option<&(String, String, usize)> {
        self.site.as_ref()
    }

    /// The same error, placed at `line` and `column` (from 1) of its file.
    #[cfg_attr(not(feature = "review"), allow(dead_code))]
    pub(crate) fn at(mut self, line: usize, column: usize) -> Self {
        self.line = Some(line);
        self.column = Some(column);
        self
    }

    /// Its kind.
    pub fn kind(&self) -> ReviewErrorKind {
        self.kind
    }

    /// What is wrong, without the place.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The line of the file it is on (from 1), when it came from a file.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The column (from 1, in characters), when it came from a file.
    pub fn column(&self) -> Option<usize> {
        self.column
    }
}
