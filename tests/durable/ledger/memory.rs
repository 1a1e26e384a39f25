//! The ledger in memory, in paused time: what the recorder writes, and how reconcilers settle
//! it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use surely::classify::{AttemptClass, DeliveryPhase};
use surely::ledger::{
    Claim, EntryId, EntryState, Evidence, Filter, Ledger, LedgerError, LedgerRecorder, LedgerStats,
    MemoryLedger, Reconciler, Settled, SettledBy, Settlement, Verdict,
};
use surely::retry::{Query, Resolution};
use surely::{Outcome, Semantics, StopReason};

use surely::retry::NoResolver;

use super::{order, secs, FlakyLedger};

/// A call that ends unknown is an entry, with the call's evidence; the caller's outcome and the
/// entry agree.
#[tokio::test(start_paused = true)]
async fn an_unknown_call_is_an_entry_with_its_evidence() {
    let ledger = MemoryLedger::new();
    let recorder = LedgerRecorder::new(ledger.clone());
    let mut client = unknown_client!(recorder.clone(), NoResolver::default());
    let err = super::call(&mut client, order("o-1")).await.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    recorder.flush().await;
    let writes = recorder.writes();
    assert_eq!((writes.queued, writes.written, writes.failed), (1, 1, 0));

    let entries = ledger.by_key("o-1").await.unwrap();
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(entry.state, EntryState::Open);
    assert_eq!(entry.tries, 0);
    let e = &entry.evidence;
    assert!(e.id.as_str().starts_with("unk-"), "{}", e.id);
    assert_eq!(e.operation.as_deref(), Some("POST /orders"));
    assert_eq!(e.semantics, Semantics::NonIdempotent);
    assert_eq!(e.stop, StopReason::Unknown);
    assert_eq!(e.attempts.len(), 1);
    assert_eq!(e.attempts[0].attempt, 1);
    assert_eq!(e.attempts[0].class, AttemptClass::MaybeCommitted);
    assert_eq!(e.attempts[0].phase, DeliveryPhase::Sent);
    assert!(e.call.is_some());
}

/// Only unknown calls are entries: a success, a failure, and an unknown that the retry layer's
/// resolver settled leave the ledger empty.
#[tokio::test(start_paused = true)]
async fn settled_calls_are_not_entries() {
    let ledger = MemoryLedger::new();
    let recorder = LedgerRecorder::new(ledger.clone());
    let found = |q: Query| async move {
        // The resolver knows which downstream to ask.
        assert_eq!(q.operation.unwrap().to_string(), "POST /orders");
        Resolution::Succeeded(http::Response::new(format!("{} exists", q.key.unwrap())))
    };
    let mut settled = unknown_client!(recorder.clone(), found);
    let res = super::call(&mut settled, order("o-2")).await.unwrap();
    assert_eq!(res.body(), "o-2 exists");
    let mut ok = answering_client!(recorder.clone(), 201);
    super::call(&mut ok, order("o-3")).await.unwrap();
    let mut refused = answering_client!(recorder.clone(), 400);
    let res = super::call(&mut refused, order("o-4")).await.unwrap();
    assert_eq!(res.status(), 400);
    recorder.flush().await;
    assert_eq!(recorder.writes().queued, 0);
    assert_eq!(ledger.stats_now(), LedgerStats::default());
}

/// A ledger that fails a few writes gets the entry on a later try; one that fails them all is
/// reported, and the entry is kept for the application, never dropped in silence.
#[tokio::test(start_paused = true)]
async fn a_ledger_write_that_fails_is_retried_then_reported() {
    let flaky = FlakyLedger::new(MemoryLedger::new());
    flaky.fail_records(3);
    let recorder = LedgerRecorder::new(flaky.clone());
    let mut client = unknown_client!(recorder.clone(), NoResolver::default());
    let _ = super::call(&mut client, order("o-5")).await;
    recorder.flush().await;
    let writes = recorder.writes();
    assert_eq!((writes.written, writes.failed), (1, 0));
    assert_eq!(flaky.inner.by_key("o-5").await.unwrap().len(), 1);

    let down = FlakyLedger::new(MemoryLedger::new());
    down.fail_records(u32::MAX);
    let recorder = LedgerRecorder::new(down.clone());
    let mut client = unknown_client!(recorder.clone(), NoResolver::default());
    let start = tokio::time::Instant::now();
    let _ = super::call(&mut client, order("o-6")).await;
    recorder.flush().await;
    let writes = recorder.writes();
    assert_eq!((writes.queued, writes.written, writes.failed), (1, 0, 1));
    assert_eq!(down.records_tried(), 8, "every try was made");
    // `docs::unknowns`: 8 tries over about 11 seconds (100 ms doubling to 5 s apart: 11.3 s).
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(11_300) && took < secs(12),
        "{took:?}"
    );
    let failed = recorder.take_failed();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].key.as_deref(), Some("o-6"));
    assert!(recorder.take_failed().is_empty(), "taken");
}

