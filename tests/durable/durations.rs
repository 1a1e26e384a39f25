//! No duration panics in the durable half. Every duration setting of its builders (the
//! ledger's reconciler, the relay, the repairer, a reconciliation rule) and every duration its
//! stores' methods take (a lease, a wait, a hold, a retention, a filter's age, a run's
//! interval) driven with values up to `Duration::MAX` (proptest): a builder refuses one longer
//! than `MAX_DURATION` with an error naming the setting, and a store counts one as ten years.
//! The memory stores under paused time; the PostgreSQL ones, whose waits are `interval`
//! arithmetic in SQL (which PostgreSQL refuses past its timestamps' range), against the
//! machine's server.

use std::time::Duration;

use proptest::prelude::*;
use surely::ledger::{Evidence, Filter, Ledger, MemoryLedger, Reconciler};
use surely::outbox::{Event, EventId, MemoryOutbox, OutboxStore, Relay};
use surely::reconcile::{
    self, Difference, DifferenceStore, MemoryDifferences, MemorySource, RepairAnswer,
    RepairRequest, Repairer, Rule, RuleError, Want,
};
use surely::retry::{Query, Resolution};
use surely::MAX_DURATION;

/// Any duration, the edges more often than chance would pick them.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::MAX),
        Just(Duration::ZERO),
        Just(MAX_DURATION),
        Just(MAX_DURATION + Duration::from_nanos(1)),
        (0..=u64::MAX, 0..1_000_000_000_u32).prop_map(|(s, n)| Duration::new(s, n)),
        (0..=86_400_000_u64).prop_map(Duration::from_millis),
    ]
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// The settings among `named` that a builder must refuse: zero where it must be positive,
/// longer than `MAX_DURATION` anywhere.
fn wrong(named: &[(&'static str, Duration, bool)]) -> Vec<&'static str> {
    named
        .iter()
        .filter(|(_, d, positive)| *d > MAX_DURATION || (*positive && d.is_zero()))
        .map(|(name, ..)| *name)
        .collect()
}

/// Completes the `n`th time it is polled: a worker's `run` polls its stop once a round, so this
/// ends a run after `n` rounds even when its poll is zero (under paused time, a loop that never
/// sleeps never lets the clock move on to a timeout).
fn after_rounds(n: usize) -> impl std::future::Future<Output = ()> {
    let mut left = n;
    std::future::poll_fn(move |_| {
        if left == 0 {
            return std::task::Poll::Ready(());
        }
        left -= 1;
        std::task::Poll::Pending
    })
}

/// Runs a worker's `run` for a few rounds or 90 s of (paused) time, whichever ends first.
async fn run_a_while(run: impl std::future::Future<Output = ()>) {
    let _ = tokio::time::timeout(Duration::from_secs(90), run).await;
}

async fn unknown(_q: Query) -> Resolution<String> {
    Resolution::Unknown
}

fn event(n: u64) -> Event {
    Event::new(
        EventId::derive(&format!("order o-{n}"), "OrderCreated"),
        format!("order o-{n}"),
        1,
        "OrderCreated",
        "o",
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The ledger: its reconciler's settings, and every method of the memory ledger that takes
    /// a duration; the reconciler run for a while with whatever it was given.
    #[test]
    fn ledger_durations_never_panic(
        lease in duration(), query_timeout in duration(), max_age in duration(),
        alert_after in duration(), poll in duration(), retention in duration(),
        hold in duration(), after in duration(), age in duration(),
    ) {
        paused().block_on(async {
            let ledger = MemoryLedger::new();
            ledger.record(&Evidence::new("o-1", "POST /orders")).await.unwrap();
            ledger.record_in_doubt(&Evidence::new("o-2", "POST /orders"), hold).await.unwrap();
            let built = Reconciler::builder(ledger.clone(), unknown)
                .lease(lease)
                .query_timeout(query_timeout)
                .max_age(max_age)
                .alert_after(alert_after)
                .poll(poll)
                .retention(retention)
                .build();
            let mut wrong = wrong(&[
                ("reconciler lease", lease, true),
                ("reconciler query_timeout", query_timeout, true),
                ("reconciler max_age", max_age, false),
                ("reconciler alert_after", alert_after, false),
                ("reconciler poll", poll, false),
                ("reconciler retention", retention, false),
            ]);
            if lease <= query_timeout {
                wrong.push("reconciler lease");
            }
            match built {
                Ok(mut reconciler) => {
                    prop_assert!(wrong.is_empty(), "built with {wrong:?}");
                    reconciler.run_once().await.unwrap();
                    run_a_while(reconciler.run(after_rounds(5))).await;
                }
                Err(e) => prop_assert!(wrong.contains(&e.setting()), "{e} for {wrong:?}"),
            }
            for claim in ledger.claim(10, lease).await.unwrap() {
                ledger.retry_later(&claim, "later", after).await.unwrap();
            }
            tokio::time::advance(Duration::from_secs(3600)).await;
            for claim in ledger.claim(10, lease).await.unwrap() {
                ledger.to_manual(&claim, "by hand").await.unwrap();
            }
            ledger.list(&Filter::new().older_than(age)).await.unwrap();
            ledger.sweep(retention).await.unwrap();
            ledger.stats().await.unwrap();
            Ok(())
        })?;
    }

    /// The outbox: the relay's settings, and every method of the memory outbox that takes a
    /// duration; the relay run for a while with whatever it was given.
    #[test]
    fn outbox_durations_never_panic(
        lease in duration(), retry_after in duration(), poll in duration(),
        stats_every in duration(), retention in duration(),
    ) {
        paused().block_on(async {
            let outbox = MemoryOutbox::new();
            outbox.enqueue(event(1));
            outbox.enqueue(event(2));
            let refusing = tower::service_fn(|_e: Event| async {
                Err::<(), _>(std::io::Error::other("broker down"))
            });
            let built = Relay::builder(outbox.clone(), refusing)
                .lease(lease)
                .retry_after(retry_after)
                .poll(poll)
                .stats_every(stats_every)
                .retention(retention)
                .recorder(surely::record::InMemoryRecorder::new())
                .build();
            let wrong = wrong(&[
                ("relay lease", lease, true),
                ("relay retry wait", retry_after, false),
                ("relay poll interval", poll, true),
                ("relay stats interval", stats_every, true),
                ("relay retention", retention, false),
            ]);
            match built {
                Ok(mut relay) => {
                    prop_assert!(wrong.is_empty(), "built with {wrong:?}");
                    relay.run_once().await.unwrap();
                    run_a_while(relay.run(after_rounds(5))).await;
                }
                Err(e) => prop_assert!(wrong.contains(&e.setting()), "{e} for {wrong:?}"),
            }
            for claimed in outbox.claim(10, lease).await.unwrap() {
                outbox.failed(&claimed, "refused", retry_after, 3).await.unwrap();
            }
            outbox.sweep(retention).await.unwrap();
            Ok(())
        })?;
    }

    /// Reconciliation: the repairer's settings and its run's poll, a rule's grace window, the
    /// reconciler's interval, and the memory store's methods that take a duration.
    #[test]
    fn reconcile_durations_never_panic(
        lease in duration(), timeout in duration(), poll in duration(), grace in duration(),
        every in duration(), after in duration(),
    ) {
        paused().block_on(async {
            let store = MemoryDifferences::new();
            let failing = tower::service_fn(|_r: RepairRequest| async {
                Err::<RepairAnswer, _>(std::io::Error::other("down"))
            });
            let built = Repairer::builder(store.clone(), failing)
                .lease(lease)
                .timeout(timeout)
                .build();
            let mut wrong = wrong(&[
                ("repairer lease", lease, true),
                ("repairer timeout", timeout, true),
            ]);
            if lease <= timeout {
                wrong.push("repairer lease");
            }
            let (orders, payments) = (MemorySource::new(), MemorySource::new());
            orders.put("o-1", "awaiting_payment", 1, std::time::SystemTime::UNIX_EPOCH);
            let reconciler = reconcile::Reconciler::builder(store.clone())
                .source("orders", orders)
                .source("payments", payments)
                .rule(
                    Rule::new("paid", ["orders", "payments"])
                        .grace(grace)
                        .repair([Want::Any, Want::Missing], "charge"),
                )
                .build();
            match reconciler {
                Ok(reconciler) => {
                    prop_assert!(grace <= MAX_DURATION);
                    run_a_while(reconciler.run(every, after_rounds(5))).await;
                }
                Err(e) => {
                    prop_assert!(grace > MAX_DURATION);
                    prop_assert_eq!(e, RuleError::GraceTooLong("paid".to_owned()));
                }
            }
            store.record(&Difference::new("paid", "o-2", vec![], Some("charge".into())))
                .await
                .unwrap();
            match built {
                Ok(repairer) => {
                    prop_assert!(wrong.is_empty(), "built with {wrong:?}");
                    run_a_while(repairer.run(poll, after_rounds(5))).await;
                }
                Err(e) => prop_assert!(wrong.contains(&e.setting()), "{e} for {wrong:?}"),
            }
            for claim in store.claim(10, lease).await.unwrap() {
                store.retry_later(&claim, "later", after).await.unwrap();
            }
            Ok(())
        })?;
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    //! The PostgreSQL stores: each method that takes a duration, with durations drawn as above
    //! (and the edges), in tables of this test's own. None may fail: a duration past ten years
    //! counts as ten years, so that `now()` moved by it stays a timestamp.

    use std::time::Duration;

    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;
    use surely::ledger::{Evidence, Filter, Ledger, PostgresLedger};
    use surely::outbox::{OutboxStore, PostgresOutbox};
    use surely::reconcile::{Difference, DifferenceStore, PostgresDifferences};
    use surely::MAX_DURATION;

    use super::{duration, event};
    use crate::support::names::suffix;
    use crate::support::postgres::{self, did_not_answer, pool};

    /// The edges, then `n` drawn at random.
    fn durations(n: usize) -> Vec<Duration> {
        let mut runner = TestRunner::default();
        let mut all = vec![
            Duration::ZERO,
            Duration::from_nanos(1),
            MAX_DURATION,
            MAX_DURATION + Duration::from_nanos(1),
            Duration::new(u64::MAX / 2, 1),
            Duration::MAX,
        ];
        all.extend((0..n).map(|_| duration().new_tree(&mut runner).unwrap().current()));
        all
    }

    #[tokio::test]
    async fn pg_ledger_durations_never_fail() {
        let test = "pg_ledger_durations_never_fail";
        let ledger = PostgresLedger::new(pool())
            .with_table(&format!("surely_ledger_d{}", suffix()))
            .unwrap();
        ledger
            .migrate()
            .await
            .unwrap_or_else(|e| did_not_answer(test, e));
        for (i, d) in durations(24).into_iter().enumerate() {
            let what = format!("{d:?}");
            let e = Evidence::new(format!("k-{i}"), "POST /orders");
            ledger.record(&e).await.expect(&what);
            ledger
                .record_in_doubt(&Evidence::new(format!("h-{i}"), "POST /orders"), d)
                .await
                .expect(&what);
            for claim in ledger.claim(2, d).await.expect(&what) {
                ledger.retry_later(&claim, "later", d).await.expect(&what);
            }
            ledger
                .list(&Filter::new().older_than(d))
                .await
                .expect(&what);
            ledger.sweep(d).await.expect(&what);
        }
        let t = ledger.table().to_owned();
        postgres::forget(ledger.pool(), &[&format!("{t}_attempts"), &t], &[&t]).await;
    }

    #[tokio::test]
    async fn pg_outbox_durations_never_fail() {
        let test = "pg_outbox_durations_never_fail";
        let outbox = PostgresOutbox::new(pool())
            .with_table(&format!("surely_outbox_d{}", suffix()))
            .unwrap();
        outbox
            .migrate()
            .await
            .unwrap_or_else(|e| did_not_answer(test, e));
        for (i, d) in durations(24).into_iter().enumerate() {
            let what = format!("{d:?}");
            let mut client = outbox.pool().get().await.unwrap();
            let txn = client.transaction().await.unwrap();
            outbox.enqueue(&txn, &event(i as u64)).await.unwrap();
            txn.commit().await.unwrap();
            for claimed in outbox.claim(2, d).await.expect(&what) {
                outbox.failed(&claimed, "refused", d, 3).await.expect(&what);
            }
            outbox.sweep(d).await.expect(&what);
        }
        postgres::forget(outbox.pool(), &[outbox.table()], &[outbox.table()]).await;
    }

    #[tokio::test]
    async fn pg_reconcile_durations_never_fail() {
        let test = "pg_reconcile_durations_never_fail";
        let store = PostgresDifferences::new(pool())
            .with_table(&format!("surely_reconcile_d{}", suffix()))
            .unwrap();
        store
            .migrate()
            .await
            .unwrap_or_else(|e| did_not_answer(test, e));
        for (i, d) in durations(24).into_iter().enumerate() {
            let what = format!("{d:?}");
            let diff = Difference::new("paid", format!("o-{i}"), vec![], Some("charge".into()));
            store.record(&diff).await.expect(&what);
            for claim in store.claim(2, d).await.expect(&what) {
                store.retry_later(&claim, "later", d).await.expect(&what);
            }
        }
        postgres::forget(store.pool(), &[store.table()], &[store.table()]).await;
    }
}
