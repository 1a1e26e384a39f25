//! The PostgreSQL ledger: the memory ledger's behaviour, plus what only a database gives:
//! entries that outlive the process, and reconcilers racing over one table without settling an
//! entry twice. Real time, with short leases on the database's clock; against the machine's
//! local server (or `SURELY_TEST_POSTGRES_URL`), and the tests fail if it does not answer.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use surely::classify::{AttemptClass, DeliveryPhase};
use surely::ledger::{
    AttemptEvidence, EntryId, EntryState, Evidence, Filter, Ledger, LedgerRecorder, PostgresLedger,
    Reconciler, Settled, SettledBy, Settlement, Verdict,
};
use surely::retry::{NoResolver, Query, Resolution};
use surely::{Outcome, Semantics, StopReason};

use super::order;
use crate::support::names::unique;
use crate::support::postgres::{self, did_not_answer};
use crate::support::time::ms;

/// A ledger in a table of its own, migrated; dropped (with its migration records) by `forget`.
async fn ledger(test: &str) -> PostgresLedger {
    let ledger = PostgresLedger::new(postgres::pool())
        .with_table(&unique("surely_ledger_t"))
        .unwrap();
    ledger
        .migrate()
        .await
        .unwrap_or_else(|e| did_not_answer(test, e));
    ledger
}

async fn forget(ledger: &PostgresLedger) {
    let t = ledger.table();
    postgres::forget(ledger.pool(), &[&format!("{t}_attempts"), t], &[t]).await;
}

/// Runs the database's clock past `d` (and a little more).
async fn wait(d: Duration) {
    tokio::time::sleep(d + Duration::from_millis(50)).await;
}

use super::micros;

/// An entry with a key, its id `id`.
fn evidence(id: &str, key: &str) -> Evidence {
    let mut e = Evidence::new(key, "POST /orders").with_id(EntryId::new(id).unwrap());
    e.recorded_at = micros(e.recorded_at);
    e
}

/// Evidence with every field set, and three attempts.
fn full_evidence(id: &str) -> Evidence {
    let t0 = micros(SystemTime::now() - Duration::from_secs(3));
    let first = AttemptEvidence::new(
        1,
        t0,
        Duration::from_nanos(1_234_567),
        AttemptClass::Rejected,
        DeliveryPhase::NotSent,
    );
    let mut second = AttemptEvidence::new(
        2,
        t0 + ms(400),
        ms(250),
        AttemptClass::MaybeCommitted,
        DeliveryPhase::Sent,
    )
    .with_downstream_id("req-2");
    second.timeout = Some("attempt timeout 250ms".to_owned());
    let mut hedge = AttemptEvidence::new(
        2,
        t0 + ms(500),
        ms(150),
        AttemptClass::MaybeCommitted,
        DeliveryPhase::ResponseStarted,
    )
    .with_downstream_id("req-2-hedge");
    hedge.hedge = true;
    hedge.cancelled = true;
    let mut e = Evidence::new("o-1", "POST /orders")
        .with_id(EntryId::new(id).unwrap())
        .with_semantics(Semantics::Keyed)
        .with_stop(StopReason::AttemptsExhausted)
        .with_attempt(first)
        .with_attempt(second)
        .with_attempt(hedge);
    e.call = Some(u64::MAX - 7);
    e.recorded_at = micros(SystemTime::now());
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_recording_is_idempotent_and_the_evidence_comes_back_whole() {
    let ledger = ledger("pg_recording_is_idempotent_and_the_evidence_comes_back_whole").await;
    let e = full_evidence("unk-full");
    assert!(ledger.record(&e).await.unwrap());
    // Recorded again (a retried write): nothing changes.
    let mut again = e.clone();
    again.key = Some("another".to_owned());
    assert!(!ledger.record(&again).await.unwrap());

    let entry = ledger.get(&e.id).await.unwrap().unwrap();
    assert_eq!(entry.evidence, e);
    assert_eq!(entry.state, EntryState::Open);
    assert_eq!((entry.tries, entry.note, entry.settlement), (0, None, None));
    assert!(entry.age < Duration::from_secs(60), "{:?}", entry.age);
    // None of the optional fields set also comes back.
    let mut bare = Evidence::new("k", "op").with_id(EntryId::new("unk-bare").unwrap());
    bare.key = None;
    bare.operation = None;
    bare.recorded_at = micros(bare.recorded_at);
    assert!(ledger.record(&bare).await.unwrap());
    assert_eq!(ledger.get(&bare.id).await.unwrap().unwrap().evidence, bare);
    assert!(ledger
        .get(&EntryId::new("unk-none").unwrap())
        .await
        .unwrap()
        .is_none());
    forget(&ledger).await;
}

/// PostgreSQL's btree refuses an entry over about 2 700 bytes: keys are found by a hash index,
/// so a long key records and is found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_keys_of_any_length_are_recorded_and_found() {
    let ledger = ledger("pg_keys_of_any_length_are_recorded_and_found").await;
    for (i, len) in [10 * 1024, 64 * 1024].into_iter().enumerate() {
        let key: String = (0..len)
            .map(|j| char::from(b'a' + ((i + j * 7) % 26) as u8))
            .collect();
        let e = evidence(&format!("unk-long-{i}"), &key);
        assert!(ledger.record(&e).await.unwrap(), "{len}-byte key");
        let found = ledger.by_key(&key).await.unwrap();
        assert_eq!(found.len(), 1, "{len}-byte key");
        assert_eq!(found[0].evidence, e);
    }
    assert!(ledger.by_key("a").await.unwrap().is_empty());
    forget(&ledger).await;
}

