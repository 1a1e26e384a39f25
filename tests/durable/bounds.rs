//! Every in-memory store of the durable half holds at most its capacity: fed distinct keys
//! past it, it keeps the first ones and refuses the rest with its typed error, dropping none.
//!
//! 100 000 keys each, not a million: each key here is a whole event, entry or difference (ids
//! drawn or digested, strings allocated), and a million of each took 15 s in a debug build on
//! two cores. The queue the outbox, ledger and differences share takes a million keys in its
//! own test (`src/queue/tests.rs`), and the store's capacity check is that queue's.

use std::time::Duration;

use bytes::Bytes;
use surely::inbox::{MemoryInbox, Processed, Versions};
use surely::ledger::{Evidence, Ledger, MemoryLedger};
use surely::outbox::{Event, EventId, MemoryOutbox, OutboxStore};
use surely::reconcile::{Difference, DifferenceStore, MemoryDifferences};

const KEYS: u32 = 100_000;
const CAPACITY: usize = 1_000;

fn event(n: u32) -> Event {
    // A fixed id form: the digest of `derive` costs more than the test needs.
    let id = EventId::new(format!("evt-{n}")).unwrap();
    Event::new(id, "order", 1, "OrderCreated", Bytes::new()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_memory_outbox_refuses_new_events_past_its_capacity() {
    let outbox = MemoryOutbox::new().with_capacity(CAPACITY);
    assert_eq!(
        MemoryOutbox::new().capacity(),
        MemoryOutbox::DEFAULT_CAPACITY
    );
    let mut full = 0;
    for n in 0..KEYS {
        match outbox.try_enqueue(event(n)) {
            Ok(added) => assert!(added),
            Err(e) => {
                assert!(e.is_full(), "{e}");
                full += 1;
            }
        }
    }
    assert_eq!((outbox.len(), full), (CAPACITY, KEYS as usize - CAPACITY));
    // `enqueue` says false, and adds nothing; an event already here is still a duplicate.
    assert!(!outbox.enqueue(event(KEYS)));
    assert!(!outbox.try_enqueue(event(0)).unwrap());
    // Published and swept, the events make room.
    for claimed in outbox
        .claim(CAPACITY, Duration::from_secs(30))
        .await
        .unwrap()
    {
        outbox.published(&claimed).await.unwrap();
    }
    assert_eq!(outbox.sweep(Duration::ZERO).await.unwrap(), CAPACITY as u64);
    assert!(outbox.try_enqueue(event(KEYS)).unwrap());
}

#[tokio::test(start_paused = true)]
async fn the_memory_ledger_refuses_new_entries_past_its_capacity() {
    let ledger = MemoryLedger::new().with_capacity(CAPACITY);
    assert_eq!(
        MemoryLedger::new().capacity(),
        MemoryLedger::DEFAULT_CAPACITY
    );
    let mut full = 0;
    for n in 0..KEYS {
        let evidence = Evidence::new(format!("o-{n}"), "POST /orders");
        let recorded = if n % 2 == 0 {
            ledger.record(&evidence).await
        } else {
            ledger
                .record_in_doubt(&evidence, Duration::from_secs(60))
                .await
        };
        match recorded {
            Ok(new) => assert!(new),
            Err(e) => {
                assert!(e.is_full(), "{e}");
                full += 1;
            }
        }
    }
    let stats = ledger.stats().await.unwrap();
    assert_eq!(stats.open + stats.in_doubt, CAPACITY as u64);
    assert_eq!(full, KEYS as usize - CAPACITY);
}

#[tokio::test(start_paused = true)]
async fn the_memory_differences_refuse_new_ones_past_their_capacity() {
    let store = MemoryDifferences::new().with_capacity(CAPACITY);
    assert_eq!(
        MemoryDifferences::new().capacity(),
        MemoryDifferences::DEFAULT_CAPACITY
    );
    let mut full = 0;
    for n in 0..KEYS {
        let d = Difference::new("r", format!("k-{n}"), vec![], Some("fix".to_owned()));
        match store.record(&d).await {
            Ok(new) => assert!(new),
            Err(e) => {
                assert!(e.is_full(), "{e}");
                full += 1;
            }
        }
    }
    let open: u64 = store
        .stats()
        .await
        .unwrap()
        .open_by_rule
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert_eq!(open, CAPACITY as u64);
    assert_eq!(full, KEYS as usize - CAPACITY);
}

#[tokio::test]
async fn the_memory_inbox_refuses_new_events_past_its_capacity() {
    let inbox = MemoryInbox::new().with_capacity(CAPACITY);
    assert_eq!(MemoryInbox::new().capacity(), MemoryInbox::DEFAULT_CAPACITY);
    let mut full = 0;
    for n in 0..KEYS {
        let handled = inbox
            .process("c", &event(n), Versions::Any, || async {
                Ok::<_, std::convert::Infallible>(Bytes::new())
            })
            .await;
        match handled {
            Ok(processed) => assert!(matches!(processed, Processed::Applied(_))),
            Err(e) => {
                assert!(e.is_full(), "{e}");
                full += 1;
            }
        }
    }
    assert_eq!((inbox.len(), full), (CAPACITY, KEYS as usize - CAPACITY));
    // The events it holds are still known: a redelivery is a duplicate, not a second run.
    let again = inbox
        .process("c", &event(0), Versions::Any, || async {
            Ok::<_, std::convert::Infallible>(Bytes::new())
        })
        .await
        .unwrap();
    assert!(matches!(again, Processed::Duplicate(_)));
}
