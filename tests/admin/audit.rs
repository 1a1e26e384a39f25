//! The audit log: who, what, when, why and how it ended, newest first; hostile values refused.

use std::time::{Duration, SystemTime};

use surely::admin::{AuditAction, AuditLog};

/// Written before, finished after, listed newest first; refused values never written.
async fn keeps_every_action(log: AuditLog) {
    let before = SystemTime::now() - Duration::from_secs(5);
    let first = log
        .begin(
            "ana",
            AuditAction::Settle,
            "unk-1",
            "found in the order table",
        )
        .await
        .unwrap();
    let second = log
        .begin(
            "bo",
            AuditAction::Discard,
            "evt-9",
            "a test event\nsent by mistake",
        )
        .await
        .unwrap();
    assert!(second > first);
    log.finish(first, "done").await.unwrap();
    let lines = log.list(10).await.unwrap();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].id, second, "newest first");
    assert_eq!(
        (
            lines[0].who.as_str(),
            lines[0].action,
            lines[0].target.as_str()
        ),
        ("bo", AuditAction::Discard, "evt-9")
    );
    assert_eq!(lines[0].why, "a test event\nsent by mistake");
    assert_eq!(
        lines[0].outcome, None,
        "not finished: it may or may not have happened"
    );
    assert_eq!(lines[1].outcome.as_deref(), Some("done"));
    assert!(lines[1].at >= before);
    assert_eq!(log.list(1).await.unwrap().len(), 1);

    for (who, why) in [
        ("", "why"),
        ("ana\u{1b}[31m", "why"),
        ("ana", "   "),
        ("ana", "a\u{7}bell"),
        (&"x".repeat(257) as &str, "why"),
        ("ana", &"y".repeat(16 * 1024 + 1)),
    ] {
        let e = log
            .begin(who, AuditAction::Requeue, "evt-1", why)
            .await
            .unwrap_err();
        assert!(e.is_invalid(), "{e}");
    }
    assert_eq!(
        log.list(10).await.unwrap().len(),
        2,
        "nothing refused was written"
    );
    for a in [
        AuditAction::Settle,
        AuditAction::RetryNow,
        AuditAction::Requeue,
        AuditAction::Discard,
    ] {
        assert_eq!(AuditAction::parse(a.as_str()), Some(a));
    }
}

#[tokio::test]
async fn memory_audit_keeps_every_action() {
    keeps_every_action(AuditLog::memory()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn pg_audit_keeps_every_action() {
    use crate::support::names::unique;
    use crate::support::postgres::{self, did_not_answer};

    let table = unique("surely_audit_t");
    let pool = postgres::pool();
    let log = AuditLog::postgres(pool.clone()).with_table(&table).unwrap();
    log.migrate()
        .await
        .unwrap_or_else(|e| did_not_answer("pg_audit_keeps_every_action", e));
    keeps_every_action(log).await;
    assert!(AuditLog::memory().with_table("Bad Name").is_err());
    postgres::forget(&pool, &[&table], &[&table]).await;
}

/// A log whose database does not answer fails the action's line with the backend's error as
/// its source, said once: the message says the audit log failed, not why.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_backend_failure_says_its_cause_once() {
    use std::error::Error as _;

    let closed = crate::support::serve::closed_port();
    let pool = surely::postgres::connect(&format!("postgres://postgres@{closed}/test")).unwrap();
    let err = AuditLog::postgres(pool)
        .begin("ana", AuditAction::Settle, "unk-1", "why")
        .await
        .unwrap_err();
    assert!(!err.is_invalid(), "{err}");
    assert_eq!(err.to_string(), "audit log failed: its backend failed");
    let cause = err.source().expect("the pool's error").to_string();
    assert!(
        !cause.is_empty() && !err.to_string().contains(&cause),
        "{err}: {cause}"
    );
    // A refused value has no cause: the message says what was refused.
    let err = AuditLog::memory()
        .begin("", AuditAction::Settle, "unk-1", "why")
        .await
        .unwrap_err();
    assert!(err.is_invalid() && err.source().is_none(), "{err}");
}

const HOUR: Duration = Duration::from_secs(3600);

/// Begins `n` actions on `log`, finishing all but the last; returns their ids.
async fn actions(log: &AuditLog, n: usize) -> Vec<u64> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = log
            .begin("ana", AuditAction::Settle, &format!("unk-{i}"), "why")
            .await
            .unwrap();
        if i + 1 < n {
            log.finish(id, "done").await.unwrap();
        }
        ids.push(id);
    }
    ids
}