/// A value PostgreSQL cannot keep (a NUL byte in a text) is refused, not a backend failure
/// that a recorder would write again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_value_postgres_refuses_is_invalid() {
    let ledger = ledger("pg_a_value_postgres_refuses_is_invalid").await;
    let e = evidence("unk-nul", "o-\0-1");
    let err = ledger.record(&e).await.unwrap_err();
    assert!(err.is_invalid(), "{err}");
    assert!(ledger.get(&e.id).await.unwrap().is_none());
    forget(&ledger).await;
}

/// A reconciler whose lease passed cannot settle an entry another one claimed since; the other
/// settles it once, and a settlement after that gets the first one back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_stale_claim_cannot_settle_and_a_settlement_is_kept() {
    let a = ledger("pg_a_stale_claim_cannot_settle_and_a_settlement_is_kept").await;
    let b = a.clone();
    let e = full_evidence("unk-race");
    a.record(&e).await.unwrap();

    let mine = a.claim(10, ms(300)).await.unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0].entry.evidence, e);
    assert_eq!(mine[0].entry.state, EntryState::Claimed);
    // Held: nobody else gets it.
    assert!(b.claim(10, ms(300)).await.unwrap().is_empty());
    wait(ms(300)).await;
    let theirs = b.claim(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(theirs.len(), 1);
    assert!(theirs[0].fence() > mine[0].fence());

    let late = Settlement::reconciled(Verdict::Failed, "not found (late)");
    assert!(a.settle(&mine[0], &late).await.unwrap_err().is_stale());
    assert!(a
        .retry_later(&mine[0], "late", ms(10))
        .await
        .unwrap_err()
        .is_stale());
    assert!(a.to_manual(&mine[0], "late").await.unwrap_err().is_stale());

    let mut found = Settlement::reconciled(Verdict::Succeeded, "order o-1 found");
    found.at = micros(found.at);
    let now = b.settle(&theirs[0], &found).await.unwrap();
    assert_eq!(now, Settled::Now(found.clone()));
    // Settled: whoever comes now gets that settlement back, and nothing changes.
    assert_eq!(
        a.settle(&mine[0], &late).await.unwrap(),
        Settled::Already(found.clone())
    );
    assert_eq!(
        b.settle(&theirs[0], &late).await.unwrap(),
        Settled::Already(found.clone())
    );
    assert!(b
        .retry_later(&theirs[0], "again", ms(10))
        .await
        .unwrap_err()
        .is_stale());
    let entry = a.get(&e.id).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Settled);
    assert_eq!(entry.settlement, Some(found));
    assert!(a.claim(10, ms(300)).await.unwrap().is_empty());
    forget(&a).await;
}

