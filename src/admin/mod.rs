//! The operator's surface: see and settle what the system could not
//! ([`docs::operators`](crate::docs::operators)).
//!
//! Some questions only a person answers: an unknown call no reconciler could settle waits in
//! the ledger's manual queue, an event the broker kept refusing waits in the outbox's
//! quarantine, the idempotency store keeps the records it found unknown or that stay
//! processing too long, a reconciliation keeps the differences no repair can fix, and an
//! inbox keeps the tasks whose wait expired or that a rule refused. [`router`] (or [`Admin::router`]) is an axum [`Router`](axum::Router)
//! over the stores the host has, to mount in the host's own server under any prefix: HTML
//! pages (rendered on the server, no JavaScript) and a JSON API under `api/` with the same
//! reads and actions.
//!
//! * **Nobody is let in by default.** Every request goes through the host's [`Authorize`]
//!   hook, which says [`Access::Denied`], [`Access::Read`] or [`Access::Act`] and the
//!   operator's name; an admin built without one refuses everything (`401`). The only ready
//!   hook, [`Authorize::dev_allow_all_from_loopback`], is for a developer's machine.
//! * **Every action is a POST with CSRF protection**: a form carries a token bound to the
//!   operator (an HMAC under a secret each [`Admin`] draws at random); the JSON API requires
//!   the header `x-surely-admin: 1` and a JSON body, which no cross-site form can send. A
//!   missing or wrong token is `403`. A GET never changes anything.
//! * **Every action is audited** in the [`AuditLog`], before it is taken: who (from the
//!   hook, never from the form), what, when, why, and how it ended; the log is a page too.
//! * **Hostile input is refused or inert**: who and why are checked like a manual settlement
//!   (length, no control characters: `400` with the reason), the templates escape all they
//!   show, bodies over 64 KiB are refused (`413`), an id that cannot be one is `400`, one
//!   that is not there `404`.
//!
//! ```
//! use axum::Router;
//! use surely::admin::{Access, Admin, Authorize};
//! use surely::ledger::MemoryLedger;
//! use surely::outbox::MemoryOutbox;
//!
//! let admin = Admin::builder()
//!     .ledger(MemoryLedger::new())
//!     .outbox(MemoryOutbox::new())
//!     .authorize(Authorize::new(|parts: &http::request::Parts| {
//!         // The host's own authentication: here, a header its proxy sets.
//!         match parts.headers.get("x-operator").and_then(|v| v.to_str().ok()) {
//!             Some(name) => Access::act(name),
//!             None => Access::Denied,
//!         }
//!     }))
//!     .build();
//! let app: Router = Router::new().nest("/admin", admin.router());
//! # let _ = app;
//! ```

mod action;
mod audit;
mod csrf;
#[cfg(feature = "opentelemetry")]
mod metrics;
mod pages;
mod stores;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::request::Parts;

pub use self::action::{Action, ActionError};
#[cfg(feature = "postgres")]
pub(crate) use self::audit::POSTGRES_COMPONENT;
pub use self::audit::{AuditAction, AuditError, AuditLog, AuditRecord, AuditSweeper};
#[cfg(feature = "opentelemetry")]
pub use self::metrics::AdminMetrics;

/// What the [`Authorize`] hook grants a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Nothing: the request is refused (`401`).
    Denied,
    /// The pages and the JSON reads, not the actions (`403`).
    Read {
        /// The operator's name.
        who: String,
    },
    /// Everything: reads and actions, written to the audit log under this name.
    Act {
        /// The operator's name: what the audit log keeps as who acted.
        who: String,
    },
}

impl Access {
    /// Read-only access for `who`.
    pub fn read(who: impl Into<String>) -> Self {
        Access::Read { who: who.into() }
    }

    /// Full access for `who`.
    pub fn act(who: impl Into<String>) -> Self {
        Access::Act { who: who.into() }
    }
}

type Hook = dyn Fn(&Parts) -> Access + Send + Sync;

/// The host's authorization hook: called with each request's head (its headers, its
/// extensions such as the host's own session or [`ConnectInfo`]), it says who the operator is
/// and what they may do. The host authenticates; the admin only asks.
#[derive(Clone)]
pub struct Authorize(Arc<Hook>);