/// Recording is idempotent: a write retried after its answer was lost adds nothing.
#[tokio::test(start_paused = true)]
async fn recording_twice_keeps_one_entry() {
    let ledger = MemoryLedger::new();
    let evidence = Evidence::new("o-7", "POST /orders");
    assert!(ledger.record(&evidence).await.unwrap());
    assert!(!ledger.record(&evidence).await.unwrap());
    assert_eq!(ledger.stats_now().open, 1);
}

async fn found(q: Query) -> Resolution<String> {
    match q.key {
        Some(key) if key.as_str().starts_with("yes") => {
            Resolution::Succeeded(format!("journal: {key} done"))
        }
        Some(key) if key.as_str().starts_with("no") => Resolution::Failed,
        _ => Resolution::Unknown,
    }
}

async fn record(ledger: &MemoryLedger, key: &str) -> EntryId {
    let evidence = Evidence::new(key, "POST /reservations");
    ledger.record(&evidence).await.unwrap();
    evidence.id
}

/// The reconciler settles what the downstream can answer, once, with the answer as evidence;
/// running it again changes nothing.
#[tokio::test(start_paused = true)]
async fn the_reconciler_settles_each_entry_once() {
    let ledger = MemoryLedger::new();
    let yes = record(&ledger, "yes-1").await;
    let no = record(&ledger, "no-1").await;
    let mut reconciler = Reconciler::builder(ledger.clone(), found).build().unwrap();
    let round = reconciler.run_once().await.unwrap();
    assert_eq!((round.claimed, round.succeeded, round.failed), (2, 1, 1));

    let yes = ledger.get(&yes).await.unwrap().unwrap();
    assert_eq!(yes.state, EntryState::Settled);
    let s = yes.settlement.clone().unwrap();
    assert_eq!(s.verdict, Verdict::Succeeded);
    assert_eq!(s.by, SettledBy::Reconciler);
    assert!(s.evidence.contains("journal: yes-1 done"), "{}", s.evidence);
    let no = ledger.get(&no).await.unwrap().unwrap();
    assert_eq!(no.settlement.clone().unwrap().verdict, Verdict::Failed);

    // Again, and with a second reconciler: nothing more to do, the same settlements.
    let again = reconciler.run_once().await.unwrap();
    assert_eq!(again.claimed, 0);
    let mut other = Reconciler::builder(ledger.clone(), found).build().unwrap();
    assert_eq!(other.run_once().await.unwrap().claimed, 0);
    assert_eq!(ledger.get(&yes.evidence.id).await.unwrap().unwrap(), {
        let mut e = yes.clone();
        e.age = ledger.get(&yes.evidence.id).await.unwrap().unwrap().age;
        e
    });
    assert_eq!(ledger.stats_now().settled, 2);
}