/// Four reconcilers over one table: every entry is settled exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_racing_reconcilers_settle_each_entry_once() {
    let ledger = ledger("pg_racing_reconcilers_settle_each_entry_once").await;
    for i in 0..200 {
        assert!(ledger
            .record(&evidence(&format!("unk-{i:03}"), &format!("o-{i}")))
            .await
            .unwrap());
    }
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let mut settled = Vec::new();
                loop {
                    let batch = ledger.claim(10, Duration::from_secs(5)).await.unwrap();
                    if batch.is_empty() {
                        return settled;
                    }
                    for claim in batch {
                        let s = Settlement::reconciled(Verdict::Succeeded, "found");
                        if ledger.settle(&claim, &s).await.unwrap().is_now() {
                            settled.push(claim.entry.evidence.id.clone());
                        }
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    assert_eq!(all.len(), 200);
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 200);
    let stats = ledger.stats().await.unwrap();
    assert_eq!((stats.unsettled(), stats.settled), (0, 200));
    assert_eq!(stats.oldest_unsettled, None);
    forget(&ledger).await;
}

/// An entry put back waits its backoff; one sent to the manual queue waits for a person, who
/// settles it with their name and reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_retry_later_waits_and_the_manual_queue_keeps_who_and_why() {
    let ledger = ledger("pg_retry_later_waits_and_the_manual_queue_keeps_who_and_why").await;
    let e = evidence("unk-retry", "o-9");
    ledger.record(&e).await.unwrap();

    let claim = ledger.claim(1, ms(300)).await.unwrap().remove(0);
    // A ledger keeps the first 16 KiB of a note (`Ledger::retry_later`'s docs).
    let kept = 16 * 1024;
    let long_note = "x".repeat(kept + 100);
    ledger
        .retry_later(&claim, &long_note, ms(400))
        .await
        .unwrap();
    let entry = ledger.get(&e.id).await.unwrap().unwrap();
    assert_eq!((entry.state, entry.tries), (EntryState::Open, 1));
    assert_eq!(
        entry.note.as_deref().map(str::len),
        Some(kept),
        "the note is cut"
    );
    assert!(
        ledger.claim(1, ms(300)).await.unwrap().is_empty(),
        "not before its backoff"
    );
    wait(ms(400)).await;
    let claim = ledger.claim(1, ms(300)).await.unwrap().remove(0);
    assert_eq!(claim.entry.tries, 1);
    ledger
        .retry_later(&claim, "order service down", ms(1))
        .await
        .unwrap();
    wait(ms(1)).await;
    let claim = ledger.claim(1, ms(300)).await.unwrap().remove(0);
    assert_eq!(claim.entry.note.as_deref(), Some("order service down"));
    ledger
        .to_manual(&claim, "still unknown after 3 queries")
        .await
        .unwrap();
    let entry = ledger.get(&e.id).await.unwrap().unwrap();
    assert_eq!((entry.state, entry.tries), (EntryState::Manual, 3));
    assert_eq!(entry.note.as_deref(), Some("still unknown after 3 queries"));
    wait(ms(300)).await;
    assert!(
        ledger.claim(1, ms(300)).await.unwrap().is_empty(),
        "the manual queue is not claimed"
    );
    // The claim it was sent there with is spent.
    assert!(ledger
        .settle(&claim, &Settlement::reconciled(Verdict::Succeeded, "late"))
        .await
        .unwrap_err()
        .is_stale());

    let mut by_hand =
        Settlement::manual(Verdict::Failed, "ops@example", "checked the warehouse").unwrap();
    by_hand.at = micros(by_hand.at);
    assert_eq!(
        ledger.settle_manually(&e.id, &by_hand).await.unwrap(),
        Settled::Now(by_hand.clone())
    );
    let other = Settlement::manual(Verdict::Succeeded, "someone", "changed my mind").unwrap();
    assert_eq!(
        ledger.settle_manually(&e.id, &other).await.unwrap(),
        Settled::Already(by_hand.clone())
    );
    let kept = ledger
        .get(&e.id)
        .await
        .unwrap()
        .unwrap()
        .settlement
        .unwrap();
    assert_eq!(
        kept.by,
        SettledBy::Manual {
            who: "ops@example".to_owned()
        }
    );
    assert_eq!(kept.evidence, "checked the warehouse");
    assert_eq!(kept, by_hand);

    // An open entry can be settled by hand too.
    let open = evidence("unk-open", "o-10");
    ledger.record(&open).await.unwrap();
    assert!(ledger
        .settle_manually(&open.id, &other)
        .await
        .unwrap()
        .is_now());

    let unknown = EntryId::new("unk-nobody").unwrap();
    assert!(ledger
        .settle_manually(&unknown, &other)
        .await
        .unwrap_err()
        .is_not_found());
    let mut ghost = claim.clone();
    ghost.entry.evidence.id = unknown;
    assert!(ledger
        .retry_later(&ghost, "n", ms(1))
        .await
        .unwrap_err()
        .is_not_found());
    assert!(ledger
        .to_manual(&ghost, "n")
        .await
        .unwrap_err()
        .is_not_found());
    assert!(ledger
        .settle(&ghost, &other)
        .await
        .unwrap_err()
        .is_not_found());
    forget(&ledger).await;
}

