//! The actions, audited: one path for the router and for programs of the host's own (the
//! `surely` command line among them).

use std::fmt;

use super::{Admin, AuditAction};
use crate::inbox::InboxError;
use crate::ledger::{check_text, EntryId, LedgerError, Settlement, Verdict, MAX_TEXT};
use crate::outbox::{EventId, OutboxError};
use crate::reconcile::{Marked, ReconcileError, RepairId};

/// What an operator does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Settle a ledger entry by hand.
    Settle {
        /// The entry.
        entry: EntryId,
        /// What became of the call.
        verdict: Verdict,
    },
    /// Send a ledger entry back to the reconcilers, now.
    RetryNow(EntryId),
    /// Publish a quarantined event again.
    Requeue(EventId),
    /// Never publish a quarantined event.
    Discard(EventId),
    /// Resolve a reconciliation difference by hand (nothing to repair, or repaired elsewhere).
    Resolve(RepairId),
    /// Send a task in the manual queue back to its handler: due at once, its expiry afresh.
    RetryTask {
        /// The consumer it belongs to.
        consumer: String,
        /// Its event.
        event: EventId,
    },
    /// Discard a task in the manual queue: recorded as processed, never run.
    DiscardTask {
        /// The consumer it belongs to.
        consumer: String,
        /// Its event.
        event: EventId,
    },
}

impl Action {
    fn audit(&self) -> (AuditAction, String) {
        match self {
            Action::Settle { entry, .. } => (AuditAction::Settle, entry.to_string()),
            Action::RetryNow(entry) => (AuditAction::RetryNow, entry.to_string()),
            Action::Requeue(event) => (AuditAction::Requeue, event.as_str().to_owned()),
            Action::Discard(event) => (AuditAction::Discard, event.as_str().to_owned()),
            Action::Resolve(id) => (AuditAction::Resolve, id.to_string()),
            Action::RetryTask { consumer, event } => {
                (AuditAction::RetryTask, task_target(consumer, event))
            }
            Action::DiscardTask { consumer, event } => {
                (AuditAction::DiscardTask, task_target(consumer, event))
            }
        }
    }
}

/// A task as the audit log names it: `<consumer> <event id>` (a consumer's name may hold
/// spaces, an event id may not).
fn task_target(consumer: &str, event: &EventId) -> String {
    format!("{consumer} {}", event.as_str())
}

/// An action was not taken (or its store failed while taking it). Its `is_*` predicates say
/// why: a value refused, no such target, a target not in a state for it, a store that cannot
/// do it, or a store (or the audit log) that did not answer.
///
/// ```
/// use surely::admin::{Action, Admin};
/// use surely::ledger::EntryId;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // An admin given no ledger has no entry to retry.
/// let admin = Admin::builder().build();
/// let entry = EntryId::new("unk-1").unwrap();
/// let err = admin.act("ana", Action::RetryNow(entry), "the order is in").await.unwrap_err();
/// assert!(err.is_not_found() && !err.is_unavailable());
/// # }
/// ```
///
/// An error of a store or of the audit log that refused the action is kept whole: the action's
/// error says what it says, and its [`source`](std::error::Error::source) is that error's
/// cause, so that a chain printer shows each cause once.
#[derive(Debug)]
pub struct ActionError {
    kind: Kind,
    repr: Repr,
}

#[derive(Debug)]
enum Repr {
    /// Said by the admin itself.
    Said(String),
    /// A store's or the audit log's error, whose message and cause are the action's.
    Wrapped(Box<dyn std::error::Error + Send + Sync>),
}

impl fmt::Display for ActionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Said(message) => f.write_str(message),
            Repr::Wrapped(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ActionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.repr {
            Repr::Said(_) => None,
            Repr::Wrapped(e) => e.source(),
        }
    }
}

pub(super) use crate::error::said;

/// Why an action was not taken: the kinds the predicates of [`ActionError`] tell apart, kept
/// for the pages' status codes and the audit log's outcomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Invalid,
    NotFound,
    Conflict,
    Unsupported,
    Unavailable,
}

