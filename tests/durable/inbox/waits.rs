//! Why a task waits decides how it waits, on the memory inbox with paused time: every reason's
//! path (transient, paced, business, stale, person), the clamps, the expiry into the manual
//! queue, and a person's retry and discard.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use surely::inbox::{
    Consumer, InboxError, MemoryInbox, Processed, Reason, TaskState, Versions, Wait, WaitPolicy,
    Waiting,
};
use surely::outbox::{Event, EventId};
use surely::retry::backoff::{Backoff, Jitter};

const SEC: Duration = Duration::from_secs(1);

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

fn consumer() -> Consumer {
    Consumer::builder("inventory").build().unwrap()
}

/// Delivers `event`, answering `answer()` and counting the handler's runs.
async fn deliver(
    inbox: &MemoryInbox,
    consumer: &Consumer,
    event: &Event,
    runs: &AtomicUsize,
    answer: impl FnOnce() -> Result<Bytes, Wait>,
) -> Processed {
    inbox
        .process_task(consumer, event, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            answer()
        })
        .await
        .unwrap()
}

fn waiting(p: &Processed) -> &Waiting {
    match p {
        Processed::Waiting(w) => w,
        other => panic!("not waiting: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn stock_short_is_rechecked_slowly_and_applied_once_when_replenished() {
    let (inbox, c, e, runs) = (
        MemoryInbox::new(),
        consumer(),
        task("o-1"),
        AtomicUsize::new(0),
    );
    let p = deliver(&inbox, &c, &e, &runs, || {
        Err(Wait::business("2 in stock, 5 needed"))
    })
    .await;
    assert_eq!(
        waiting(&p).delay,
        300 * SEC,
        "the business policy's recheck"
    );
    assert!(!p.is_settled());
    // A redelivery before the recheck (the broker's own timer, a consumer restart) runs nothing.
    for minute in 1..=3 {
        tokio::time::advance(60 * SEC).await;
        let early = deliver(&inbox, &c, &e, &runs, || Ok("never".into())).await;
        assert!(waiting(&early).early);
        assert_eq!(
            early.delay(),
            Some((300 - 60 * minute) * SEC),
            "the time left"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "an early delivery runs nothing"
        );
    }
    tokio::time::advance(120 * SEC).await;
    let p = deliver(&inbox, &c, &e, &runs, || Ok("reserved".into())).await;
    assert_eq!(p, Processed::Applied("reserved".into()));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "ran at the first delivery and the recheck"
    );
    let again = deliver(&inbox, &c, &e, &runs, || Ok("twice".into())).await;
    assert_eq!(again, Processed::Duplicate("reserved".into()));
    assert!(
        inbox.task("inventory", e.id().as_str()).is_none(),
        "its schedule is forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn a_business_wait_past_its_expiry_goes_to_a_person_with_its_steps() {
    let c = Consumer::builder("inventory")
        .policy(
            Reason::Business,
            WaitPolicy::new(Backoff::constant(600 * SEC)).expire_after(1800 * SEC),
        )
        .build()
        .unwrap();
    let (inbox, e, runs) = (MemoryInbox::new(), task("o-2"), AtomicUsize::new(0));
    let mut delays = Vec::new();
    loop {
        let p = deliver(&inbox, &c, &e, &runs, || {
            Err(Wait::business("document not uploaded"))
        })
        .await;
        match p {
            Processed::Waiting(w) => {
                delays.push(w.delay);
                tokio::time::advance(w.delay).await;
            }
            Processed::Manual { reason } => {
                assert_eq!(reason, Reason::Business);
                break;
            }
            other => panic!("{other:?}"),
        }
        assert!(delays.len() < 10, "it never loops for ever");
    }
    assert_eq!(
        delays,
        [600 * SEC; 3],
        "rechecked every ten minutes until the expiry"
    );
    let t = inbox.task("inventory", e.id().as_str()).unwrap();
    assert_eq!(
        (t.state, t.reason, t.attempts),
        (TaskState::Manual, Reason::Business, 4)
    );
    assert!(t.why.starts_with("expired"), "{}", t.why);
    assert_eq!(t.steps.len(), 4);
    assert!(t
        .steps
        .iter()
        .all(|s| s.reason == Reason::Business && s.why == "document not uploaded"));
    // A redelivery does not run it; it is settled for the broker (the inbox keeps it).
    let p = deliver(&inbox, &c, &e, &runs, || Ok("never".into())).await;
    assert_eq!(
        p,
        Processed::Manual {
            reason: Reason::Business
        }
    );
    assert!(p.is_settled());
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(inbox.stats().to_manual, 1);
}

#[tokio::test(start_paused = true)]
async fn a_paced_task_never_comes_back_sooner_than_the_downstream_asked() {
    let (inbox, c, runs) = (MemoryInbox::new(), consumer(), AtomicUsize::new(0));
    let e = task("o-3");
    let mut headers = http::HeaderMap::new();
    headers.insert("retry-after", "45".parse().unwrap());
    let h = headers.clone();
    let p = deliver(&inbox, &c, &e, &runs, move || Err(Wait::paced_by(&h))).await;
    let w = waiting(&p);
    assert_eq!(
        (w.reason, w.delay, w.clamped_from),
        (Reason::Paced, 45 * SEC, None)
    );
    tokio::time::advance(44 * SEC).await;
    let early = deliver(&inbox, &c, &e, &runs, || Ok("charged".into())).await;
    assert_eq!(early.delay(), Some(SEC));
    tokio::time::advance(SEC).await;
    let p = deliver(&inbox, &c, &e, &runs, || Ok("charged".into())).await;
    assert_eq!(p, Processed::Applied("charged".into()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A pace beyond the policy's longest is not shortened: a person decides.
    let far = task("o-4");
    let p = deliver(&inbox, &c, &far, &runs, || Err(Wait::paced(3 * 3600 * SEC))).await;
    assert_eq!(
        p,
        Processed::Manual {
            reason: Reason::Paced
        }
    );
    let t = inbox.task("inventory", far.id().as_str()).unwrap();
    assert!(t.why.contains("never sooner than asked"), "{}", t.why);
}

#[tokio::test(start_paused = true)]
async fn a_malformed_retry_after_falls_back_to_the_transient_policy() {
    let (inbox, c, runs) = (MemoryInbox::new(), consumer(), AtomicUsize::new(0));
    let e = task("o-5");
    for hostile in ["-1", "soon", "1e9", "Wed, 99 Foo 2015"] {
        let mut headers = http::HeaderMap::new();
        headers.insert("retry-after", hostile.parse().unwrap());
        let wait = Wait::paced_by(&headers);
        assert_eq!(wait.reason(), Reason::Transient, "{hostile}");
    }
    let mut headers = http::HeaderMap::new();
    headers.insert("retry-after", "soon".parse().unwrap());
    let p = deliver(&inbox, &c, &e, &runs, move || Err(Wait::paced_by(&headers))).await;
    let w = waiting(&p);
    assert_eq!(w.reason, Reason::Transient);
    assert!(
        w.delay <= SEC,
        "the transient backoff's first delay, full jitter: {:?}",
        w.delay
    );
}

#[tokio::test(start_paused = true)]
async fn transient_waits_back_off_and_stop_after_their_attempts() {
    let c = Consumer::builder("inventory")
        .policy(
            Reason::Transient,
            WaitPolicy::new(
                Backoff::exponential(SEC)
                    .cap(60 * SEC)
                    .jitter(Jitter::None)
                    .build()
                    .unwrap(),
            )
            .attempts(4),
        )
        .build()
        .unwrap();
    let (inbox, e, runs) = (MemoryInbox::new(), task("o-6"), AtomicUsize::new(0));
    let mut delays = Vec::new();
    let last = loop {
        let p = deliver(&inbox, &c, &e, &runs, || {
            Err(std::io::Error::other("connection refused").into())
        })
        .await;
        match p.delay() {
            Some(d) => {
                delays.push(d);
                tokio::time::advance(d).await;
            }
            None => break p,
        }
    };
    assert_eq!(
        delays,
        [SEC, 2 * SEC, 4 * SEC],
        "no jitter in this policy: the backoff itself"
    );
    assert_eq!(
        last,
        Processed::Manual {
            reason: Reason::Transient
        }
    );
    let t = inbox.task("inventory", e.id().as_str()).unwrap();
    assert!(t.why.contains("4 attempts in a row"), "{}", t.why);
    assert_eq!(
        t.steps[0].why, "connection refused",
        "the error's message is kept"
    );
}

#[tokio::test(start_paused = true)]
async fn an_out_of_range_delay_is_clamped_to_the_policy_and_recorded() {
    let (inbox, c, runs) = (MemoryInbox::new(), consumer(), AtomicUsize::new(0));
    // Below the business policy's shortest (1 min): raised.
    let e = task("o-7");
    let p = deliver(&inbox, &c, &e, &runs, || {
        Err(Wait::business("short").after(Duration::ZERO))
    })
    .await;
    assert_eq!(
        (waiting(&p).delay, waiting(&p).clamped_from),
        (60 * SEC, Some(Duration::ZERO))
    );
    // Beyond its longest (1 h), Duration::MAX included: lowered.
    let e = task("o-8");
    let p = deliver(&inbox, &c, &e, &runs, || {
        Err(Wait::business("short").after(Duration::MAX))
    })
    .await;
    assert_eq!(
        (waiting(&p).delay, waiting(&p).clamped_from),
        (3600 * SEC, Some(Duration::MAX))
    );
    let t = inbox.task("inventory", e.id().as_str()).unwrap();
    assert_eq!(t.steps[0].clamped_from, Some(Duration::MAX));
    // Beyond the task's expiry (a day, 23 h 30 min in): shortened to end there.
    tokio::time::advance(23 * 3600 * SEC + 1800 * SEC).await;
    let p = deliver(&inbox, &c, &e, &runs, || {
        Err(Wait::business("short").after(3600 * SEC))
    })
    .await;
    assert_eq!(waiting(&p).delay, 1800 * SEC, "ends at the expiry");
    assert_eq!(waiting(&p).clamped_from, Some(3600 * SEC));
}

#[tokio::test(start_paused = true)]
async fn an_order_cancelled_while_its_task_waited_is_stale_and_never_applied() {
    let (inbox, c, runs) = (MemoryInbox::new(), consumer(), AtomicUsize::new(0));
    let e = task("o-9");
    let p = deliver(&inbox, &c, &e, &runs, || Err(Wait::business("short"))).await;
    assert!(p.delay().is_some());
    tokio::time::advance(300 * SEC).await;
    // Meanwhile the order moved to version 3: cancelled.
    let p = deliver(&inbox, &c, &e, &runs, || {
        Err(Wait::stale(3, "the order was cancelled"))
    })
    .await;
    assert_eq!(p, Processed::Stale { applied: 3 });
    assert!(p.is_settled());
    let again = deliver(&inbox, &c, &e, &runs, || Ok("reserved".into())).await;
    match again {
        Processed::Duplicate(note) => {
            let note = String::from_utf8(note.to_vec()).unwrap();
            assert!(
                note.contains("version 1") && note.contains("at 3"),
                "{note}"
            );
            assert!(note.contains("cancelled"), "{note}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "never applied");
    assert!(inbox.task("inventory", e.id().as_str()).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_refused_task_goes_to_a_person_who_retries_or_discards_it() {
    let (inbox, c, runs) = (MemoryInbox::new(), consumer(), AtomicUsize::new(0));
    let (a, b) = (task("o-10"), task("o-11"));
    for e in [&a, &b] {
        let p = deliver(&inbox, &c, e, &runs, || {
            Err(Wait::person("fraud rule", "amount over 10 000"))
        })
        .await;
        assert_eq!(
            p,
            Processed::Manual {
                reason: Reason::Person
            }
        );
    }
    let manual = inbox.tasks(Some("inventory"), Some(TaskState::Manual), 10);
    assert_eq!(manual.len(), 2);
    assert!(inbox.tasks(Some("billing"), None, 10).is_empty());
    let stats = inbox.task_stats();
    assert_eq!(
        stats
            .get(TaskState::Manual, Reason::Person)
            .map(|c| c.tasks),
        Some(2)
    );
    assert!(manual[0].why.contains("fraud rule") && manual[0].why.contains("amount"));
    assert!(inbox
        .tasks(Some("inventory"), Some(TaskState::Waiting), 10)
        .is_empty());

    // Bad input is refused, typed; an unknown task is named.
    let err = inbox
        .retry_task("inventory", a.id().as_str(), "", "checked")
        .unwrap_err();
    assert!(err.is_invalid(), "{err}");
    let err = inbox
        .retry_task("inventory", a.id().as_str(), "ana", "ok\u{7}")
        .unwrap_err();
    assert!(err.is_invalid(), "{err}");
    let err = inbox
        .discard_task("inventory", "no-such", "ana", "gone")
        .unwrap_err();
    assert!(
        matches!(err, InboxError::NoSuchTask(ref s) if s.contains("no-such")),
        "{err}"
    );

    // Retried: handed out once, processed as a delivery, applied.
    inbox
        .retry_task("inventory", a.id().as_str(), "ana", "customer verified")
        .unwrap();
    let err = inbox
        .retry_task("inventory", a.id().as_str(), "ana", "twice")
        .unwrap_err();
    assert!(err.is_no_such_task(), "no longer in the manual queue");
    let handed = inbox.take_retried("inventory", 10, SEC);
    assert_eq!(handed, std::slice::from_ref(&a));
    assert!(
        inbox.take_retried("inventory", 10, SEC).is_empty(),
        "handed out once"
    );
    let p = deliver(&inbox, &c, &handed[0], &runs, || Ok("reserved".into())).await;
    assert_eq!(p, Processed::Applied("reserved".into()));

    // Discarded: recorded, so that a redelivery runs nothing.
    let result = inbox
        .discard_task("inventory", b.id().as_str(), "ana", "duplicate order")
        .unwrap();
    assert_eq!(result, Bytes::from("discarded by ana: duplicate order"));
    let p = deliver(&inbox, &c, &b, &runs, || Ok("never".into())).await;
    assert_eq!(p, Processed::Duplicate(result));
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn a_retried_task_gets_a_fresh_expiry_and_keeps_its_attempts() {
    let c = Consumer::builder("inventory")
        .policy(
            Reason::Business,
            WaitPolicy::new(Backoff::constant(60 * SEC)).expire_after(120 * SEC),
        )
        .build()
        .unwrap();
    let (inbox, e, runs) = (MemoryInbox::new(), task("o-12"), AtomicUsize::new(0));
    let mut manual_after = Vec::new();
    for round in 0..2 {
        let mut n = 0;
        loop {
            n += 1;
            let p = deliver(&inbox, &c, &e, &runs, || Err(Wait::business("short"))).await;
            match p.delay() {
                Some(d) => tokio::time::advance(d).await,
                None => break,
            }
        }
        manual_after.push(n);
        if round == 0 {
            inbox
                .retry_task("inventory", e.id().as_str(), "ana", "stock arrives today")
                .unwrap();
            assert_eq!(inbox.take_retried("inventory", 1, SEC).len(), 1);
        }
    }
    assert_eq!(
        manual_after,
        [3, 3],
        "the expiry counted afresh from the retry"
    );
    let t = inbox.task("inventory", e.id().as_str()).unwrap();
    assert_eq!(t.attempts, 6, "attempts are kept");
    assert_eq!(t.steps.len(), 6);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_task_counts_towards_the_capacity_and_versions_still_apply() {
    let inbox = MemoryInbox::new().with_capacity(1);
    let c = Consumer::builder("inventory")
        .versions(Versions::InOrder)
        .build()
        .unwrap();
    let runs = AtomicUsize::new(0);
    let e = task("o-13");
    let p = deliver(&inbox, &c, &e, &runs, || Err(Wait::transient("blip"))).await;
    assert!(p.delay().is_some());
    let err = inbox
        .process_task(&c, &task("o-14"), || async { Ok(Bytes::new()) })
        .await
        .unwrap_err();
    assert!(err.is_full(), "{err}");
    // Its own redelivery still goes through.
    tokio::time::advance(p.delay().unwrap()).await;
    let p = deliver(&inbox, &c, &e, &runs, || Ok("done".into())).await;
    assert_eq!(p, Processed::Applied("done".into()));
    let stats = inbox.stats();
    assert_eq!((stats.applied, stats.waits), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_retried_task_that_waits_again_is_handed_out_again_when_due() {
    let (inbox, c, runs) = (MemoryInbox::new(), consumer(), AtomicUsize::new(0));
    let e = task("o-15");
    let p = deliver(&inbox, &c, &e, &runs, || {
        Err(Wait::person("rule", "check it"))
    })
    .await;
    assert!(
        p.is_settled(),
        "acknowledged: the broker will not deliver it again"
    );
    inbox
        .retry_task("inventory", e.id().as_str(), "ana", "checked")
        .unwrap();
    let handed = inbox.take_retried("inventory", 10, 30 * SEC);
    assert_eq!(handed.len(), 1);
    assert!(
        inbox.take_retried("inventory", 10, 30 * SEC).is_empty(),
        "held for its lease"
    );
    // It waits again: the inbox, not the broker, delivers it when its time comes.
    let p = deliver(&inbox, &c, &handed[0], &runs, || {
        Err(Wait::business("short"))
    })
    .await;
    let delay = p.delay().unwrap();
    assert_eq!(waiting(&p).why, "short");
    tokio::time::advance(delay - SEC).await;
    assert!(
        inbox.take_retried("inventory", 10, 30 * SEC).is_empty(),
        "not before its time"
    );
    tokio::time::advance(SEC).await;
    let again = inbox.take_retried("inventory", 10, 30 * SEC);
    assert_eq!(again.len(), 1, "handed out again once due");
    // A consumer that dies holding it: handed out again after the lease.
    tokio::time::advance(30 * SEC).await;
    let again = inbox.take_retried("inventory", 10, 30 * SEC);
    assert_eq!(again.len(), 1);
    let p = deliver(&inbox, &c, &again[0], &runs, || Ok("reserved".into())).await;
    assert_eq!(p, Processed::Applied("reserved".into()));
    assert!(inbox.take_retried("inventory", 10, 30 * SEC).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pace_past_the_expiry_goes_to_a_person_and_is_never_shortened() {
    let c = Consumer::builder("payments")
        .policy(
            Reason::Paced,
            WaitPolicy::new(Backoff::constant(SEC))
                .at_most(10 * SEC)
                .expire_after(12 * SEC),
        )
        .build()
        .unwrap();
    let (inbox, e, runs) = (MemoryInbox::new(), task("o-16"), AtomicUsize::new(0));
    let p = deliver(&inbox, &c, &e, &runs, || Err(Wait::paced(8 * SEC))).await;
    assert_eq!(p.delay(), Some(8 * SEC));
    tokio::time::advance(8 * SEC).await;
    // 8 s more would end 4 s past the expiry: not shortened to 4 s.
    let p = deliver(&inbox, &c, &e, &runs, || Err(Wait::paced(8 * SEC))).await;
    assert_eq!(
        p,
        Processed::Manual {
            reason: Reason::Paced
        }
    );
    let t = inbox.task("payments", e.id().as_str()).unwrap();
    assert!(t.why.contains("past the task's expiry"), "{}", t.why);
}