/// An entry the query leaves unknown is tried again after its backoff, and after its tries goes
/// to the manual queue, where a person settles it with who and why.
#[tokio::test(start_paused = true)]
async fn unknown_answers_back_off_then_go_to_the_manual_queue() {
    let ledger = MemoryLedger::new();
    let id = record(&ledger, "maybe-1").await;
    let asked = Arc::new(AtomicU32::new(0));
    let counted = asked.clone();
    let resolver = move |q: Query| {
        counted.fetch_add(1, Ordering::SeqCst);
        found(q)
    };
    let backoff = surely::retry::backoff::Backoff::exponential(secs(10))
        .jitter(surely::retry::backoff::Jitter::None)
        .build()
        .unwrap();
    let mut reconciler = Reconciler::builder(ledger.clone(), resolver)
        .backoff(backoff)
        .max_tries(3)
        .build()
        .unwrap();
    assert_eq!(reconciler.run_once().await.unwrap().retried, 1);
    // Not before its backoff (10 s, then 20 s).
    tokio::time::advance(secs(9)).await;
    assert_eq!(reconciler.run_once().await.unwrap().claimed, 0);
    tokio::time::advance(secs(1)).await;
    assert_eq!(reconciler.run_once().await.unwrap().retried, 1);
    tokio::time::advance(secs(19)).await;
    assert_eq!(reconciler.run_once().await.unwrap().claimed, 0);
    tokio::time::advance(secs(1)).await;
    assert_eq!(reconciler.run_once().await.unwrap().to_manual, 1);
    assert_eq!(asked.load(Ordering::SeqCst), 3);

    let entry = ledger.get(&id).await.unwrap().unwrap();
    assert_eq!((entry.state, entry.tries), (EntryState::Manual, 3));
    assert!(entry.note.unwrap().contains("a person must settle it"));
    // The manual queue is not claimed again.
    tokio::time::advance(secs(3600)).await;
    assert_eq!(reconciler.run_once().await.unwrap().claimed, 0);
    let manual = ledger
        .list(&Filter::new().state(EntryState::Manual))
        .await
        .unwrap();
    assert_eq!(manual.len(), 1);

    let by_hand = Settlement::manual(
        Verdict::Failed,
        "ops@example.com",
        "the warehouse has no such reservation",
    )
    .unwrap();
    let settled = ledger.settle_manually(&id, &by_hand).await.unwrap();
    assert!(settled.is_now());
    let entry = ledger.get(&id).await.unwrap().unwrap();
    let s = entry.settlement.unwrap();
    assert_eq!(
        s.by,
        SettledBy::Manual {
            who: "ops@example.com".into()
        }
    );
    assert_eq!(s.evidence, "the warehouse has no such reservation");
    // A second person's settlement does not replace the first.
    let second = Settlement::manual(Verdict::Succeeded, "bob", "looks fine").unwrap();
    match ledger.settle_manually(&id, &second).await.unwrap() {
        Settled::Already(kept) => assert_eq!(kept.verdict, Verdict::Failed),
        other => panic!("{other:?}"),
    }
    let missing = EntryId::new("unk-missing").unwrap();
    assert!(ledger
        .settle_manually(&missing, &second)
        .await
        .unwrap_err()
        .is_not_found());
}

/// A call the resolver cannot query (no key) goes to the manual queue at once; so does one past
/// the maximum age.
#[tokio::test(start_paused = true)]
async fn what_cannot_be_queried_goes_to_the_manual_queue() {
    let ledger = MemoryLedger::new();
    let declines = |q: Query| {
        q.key
            .is_some()
            .then(|| surely::retry::Resolving::new(found(q)))
    };
    let id = record(&ledger, "anything").await;
    let mut reconciler = Reconciler::builder(ledger.clone(), super::Declining(declines))
        .build()
        .unwrap();
    // Keyed: the query is made, unknown.
    assert_eq!(reconciler.run_once().await.unwrap().retried, 1);
    let mut keyless = Evidence::new("x", "POST /x");
    keyless.key = None;
    ledger.record(&keyless).await.unwrap();
    tokio::time::advance(secs(2)).await;
    let round = reconciler.run_once().await.unwrap();
    assert_eq!((round.to_manual, round.retried), (1, 1));
    let manual = ledger.get(&keyless.id).await.unwrap().unwrap();
    assert_eq!(manual.state, EntryState::Manual);
    assert!(manual.note.unwrap().contains("cannot query"));

    // Too old: to the manual queue after its next unknown answer.
    let mut old = Reconciler::builder(ledger.clone(), found)
        .max_age(secs(60))
        .build()
        .unwrap();
    tokio::time::advance(secs(60)).await;
    assert_eq!(old.run_once().await.unwrap().to_manual, 1);
    assert_eq!(
        ledger.get(&id).await.unwrap().unwrap().state,
        EntryState::Manual
    );
}