impl Kind {
    /// `invalid`, `not found`, `conflict`, `unsupported`, `unavailable`.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kind::Invalid => "invalid",
            Kind::NotFound => "not found",
            Kind::Conflict => "conflict",
            Kind::Unsupported => "unsupported",
            Kind::Unavailable => "unavailable",
        }
    }
}

impl ActionError {
    pub(super) fn new(kind: Kind, message: impl fmt::Display) -> Self {
        ActionError {
            kind,
            repr: Repr::Said(message.to_string()),
        }
    }

    /// `error`, refusing the action as `kind`.
    pub(super) fn wrap(kind: Kind, error: impl std::error::Error + Send + Sync + 'static) -> Self {
        ActionError {
            kind,
            repr: Repr::Wrapped(Box::new(error)),
        }
    }

    pub(super) fn kind(&self) -> Kind {
        self.kind
    }

    /// Whether a value was refused (who, why): nothing was written.
    pub fn is_invalid(&self) -> bool {
        self.kind == Kind::Invalid
    }

    /// Whether there is no such entry, quarantined event or difference, or the admin was given
    /// no store for it.
    pub fn is_not_found(&self) -> bool {
        self.kind == Kind::NotFound
    }

    /// Whether the target is not in a state for the action (a settled entry, a claimed one).
    pub fn is_conflict(&self) -> bool {
        self.kind == Kind::Conflict
    }

    /// Whether the store cannot take the action.
    pub fn is_unsupported(&self) -> bool {
        self.kind == Kind::Unsupported
    }

    /// Whether a store, or the audit log, did not answer.
    pub fn is_unavailable(&self) -> bool {
        self.kind == Kind::Unavailable
    }

    pub(super) fn of_ledger(e: LedgerError) -> Self {
        let kind = if e.is_not_found() {
            Kind::NotFound
        } else if e.is_invalid() {
            Kind::Invalid
        } else if e.is_conflict() || e.is_stale() {
            Kind::Conflict
        } else if e.is_unsupported() {
            Kind::Unsupported
        } else {
            Kind::Unavailable
        };
        ActionError::wrap(kind, e)
    }

    pub(super) fn of_reconcile(e: ReconcileError) -> Self {
        let kind = if e.is_not_found() {
            Kind::NotFound
        } else if e.is_invalid() {
            Kind::Invalid
        } else if e.is_stale() {
            Kind::Conflict
        } else {
            Kind::Unavailable
        };
        ActionError::wrap(kind, e)
    }

    pub(super) fn of_inbox(e: InboxError) -> Self {
        let kind = if e.is_no_such_task() {
            Kind::NotFound
        } else if e.is_invalid() {
            Kind::Invalid
        } else if e.is_unknown_reason() {
            Kind::Conflict
        } else {
            Kind::Unavailable
        };
        ActionError::wrap(kind, e)
    }

    pub(super) fn of_outbox(e: OutboxError) -> Self {
        let kind = if e.is_not_found() {
            Kind::NotFound
        } else if e.is_stale() {
            Kind::Conflict
        } else if e.is_unsupported() {
            Kind::Unsupported
        } else {
            Kind::Unavailable
        };
        ActionError::wrap(kind, e)
    }
}