/// Listing by key, state and age, oldest first and limited; the counts by state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_lists_and_counts() {
    let ledger = ledger("pg_lists_and_counts").await;
    for i in 0..3 {
        ledger
            .record(&evidence(&format!("unk-old-{i}"), "o-old"))
            .await
            .unwrap();
    }
    wait(ms(300)).await;
    for i in 0..3 {
        ledger
            .record(&evidence(&format!("unk-new-{i}"), &format!("o-new-{i}")))
            .await
            .unwrap();
    }
    let ids = |entries: Vec<surely::ledger::Entry>| -> Vec<String> {
        entries
            .into_iter()
            .map(|e| e.evidence.id.to_string())
            .collect()
    };
    assert_eq!(
        ids(ledger.list(&Filter::new()).await.unwrap()),
        [
            "unk-old-0",
            "unk-old-1",
            "unk-old-2",
            "unk-new-0",
            "unk-new-1",
            "unk-new-2"
        ]
    );
    assert_eq!(
        ids(ledger.list(&Filter::new().limit(2)).await.unwrap()),
        ["unk-old-0", "unk-old-1"]
    );
    assert!(ledger
        .list(&Filter::new().limit(0))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        ids(ledger
            .list(&Filter::new().older_than(ms(300)))
            .await
            .unwrap()),
        ["unk-old-0", "unk-old-1", "unk-old-2"]
    );
    assert_eq!(ids(ledger.by_key("o-old").await.unwrap()).len(), 3);

    // The two oldest claimed, one of them sent to the manual queue, the next settled.
    let claims = ledger.claim(2, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        ids(claims.iter().map(|c| c.entry.clone()).collect()),
        ["unk-old-0", "unk-old-1"]
    );
    ledger.to_manual(&claims[1], "by hand").await.unwrap();
    let claim = ledger.claim(1, Duration::from_secs(30)).await.unwrap();
    ledger
        .settle(
            &claim[0],
            &Settlement::reconciled(Verdict::Succeeded, "found"),
        )
        .await
        .unwrap();

    let in_state = |s| Filter::new().state(s);
    assert_eq!(
        ids(ledger.list(&in_state(EntryState::Claimed)).await.unwrap()),
        ["unk-old-0"]
    );
    assert_eq!(
        ids(ledger.list(&in_state(EntryState::Manual)).await.unwrap()),
        ["unk-old-1"]
    );
    assert_eq!(
        ids(ledger.list(&in_state(EntryState::Settled)).await.unwrap()),
        ["unk-old-2"]
    );
    assert_eq!(
        ids(ledger
            .list(&in_state(EntryState::Open).key("o-new-1"))
            .await
            .unwrap()),
        ["unk-new-1"]
    );
    assert!(ledger
        .list(&in_state(EntryState::Open).older_than(ms(300)))
        .await
        .unwrap()
        .is_empty());

    let stats = ledger.stats().await.unwrap();
    assert_eq!(
        (stats.open, stats.claimed, stats.manual, stats.settled),
        (3, 1, 1, 1)
    );
    let oldest = stats.oldest_unsettled.unwrap();
    assert!(
        oldest >= ms(300) && oldest < Duration::from_secs(60),
        "{oldest:?}"
    );
    forget(&ledger).await;
}