impl Authorize {
    /// A hook of the host's own.
    pub fn new(hook: impl Fn(&Parts) -> Access + Send + Sync + 'static) -> Self {
        Authorize(Arc::new(hook))
    }

    /// Refuses everything: what an [`Admin`] built without a hook has.
    pub fn deny_all() -> Self {
        Authorize::new(|_| Access::Denied)
    }

    /// **For a developer's machine only; never in production.** Lets every request from a
    /// loopback address act, as `dev@<address>`, and refuses the rest. It needs the peer's
    /// address, which axum gives when the server is run with
    /// `into_make_service_with_connect_info::<SocketAddr>()`; without it, every request is
    /// refused. Anything on the machine can act: other users, other processes, a browser
    /// tab tricked into a request (CSRF protection still applies), and everyone a reverse proxy
    /// on the same machine forwards (never put it behind one).
    ///
    /// The request must also name a loopback host (`localhost`, `127.0.0.1`, `[::1]`, in its
    /// `Host` or its URI), so that a web page whose name was made to resolve to 127.0.0.1
    /// (DNS rebinding) cannot read the pages, and their CSRF tokens, as if it were the admin.
    pub fn dev_allow_all_from_loopback() -> Self {
        Authorize::new(
            |parts| match parts.extensions.get::<ConnectInfo<SocketAddr>>() {
                Some(ConnectInfo(peer)) if peer.ip().is_loopback() && names_loopback(parts) => {
                    Access::act(format!("dev@{}", peer.ip()))
                }
                _ => Access::Denied,
            },
        )
    }

    fn check(&self, parts: &Parts) -> Access {
        (self.0)(parts)
    }
}

/// Whether the host a request names (its `Host`, else its URI's authority) is a loopback one; a
/// request that names none (HTTP/1.0 without `Host`) passes, as no browser sends one.
fn names_loopback(parts: &Parts) -> bool {
    let named = match parts.headers.get(http::header::HOST) {
        Some(host) => match host.to_str() {
            Ok(host) => Some(host),
            Err(_) => return false,
        },
        None => parts.uri.authority().map(|a| a.as_str()),
    };
    let Some(named) = named else { return true };
    let Ok(authority) = named.parse::<http::uri::Authority>() else {
        return false;
    };
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl fmt::Debug for Authorize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authorize").finish_non_exhaustive()
    }
}

/// The admin: the stores it shows, who may use it, and where it writes what they did. Build
/// it with [`Admin::builder`], serve it with [`router`](Self::router).
#[derive(Clone)]
pub struct Admin {
    inner: Arc<Inner>,
}

struct Inner {
    ledger: Option<Box<dyn stores::DynLedger>>,
    outbox: Option<Box<dyn stores::DynOutbox>>,
    idempotency: Option<Box<dyn stores::DynIdempotency>>,
    differences: Option<Box<dyn stores::DynDifferences>>,
    tasks: Option<Box<dyn stores::DynTasks>>,
    stuck_after: std::time::Duration,
    authorize: Authorize,
    audit: AuditLog,
    csrf: csrf::Csrf,
    /// The running service's chain, reviewed once when the admin is built.
    review: Option<Result<crate::review::Review, crate::review::ReviewError>>,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("ledger", &self.inner.ledger.is_some())
            .field("outbox", &self.inner.outbox.is_some())
            .field("idempotency", &self.inner.idempotency.is_some())
            .field("differences", &self.inner.differences.is_some())
            .field("tasks", &self.inner.tasks.is_some())
            .field("audit", &self.inner.audit)
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// A builder with no store, an in-memory audit log, and no authorization: an admin
    /// built from it as it is refuses every request.
    pub fn builder() -> AdminBuilder {
        AdminBuilder {
            ledger: None,
            outbox: None,
            idempotency: None,
            differences: None,
            tasks: None,
            stuck_after: std::time::Duration::from_secs(300),
            authorize: None,
            audit: None,
            review: None,
        }
    }

    /// The admin's router, to [`nest`](axum::Router::nest) under a prefix of the host's server
    /// (its links follow the prefix), or to serve alone.
    pub fn router(&self) -> axum::Router {
        pages::router(self.clone())
    }

    /// The audit log it writes.
    pub fn audit(&self) -> &AuditLog {
        &self.inner.audit
    }
}

