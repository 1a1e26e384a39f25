//! The intent journal on the memory ledger, in paused time: a journaled call's intent is in
//! the ledger before its first attempt goes out, it goes when the call ends definitively, it
//! becomes the call's one entry when the call ends unknown, and it is left in doubt, for a
//! reconciler once its hold has passed, when the call never ends.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use surely::journal::{Intent, IntentDigest, IntentId, IntentJournal, JournalError, Journaled};
use surely::ledger::{
    EntryId, EntryState, Evidence, Ledger, LedgerRecorder, MemoryLedger, Reconciler, Verdict,
};
use surely::retry::{Query, Resolution};
use surely::{Outcome, Semantics, StopReason};

use super::{order, secs, FlakyLedger};

/// The client stack with `recorder` as its recorder and its journal, over `transport`, with a
/// 10 s deadline.
macro_rules! journaled_client {
    ($recorder:expr, $transport:expr) => {
        surely::client()
            .timeout(secs(10))
            .recorder($recorder.clone())
            .journal($recorder.clone())
            .build($transport)
            .unwrap()
    };
}

/// Sends order `key` through a journaling client to an order service that commits and never
/// answers, and drops the call once its attempt is out.
async fn send_and_drop(recorder: &LedgerRecorder, key: &str) {
    let sent = Arc::new(AtomicU32::new(0));
    let count = sent.clone();
    let transport = tower::service_fn(move |_req: Request<String>| {
        count.fetch_add(1, Ordering::SeqCst);
        std::future::pending::<Result<Response<String>, std::io::Error>>()
    });
    let mut client = journaled_client!(recorder, transport);
    let req = order(key);
    let call = tokio::spawn(async move { super::call(&mut client, req).await });
    while sent.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
}