/// The sweep deletes settled entries past the retention, and their attempts; never an open,
/// claimed or manual one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_sweep_deletes_only_settled_entries_past_retention() {
    let ledger = ledger("pg_sweep_deletes_only_settled_entries_past_retention").await;
    for i in 0..5 {
        let mut e = full_evidence(&format!("unk-{i}"));
        e.key = Some(format!("o-{i}"));
        ledger.record(&e).await.unwrap();
    }
    let claims = ledger.claim(4, Duration::from_secs(30)).await.unwrap();
    let done = Settlement::reconciled(Verdict::Succeeded, "found");
    ledger.settle(&claims[0], &done).await.unwrap();
    ledger.settle(&claims[1], &done).await.unwrap();
    ledger.to_manual(&claims[2], "by hand").await.unwrap();
    // unk-3 claimed, unk-4 open.

    assert_eq!(ledger.sweep(Duration::from_secs(3600)).await.unwrap(), 0);
    assert_eq!(ledger.sweep(Duration::ZERO).await.unwrap(), 2);
    let left: Vec<_> = ledger
        .list(&Filter::new())
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.evidence.id.to_string(), e.state))
        .collect();
    assert_eq!(
        left,
        [
            ("unk-2".to_owned(), EntryState::Manual),
            ("unk-3".to_owned(), EntryState::Claimed),
            ("unk-4".to_owned(), EntryState::Open),
        ]
    );
    let client = ledger.pool().get().await.unwrap();
    let attempts: Vec<String> = client
        .query(
            &format!(
                "SELECT DISTINCT entry_id FROM {}_attempts ORDER BY entry_id",
                ledger.table()
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(attempts, ["unk-2", "unk-3", "unk-4"]);
    drop(client);
    assert_eq!(ledger.sweep(Duration::ZERO).await.unwrap(), 0);
    forget(&ledger).await;
}

/// The whole chain over PostgreSQL: a call that ends unknown is recorded by the client stack,
/// and a reconciler settles it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_an_unknown_call_is_recorded_and_reconciled() {
    let ledger = ledger("pg_an_unknown_call_is_recorded_and_reconciled").await;
    let recorder = LedgerRecorder::new(ledger.clone());
    let mut client = unknown_client!(recorder.clone(), NoResolver::default());
    let err = super::call(&mut client, order("o-77")).await.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    recorder.flush().await;
    assert_eq!(recorder.writes().written, 1);
    let entry = ledger.by_key("o-77").await.unwrap().remove(0);
    assert_eq!(entry.evidence.operation.as_deref(), Some("POST /orders"));
    assert_eq!(entry.evidence.attempts.len(), 1);

    let lookup = |q: Query| async move {
        match q.key {
            Some(order) => Resolution::Succeeded(format!("{order} found")),
            None => Resolution::Unknown,
        }
    };
    let mut reconciler = Reconciler::builder(ledger.clone(), lookup).build().unwrap();
    assert_eq!(reconciler.run_once().await.unwrap().succeeded, 1);
    assert_eq!(reconciler.run_once().await.unwrap().succeeded, 0);
    let settled = ledger.get(&entry.evidence.id).await.unwrap().unwrap();
    assert_eq!(settled.settlement.unwrap().verdict, Verdict::Succeeded);
    forget(&ledger).await;
}

