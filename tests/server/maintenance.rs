//! The maintenance task: chores in leased, bounded batches, and what it does when a chore
//! fails, panics, hangs, or another instance holds its lease.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use surely::classify::BoxError;
use surely::maintenance::Leases;
use surely::maintenance::{Batch, BoxFuture, Chore, LocalLeases, Maintenance, PostgresLeases};
use surely::record::{InMemoryRecorder, MaintenanceOutcome};

use crate::support::{names::unique, postgres};

/// A table of `rows` rows that a batch works down `limit` at a time, with a way to make its next
/// batch fail, panic or hang.
#[derive(Clone)]
struct Rows {
    name: String,
    left: Arc<AtomicU64>,
    batches: Arc<AtomicUsize>,
    next: Arc<Mutex<Vec<Fault>>>,
}

#[derive(Clone, Copy)]
enum Fault {
    Fail,
    Panic,
    Hang,
}

impl Rows {
    fn new(name: &str, rows: u64) -> Self {
        Rows {
            name: name.to_owned(),
            left: Arc::new(AtomicU64::new(rows)),
            batches: Arc::new(AtomicUsize::new(0)),
            next: Arc::default(),
        }
    }

    fn then(&self, fault: Fault) {
        self.next.lock().unwrap().push(fault);
    }
}