/// The ids left in `log`, oldest first.
async fn left(log: &AuditLog) -> Vec<u64> {
    let mut ids: Vec<u64> = log.list(100).await.unwrap().iter().map(|l| l.id).collect();
    ids.reverse();
    ids
}

/// The memory log's sweeper: finished lines past the retention go, at most a batch's limit,
/// the oldest first; a line without an outcome stays, whatever its age; a new line after a
/// sweep gets an id of its own.
#[tokio::test(start_paused = true)]
async fn the_memory_audit_sweeper_deletes_finished_lines_a_bounded_batch_at_a_time() {
    use surely::maintenance::Chore;
    let log = AuditLog::memory();
    let ids = actions(&log, 5).await;
    let sweeper = log.sweeper(2 * HOUR).unwrap();
    assert!(sweeper.name().starts_with("audit memory "));
    assert_eq!(sweeper.run(10).await.unwrap().done, 0, "recent");
    tokio::time::advance(3 * HOUR).await;
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (3, true));
    assert_eq!(left(&log).await, ids[3..], "the oldest first");
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (1, false));
    assert_eq!(left(&log).await, [ids[4]], "the unfinished line stays");
    let next = log
        .begin("ana", AuditAction::Settle, "unk-9", "why")
        .await
        .unwrap();
    assert!(next > ids[4], "ids are never reused");
    let err = log.sweeper(HOUR / 2).unwrap_err();
    assert_eq!(err.setting(), "audit retention");
    assert!(
        err.reason().contains("1800s") && err.reason().contains("3600s"),
        "{err}"
    );
}

/// The same on PostgreSQL, and two instances' batches at once delete disjoint lines.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn pg_the_audit_sweeper_deletes_finished_lines_a_bounded_batch_at_a_time() {
    use crate::support::names::unique;
    use crate::support::postgres::{self, did_not_answer};
    use surely::maintenance::Chore;

    let table = unique("surely_audit_t");
    let pool = postgres::pool();
    let log = AuditLog::postgres(pool.clone()).with_table(&table).unwrap();
    log.migrate().await.unwrap_or_else(|e| {
        did_not_answer(
            "pg_the_audit_sweeper_deletes_finished_lines_a_bounded_batch_at_a_time",
            e,
        )
    });
    let ids = actions(&log, 10).await;
    let sweeper = log.sweeper(2 * HOUR).unwrap();
    assert_eq!(sweeper.name(), format!("audit {table}"));
    assert_eq!(sweeper.run(100).await.unwrap().done, 0, "recent");
    let client = pool.get().await.unwrap();
    client
        .execute(
            &format!("UPDATE {table} SET at = now() - interval '3 hours' - (100 - id) * interval '1 second'"),
            &[],
        )
        .await
        .unwrap();
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (3, true));
    assert_eq!(left(&log).await, ids[3..], "the oldest first");
    // Another instance's batch holds two lines.
    let mut other = pool.get().await.unwrap();
    let txn = other.transaction().await.unwrap();
    txn.query(
        &format!("SELECT 1 FROM {table} ORDER BY id LIMIT 2 FOR UPDATE"),
        &[],
    )
    .await
    .unwrap();
    let (a, b) = (
        log.sweeper(2 * HOUR).unwrap(),
        log.sweeper(2 * HOUR).unwrap(),
    );
    let (x, y) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(a.run(100), b.run(100))
    })
    .await
    .expect("no batch waits for the held lines");
    assert_eq!(
        x.unwrap().done + y.unwrap().done,
        4,
        "disjoint, all not held"
    );
    txn.rollback().await.unwrap();
    let batch = sweeper.run(100).await.unwrap();
    assert_eq!((batch.done, batch.more), (2, false));
    assert_eq!(left(&log).await, [ids[9]], "the unfinished line stays");
    drop(client);
    postgres::forget(&pool, &[&table], &[&table]).await;
}