/// A table in a schema of its own: the migration names its indexes without the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_schema_qualified_table_migrates_and_works() {
    let pool = postgres::pool();
    let (client, schema) = postgres::schema(
        &pool,
        "pg_a_schema_qualified_table_migrates_and_works",
        "surely_ledger_s",
    )
    .await;
    let table = format!("{schema}.unknown_calls");
    let ledger = PostgresLedger::new(pool.clone())
        .with_table(&table)
        .unwrap();
    ledger.migrate().await.unwrap();
    let e = full_evidence("unk-s");
    assert!(ledger.record(&e).await.unwrap());
    assert_eq!(ledger.by_key("o-1").await.unwrap()[0].evidence, e);
    postgres::forget_schema(&client, &schema, &[&table]).await;
}

/// A ledger whose table is missing, or whose database cannot be reached, answers errors; a
/// table name that is not an identifier is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_missing_table_or_database_is_an_error_not_a_panic() {
    let pool = postgres::pool();
    let missing = PostgresLedger::new(pool)
        .with_table(&unique("surely_ledger_missing"))
        .unwrap();
    let e = evidence("unk-x", "o-x");
    assert!(missing.record(&e).await.is_err());
    assert!(missing.claim(1, ms(100)).await.is_err());
    assert!(missing.get(&e.id).await.is_err());
    assert!(missing.list(&Filter::new()).await.is_err());
    assert!(missing.stats().await.is_err());
    assert!(missing.sweep(Duration::ZERO).await.is_err());
    assert!(missing
        .settle_manually(&e.id, &Settlement::reconciled(Verdict::Succeeded, "found"))
        .await
        .is_err());

    // Nothing listens on port 1.
    let nowhere = surely::postgres::connect("postgres://postgres@127.0.0.1:1/test").unwrap();
    let down = PostgresLedger::new(nowhere);
    let err = down.record(&e).await.unwrap_err();
    assert!(!err.is_invalid() && !err.is_stale(), "{err}");
    assert!(down.stats().await.is_err());
    assert!(down.migrate().await.is_err());

    for bad in ["bad; drop", "", "Ledger", "a.b.c", "1st", "x\"y"] {
        let pool = postgres::pool();
        assert!(PostgresLedger::new(pool).with_table(bad).is_err(), "{bad}");
    }
}

/// A row this version cannot read (written by a newer one, or by hand) is an error that says
/// so, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_row_that_does_not_parse_is_an_error() {
    let ledger = ledger("pg_a_row_that_does_not_parse_is_an_error").await;
    let e = full_evidence("unk-odd");
    ledger.record(&e).await.unwrap();
    let client = ledger.pool().get().await.unwrap();
    client
        .execute(
            &format!(
                "UPDATE {}_attempts SET class = 'teleported' WHERE pos = 2",
                ledger.table()
            ),
            &[],
        )
        .await
        .unwrap();
    let err = ledger.get(&e.id).await.unwrap_err();
    assert!(crate::chain(&err).contains("teleported"), "{err}");
    assert!(ledger.claim(1, ms(300)).await.is_err());
    client
        .execute(
            &format!("UPDATE {} SET semantics = 'quantum'", ledger.table()),
            &[],
        )
        .await
        .unwrap();
    let err = ledger.list(&Filter::new()).await.unwrap_err();
    assert!(crate::chain(&err).contains("quantum"), "{err}");
    drop(client);
    forget(&ledger).await;
}

