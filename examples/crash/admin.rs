//! The `admin` role: a person at surely's admin while the kills go on, working the ledger ahead
//! of the reconciler and the manual queue of tasks. Every action goes through `Admin::act`,
//! audited in a table of the run's own: its line written before the action, its outcome after.
//!
//! * a ledger entry (open, claimed or manual) whose answer the order table
//!   gives (the order exists: succeeded; none, nothing in flight, past the grace: failed) is
//!   settled by hand with that verdict, as the reconciler would have; an entry the reconciler
//!   settled first makes the action a conflict, audited as refused;
//! * a task the fraud rule refused and whose refusal stands (`tasks.rs`) is discarded.
//!
//! The ledger is wrapped with two crash points: `admin-begun` (the audit line written, the
//! settlement not made) and `admin-acted` (the settlement made, its outcome not written). A
//! line without an outcome says "the action may have happened"; invariant 13 checks that it
//! did or did not, never half, and that no entry was settled by the admin without a line.

use std::sync::Arc;
use std::time::Duration;

use surely::admin::{Action, Admin};
use surely::ledger::{
    Claim, Entry, EntryId, EntryState, Evidence, Filter, Ledger, LedgerError, LedgerStats,
    PostgresLedger, Settled, Settlement, Verdict,
};
use surely::retry::Resolution;

use crate::crashpoint::{self, ADMIN_ACTED, ADMIN_BEGUN};
use crate::reconcile::Facts;
use crate::tasks::{Fate, Fates, ENV_TASKS};
use crate::world::{World, CONSUMER};
use crate::BoxError;

/// Who the admin's actions are by, in the audit log and on the settlements.
pub(crate) const WHO: &str = "crash admin";
/// Why it settles an entry.
pub(crate) const WHY_SETTLE: &str = "checked the order table";
/// How often it looks.
const POLL: Duration = Duration::from_millis(300);
/// How old an entry must be before the admin looks at it.
const MIN_AGE: Duration = Duration::from_millis(200);

/// The run's ledger, with the admin's crash points around a settlement by hand.
struct CrashingLedger(PostgresLedger);

impl Ledger for CrashingLedger {
    async fn record(&self, evidence: &Evidence) -> Result<bool, LedgerError> {
        self.0.record(evidence).await
    }

    async fn record_in_doubt(
        &self,
        evidence: &Evidence,
        hold: Duration,
    ) -> Result<bool, LedgerError> {
        self.0.record_in_doubt(evidence, hold).await
    }

    async fn forget_in_doubt(&self, ids: &[EntryId]) -> Result<u64, LedgerError> {
        self.0.forget_in_doubt(ids).await
    }

    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Claim>, LedgerError> {
        self.0.claim(max, lease).await
    }

    async fn settle(&self, claim: &Claim, settlement: &Settlement) -> Result<Settled, LedgerError> {
        self.0.settle(claim, settlement).await
    }

    async fn retry_later(
        &self,
        claim: &Claim,
        note: &str,
        after: Duration,
    ) -> Result<(), LedgerError> {
        self.0.retry_later(claim, note, after).await
    }

    async fn to_manual(&self, claim: &Claim, reason: &str) -> Result<(), LedgerError> {
        self.0.to_manual(claim, reason).await
    }

    async fn settle_manually(
        &self,
        id: &EntryId,
        settlement: &Settlement,
    ) -> Result<Settled, LedgerError> {
        // The audit line is written: the settlement is not made yet.
        crashpoint::at(ADMIN_BEGUN).await;
        let settled = self.0.settle_manually(id, settlement).await?;
        // Made: its outcome is not written yet.
        crashpoint::at(ADMIN_ACTED).await;
        Ok(settled)
    }

    async fn retry_now(&self, id: &EntryId, note: &str) -> Result<(), LedgerError> {
        self.0.retry_now(id, note).await
    }