/// A query that never answers is cut at the query timeout, and the entry stays unknown.
#[tokio::test(start_paused = true)]
async fn a_query_that_hangs_is_cut_at_its_timeout() {
    let ledger = MemoryLedger::new();
    record(&ledger, "yes-hangs").await;
    let hangs = |_q: Query| std::future::pending::<Resolution<String>>();
    let mut reconciler = Reconciler::builder(ledger.clone(), hangs)
        .query_timeout(secs(2))
        .build()
        .unwrap();
    let round = reconciler.run_once().await.unwrap();
    assert_eq!(round.retried, 1);
    assert_eq!(ledger.stats_now().open, 1);
}

/// A reconciler that dies holding an entry (its lease passes) loses it to another, which
/// settles it; the first one's late settlement gets the second one's back.
#[tokio::test(start_paused = true)]
async fn a_dead_reconcilers_entry_is_taken_over_after_its_lease() {
    let ledger = MemoryLedger::new();
    let id = record(&ledger, "yes-2").await;
    // The first reconciler claims it and dies before answering.
    let dead: Vec<Claim> = ledger.claim(10, secs(30)).await.unwrap();
    assert_eq!(dead.len(), 1);
    let mut second = Reconciler::builder(ledger.clone(), found).build().unwrap();
    assert_eq!(second.run_once().await.unwrap().claimed, 0, "held");
    tokio::time::advance(secs(30)).await;
    assert_eq!(second.run_once().await.unwrap().succeeded, 1);
    // The first comes back with its answer: the settlement is kept.
    let late = Settlement::reconciled(Verdict::Failed, "late");
    match ledger.settle(&dead[0], &late).await.unwrap() {
        Settled::Already(kept) => assert_eq!(kept.verdict, Verdict::Succeeded),
        other => panic!("{other:?}"),
    }
    // A stale claim cannot move an unsettled entry either.
    let other = record(&ledger, "maybe-2").await;
    let first = ledger.claim(10, secs(1)).await.unwrap();
    tokio::time::advance(secs(1)).await;
    let current = ledger.claim(10, secs(60)).await.unwrap();
    assert_eq!(current[0].entry.evidence.id, other);
    assert!(current[0].fence() > first[0].fence());
    for stale in [
        ledger.retry_later(&first[0], "x", secs(1)).await,
        ledger.to_manual(&first[0], "x").await,
    ] {
        assert!(stale.unwrap_err().is_stale());
    }
    assert!(ledger
        .settle(&first[0], &late)
        .await
        .unwrap_err()
        .is_stale());
    let _ = id;
}

/// A crash between the downstream's answer and the settlement's commit: the entry comes back
/// after the lease and is settled the same way, once.
#[tokio::test(start_paused = true)]
async fn a_settlement_lost_in_a_crash_is_made_again_the_same_way() {
    let flaky = FlakyLedger::new(MemoryLedger::new());
    let evidence = Evidence::new("yes-3", "POST /reservations");
    flaky.record(&evidence).await.unwrap();
    flaky.fail_settles(1);
    let mut reconciler = Reconciler::builder(flaky.clone(), found)
        .lease(secs(60))
        .build()
        .unwrap();
    let round = reconciler.run_once().await.unwrap();
    assert_eq!((round.claimed, round.errors, round.succeeded), (1, 1, 0));
    assert_eq!(flaky.inner.stats_now().claimed, 1);
    assert_eq!(reconciler.run_once().await.unwrap().claimed, 0);
    tokio::time::advance(secs(60)).await;
    let round = reconciler.run_once().await.unwrap();
    assert_eq!((round.claimed, round.succeeded), (1, 1));
    let entry = flaky.inner.get(&evidence.id).await.unwrap().unwrap();
    assert_eq!(entry.settlement.unwrap().verdict, Verdict::Succeeded);
    assert_eq!(flaky.inner.stats_now().settled, 1);
}

/// A person settles an entry a reconciler holds: the reconciler's settlement gets the person's
/// back.
#[tokio::test(start_paused = true)]
async fn a_manual_settlement_wins_over_a_claim() {
    let ledger = MemoryLedger::new();
    let id = record(&ledger, "yes-4").await;
    let claim = ledger.claim(1, secs(60)).await.unwrap().remove(0);
    let by_hand = Settlement::manual(Verdict::Failed, "ann", "cancelled by phone").unwrap();
    assert!(ledger
        .settle_manually(&id, &by_hand)
        .await
        .unwrap()
        .is_now());
    let found = Settlement::reconciled(Verdict::Succeeded, "journal says done");
    let settled = ledger.settle(&claim, &found).await.unwrap();
    assert_eq!(settled, Settled::Already(by_hand));
}