impl Admin {
    /// Takes `action` as `who`, for `why`, audited: the audit log's line is written first,
    /// then the action is taken, then its outcome is written ([`docs::operators`]). The
    /// router's forms and JSON API come here after their checks; a program of the host's own
    /// (a script, the `surely` command line) calls it directly, having authenticated `who`
    /// itself.
    ///
    /// # Errors
    ///
    /// [`is_invalid`](ActionError::is_invalid) for a `who` or `why` the log cannot keep
    /// (nothing written); the others after the line was written, with the outcome saying the
    /// same.
    ///
    /// [`docs::operators`]: crate::docs::operators
    pub async fn act(&self, who: &str, action: Action, why: &str) -> Result<(), ActionError> {
        let invalid = |e: String| ActionError::new(Kind::Invalid, e);
        check_text("why", why, MAX_TEXT, true).map_err(invalid)?;
        let inner = &self.inner;
        let missing = |what: &str| {
            ActionError::new(Kind::NotFound, format!("this admin was given no {what}"))
        };
        let ledger = || inner.ledger.as_ref().ok_or_else(|| missing("ledger"));
        let outbox = || inner.outbox.as_ref().ok_or_else(|| missing("outbox"));
        let differences = || {
            inner
                .differences
                .as_ref()
                .ok_or_else(|| missing("reconciliation differences"))
        };
        let tasks = || inner.tasks.as_ref().ok_or_else(|| missing("task store"));
        // The store is there, and the values pass, before anything is written.
        let settlement = match &action {
            Action::Settle { verdict, .. } => {
                ledger()?;
                Some(Settlement::manual(*verdict, who, why).map_err(ActionError::of_ledger)?)
            }
            Action::RetryNow(_) => ledger().map(|_| None)?,
            Action::Requeue(_) | Action::Discard(_) => outbox().map(|_| None)?,
            Action::Resolve(_) => differences().map(|_| None)?,
            Action::RetryTask { .. } | Action::DiscardTask { .. } => {
                tasks()?;
                check_text("who", who, crate::ledger::MAX_WHO, false).map_err(invalid)?;
                None
            }
        };
        let (audit, target) = action.audit();
        let line = inner
            .audit
            .begin(who, audit, &target, why)
            .await
            .map_err(|e| {
                let kind = if e.is_invalid() {
                    Kind::Invalid
                } else {
                    Kind::Unavailable
                };
                ActionError::wrap(kind, e)
            })?;
        let done = match (&action, settlement) {
            (Action::Settle { entry, .. }, Some(s)) => match ledger()?.settle(entry, &s).await {
                Ok(settled) if settled.is_now() => Ok(()),
                Ok(settled) => Err(ActionError::new(
                    Kind::Conflict,
                    format!(
                        "ledger entry {entry} was already settled: {}",
                        settled.settlement().verdict.as_str()
                    ),
                )),
                Err(e) => Err(ActionError::of_ledger(e)),
            },
            (Action::RetryNow(entry), _) => {
                let note = format!("sent back by {who}: {why}");
                ledger()?
                    .retry_now(entry, &note)
                    .await
                    .map_err(ActionError::of_ledger)
            }
            (Action::Requeue(event), _) => outbox()?
                .requeue(event)
                .await
                .map_err(ActionError::of_outbox),
            (Action::Discard(event), _) => outbox()?
                .discard(event)
                .await
                .map(drop)
                .map_err(ActionError::of_outbox),
            (Action::Resolve(id), _) => match differences()?.resolve(id, who, why).await {
                Ok(Marked::Now) => Ok(()),
                Ok(Marked::Already) => Err(ActionError::new(
                    Kind::Conflict,
                    format!("difference {id} was already repaired or resolved"),
                )),
                Err(e) => Err(ActionError::of_reconcile(e)),
            },
            (Action::RetryTask { consumer, event }, _) => tasks()?
                .retry(consumer, event.as_str(), who, why)
                .await
                .map_err(ActionError::of_inbox),
            (Action::DiscardTask { consumer, event }, _) => tasks()?
                .discard(consumer, event.as_str(), who, why)
                .await
                .map(drop)
                .map_err(ActionError::of_inbox),
            (Action::Settle { .. }, None) => Err(missing("settlement")),
        };
        let outcome = match &done {
            Ok(()) => "done".to_owned(),
            Err(e) => format!("refused ({}): {}", e.kind().as_str(), said(e)),
        };
        if let Err(e) = inner.audit.finish(line, &outcome).await {
            tracing::error!(error = &e as &dyn std::error::Error, line, %outcome, "admin action taken, its outcome not written to the audit log");
        }
        done
    }
}
