//! `Admin::act`'s errors, told apart by their predicates, as the command line's exit codes and
//! the pages' status codes tell them apart.

use surely::admin::{Action, ActionError, Admin, AuditLog};
use surely::ledger::{EntryId, MemoryLedger, Verdict};

use crate::http::manual_entry;

/// Which predicates hold, in the order invalid, not found, conflict, unsupported, unavailable.
fn kinds(e: &ActionError) -> [bool; 5] {
    [
        e.is_invalid(),
        e.is_not_found(),
        e.is_conflict(),
        e.is_unsupported(),
        e.is_unavailable(),
    ]
}

#[tokio::test]
async fn action_errors_say_their_kind_by_predicate() {
    let ledger = MemoryLedger::new();
    let audit = AuditLog::memory();
    let admin = Admin::builder()
        .ledger(ledger.clone())
        .audit(audit.clone())
        .build();
    let entry = manual_entry(&ledger, "unk-1", "order-1").await;
    let settle = |entry: &EntryId| Action::Settle {
        entry: entry.clone(),
        verdict: Verdict::Succeeded,
    };

    let invalid = admin.act("ana", settle(&entry), "").await.unwrap_err();
    assert_eq!(
        kinds(&invalid),
        [true, false, false, false, false],
        "{invalid}"
    );

    let nowhere = EntryId::new("unk-none").unwrap();
    let missing = admin.act("ana", settle(&nowhere), "why").await.unwrap_err();
    assert_eq!(
        kinds(&missing),
        [false, true, false, false, false],
        "{missing}"
    );

    admin.act("ana", settle(&entry), "found it").await.unwrap();
    let again = admin.act("ana", settle(&entry), "again").await.unwrap_err();
    assert_eq!(kinds(&again), [false, false, true, false, false], "{again}");
    // The audit log keeps the kind in the outcome it writes.
    let last = audit.list(1).await.unwrap().remove(0);
    assert!(
        last.outcome
            .as_deref()
            .unwrap_or_default()
            .starts_with("refused (conflict)"),
        "{last:?}"
    );

    // An admin without the store: nothing to act on.
    let bare = Admin::builder().build();
    let no_outbox = bare
        .act(
            "ana",
            Action::Requeue(surely::outbox::EventId::new("evt-1").unwrap()),
            "why",
        )
        .await
        .unwrap_err();
    assert_eq!(
        kinds(&no_outbox),
        [false, true, false, false, false],
        "{no_outbox}"
    );
}

/// A store that did not answer: the action's error is the store's, its cause one `source()`
/// away and not in the message, and the audit log's outcome says the whole chain.
#[tokio::test]
async fn a_failed_store_is_kept_whole_with_its_cause() {
    use std::error::Error as _;

    // Nothing listens on port 1: every connection is refused.
    let pool = surely::postgres::connect("postgres://postgres@127.0.0.1:1/test").unwrap();
    let ledger = surely::ledger::PostgresLedger::new(pool);
    let audit = AuditLog::memory();
    let admin = Admin::builder().ledger(ledger).audit(audit.clone()).build();
    let entry = EntryId::new("unk-1").unwrap();

    let err = admin
        .act("ana", Action::RetryNow(entry), "the order is in")
        .await
        .unwrap_err();
    assert_eq!(kinds(&err), [false, false, false, false, true], "{err}");
    let cause = err.source().expect("the store's cause").to_string();
    assert!(!err.to_string().contains(&cause), "{err} repeats {cause}");
    let outcome = audit.list(1).await.unwrap().remove(0).outcome.unwrap();
    assert!(
        outcome.starts_with("refused (unavailable): ") && outcome.contains(&cause),
        "{outcome}"
    );
}