/// Settled entries are swept after their retention; open, claimed and manual ones never are.
#[tokio::test(start_paused = true)]
async fn only_settled_entries_are_swept() {
    let ledger = MemoryLedger::new();
    let settled = record(&ledger, "yes-5").await;
    let mut reconciler = Reconciler::builder(ledger.clone(), found).build().unwrap();
    reconciler.run_once().await.unwrap();
    let manual = record(&ledger, "manual").await;
    let claim = ledger.claim(10, secs(60)).await.unwrap();
    assert_eq!(claim[0].entry.evidence.id, manual);
    ledger.to_manual(&claim[0], "by test").await.unwrap();
    record(&ledger, "claimed").await;
    assert_eq!(ledger.claim(10, secs(3600 * 48)).await.unwrap().len(), 1);
    record(&ledger, "open").await;

    tokio::time::advance(secs(3600 * 24)).await;
    assert_eq!(ledger.sweep(secs(3600 * 25)).await.unwrap(), 0, "kept");
    assert_eq!(ledger.sweep(secs(3600 * 24)).await.unwrap(), 1);
    assert!(ledger.get(&settled).await.unwrap().is_none());
    assert_eq!(ledger.sweep(Duration::ZERO).await.unwrap(), 0);
    let stats = ledger.stats_now();
    assert_eq!(
        (stats.open, stats.claimed, stats.manual, stats.settled),
        (1, 1, 1, 0)
    );
    assert_eq!(stats.unsettled(), 3);
}

/// Entries older than the alert limit are reported; listing filters by key, state and age.
#[tokio::test(start_paused = true)]
async fn old_entries_are_reported_and_listed() {
    let ledger = MemoryLedger::new();
    record(&ledger, "maybe-old").await;
    tokio::time::advance(secs(600)).await;
    record(&ledger, "maybe-new").await;
    let mut reconciler = Reconciler::builder(ledger.clone(), found)
        .alert_after(secs(300))
        .build()
        .unwrap();
    let round = reconciler.run_once().await.unwrap();
    assert_eq!(round.overdue, Some(1));
    let stats = ledger.stats_now();
    assert_eq!(stats.oldest_unsettled, Some(secs(600)));

    let old = ledger
        .list(&Filter::new().older_than(secs(300)))
        .await
        .unwrap();
    assert_eq!(old.len(), 1);
    assert_eq!(old[0].evidence.key.as_deref(), Some("maybe-old"));
    let all = ledger.list(&Filter::new()).await.unwrap();
    let keys: Vec<_> = all
        .iter()
        .map(|e| e.evidence.key.clone().unwrap())
        .collect();
    assert_eq!(keys, ["maybe-old", "maybe-new"], "oldest first");
    assert_eq!(ledger.list(&Filter::new().limit(1)).await.unwrap().len(), 1);
    assert!(ledger.by_key("nobody").await.unwrap().is_empty());
}

/// `docs::unknowns`: the reconciler's alert is for entries older than an hour by default.
#[tokio::test(start_paused = true)]
async fn entries_are_overdue_after_an_hour_by_default() {
    let ledger = MemoryLedger::new();
    record(&ledger, "o-late").await;
    let still_unknown = |_q: Query| async { Resolution::<String>::Unknown };
    let mut reconciler = Reconciler::builder(ledger.clone(), still_unknown)
        .build()
        .unwrap();
    tokio::time::advance(secs(3_590)).await;
    assert_eq!(reconciler.run_once().await.unwrap().overdue, Some(0));
    tokio::time::advance(secs(20)).await;
    assert_eq!(reconciler.run_once().await.unwrap().overdue, Some(1));
}

