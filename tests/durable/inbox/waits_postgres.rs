//! Tasks' waits on PostgreSQL, and through NATS JetStream: the schedule committed in the
//! handler's transaction (its writes rolled back), early deliveries that run nothing, the
//! manual queue's retry and discard, an unknown reason held; on JetStream, a `nak` with the
//! policy's delay, and a consumer killed between its state write and its `nak`. Real time
//! (the database's clock), with short policies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use surely::inbox::{
    Consumer, InboxTransaction, PostgresInbox, Processed, Reason, TaskState, Wait, WaitPolicy,
};
use surely::outbox::{Event, EventId};
use surely::retry::backoff::Backoff;

use super::postgres::{forget, inbox};
use crate::support::names::suffix;

const MS: Duration = Duration::from_millis(1);

async fn qty(inbox: &PostgresInbox, stock: &str) -> i64 {
    let client = inbox.pool().get().await.unwrap();
    let sql = format!("SELECT qty FROM {stock} WHERE sku = 'sku-42'");
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

fn task(name: &str) -> Event {
    Event::new(
        EventId::derive(&format!("task {name}"), "Reserve"),
        format!("order {name}"),
        1,
        "Reserve",
        "sku-42",
    )
    .unwrap()
}

/// A consumer whose business waits are rechecked every `recheck`.
fn consumer(recheck: Duration) -> Consumer {
    Consumer::builder("inventory")
        .policy(
            Reason::Business,
            WaitPolicy::new(Backoff::constant(recheck)).expire_after(Duration::from_secs(60)),
        )
        .build()
        .unwrap()
}

/// A handler that takes one unit of stock, then answers `answer`: its write stays only if the
/// answer is `Ok`.
fn reserve<'t>(
    txn: &'t InboxTransaction,
    stock: &str,
    runs: &Arc<AtomicUsize>,
    answer: Result<&'static str, fn() -> Wait>,
) -> surely::inbox::Handler<'t, Wait> {
    let sql = format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = 'sku-42'");
    let runs = runs.clone();
    Box::pin(async move {
        runs.fetch_add(1, Ordering::SeqCst);
        txn.execute(&sql, &[]).await?;
        match answer {
            Ok(result) => Ok(result.into()),
            Err(wait) => Err(wait()),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_wait_rolls_back_the_handlers_write_and_commits_the_schedule() {
    let test = "pg_a_wait_rolls_back_the_handlers_write_and_commits_the_schedule";
    let (inbox, stock) = inbox(test).await;
    let (c, e, runs) = (
        consumer(600 * MS),
        task("o-1"),
        Arc::new(AtomicUsize::new(0)),
    );
    let short = || Wait::business("2 in stock, 5 needed");
    let p = inbox
        .process_task_and_commit(&c, &e, |txn| reserve(txn, &stock, &runs, Err(short)))
        .await
        .unwrap();
    assert_eq!(p.delay(), Some(600 * MS));
    assert_eq!(
        qty(&inbox, &stock).await,
        100,
        "the handler's write rolled back"
    );
    let t = inbox
        .task("inventory", e.id().as_str())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (t.state, t.reason, t.attempts),
        (TaskState::Waiting, Reason::Business, 1)
    );
    assert_eq!(t.steps.len(), 1);
    assert_eq!(t.steps[0].why, "2 in stock, 5 needed");
    // Early: the handler does not run, and the answer is the time left.
    let p = inbox
        .process_task_and_commit(&c, &e, |txn| reserve(txn, &stock, &runs, Ok("never")))
        .await
        .unwrap();
    match p {
        Processed::Waiting(w) => assert!(
            w.early && w.delay <= 600 * MS && w.delay > 300 * MS,
            "{w:?}"
        ),
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(650 * MS).await;
    let p = inbox
        .process_task_and_commit(&c, &e, |txn| reserve(txn, &stock, &runs, Ok("reserved")))
        .await
        .unwrap();
    assert_eq!(p, Processed::Applied("reserved".into()));
    assert_eq!(qty(&inbox, &stock).await, 99, "applied once");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(inbox
        .task("inventory", e.id().as_str())
        .await
        .unwrap()
        .is_none());
    let p = inbox
        .process_task_and_commit(&c, &e, |txn| reserve(txn, &stock, &runs, Ok("twice")))
        .await
        .unwrap();
    assert_eq!(p, Processed::Duplicate("reserved".into()));
    forget(&inbox, &stock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_stale_person_retry_and_discard() {
    let (inbox, stock) = inbox("pg_stale_person_retry_and_discard").await;
    let (c, runs) = (
        consumer(Duration::from_secs(1)),
        Arc::new(AtomicUsize::new(0)),
    );
    // Stale: recorded as a no-op with both versions, its write rolled back, never retried.
    let cancelled = task("o-2");
    let p = inbox
        .process_task_and_commit(&c, &cancelled, |txn| {
            reserve(
                txn,
                &stock,
                &runs,
                Err(|| Wait::stale(3, "the order was cancelled")),
            )
        })
        .await
        .unwrap();
    assert_eq!(p, Processed::Stale { applied: 3 });
    let p = inbox
        .process_task_and_commit(&c, &cancelled, |txn| {
            reserve(txn, &stock, &runs, Ok("never"))
        })
        .await
        .unwrap();
    let Processed::Duplicate(note) = p else {
        panic!("{p:?}")
    };
    let note = String::from_utf8(note.to_vec()).unwrap();
    assert!(
        note.contains("version 1") && note.contains("at 3"),
        "{note}"
    );

    // Refused by a rule: the manual queue, with who and why.
    let (a, b) = (task("o-3"), task("o-4"));
    for e in [&a, &b] {
        let p = inbox
            .process_task_and_commit(&c, e, |txn| {
                reserve(
                    txn,
                    &stock,
                    &runs,
                    Err(|| Wait::person("fraud rule", "amount over 10 000")),
                )
            })
            .await
            .unwrap();
        assert_eq!(
            p,
            Processed::Manual {
                reason: Reason::Person
            }
        );
    }
    let manual = inbox
        .tasks(Some("inventory"), Some(TaskState::Manual), 10)
        .await
        .unwrap();
    assert_eq!(manual.len(), 2);
    assert_eq!(manual[0].event, a, "the event is kept whole");
    let stats = inbox.task_stats().await.unwrap();
    let person = stats.get(TaskState::Manual, Reason::Person).unwrap();
    assert_eq!(person.tasks, 2);
    assert!(
        person.oldest < Duration::from_secs(60),
        "{:?}",
        person.oldest
    );
    assert_eq!(stats.total(TaskState::Waiting), 0);
    assert_eq!(
        inbox.tasks(None, None, 10).await.unwrap().len(),
        2,
        "every consumer's"
    );
    assert!(manual[0].why.contains("fraud rule"), "{}", manual[0].why);
    let p = inbox
        .process_task_and_commit(&c, &a, |txn| reserve(txn, &stock, &runs, Ok("never")))
        .await
        .unwrap();
    assert_eq!(
        p,
        Processed::Manual {
            reason: Reason::Person
        },
        "a redelivery runs nothing"
    );

    // Bad input, typed.
    let err = inbox
        .retry_task("inventory", a.id().as_str(), " ", "why")
        .await
        .unwrap_err();
    assert!(err.is_invalid(), "{err}");
    let err = inbox
        .discard_task("inventory", "nope", "ana", "why")
        .await
        .unwrap_err();
    assert!(err.is_no_such_task(), "{err}");

    // Retried: handed out to one consumer for a lease, then applied.
    inbox
        .retry_task("inventory", a.id().as_str(), "ana", "verified")
        .await
        .unwrap();
    let lease = Duration::from_millis(400);
    let handed = inbox.take_retried("inventory", 10, lease).await.unwrap();
    assert_eq!(handed, std::slice::from_ref(&a));
    assert!(inbox
        .take_retried("inventory", 10, lease)
        .await
        .unwrap()
        .is_empty());
    tokio::time::sleep(lease + 100 * MS).await;
    let again = inbox.take_retried("inventory", 10, lease).await.unwrap();
    assert_eq!(
        again,
        std::slice::from_ref(&a),
        "a consumer that died holding it: another takes it"
    );
    let p = inbox
        .process_task_and_commit(&c, &again[0], |txn| {
            reserve(txn, &stock, &runs, Ok("reserved"))
        })
        .await
        .unwrap();
    assert_eq!(p, Processed::Applied("reserved".into()));
    assert_eq!(qty(&inbox, &stock).await, 99);

    // Discarded: recorded in one statement; the redelivery is a duplicate.
    let result = inbox
        .discard_task("inventory", b.id().as_str(), "ana", "duplicate")
        .await
        .unwrap();
    let p = inbox
        .process_task_and_commit(&c, &b, |txn| reserve(txn, &stock, &runs, Ok("never")))
        .await
        .unwrap();
    assert_eq!(p, Processed::Duplicate(result));
    assert_eq!(qty(&inbox, &stock).await, 99);
    assert!(inbox
        .tasks(Some("inventory"), None, 10)
        .await
        .unwrap()
        .is_empty());
    forget(&inbox, &stock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_reason_this_version_does_not_know_holds_the_task() {
    let (inbox, stock) = inbox("pg_a_reason_this_version_does_not_know_holds_the_task").await;
    let (c, e, runs) = (
        consumer(Duration::ZERO),
        task("o-5"),
        Arc::new(AtomicUsize::new(0)),
    );
    let p = inbox
        .process_task_and_commit(&c, &e, |txn| {
            reserve(txn, &stock, &runs, Err(|| Wait::business("short")))
        })
        .await
        .unwrap();
    assert_eq!(p.delay(), Some(Duration::ZERO));
    // A later version wrote a reason this one does not know.
    let client = inbox.pool().get().await.unwrap();
    let t = inbox.table();
    client
        .execute(&format!("UPDATE {t}_tasks SET reason = 'snoozed'"), &[])
        .await
        .unwrap();
    let err = inbox
        .process_task_and_commit(&c, &e, |txn| reserve(txn, &stock, &runs, Ok("never")))
        .await
        .unwrap_err();
    assert!(err.is_unknown_reason(), "{err}");
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("snoozed"), "{source}");
    let err = inbox.tasks(Some("inventory"), None, 10).await.unwrap_err();
    assert!(err.is_unknown_reason(), "listed: {err}");
    let stats = inbox.task_stats().await.unwrap();
    assert_eq!(
        (stats.unknown, stats.counts.len()),
        (1, 0),
        "counted as unknown"
    );
    let held: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {t}_tasks WHERE reason = 'snoozed'"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 1, "held, not dropped");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    forget(&inbox, &stock).await;
}

/// A slow handler does not make its task due sooner: the next time counts from its answer,
/// not from when its transaction began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_slow_handlers_task_is_not_due_sooner_than_asked() {
    let (inbox, stock) = inbox("pg_a_slow_handlers_task_is_not_due_sooner_than_asked").await;
    let (c, e) = (consumer(Duration::from_secs(1)), task("o-9"));
    let p = inbox
        .process_task_and_commit(&c, &e, |_txn| {
            Box::pin(async {
                tokio::time::sleep(400 * MS).await;
                Err(Wait::paced(Duration::from_secs(1)))
            })
        })
        .await
        .unwrap();
    assert_eq!(p.delay(), Some(Duration::from_secs(1)));
    let t = inbox
        .task("inventory", e.id().as_str())
        .await
        .unwrap()
        .unwrap();
    let due = t.due_in.unwrap();
    assert!(due > 900 * MS, "due in {due:?}, after a 400 ms handler");
    forget(&inbox, &stock).await;
}

/// A task a person retried is delivered by the inbox from then on: one that waits again is
/// handed out again once due, not stranded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_retried_task_that_waits_again_is_handed_out_again_when_due() {
    let test = "pg_a_retried_task_that_waits_again_is_handed_out_again_when_due";
    let (inbox, stock) = inbox(test).await;
    let (c, e, runs) = (
        consumer(300 * MS),
        task("o-10"),
        Arc::new(AtomicUsize::new(0)),
    );
    let refuse = || Wait::person("rule", "check it");
    inbox
        .process_task_and_commit(&c, &e, |txn| reserve(txn, &stock, &runs, Err(refuse)))
        .await
        .unwrap();
    inbox
        .retry_task("inventory", e.id().as_str(), "ana", "checked")
        .await
        .unwrap();
    let lease = Duration::from_secs(30);
    let handed = inbox.take_retried("inventory", 10, lease).await.unwrap();
    assert_eq!(handed.len(), 1);
    let short = || Wait::business("short");
    let p = inbox
        .process_task_and_commit(&c, &handed[0], |txn| {
            reserve(txn, &stock, &runs, Err(short))
        })
        .await
        .unwrap();
    assert_eq!(p.delay(), Some(300 * MS));
    assert!(
        inbox
            .take_retried("inventory", 10, lease)
            .await
            .unwrap()
            .is_empty(),
        "not yet due"
    );
    tokio::time::sleep(350 * MS).await;
    let again = inbox.take_retried("inventory", 10, lease).await.unwrap();
    assert_eq!(again.len(), 1, "handed out again once due");
    let p = inbox
        .process_task_and_commit(&c, &again[0], |txn| {
            reserve(txn, &stock, &runs, Ok("reserved"))
        })
        .await
        .unwrap();
    assert_eq!(p, Processed::Applied("reserved".into()));
    assert_eq!(qty(&inbox, &stock).await, 99);
    assert!(inbox
        .take_retried("inventory", 10, lease)
        .await
        .unwrap()
        .is_empty());
    forget(&inbox, &stock).await;
}

/// An applied task's record and the deletion of its schedule are one transaction: a consumer
/// killed between two transactions would leave the schedule of an applied event behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_an_applied_tasks_record_and_its_schedules_deletion_commit_together() {
    let test = "pg_an_applied_tasks_record_and_its_schedules_deletion_commit_together";
    let (inbox, stock) = inbox(test).await;
    let (c, e, runs) = (
        consumer(Duration::ZERO),
        task("o-11"),
        Arc::new(AtomicUsize::new(0)),
    );
    let t = inbox.table().to_owned();
    let seen = format!("{stock}_txids");
    inbox
        .pool()
        .get()
        .await
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE {seen} (what text, txid bigint);
             CREATE FUNCTION {seen}_f() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO {seen} VALUES (TG_TABLE_NAME || ' ' || TG_OP, txid_current());
             RETURN NULL; END $$;
             CREATE TRIGGER {seen}_r AFTER INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {seen}_f();
             CREATE TRIGGER {seen}_t AFTER DELETE ON {t}_tasks FOR EACH ROW
                 EXECUTE FUNCTION {seen}_f();"
        ))
        .await
        .unwrap();
    let short = || Wait::business("short");
    inbox
        .process_task_and_commit(&c, &e, |txn| reserve(txn, &stock, &runs, Err(short)))
        .await
        .unwrap();
    let p = inbox
        .process_task_and_commit(&c, &e, |txn| reserve(txn, &stock, &runs, Ok("reserved")))
        .await
        .unwrap();
    assert_eq!(p, Processed::Applied("reserved".into()));
    let client = inbox.pool().get().await.unwrap();
    let rows = client
        .query(&format!("SELECT what, txid FROM {seen}"), &[])
        .await
        .unwrap();
    let txids: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
    assert_eq!(
        rows.len(),
        2,
        "the record's insert and the schedule's delete"
    );
    assert_eq!(txids[0], txids[1], "in one transaction");
    client
        .batch_execute(&format!(
            "DROP TABLE {seen}; DROP FUNCTION {seen}_f CASCADE"
        ))
        .await
        .unwrap();
    forget(&inbox, &stock).await;
}

#[cfg(feature = "nats")]
mod jetstream {
    //! Through JetStream: the schedule's delay is the `nak`'s.

    use std::time::Instant;

    use surely::deps::async_nats::jetstream::{self, consumer};
    use surely::outbox::JetStreamPublisher;
    use tokio_stream::StreamExt;
    use tower::{Service, ServiceExt};

    use super::*;
    use crate::support::nats;

    const ACK_WAIT: Duration = Duration::from_secs(1);

    struct World {
        inbox: PostgresInbox,
        stock: String,
        js: jetstream::Context,
        stream: String,
        consumer: consumer::PullConsumer,
    }

    impl World {
        async fn new(test: &str) -> World {
            let (inbox, stock) = inbox(test).await;
            let js = nats::jetstream(test).await;
            let stream = format!("surely_waits_{}", suffix());
            let st = nats::stream(&js, test, &stream).await;
            let consumer = st
                .create_consumer(consumer::pull::Config {
                    durable_name: Some("inventory".to_owned()),
                    ack_wait: ACK_WAIT,
                    ..Default::default()
                })
                .await
                .unwrap();
            World {
                inbox,
                stock,
                js,
                stream,
                consumer,
            }
        }

        async fn publish(&self, event: Event) {
            let mut publisher = JetStreamPublisher::new(self.js.clone(), self.stream.clone());
            publisher.ready().await.unwrap().call(event).await.unwrap();
        }

        /// The messages waiting now (at most 10, waiting at most `wait`).
        async fn fetch(&self, wait: Duration) -> Vec<jetstream::Message> {
            let mut batch = self
                .consumer
                .fetch()
                .max_messages(10)
                .expires(wait)
                .messages()
                .await
                .unwrap();
            let mut out = Vec::new();
            while let Some(m) = batch.next().await {
                out.push(m.unwrap());
            }
            out
        }

        async fn forget(self) {
            forget(&self.inbox, &self.stock).await;
            self.js.delete_stream(&self.stream).await.unwrap();
        }
    }

    fn paced() -> Wait {
        let mut headers = http::HeaderMap::new();
        headers.insert("retry-after", "2".parse().unwrap());
        Wait::paced_by(&headers)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paced_task_is_nakd_with_the_downstreams_delay() {
        let w = World::new("a_paced_task_is_nakd_with_the_downstreams_delay").await;
        let (c, runs) = (
            consumer(Duration::from_secs(1)),
            Arc::new(AtomicUsize::new(0)),
        );
        w.publish(task("o-6")).await;
        let first = w.fetch(Duration::from_millis(500)).await;
        assert_eq!(first.len(), 1);
        let naked = Instant::now();
        let p = w
            .inbox
            .process_jetstream_task(&first[0], &c, |txn| {
                reserve(txn, &w.stock, &runs, Err(paced))
            })
            .await
            .unwrap();
        assert_eq!(p.delay(), Some(Duration::from_secs(2)));
        // Not before the two seconds the channel asked for.
        assert!(w.fetch(Duration::from_millis(1500)).await.is_empty());
        let again = w.fetch(Duration::from_secs(2)).await;
        assert_eq!(again.len(), 1);
        assert!(
            naked.elapsed() >= Duration::from_secs(2),
            "{:?}",
            naked.elapsed()
        );
        let p = w
            .inbox
            .process_jetstream_task(&again[0], &c, |txn| {
                reserve(txn, &w.stock, &runs, Ok("charged"))
            })
            .await
            .unwrap();
        assert_eq!(p, Processed::Applied("charged".into()));
        assert_eq!(qty(&w.inbox, &w.stock).await, 99);
        assert!(
            w.fetch(ACK_WAIT + 300 * MS).await.is_empty(),
            "acknowledged"
        );
        w.forget().await;
    }

    /// The consumer commits the task's schedule, then dies before its `nak`: JetStream
    /// redelivers after its ack wait, sooner than the policy; the inbox answers with the time
    /// left and runs nothing, and the task is applied once, at its time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consumer_killed_between_its_state_write_and_its_nak_is_not_run_sooner() {
        let w =
            World::new("a_consumer_killed_between_its_state_write_and_its_nak_is_not_run_sooner")
                .await;
        let (c, runs) = (
            consumer(Duration::from_secs(1)),
            Arc::new(AtomicUsize::new(0)),
        );
        let e = task("o-7");
        w.publish(e.clone()).await;
        let first = w.fetch(Duration::from_millis(500)).await;
        assert_eq!(first.len(), 1);
        let written = Instant::now();
        // The consumer that dies: the schedule commits, the `nak` never goes.
        let p = w
            .inbox
            .process_task_and_commit(&c, &e, |txn| reserve(txn, &w.stock, &runs, Err(paced)))
            .await
            .unwrap();
        assert_eq!(p.delay(), Some(Duration::from_secs(2)));
        drop(first);
        // JetStream's ack wait (1 s) brings it back sooner than the pace (2 s).
        let early = w.fetch(ACK_WAIT + 500 * MS).await;
        assert_eq!(early.len(), 1, "redelivered after the ack wait");
        assert!(written.elapsed() < Duration::from_secs(2));
        let p = w
            .inbox
            .process_jetstream_task(&early[0], &c, |txn| {
                reserve(txn, &w.stock, &runs, Ok("never"))
            })
            .await
            .unwrap();
        let Processed::Waiting(waiting) = p else {
            panic!("{p:?}")
        };
        assert!(waiting.early, "{waiting:?}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "not run sooner than its policy"
        );
        let due = w.fetch(Duration::from_secs(3)).await;
        assert_eq!(due.len(), 1);
        assert!(
            written.elapsed() >= Duration::from_secs(2),
            "{:?}",
            written.elapsed()
        );
        let p = w
            .inbox
            .process_jetstream_task(&due[0], &c, |txn| {
                reserve(txn, &w.stock, &runs, Ok("charged"))
            })
            .await
            .unwrap();
        assert_eq!(p, Processed::Applied("charged".into()));
        assert_eq!(qty(&w.inbox, &w.stock).await, 99);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        w.forget().await;
    }

    /// A handler that kills its consumer is redelivered after each crash; past the consumer's
    /// `max_deliveries` the task goes to a person before its handler runs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_delivered_too_often_goes_to_a_person_unrun() {
        let w = World::new("a_message_delivered_too_often_goes_to_a_person_unrun").await;
        let c = Consumer::builder("inventory")
            .max_deliveries(2)
            .build()
            .unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let e = task("o-8");
        w.publish(e.clone()).await;
        // Two deliveries whose consumer dies in the handler: no answer, no acknowledgement.
        for _ in 0..2 {
            let m = w.fetch(ACK_WAIT + 500 * MS).await;
            assert_eq!(m.len(), 1);
            runs.fetch_add(1, Ordering::SeqCst);
        }
        let third = w.fetch(ACK_WAIT + 500 * MS).await;
        assert_eq!(third.len(), 1);
        let p = w
            .inbox
            .process_jetstream_task(&third[0], &c, |txn| {
                reserve(txn, &w.stock, &runs, Ok("never"))
            })
            .await
            .unwrap();
        assert_eq!(
            p,
            Processed::Manual {
                reason: Reason::Transient
            }
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2, "not run a third time");
        let t = w
            .inbox
            .task("inventory", e.id().as_str())
            .await
            .unwrap()
            .unwrap();
        assert!(t.why.contains("delivered 3 times"), "{}", t.why);
        assert!(
            w.fetch(ACK_WAIT + 300 * MS).await.is_empty(),
            "acknowledged"
        );
        assert_eq!(qty(&w.inbox, &w.stock).await, 100);
        w.forget().await;
    }
}