/// The ledger's entries for `key`.
async fn entries(ledger: &MemoryLedger, key: &str) -> Vec<surely::ledger::Entry> {
    ledger.by_key(key).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn the_intent_is_in_the_ledger_before_the_first_attempt_and_goes_when_the_call_succeeds() {
    let ledger = MemoryLedger::new();
    let recorder = LedgerRecorder::new(ledger.clone());
    let seen = ledger.clone();
    let transport = tower::service_fn(move |_req: Request<String>| {
        let seen = seen.clone();
        async move {
            // The attempt is going out: its intent is already there, in doubt.
            let found = seen.by_key("o-1").await.unwrap();
            assert_eq!(found.len(), 1, "the intent is written before the attempt");
            let e = &found[0];
            assert_eq!(e.state, EntryState::InDoubt);
            assert_eq!(e.evidence.operation.as_deref(), Some("POST /orders"));
            assert_eq!(e.evidence.semantics, Semantics::NonIdempotent);
            assert_eq!(e.evidence.digest.as_deref(), Some("sha-256=:abc=:"));
            assert!(e.evidence.deadline.is_some());
            assert!(e.evidence.attempts.is_empty());
            Ok::<_, std::io::Error>(Response::new(String::from("placed")))
        }
    });
    let mut client = journaled_client!(recorder, transport);
    let mut req = order("o-1");
    req.extensions_mut()
        .insert(IntentDigest::new("sha-256=:abc=:").unwrap());
    let res = super::call(&mut client, req).await.unwrap();
    assert_eq!(res.body(), "placed");
    recorder.flush().await;
    let writes = recorder.writes();
    assert_eq!((writes.intents, writes.forgotten), (1, 1));
    assert!(entries(&ledger, "o-1").await.is_empty());
    assert_eq!(ledger.stats_now().unsettled(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_definitive_failure_forgets_the_intent_too() {
    let ledger = MemoryLedger::new();
    let recorder = LedgerRecorder::new(ledger.clone());
    let transport = tower::service_fn(|_req: Request<String>| async {
        Ok::<_, std::io::Error>(Response::builder().status(400).body(String::new()).unwrap())
    });
    let mut client = journaled_client!(recorder, transport);
    let res = super::call(&mut client, order("o-2")).await.unwrap();
    assert_eq!(res.status(), 400);
    recorder.flush().await;
    assert_eq!(recorder.writes().forgotten, 1);
    assert!(entries(&ledger, "o-2").await.is_empty());
}

/// An unknown call is one entry, the intent's, now open and with the call's attempts: the
/// journal and the recorder agree on its id.
#[tokio::test(start_paused = true)]
async fn a_call_that_ends_unknown_makes_its_intent_the_one_entry_with_its_attempts() {
    let ledger = MemoryLedger::new();
    let recorder = LedgerRecorder::new(ledger.clone());
    let mut client = surely::client()
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
    let mut req = order("o-3");
    req.extensions_mut()
        .insert(IntentDigest::new("sha-256=:o3=:").unwrap());
    let err = super::call(&mut client, req).await.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    recorder.flush().await;
    let found = entries(&ledger, "o-3").await;
    assert_eq!(found.len(), 1, "one entry per call: {found:?}");
    let e = &found[0];
    assert_eq!(e.state, EntryState::Open);
    assert_eq!(e.evidence.attempts.len(), 1);
    assert_eq!(e.evidence.stop, StopReason::Unknown);
    // What only the intent knew is kept.
    assert_eq!(e.evidence.digest.as_deref(), Some("sha-256=:o3=:"));
    assert!(e.evidence.deadline.is_some());
    let writes = recorder.writes();
    assert_eq!(
        (writes.intents, writes.written, writes.forgotten),
        (1, 1, 0)
    );
}

/// The process dies mid-call: its attempt went out, and nothing after that happens (here: the
/// recorder's writer never runs, as in a process killed before its asynchronous write, and the
/// call is dropped). Its intent stays in doubt: no reconciler takes it while the call could
/// still be running, and one takes it, asks by key and settles it, once its hold (the deadline
/// and the grace) has passed.
#[tokio::test(start_paused = true)]
async fn a_call_whose_process_dies_leaves_its_intent_for_the_reconciler_after_its_hold() {
    let ledger = MemoryLedger::new();
    // The process's writer, which dies with it before it writes anything.
    let (recorder, _dead_writer) = LedgerRecorder::pair(ledger.clone());
    send_and_drop(&recorder, "o-4").await;
    let found = entries(&ledger, "o-4").await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].state, EntryState::InDoubt);
    assert_eq!(ledger.stats_now().in_doubt, 1);

    let lookups = Arc::new(AtomicU32::new(0));
    let asked = lookups.clone();
    let lookup = move |q: Query| {
        asked.fetch_add(1, Ordering::SeqCst);
        async move {
            match q.key {
                Some(order) => Resolution::Succeeded(format!("{order} is in the order table")),
                None => Resolution::Unknown,
            }
        }
    };
    let mut reconciler = Reconciler::builder(ledger.clone(), lookup).build().unwrap();
    // While the call could still be running, nobody asks.
    tokio::time::advance(secs(10)).await;
    let round = reconciler.run_once().await.unwrap();
    assert_eq!((round.claimed, lookups.load(Ordering::SeqCst)), (0, 0));
    // `docs::unknowns`: held until the call's deadline and a grace of 5 s have passed.
    tokio::time::advance(Duration::from_millis(4_900)).await;
    let round = reconciler.run_once().await.unwrap();
    assert_eq!((round.claimed, lookups.load(Ordering::SeqCst)), (0, 0));
    // Past its deadline and the grace, it is an unknown like any other.
    tokio::time::advance(Duration::from_millis(100)).await;
    let round = reconciler.run_once().await.unwrap();
    assert_eq!((round.claimed, round.succeeded), (1, 1));
    let entry = ledger.get(&found[0].evidence.id).await.unwrap().unwrap();
    assert_eq!(entry.settlement.unwrap().verdict, Verdict::Succeeded);
    // A second run finds nothing to do.
    let round = reconciler.run_once().await.unwrap();
    assert_eq!((round.claimed, round.succeeded), (0, 0));
}

/// A call its caller drops in a process that lives on is recorded as the recorder sees it end
/// (unknown: its attempt was out), as the intent's one entry, open at once.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_by_its_caller_is_the_intents_one_open_entry() {
    let ledger = MemoryLedger::new();
    let recorder = LedgerRecorder::new(ledger.clone());
    send_and_drop(&recorder, "o-11").await;
    recorder.flush().await;
    let found = entries(&ledger, "o-11").await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].state, EntryState::Open);
    assert_eq!(found[0].evidence.stop, StopReason::Cancelled);
}

/// A journal that cannot write: the call is not sent, fails with the journal's error, and
/// says so in its outcome; the next call, once the ledger is back, goes out.
#[tokio::test(start_paused = true)]
async fn a_call_whose_intent_cannot_be_written_is_not_sent() {
    let flaky = FlakyLedger::new(MemoryLedger::new());
    flaky.fail_records(1);
    let recorder = LedgerRecorder::new(flaky.clone());
    let sent = Arc::new(AtomicU32::new(0));
    let count = sent.clone();
    let transport = tower::service_fn(move |_req: Request<String>| {
        count.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, std::io::Error>(Response::new(String::from("placed"))) }
    });
    let mut client = journaled_client!(recorder, transport);
    let err = super::call(&mut client, order("o-5")).await.unwrap_err();
    assert_eq!(sent.load(Ordering::SeqCst), 0, "nothing was sent");
    let failed = err.journal_failed().expect("the journal's error");
    assert_eq!(failed.message(), "the journal's backend failed");
    // The ledger's error, and its cause, each said once along the error's sources.
    let said = crate::chain(failed);
    assert!(
        said.ends_with("ledger store failed: the database is down"),
        "{said}"
    );
    assert!(
        !failed.to_string().contains("the database is down"),
        "{failed}"
    );
    assert_eq!(err.outcome(), Outcome::Failed);
    assert_eq!(err.attempts(), 0);
    assert_eq!(err.stop_reason(), Some(StopReason::NotRetried));
    assert!(err.to_string().contains("could not be journaled"), "{err}");
    super::call(&mut client, order("o-5")).await.unwrap();
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}