/// The intent journal's rules on PostgreSQL: the memory ledger's, with the hold on the
/// database's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_intents_are_kept_by_the_ledgers_rules() {
    let ledger = ledger("pg_intents_are_kept_by_the_ledgers_rules").await;
    super::journal::ledger_keeps_intents(ledger.clone(), wait).await;
    forget(&ledger).await;
}

/// Journaled calls over PostgreSQL: a success leaves nothing, an unknown is one open entry
/// with its attempts, and a client that dies mid-call leaves its intent in doubt in the table,
/// where another process's reconciler finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_journaled_calls_leave_one_entry_per_unknown_and_an_intent_per_dead_call() {
    use http::{Request, Response};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    let ledger =
        ledger("pg_journaled_calls_leave_one_entry_per_unknown_and_an_intent_per_dead_call").await;
    let recorder = LedgerRecorder::new(ledger.clone());
    let mut ok = surely::client()
        .recorder(recorder.clone())
        .journal(recorder.clone())
        .build(tower::service_fn(|_req: Request<String>| async {
            Ok::<_, std::io::Error>(Response::new(String::from("placed")))
        }))
        .unwrap();
    for i in 0..5 {
        super::call(&mut ok, order(&format!("ok-{i}")))
            .await
            .unwrap();
    }
    let mut lost = surely::client()
        .recorder(recorder.clone())
        .journal(recorder.clone())
        .build(
            tower::ServiceBuilder::new()
                .layer(surely::fault::InjectFaultLayer::new(
                    surely::fault::Schedule::new().at(0, surely::fault::Fault::ResetAfterSend),
                ))
                .service(tower::service_fn(|_req: Request<String>| async {
                    Ok::<_, std::io::Error>(Response::new(String::from("placed")))
                })),
        )
        .unwrap();
    let err = super::call(&mut lost, order("lost-1")).await.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    recorder.flush().await;
    let writes = recorder.writes();
    assert_eq!(
        (writes.intents, writes.forgotten, writes.written),
        (6, 5, 1)
    );
    let stats = ledger.stats().await.unwrap();
    assert_eq!((stats.in_doubt, stats.open), (0, 1));
    let entry = ledger.by_key("lost-1").await.unwrap().remove(0);
    assert_eq!(entry.state, EntryState::Open);
    assert_eq!(entry.evidence.attempts.len(), 1);
    assert!(entry.evidence.deadline.is_some());

    // A client process that dies mid-call: its writer never runs again.
    let (dying, _dead_writer) = LedgerRecorder::pair(ledger.clone());
    let sent = Arc::new(AtomicU32::new(0));
    let count = sent.clone();
    let mut hanging = surely::client()
        .recorder(dying.clone())
        .journal(dying.clone())
        .build(tower::service_fn(move |_req: Request<String>| {
            count.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<Response<String>, std::io::Error>>()
        }))
        .unwrap();
    let call = tokio::spawn(async move { super::call(&mut hanging, order("dead-1")).await });
    while sent.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    call.abort();
    let _ = call.await;
    let found = ledger.by_key("dead-1").await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].state, EntryState::InDoubt);
    assert_eq!(found[0].evidence.operation.as_deref(), Some("POST /orders"));
    // Held for the call's deadline (10 s by default) and the grace: no reconciler takes it yet.
    assert!(ledger.claim(10, ms(500)).await.unwrap().iter().all(|c| c
        .entry
        .evidence
        .key
        .as_deref()
        != Some("dead-1")));
    forget(&ledger).await;
}

#[tokio::test]
async fn pg_retry_now_sends_a_manual_entry_back() {
    let ledger = ledger("pg_retry_now_sends_a_manual_entry_back").await;
    super::retry_now_sends_a_manual_entry_back(
        ledger.clone(),
        EntryId::new(unique("unk")).unwrap(),
    )
    .await;
    forget(&ledger).await;
}