/// `docs::unknowns`: while a reconciler runs, its warning about overdue entries comes at most
/// once a minute.
#[tokio::test(start_paused = true)]
async fn the_overdue_warning_comes_at_most_once_a_minute() {
    #[derive(Clone, Default)]
    struct Log(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let ledger = MemoryLedger::new();
    record(&ledger, "o-late").await;
    tokio::time::advance(secs(2 * 3600)).await;
    let still_unknown = |_q: Query| async { Resolution::<String>::Unknown };
    Reconciler::builder(ledger.clone(), still_unknown)
        .build()
        .unwrap()
        .run(tokio::time::sleep(secs(150)))
        .await;
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let warnings = text.matches("unsettled past the alert limit").count();
    assert_eq!(warnings, 3, "at 0, 60 and 120 s of 150: {text}");
}

/// Bad settings and bad values are errors that say what is wrong.
#[tokio::test(start_paused = true)]
async fn bad_settings_and_values_are_refused() {
    let ledger = MemoryLedger::new();
    for (builder, what) in [
        (Reconciler::builder(ledger.clone(), found).batch(0), "batch"),
        (
            Reconciler::builder(ledger.clone(), found).max_tries(0),
            "max_tries",
        ),
        (
            Reconciler::builder(ledger.clone(), found)
                .lease(secs(5))
                .query_timeout(secs(5)),
            "lease",
        ),
        (
            Reconciler::builder(ledger.clone(), found).query_timeout(Duration::ZERO),
            "query_timeout",
        ),
    ] {
        let err = builder.build().unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
    }
    for bad in ["", "has space", "semi;colon", &"x".repeat(129)] {
        let err: LedgerError = EntryId::new(bad).unwrap_err();
        assert!(err.is_invalid(), "{bad:?}");
    }
    assert!(EntryId::new("unk-0a:b.c_d").is_ok());
    for (who, why) in [
        ("", "why"),
        ("who", " "),
        ("a\u{7}b", "why"),
        (&"w".repeat(257)[..], "why"),
        ("who", &"y".repeat(16 * 1024 + 1)[..]),
    ] {
        let err = Settlement::manual(Verdict::Failed, who, why).unwrap_err();
        assert!(err.is_invalid(), "{who:?} {why:?}: {err}");
    }
    assert!(Settlement::manual(Verdict::Failed, "ann", "line one\nline two").is_ok());
    // A downstream's long answer is cut, not refused.
    let long = Settlement::reconciled(Verdict::Succeeded, "é".repeat(20_000));
    assert!(long.evidence.len() <= 16 * 1024);
    assert!(long.evidence.ends_with('…'));
}

/// A running reconciler settles what comes in, reports the overdue, and sweeps settled entries
/// after their retention, until told to stop.
#[tokio::test(start_paused = true)]
async fn a_running_reconciler_settles_and_sweeps_until_stopped() {
    let ledger = MemoryLedger::new();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reconciler = Reconciler::builder(ledger.clone(), found)
        .poll(secs(1))
        .retention(secs(7200))
        .build()
        .unwrap();
    let running = tokio::spawn(reconciler.run(async {
        let _ = stopped.await;
    }));
    let yes = record(&ledger, "yes-6").await;
    let maybe = record(&ledger, "maybe-6").await;
    tokio::time::sleep(secs(2)).await;
    assert_eq!(
        ledger.get(&yes).await.unwrap().unwrap().state,
        EntryState::Settled
    );
    // The sweep runs once an hour: the settled entry is gone after its two hours, the unknown
    // one stays.
    tokio::time::sleep(secs(3 * 3600 + 10)).await;
    assert!(ledger.get(&yes).await.unwrap().is_none());
    assert!(ledger
        .get(&maybe)
        .await
        .unwrap()
        .unwrap()
        .state
        .is_unsettled());
    stop.send(()).unwrap();
    running.await.unwrap();
}

/// The reconciler's resolver is told the entry's operation: one reconciler can serve a ledger
/// that several client stacks write to.
#[tokio::test(start_paused = true)]
async fn the_resolver_is_told_the_operation() {
    let ledger = MemoryLedger::new();
    record(&ledger, "r-1").await;
    let by_operation = |q: Query| async move {
        match q.operation.map(|o| o.to_string()).as_deref() {
            Some("POST /reservations") => Resolution::Succeeded("the warehouse has it".to_owned()),
            _ => Resolution::Unknown,
        }
    };
    let mut reconciler = Reconciler::builder(ledger.clone(), by_operation)
        .build()
        .unwrap();
    assert_eq!(reconciler.run_once().await.unwrap().succeeded, 1);
}

/// The caller asks again with the same key and the server answers with its stored result: the
/// first call took effect, and its entry is settled without waiting for a reconciler.
#[tokio::test(start_paused = true)]
async fn a_replay_of_the_same_key_settles_its_entry() {
    let ledger = MemoryLedger::new();
    let recorder = LedgerRecorder::new(ledger.clone());
    let placed = Arc::new(AtomicU32::new(0));
    let count = placed.clone();
    // The order service: places the order the first time, replays it after.
    let service = tower::service_fn(move |_req: http::Request<String>| {
        let first = count.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            let mut res = http::Response::new(String::from("o-8"));
            if !first {
                res.headers_mut().insert(
                    surely::headers::IDEMPOTENT_REPLAYED,
                    http::HeaderValue::from_static("true"),
                );
            }
            Ok::<_, std::io::Error>(res)
        }
    });
    // One attempt per call: the first reply is lost, and the call ends unknown.
    let mut client = surely::client()
        .recorder(recorder.clone())
        .retry(|r| r.max_attempts(1))
        .build(
            tower::ServiceBuilder::new()
                .layer(surely::fault::InjectFaultLayer::new(
                    surely::fault::Schedule::new().at(0, surely::fault::Fault::ResetAfterSend),
                ))
                .service(service),
        )
        .unwrap();
    let keyed = || {
        let mut req = order("o-8");
        req.headers_mut().insert(
            surely::headers::IDEMPOTENCY_KEY,
            http::HeaderValue::from_static("o-8"),
        );
        req
    };
    let err = super::call(&mut client, keyed()).await.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    recorder.flush().await;
    assert_eq!(ledger.stats_now().open, 1);

    let res = super::call(&mut client, keyed()).await.unwrap();
    assert!(surely::OutcomeExt::is_replayed(&res));
    recorder.flush().await;
    assert_eq!(recorder.writes().settled_by_replay, 1);
    let entry = ledger.by_key("o-8").await.unwrap().remove(0);
    let s = entry.settlement.unwrap();
    assert_eq!(
        (entry.state, s.verdict),
        (EntryState::Settled, Verdict::Succeeded)
    );
    assert!(s.evidence.contains("stored result"), "{}", s.evidence);
    assert_eq!(placed.load(Ordering::SeqCst), 2);

    // A success that is not a replay proves nothing about an earlier call.
    let other = Evidence::new("o-9", "POST /orders");
    ledger.record(&other).await.unwrap();
    let mut plain = answering_client!(recorder.clone(), 201);
    super::call(&mut plain, order("o-9")).await.unwrap();
    recorder.flush().await;
    assert_eq!(
        ledger.get(&other.id).await.unwrap().unwrap().state,
        EntryState::Open
    );
}