impl Chore for Rows {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, limit: usize) -> BoxFuture<'_, Result<Batch, BoxError>> {
        Box::pin(async move {
            self.batches.fetch_add(1, Ordering::SeqCst);
            let fault = self.next.lock().unwrap().pop();
            match fault {
                Some(Fault::Fail) => return Err("the database is down".into()),
                Some(Fault::Panic) => panic!("a chore with a bug"),
                Some(Fault::Hang) => std::future::pending::<()>().await,
                None => {}
            }
            // Each batch takes a second of (paused) time.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let left = self.left.load(Ordering::SeqCst);
            let done = left.min(limit as u64);
            self.left.store(left - done, Ordering::SeqCst);
            Ok(Batch::new(done, done == limit as u64))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_backlog_is_worked_down_in_bounded_batches_until_the_round_time_runs_out() {
    let rows = Rows::new("rows", 25_000);
    let handle = Maintenance::builder()
        .chore(rows.clone())
        .batch_size(1000)
        .round_time(Duration::from_secs(10))
        .every(Duration::from_secs(60))
        .duty(1.0)
        .build()
        .unwrap()
        .spawn();
    // The first round runs at once: ten batches of a second each, then the round's time is up.
    let reports = handle.run_now().await;
    // The round at start and the one asked for: 20 batches of 1000.
    assert_eq!(rows.left.load(Ordering::SeqCst), 5_000);
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].outcome, MaintenanceOutcome::OutOfTime);
    assert_eq!((reports[0].done, reports[0].batches), (10_000, 10));
    // The next round finishes the rest: five full batches, then an empty one says "no more".
    let reports = handle.run_now().await;
    assert_eq!(reports[0].outcome, MaintenanceOutcome::Done);
    assert_eq!(reports[0].done, 5_000);
    assert_eq!(rows.left.load(Ordering::SeqCst), 0);
    assert_eq!(handle.last_reports(), reports);
    handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn rounds_come_every_interval_on_their_own() {
    let rows = Rows::new("rows", 0);
    let recorder = InMemoryRecorder::new();
    let handle = Maintenance::builder()
        .chore(rows.clone())
        .every(Duration::from_secs(60))
        .round_time(Duration::from_secs(30))
        .recorder(recorder.clone())
        .build()
        .unwrap()
        .spawn();
    tokio::time::sleep(Duration::from_secs(60 * 10 + 30)).await;
    // At start, then at 1:01, 2:02 ... (each round takes a second): eleven rounds by 10:30.
    let reports = recorder.maintenance_reports();
    assert_eq!(reports.len(), 11, "{reports:?}");
    assert!(reports
        .iter()
        .all(|r| r.outcome == MaintenanceOutcome::Done));
    handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_a_panicking_and_a_hanging_batch_each_keep_their_rows_and_say_why() {
    let rows = Rows::new("rows", 3_000);
    let other = Rows::new("other", 10);
    let recorder = InMemoryRecorder::new();
    let handle = Maintenance::builder()
        .chore(rows.clone())
        .chore(other.clone())
        .batch_size(1000)
        .batch_time(Duration::from_secs(5))
        .recorder(recorder.clone())
        .build()
        .unwrap()
        .spawn();
    handle.run_now().await; // the start's round and this one: all done
    rows.left.store(3_000, Ordering::SeqCst);
    for (fault, why) in [
        (Fault::Fail, "the database is down"),
        (Fault::Panic, "the chore panicked"),
        (Fault::Hang, "a batch did not finish in 5s"),
    ] {
        rows.then(fault);
        let reports = handle.run_now().await;
        assert_eq!(
            reports[0].outcome,
            MaintenanceOutcome::Failed(why.to_owned()),
            "{reports:?}"
        );
        assert_eq!(
            rows.left.load(Ordering::SeqCst),
            3_000,
            "nothing lost, nothing done"
        );
        // The other chore ran all the same, and the task goes on.
        assert_eq!(reports[1].outcome, MaintenanceOutcome::Done);
        assert!(handle.is_running());
    }
    let reports = handle.run_now().await;
    assert_eq!(reports[0].outcome, MaintenanceOutcome::Done);
    assert_eq!(rows.left.load(Ordering::SeqCst), 0);
    let failed = recorder
        .maintenance_reports()
        .iter()
        .filter(|r| matches!(r.outcome, MaintenanceOutcome::Failed(_)))
        .count();
    assert_eq!(failed, 3);
    handle.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn of_two_instances_one_runs_each_chore_per_round() {
    let leases = LocalLeases::new();
    let rows = Rows::new("rows", 0);
    let start = |holder: &str| {
        Maintenance::builder()
            .chore(rows.clone())
            .leases(leases.clone())
            .holder(holder)
            .every(Duration::from_secs(60))
            .build()
            .unwrap()
            .spawn()
    };
    let (a, b) = (start("a"), start("b"));
    tokio::time::sleep(Duration::from_secs(60 * 5 + 30)).await;
    // Six rounds' time (the start's and five more), one batch each, whoever ran it.
    assert_eq!(rows.batches.load(Ordering::SeqCst), 6);
    let held = |h: &surely::maintenance::MaintenanceHandle| {
        h.last_reports()[0].outcome == MaintenanceOutcome::HeldElsewhere
    };
    assert!(
        held(&a) != held(&b),
        "one ran the last round, the other did not"
    );
    // When the holder stops, the other takes the chore over once the lease runs out.
    let (holder, other) = if held(&a) { (b, a) } else { (a, b) };
    holder.shutdown().await;
    tokio::time::sleep(Duration::from_secs(125)).await;
    assert_eq!(other.last_reports()[0].outcome, MaintenanceOutcome::Done);
    other.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_backlog_is_worked_down_at_the_duty_asked_for() {
    let rows = Rows::new("rows", 25_000);
    let handle = Maintenance::builder()
        .chore(rows.clone())
        .batch_size(1000)
        .round_time(Duration::from_secs(12))
        .every(Duration::from_secs(60))
        .duty(0.25)
        .build()
        .unwrap()
        .spawn();
    // Each batch works a second and rests three: three batches in a round of twelve seconds
    // (the start's round and the one asked for).
    let reports = handle.run_now().await;
    assert_eq!(
        (reports[0].done, reports[0].batches),
        (3_000, 3),
        "{reports:?}"
    );
    assert_eq!(reports[0].outcome, MaintenanceOutcome::OutOfTime);
    assert_eq!(rows.left.load(Ordering::SeqCst), 19_000);
    handle.shutdown().await;
    // A duty near zero asks for a rest past any duration: the round's time bounds it, and
    // nothing panics.
    let handle = Maintenance::builder()
        .chore(rows.clone())
        .round_time(Duration::from_secs(12))
        .duty(f64::MIN_POSITIVE)
        .build()
        .unwrap()
        .spawn();
    let reports = handle.run_now().await;
    assert_eq!(reports[0].batches, 1, "{reports:?}");
    assert_eq!(reports[0].outcome, MaintenanceOutcome::OutOfTime);
    handle.shutdown().await;
}

#[test]
fn settings_that_cannot_work_are_refused_by_name() {
    let refused = |b: surely::maintenance::MaintenanceBuilder| b.build().unwrap_err();
    let b = Maintenance::builder;
    assert_eq!(refused(b().every(Duration::ZERO)).setting(), "every");
    assert_eq!(refused(b().every(Duration::MAX)).setting(), "every");
    assert_eq!(
        refused(b().batch_time(Duration::ZERO)).setting(),
        "batch_time"
    );
    assert_eq!(
        refused(b().round_time(Duration::MAX)).setting(),
        "round_time"
    );
    assert_eq!(refused(b().batch_size(0)).setting(), "batch_size");
    for duty in [0.0, -1.0, 1.5, f64::NAN, f64::INFINITY] {
        assert_eq!(refused(b().duty(duty)).setting(), "duty", "{duty}");
    }
    assert!(b().duty(f64::MIN_POSITIVE).build().is_ok());
    assert_eq!(refused(b().holder("")).setting(), "holder");
    let e = refused(
        b().every(Duration::from_secs(10))
            .round_time(Duration::from_secs(20)),
    );
    assert_eq!(e.setting(), "round_time");
    assert_eq!(
        e.reason(),
        "20s is longer than every (10s): a round would outlive its lease"
    );
    let e = refused(b().chore(Rows::new("x", 0)).chore(Rows::new("x", 0)));
    assert_eq!(e.setting(), "chore");
    assert!(b().chore(Rows::new("x", 0)).build().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_stopped_task_answers_with_nothing() {
    let handle = Maintenance::builder().build().unwrap().spawn();
    let kept = handle.clone();
    handle.shutdown().await;
    assert!(!kept.is_running());
    assert!(kept.run_now().await.is_empty());
}

#[tokio::test]
async fn postgres_leases_give_a_chore_to_one_holder_until_its_time_is_up() {
    let pool = postgres::pool();
    let table = unique("leases");
    let leases = PostgresLeases::new(pool.clone())
        .with_table(&table)
        .unwrap();
    leases.migrate().await.unwrap();
    let ttl = Duration::from_millis(300);
    assert!(leases.take("sweep", "a", ttl).await.unwrap());
    assert!(!leases.take("sweep", "b", ttl).await.unwrap(), "a holds it");
    assert!(
        leases.take("sweep", "a", ttl).await.unwrap(),
        "a takes its own again"
    );
    assert!(
        leases.take("other", "b", ttl).await.unwrap(),
        "another name is free"
    );
    // On the database's clock: b gets it once a's time is up.
    let mut waited = Duration::ZERO;
    while !leases.take("sweep", "b", ttl).await.unwrap() {
        assert!(waited < Duration::from_secs(5), "the lease never ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    assert!(
        waited >= Duration::from_millis(200),
        "taken after {waited:?}"
    );
    // Many holders at once: exactly one gets it.
    let mut takers = Vec::new();
    for i in 0..8 {
        let leases = leases.clone();
        takers.push(tokio::spawn(async move {
            leases
                .take("race", &format!("h{i}"), Duration::from_secs(60))
                .await
                .unwrap()
        }));
    }
    let mut won = 0;
    for t in takers {
        won += usize::from(t.await.unwrap());
    }
    assert_eq!(won, 1);
    postgres::forget(&pool, &[&table], &[&table]).await;
}

mod idempotency {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};
    use surely::idempotency::IdempotencyKey;
    use surely::maintenance::Maintenance;
    use surely::record::MaintenanceOutcome;
    use surely::server::idempotency::IdempotencyLayer;
    use surely::server::store::{
        IdempotencyStore, MemoryStore, RecordKey, RecordState, RequestDigest, StoredResponse,
    };

    fn key(k: &str) -> RecordKey {
        RecordKey::new("", "POST /orders", IdempotencyKey::new(k).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweeper_deletes_expired_records_in_batches_and_never_an_open_one() {
        let store = MemoryStore::new();
        let lease = Duration::from_secs(3600);
        let answer = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), Bytes::new());
        for i in 0..5 {
            let k = key(&format!("done-{i}"));
            let fence = store
                .acquire(&k, &RequestDigest::of(b"{}"), lease)
                .await
                .unwrap()
                .fence()
                .unwrap();
            store
                .complete(&k, fence, &answer, Duration::from_secs(60))
                .await
                .unwrap();
        }
        store
            .acquire(&key("open"), &RequestDigest::of(b"{}"), lease)
            .await
            .unwrap();
        let unknown = store
            .acquire(&key("unknown"), &RequestDigest::of(b"{}"), lease)
            .await
            .unwrap()
            .fence()
            .unwrap();
        store
            .mark_unknown(&key("unknown"), unknown, "lost reply")
            .await
            .unwrap();

        let refuse = Arc::new(AtomicBool::new(true));
        let layer = {
            let refuse = Arc::clone(&refuse);
            IdempotencyLayer::builder(store.clone())
                .archive(move |_batch| {
                    let refuse = refuse.load(Ordering::SeqCst);
                    async move {
                        if refuse {
                            Err("the archive's bucket is read-only".into())
                        } else {
                            Ok(())
                        }
                    }
                })
                .build()
                .unwrap()
        };
        let handle = Maintenance::builder()
            .chore(layer.sweeper(Duration::from_secs(60)).unwrap())
            .batch_size(2)
            .build()
            .unwrap()
            .spawn();
        // Retention (60 s) and the safety window (60 s) not yet past: nothing to do.
        tokio::time::advance(Duration::from_secs(90)).await;
        let r = handle.run_now().await;
        assert_eq!((r[0].done, &r[0].outcome), (0, &MaintenanceOutcome::Done));
        // Past both, with the archive refusing: the records are kept, and the report says why.
        tokio::time::advance(Duration::from_secs(60)).await;
        let r = handle.run_now().await;
        assert_eq!(r[0].done, 0);
        assert!(
            matches!(&r[0].outcome, MaintenanceOutcome::Failed(why)
                if why.contains("archive refused a batch: the archive's bucket is read-only")),
            "{r:?}"
        );
        assert!(store.inspect(&key("done-0")).await.unwrap().is_some());
        // The archive takes them: three batches (2, 2, 1).
        refuse.store(false, Ordering::SeqCst);
        let r = handle.run_now().await;
        assert_eq!((r[0].done, r[0].batches), (5, 3), "{r:?}");
        assert_eq!(r[0].outcome, MaintenanceOutcome::Done);
        for i in 0..5 {
            assert!(store
                .inspect(&key(&format!("done-{i}")))
                .await
                .unwrap()
                .is_none());
        }
        assert!(matches!(
            store.inspect(&key("open")).await.unwrap().unwrap().state,
            RecordState::Processing { .. }
        ));
        assert!(matches!(
            store.inspect(&key("unknown")).await.unwrap().unwrap().state,
            RecordState::Unknown { .. }
        ));
        assert_eq!(
            layer.sweeper(Duration::MAX).unwrap_err().setting(),
            "keep_expired_for"
        );
        handle.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_recoverer_settles_a_record_whose_owner_and_client_died_with_no_request() {
        let store = MemoryStore::new();
        let lease = Duration::from_secs(30);
        let layer = IdempotencyLayer::builder(store.clone())
            .lease(lease)
            .build()
            .unwrap();
        let handle = Maintenance::builder()
            .chore(layer.recoverer())
            .every(Duration::from_secs(10))
            .round_time(Duration::from_secs(10))
            .build()
            .unwrap()
            .spawn();
        for i in 0..3 {
            store
                .acquire(&key(&format!("dead-{i}")), &RequestDigest::of(b"{}"), lease)
                .await
                .unwrap();
        }
        // The rounds every ten seconds find them once the lease has passed: released (no
        // checkpoint: nothing happened), with no request sent.
        tokio::time::sleep(Duration::from_secs(45)).await;
        for i in 0..3 {
            let view = store
                .inspect(&key(&format!("dead-{i}")))
                .await
                .unwrap()
                .unwrap();
            assert!(matches!(view.state, RecordState::Released), "{view:?}");
            assert_eq!(view.fence.get(), 2);
        }
        let done: u64 = handle.last_reports().iter().map(|r| r.done).sum();
        assert_eq!(done, 0, "the last round found nothing left");
        handle.shutdown().await;
    }
}