    async fn get(&self, id: &EntryId) -> Result<Option<Entry>, LedgerError> {
        self.0.get(id).await
    }

    async fn list(&self, filter: &Filter) -> Result<Vec<Entry>, LedgerError> {
        self.0.list(filter).await
    }

    async fn stats(&self) -> Result<LedgerStats, LedgerError> {
        self.0.stats().await
    }

    async fn sweep(&self, retention: Duration) -> Result<u64, LedgerError> {
        self.0.sweep(retention).await
    }
}

pub(crate) async fn run() -> Result<(), BoxError> {
    let stopped = crashpoint::control();
    let world = World::from_env()?;
    world.reach_postgres().await?;
    let facts = Facts::new(&world)?;
    let fates = Fates::new(std::env::var(ENV_TASKS)?.parse()?);
    let fates = if world.amqp_url.is_some() {
        fates.all_at_once()
    } else {
        fates
    };
    let inbox = world.inbox()?;
    let admin = Admin::builder()
        .ledger(CrashingLedger(world.ledger()?))
        .tasks(world.inbox()?)
        .audit(world.audit()?)
        .build();
    crashpoint::ready();
    let stop = crashpoint::stop_of(stopped);
    tokio::pin!(stop);
    loop {
        if let Err(e) = round(&admin, &facts, &inbox, fates).await {
            eprintln!("admin: {e}");
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// One look at the ledger and the manual queue.
async fn round(
    admin: &Admin,
    facts: &Arc<Facts>,
    inbox: &surely::inbox::PostgresInbox,
    fates: Fates,
) -> Result<(), BoxError> {
    let mut unsettled = Vec::new();
    for state in [EntryState::Open, EntryState::Claimed, EntryState::Manual] {
        let filter = Filter::new().state(state).older_than(MIN_AGE).limit(8);
        unsettled.extend(facts.ledger.list(&filter).await?);
    }
    for entry in unsettled {
        let Some(key) = entry.evidence.key.as_deref() else {
            continue;
        };
        let verdict = match facts.about_call(key).await? {
            Resolution::Succeeded(_) => Verdict::Succeeded,
            Resolution::Failed => Verdict::Failed,
            _ => continue,
        };
        let action = Action::Settle {
            entry: entry.evidence.id.clone(),
            verdict,
        };
        match admin.act(WHO, action, WHY_SETTLE).await {
            Ok(()) => crashpoint::say("note admin-settled"),
            Err(e) if e.is_conflict() => crashpoint::say("note admin-conflict"),
            Err(e) => eprintln!("admin: settling {}: {e}", entry.evidence.id),
        }
    }
    let manual = inbox
        .tasks(Some(CONSUMER), Some(surely::inbox::TaskState::Manual), 16)
        .await?;
    for task in manual {
        let id = task.event.id();
        if fates.of(id.as_str()) != (Fate::Refused { discard: true }) {
            continue;
        }
        let action = Action::DiscardTask {
            consumer: CONSUMER.to_owned(),
            event: id.clone(),
        };
        match admin
            .act(WHO, action, "the refusal stands: the order is void")
            .await
        {
            Ok(()) => crashpoint::say("note admin-discarded"),
            Err(e) if e.is_conflict() => crashpoint::say("note admin-conflict"),
            Err(e) => eprintln!("admin: discarding {id}: {e}"),
        }
    }
    Ok(())
}

/// What invariant 13 reads: the audit log's lines.
pub(crate) async fn audit_lines(
    world: &World,
) -> Result<Vec<surely::admin::AuditRecord>, BoxError> {
    Ok(world.audit()?.list(1_000_000).await?)
}

/// Whether `entry` was settled by the admin.
pub(crate) fn by_admin(entry: &Entry) -> bool {
    matches!(
        entry.settlement.as_ref().map(|s| &s.by),
        Some(surely::ledger::SettledBy::Manual { who }) if who == WHO
    )
}