/// The ledger's sweeper deletes settled entries past the retention (with their attempts), at
/// most its limit a batch, the longest settled first; never an open, claimed or manual one;
/// two instances' batches at once delete disjoint entries.
#[tokio::test]
async fn pg_the_sweeper_deletes_settled_entries_a_bounded_batch_at_a_time() {
    use crate::sweeping::{exec, two_batches_beside_held_rows, HOUR};
    use surely::maintenance::Chore;
    let ledger = ledger("pg_the_sweeper_deletes_settled_entries_a_bounded_batch_at_a_time").await;
    for i in 0..12 {
        ledger
            .record(&full_evidence(&format!("unk-{i:02}")))
            .await
            .unwrap();
    }
    let claims = ledger.claim(11, Duration::from_secs(60)).await.unwrap();
    let done = Settlement::reconciled(Verdict::Succeeded, "found");
    for c in &claims[..9] {
        ledger.settle(c, &done).await.unwrap();
    }
    ledger.to_manual(&claims[9], "by hand").await.unwrap();
    // unk-10 claimed, unk-11 open.
    let sweeper = ledger.sweeper(2 * HOUR).unwrap();
    assert_eq!(sweeper.name(), format!("ledger {}", ledger.table()));
    assert_eq!(sweeper.run(100).await.unwrap().done, 0, "settled just now");
    let t = ledger.table();
    // Everything three hours old; unk-08 settled the longest ago, then unk-07, ...
    exec(
        ledger.pool(),
        &format!(
            "UPDATE {t} SET created_at = now() - interval '4 hours',
                 settled_at = now() - interval '3 hours' - seq * interval '1 minute'
             WHERE state = 'settled'"
        ),
    )
    .await;
    exec(
        ledger.pool(),
        &format!("UPDATE {t} SET created_at = now() - interval '4 hours' WHERE state <> 'settled'"),
    )
    .await;
    let batch = sweeper.run(3).await.unwrap();
    assert_eq!((batch.done, batch.more), (3, true));
    let ids = |state: EntryState| {
        let ledger = &ledger;
        async move {
            ledger
                .list(&Filter::new().state(state))
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.evidence.id.to_string())
                .collect::<Vec<_>>()
        }
    };
    let settled = ids(EntryState::Settled).await;
    assert_eq!(
        settled,
        (0..6).map(|i| format!("unk-{i:02}")).collect::<Vec<_>>(),
        "the longest settled first"
    );
    let other = ledger.sweeper(2 * HOUR).unwrap();
    let lock = format!("SELECT 1 FROM {t} WHERE state = 'settled' ORDER BY seq LIMIT 2 FOR UPDATE");
    let swept = two_batches_beside_held_rows(ledger.pool(), &sweeper, &other, &lock).await;
    assert_eq!(swept, 4, "disjoint, every settled entry not held");
    let batch = sweeper.run(100).await.unwrap();
    assert_eq!((batch.done, batch.more), (2, false));
    assert_eq!(ids(EntryState::Manual).await, ["unk-09"]);
    assert_eq!(ids(EntryState::Claimed).await, ["unk-10"]);
    assert_eq!(ids(EntryState::Open).await, ["unk-11"]);
    let client = ledger.pool().get().await.unwrap();
    let attempts: i64 = client
        .query_one(
            &format!("SELECT count(DISTINCT entry_id) FROM {t}_attempts"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 3, "the swept entries' attempts went with them");
    drop(client);

    let err = ledger.sweeper(Duration::from_secs(60)).unwrap_err();
    assert_eq!(err.setting(), "ledger retention");
    assert!(
        err.reason().contains("60s") && err.reason().contains("3600s"),
        "{err}"
    );
    forget(&ledger).await;
}