/// The admin's router: [`Admin::router`].
pub fn router(admin: Admin) -> axum::Router {
    admin.router()
}

/// Builds an [`Admin`]: any subset of the stores, the authorization hook, the audit log.
#[must_use]
pub struct AdminBuilder {
    ledger: Option<Box<dyn stores::DynLedger>>,
    outbox: Option<Box<dyn stores::DynOutbox>>,
    idempotency: Option<Box<dyn stores::DynIdempotency>>,
    differences: Option<Box<dyn stores::DynDifferences>>,
    tasks: Option<Box<dyn stores::DynTasks>>,
    stuck_after: std::time::Duration,
    authorize: Option<Authorize>,
    audit: Option<AuditLog>,
    review: Option<Result<crate::review::Review, crate::review::ReviewError>>,
}

impl fmt::Debug for AdminBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminBuilder").finish_non_exhaustive()
    }
}

impl AdminBuilder {
    /// The UNKNOWN ledger: its open entries, its manual queue, each entry's evidence; settle,
    /// retry now.
    pub fn ledger(mut self, ledger: impl crate::ledger::Ledger) -> Self {
        self.ledger = Some(Box::new(ledger));
        self
    }

    /// The outbox: its quarantine; requeue, discard.
    pub fn outbox(mut self, outbox: impl crate::outbox::OutboxStore) -> Self {
        self.outbox = Some(Box::new(outbox));
        self
    }

    /// The idempotency store: its unknown records, and those processing for longer than
    /// `stuck_after` (5 minutes unless [set](Self::stuck_after)).
    pub fn idempotency(mut self, store: impl crate::server::store::IdempotencyStore) -> Self {
        self.idempotency = Some(Box::new(store));
        self
    }

    /// The reconciliation differences: open ones and the manual queue; resolve by hand.
    pub fn differences(mut self, differences: impl crate::reconcile::DifferenceStore) -> Self {
        self.differences = Some(Box::new(differences));
        self
    }

    /// The inbox's tasks: those a person must decide (the manual queue, beside the ledger's
    /// entries) and those waiting, by reason, each with its attempts' evidence; retry now,
    /// discard ([`TaskStore`](crate::inbox::TaskStore)).
    pub fn tasks(mut self, tasks: impl crate::inbox::TaskStore) -> Self {
        self.tasks = Some(Box::new(tasks));
        self
    }

    /// How long a record processes before the admin shows it as stuck (5 minutes unless set).
    /// At most [`MAX_DURATION`](crate::MAX_DURATION): a longer age is taken as ten years (a
    /// store could not look that far back: PostgreSQL's timestamps end).
    pub fn stuck_after(mut self, age: std::time::Duration) -> Self {
        self.stuck_after = age.min(crate::MAX_DURATION);
        self
    }

    /// The running service's chain, reviewed ([`Chain::review`](crate::review::Chain::review))
    /// once, now: the Review page (`/review`, and `/api/review` as JSON) shows its seven
    /// answers per operation, its worst paths and its findings, or why it could not be
    /// reviewed. Build the chain from the stacks the service built, with their `describe()`.
    pub fn review(mut self, chain: &crate::review::Chain) -> Self {
        self.review = Some(chain.review());
        self
    }

    /// Who may read and act. Without it, every request is refused.
    pub fn authorize(mut self, authorize: Authorize) -> Self {
        self.authorize = Some(authorize);
        self
    }

    /// Where actions are written (in memory unless given: give
    /// [`AuditLog::postgres`] to keep them).
    #[cfg_attr(
        not(all(feature = "admin", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "`AuditLog::postgres`",
        )
    )]
    pub fn audit(mut self, audit: AuditLog) -> Self {
        self.audit = Some(audit);
        self
    }

    /// The admin.
    pub fn build(self) -> Admin {
        Admin {
            inner: Arc::new(Inner {
                ledger: self.ledger,
                outbox: self.outbox,
                idempotency: self.idempotency,
                differences: self.differences,
                tasks: self.tasks,
                stuck_after: self.stuck_after,
                authorize: self.authorize.unwrap_or_else(Authorize::deny_all),
                audit: self.audit.unwrap_or_else(AuditLog::memory),
                csrf: csrf::Csrf::new(),
                review: self.review,
            }),
        }
    }
}