/// A recorder whose writer is gone (its runtime shut down, or it was never spawned) cannot
/// write: the unknown call is reported and kept, and a flush does not hang.
#[tokio::test(start_paused = true)]
async fn a_recorder_without_its_writer_reports_and_keeps_the_entry() {
    let ledger = MemoryLedger::new();
    let (recorder, writer) = LedgerRecorder::pair(ledger.clone());
    drop(writer);
    let mut client = unknown_client!(recorder.clone(), NoResolver::default());
    let err = super::call(&mut client, order("o-10")).await.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    recorder.flush().await;
    let writes = recorder.writes();
    assert_eq!((writes.queued, writes.written, writes.failed), (1, 0, 1));
    assert_eq!(recorder.take_failed()[0].key.as_deref(), Some("o-10"));
    assert_eq!(ledger.stats_now(), LedgerStats::default());
}

#[tokio::test(start_paused = true)]
async fn retry_now_sends_a_manual_entry_back() {
    super::retry_now_sends_a_manual_entry_back(MemoryLedger::new(), EntryId::generate()).await;
}

/// A ledger of one's own, written before `retry_now`: it still compiles, and says so.
#[tokio::test(start_paused = true)]
async fn a_ledger_without_retry_now_says_so() {
    let flaky = FlakyLedger::new(MemoryLedger::new());
    let e = flaky
        .retry_now(&EntryId::generate(), "why")
        .await
        .unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    assert_eq!(
        e.to_string(),
        "this ledger store cannot send an entry back to the reconcilers"
    );
}