/// Which calls: every call that is not safe, unless a `Journaled` extension says otherwise.
#[tokio::test(start_paused = true)]
async fn a_request_may_choose_to_be_journaled_or_not() {
    let journal = Notes::default();
    let transport = tower::service_fn(|_req: Request<String>| async {
        Ok::<_, std::io::Error>(Response::new(String::new()))
    });
    let mut client = surely::client()
        .journal(journal.clone())
        .build(transport)
        .unwrap();
    let get = |path: &str| Request::get(path).body(String::new()).unwrap();
    super::call(&mut client, get("/plain-read")).await.unwrap();
    let mut read = get("/journaled-read");
    read.extensions_mut().insert(Journaled::Yes);
    super::call(&mut client, read).await.unwrap();
    let mut write = order("o-skip");
    write.extensions_mut().insert(Journaled::No);
    super::call(&mut client, write).await.unwrap();
    super::call(&mut client, order("o-6")).await.unwrap();
    assert_eq!(
        journal.notes(),
        [
            "begin GET /journaled-read",
            "end GET /journaled-read Succeeded",
            "begin POST /orders o-6",
            "end POST /orders o-6 Succeeded",
        ]
    );
}

/// A call dropped while its intent is being written (its deadline passed: the journal hung)
/// sent nothing, and tells the journal so.
#[tokio::test(start_paused = true)]
async fn a_call_cut_short_while_its_intent_is_written_ends_it_as_failed() {
    let journal = Notes::hanging();
    let transport = tower::service_fn(|_req: Request<String>| async {
        Ok::<_, std::io::Error>(Response::new(String::new()))
    });
    let mut client = surely::client()
        .timeout(secs(1))
        .journal(journal.clone())
        .build(transport)
        .unwrap();
    let err = super::call(&mut client, order("o-7")).await.unwrap_err();
    assert!(err.is_deadline_exceeded(), "{err}");
    assert_eq!(err.outcome(), Outcome::Failed);
    assert_eq!(
        journal.notes(),
        ["begin POST /orders o-7", "end POST /orders o-7 Failed"]
    );
}

/// The ledger's own rules: an intent recorded twice is one; an open record of it makes it open
/// and keeps what only the intent knew; forgetting takes only what is still in doubt.
#[tokio::test(start_paused = true)]
async fn the_memory_ledger_keeps_intents_by_its_rules() {
    ledger_keeps_intents(MemoryLedger::new(), |d| async move {
        tokio::time::advance(d).await;
    })
    .await;
}

/// What `ledger_keeps_intents` checks, for every ledger; `pass` lets `d` of the ledger's clock
/// go by.
pub(crate) async fn ledger_keeps_intents<L, F, Fut>(ledger: L, pass: F)
where
    L: Ledger,
    F: Fn(Duration) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let hold = Duration::from_millis(300);
    let intent = Intent::new("o-8", "POST /orders")
        .with_deadline_in(Duration::from_secs(2))
        .with_digest("sha-256=:o8=:");
    let mut e = Evidence::of_intent(&intent);
    e.recorded_at = super::micros(e.recorded_at);
    e.deadline = e.deadline.map(super::micros);
    assert_eq!(e.id, EntryId::of_intent(intent.id));
    assert!(ledger.record_in_doubt(&e, hold).await.unwrap());
    assert!(!ledger.record_in_doubt(&e, hold).await.unwrap(), "once");
    let stats = ledger.stats().await.unwrap();
    assert_eq!((stats.in_doubt, stats.open, stats.unsettled()), (1, 0, 1));
    // Not claimed while held.
    assert!(ledger.claim(10, secs(30)).await.unwrap().is_empty());

    // Another intent, whose call ends unknown: its record makes it open, with the attempts.
    let other = Intent::new("o-9", "POST /orders").with_digest("sha-256=:o9=:");
    let mut held = Evidence::of_intent(&other);
    held.recorded_at = super::micros(held.recorded_at);
    assert!(ledger.record_in_doubt(&held, secs(3600)).await.unwrap());
    let mut unknown = Evidence::new("o-9", "POST /orders")
        .with_id(held.id.clone())
        .with_attempt(surely::ledger::AttemptEvidence::new(
            1,
            held.recorded_at,
            Duration::from_millis(20),
            surely::classify::AttemptClass::MaybeCommitted,
            surely::classify::DeliveryPhase::Sent,
        ));
    unknown.recorded_at = super::micros(unknown.recorded_at);
    assert!(
        ledger.record(&unknown).await.unwrap(),
        "the intent becomes the entry"
    );
    assert!(!ledger.record(&unknown).await.unwrap(), "recorded once");
    let entry = ledger.get(&held.id).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Open);
    assert_eq!(entry.evidence.attempts.len(), 1);
    assert_eq!(entry.evidence.digest.as_deref(), Some("sha-256=:o9=:"));
    // An intent is never made of an entry that is already there.
    assert!(!ledger.record_in_doubt(&held, hold).await.unwrap());
    assert_eq!(
        ledger.get(&held.id).await.unwrap().unwrap().state,
        EntryState::Open
    );

    // Forgetting takes the ones in doubt only.
    let third = Evidence::of_intent(&Intent::new("o-10", "POST /orders"));
    assert!(ledger.record_in_doubt(&third, secs(3600)).await.unwrap());
    let gone = ledger
        .forget_in_doubt(&[
            third.id.clone(),
            held.id.clone(),
            EntryId::new("unk-none").unwrap(),
        ])
        .await
        .unwrap();
    assert_eq!(gone, 1);
    assert!(ledger.get(&third.id).await.unwrap().is_none());
    assert!(ledger.get(&held.id).await.unwrap().is_some());
    assert_eq!(ledger.forget_in_doubt(&[]).await.unwrap(), 0);

    // Past its hold, the first one is claimed like an open entry: the held and the open one.
    pass(hold).await;
    let claims = ledger.claim(10, secs(30)).await.unwrap();
    let mut claimed: Vec<&str> = claims
        .iter()
        .map(|c| c.entry.evidence.key.as_deref().unwrap())
        .collect();
    claimed.sort_unstable();
    assert_eq!(claimed, ["o-8", "o-9"]);
    let first = claims.iter().find(|c| c.entry.evidence.id == e.id).unwrap();
    assert_eq!(
        first.entry.evidence.digest.as_deref(),
        Some("sha-256=:o8=:")
    );
    assert_eq!(first.entry.evidence.deadline, e.deadline);
    // A claimed intent is no longer in doubt: it is not forgotten.
    assert_eq!(ledger.forget_in_doubt(&[e.id.clone()]).await.unwrap(), 0);
}

/// A journal that notes what it is told, for the tests that need no ledger.
#[derive(Clone, Default)]
struct Notes {
    notes: Arc<Mutex<Vec<String>>>,
    ids: Arc<Mutex<Vec<(IntentId, String)>>>,
    hang: bool,
}

impl Notes {
    fn hanging() -> Self {
        Notes {
            hang: true,
            ..Notes::default()
        }
    }

    fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap().clone()
    }
}

impl IntentJournal for Notes {
    async fn begin(&self, intent: &Intent) -> Result<(), JournalError> {
        let what = match &intent.key {
            Some(key) => format!("{} {key}", intent.operation.as_deref().unwrap_or("-")),
            None => intent.operation.clone().unwrap_or_default(),
        };
        self.notes.lock().unwrap().push(format!("begin {what}"));
        self.ids.lock().unwrap().push((intent.id, what));
        if self.hang {
            std::future::pending::<()>().await;
        }
        Ok(())
    }

    fn end(&self, id: IntentId, outcome: Outcome) {
        let what = self
            .ids
            .lock()
            .unwrap()
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, w)| w.clone())
            .unwrap_or_else(|| format!("unknown intent {id}"));
        self.notes
            .lock()
            .unwrap()
            .push(format!("end {what} {outcome:?}"));
    }
}

/// The intent of a call made without a call record layer still has an id, a key and an
/// operation; a digest that is not one is refused with a reason.
#[test]
fn intents_and_digests_say_what_is_wrong() {
    let long = "x".repeat(300);
    let err = IntentDigest::new(long.as_str()).unwrap_err();
    assert!(err.message().contains("1 to 256"), "{}", err.message());
    assert!(IntentDigest::new("").is_err());
    let err = IntentDigest::new("a\u{7}b").unwrap_err();
    assert!(err.message().contains("control"), "{}", err.message());
    let intent = Intent::new("k", "POST /x");
    assert_eq!(intent.id.to_string().len(), 32);
    assert_eq!(EntryId::of_intent(intent.id).as_str().len(), 36);
}
