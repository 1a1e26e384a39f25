//! Writing unknown calls to the ledger, as a recorder.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::{EntryId, Evidence, Ledger, LedgerError, Settlement, Verdict};
use crate::journal::{Intent, IntentId, IntentJournal, JournalError};
use crate::record::{AttemptRecord, CallId, CallRecord, Recorder};
use crate::Outcome;

/// Intents forgotten in one statement, at most.
const FORGET_BATCH: usize = 512;

/// Calls in flight whose attempts the recorder keeps, at most; past it, a call's entry is
/// written without the attempts it could not keep (and [`LedgerWrites::attempts_dropped`]
/// counts them).
const MAX_CALLS: usize = 10_000;
/// Entries whose write failed that the recorder keeps for [`LedgerRecorder::take_failed`].
const MAX_FAILED: usize = 1_000;

/// A [`Recorder`] that writes every call that ends [unknown](Outcome::Unknown) to a
/// [`Ledger`], with its [`Evidence`]. Give it to the client stack's
/// [`recorder`](crate::client::ClientBuilder::recorder), alone or beside another one as a pair
/// (`(TracingRecorder::default(), ledger_recorder)`).
///
/// It keeps the attempts of the calls in flight (a call whose outcome a resolver settled is
/// not unknown, and is not written), and when a call ends unknown hands its evidence to a
/// writer task. The caller is not held up by the write: [`flush`](Self::flush) waits for the
/// writes queued so far, which a test, or a service shutting down, does.
///
/// A write that fails is tried again (8 tries, 100 ms doubling to 5 s apart); one that still
/// fails is reported as a `tracing` error with the entry's id, key and operation, counted in
/// [`LedgerWrites::failed`], and kept for [`take_failed`](Self::take_failed) (the last 1 000):
/// never dropped in silence.
///
/// # Memory
///
/// The writes wait in a queue of at most [`DEFAULT_QUEUE`](Self::DEFAULT_QUEUE) (10 000;
/// [`with_queue`](Self::with_queue) sets another bound), for a writer that a slow or
/// unreachable ledger holds up. A write that finds the queue full is not queued, and is
/// counted in [`LedgerWrites::queue_full`]: an unknown call's entry is then reported and kept as
/// a failed one (above), a replay's settlement is left to the reconciler, and a finished call's
/// intent stays in doubt for a reconciler to settle. Besides the queue, it keeps the attempts of
/// at most 10 000 calls in flight (past them a call's entry is written without its attempts,
/// counted in [`LedgerWrites::attempts_dropped`]) and the last 1 000 failed entries.
///
/// Asking again with the same key is itself a query: when a later call with an entry's key is
/// answered with the server's stored result (`idempotent-replayed: true`, as surely's
/// [`IdempotencyLayer`][crate::server::idempotency::IdempotencyLayer] answers), the first call
/// took effect, and the recorder settles the key's unsettled entries as succeeded (through
/// [`Ledger::settle_manually`], as the reconciler; counted in
/// [`LedgerWrites::settled_by_replay`]). A success that is not a replay proves nothing about an
/// earlier call, and settles nothing. The key must name one intent: a business key reused for
/// another order would settle the wrong entry.
///
/// It is also an [`IntentJournal`]: give it to the client's
/// [`journal`](crate::client::ClientBuilder::journal) as well, and a journaled call's intent is
/// written to the ledger, in doubt, before the call's first attempt (the call waits for that
/// write); a call that ends unknown makes its intent an open entry with its attempts (one entry
/// per call), and one that ends definitively has its intent forgotten by the writer, in
/// batches, off the call's path. A process killed mid-call leaves the intent in doubt, for a
/// reconciler once its hold has passed ([`docs::unknowns`](crate::docs::unknowns#a-client-that-dies-mid-call)).
///
/// Clones share the writer.
#[cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::idempotency::IdempotencyLayer",
    )
)]
#[derive(Clone)]
pub struct LedgerRecorder {
    shared: Arc<Shared>,
    writes: mpsc::Sender<Write>,
    intents: Arc<dyn Intents>,
}

/// The ledger, as the journal's awaited writes reach it (the writer task owns it otherwise).
trait Intents: Send + Sync {
    fn hold(&self, evidence: Evidence, hold: Duration) -> BeginFuture;
}

type BeginFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<bool, LedgerError>> + Send + 'static>>;

impl<L: Ledger> Intents for Arc<L> {
    fn hold(&self, evidence: Evidence, hold: Duration) -> BeginFuture {
        let ledger = self.clone();
        Box::pin(async move { ledger.record_in_doubt(&evidence, hold).await })
    }
}

/// What the writer does.
enum Write {
    /// Records an unknown call.
    Entry(Evidence),
    /// A call with this key was answered with the server's stored result: settles the key's
    /// unsettled entries as succeeded.
    Replayed { key: String, call: u64 },
    /// A journaled call ended definitively: its intent may go.
    Forget(EntryId),
}

struct Shared {
    attempts: Mutex<HashMap<CallId, Vec<AttemptRecord>>>,
    queued: AtomicU64,
    written: AtomicU64,
    duplicate: AtomicU64,
    failed: AtomicU64,
    settled_by_replay: AtomicU64,
    attempts_dropped: AtomicU64,
    intents: AtomicU64,
    forgotten: AtomicU64,
    queue_full: AtomicU64,
    failed_entries: Mutex<Vec<Evidence>>,
    /// Writes finished (written, duplicate or failed).
    done: watch::Sender<u64>,
}

/// What a [`LedgerRecorder`] has done so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LedgerWrites {
    /// Unknown calls handed to the writer.
    pub queued: u64,
    /// Entries written.
    pub written: u64,
    /// Entries the ledger already had (a write retried after its answer was lost).
    pub duplicate: u64,
    /// Entries that could not be written after every try: reported, and kept for
    /// [`LedgerRecorder::take_failed`].
    pub failed: u64,
    /// Entries settled as succeeded because a later call with their key was answered with
    /// the server's stored result.
    pub settled_by_replay: u64,
    /// Attempt records not kept because too many calls were in flight.
    pub attempts_dropped: u64,
    /// Journaled calls' intents written, in doubt.
    pub intents: u64,
    /// Intents forgotten because their calls ended definitively.
    pub forgotten: u64,
    /// Writes not queued because the writer's queue was full: unknown calls' entries among
    /// them are also counted in `failed`, and kept for [`LedgerRecorder::take_failed`].
    pub queue_full: u64,
}

impl LedgerRecorder {
    /// A recorder writing to `ledger`, its writer spawned on the current Tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, as [`tokio::spawn`] does; [`pair`](Self::pair) gives the writer
    /// to run yourself.
    pub fn new(ledger: impl Ledger) -> Self {
        Self::with_queue(ledger, Self::DEFAULT_QUEUE)
    }

    /// The writes a recorder's queue holds unless [`with_queue`](Self::with_queue) says
    /// otherwise.
    pub const DEFAULT_QUEUE: usize = 10_000;

    /// A recorder writing to `ledger` as [`new`](Self::new) does, its queue holding at most
    /// `writes` writes (at least 1; see "Memory" above).
    ///
    /// ```
    /// use surely::ledger::{LedgerRecorder, MemoryLedger};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let recorder = LedgerRecorder::with_queue(MemoryLedger::new(), 100_000);
    /// assert_eq!(recorder.writes().queue_full, 0);
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, as [`tokio::spawn`] does.
    pub fn with_queue(ledger: impl Ledger, writes: usize) -> Self {
        let (recorder, writer) = Self::pair_with_queue(ledger, writes);
        tokio::spawn(writer);
        recorder
    }

    /// A recorder writing to `ledger`, and its writer, which must be spawned (it ends when
    /// every clone of the recorder is dropped and its queue is written).
    pub fn pair(ledger: impl Ledger) -> (Self, impl Future<Output = ()> + Send + 'static) {
        Self::pair_with_queue(ledger, Self::DEFAULT_QUEUE)
    }

    /// [`pair`](Self::pair), its queue holding at most `writes` writes (at least 1).
    pub fn pair_with_queue(
        ledger: impl Ledger,
        writes: usize,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        // tokio's bound, far above any queue worth its memory.
        let (writes, queue) = mpsc::channel(writes.clamp(1, tokio::sync::Semaphore::MAX_PERMITS));
        let shared = Arc::new(Shared {
            attempts: Mutex::new(HashMap::new()),
            queued: AtomicU64::new(0),
            written: AtomicU64::new(0),
            duplicate: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            settled_by_replay: AtomicU64::new(0),
            attempts_dropped: AtomicU64::new(0),
            intents: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            queue_full: AtomicU64::new(0),
            failed_entries: Mutex::new(Vec::new()),
            done: watch::channel(0).0,
        });
        let ledger = Arc::new(ledger);
        let writer = write(ledger.clone(), queue, shared.clone());
        let intents: Arc<dyn Intents> = Arc::new(ledger);
        (
            LedgerRecorder {
                shared,
                writes,
                intents,
            },
            writer,
        )
    }

    /// Waits until every unknown call recorded so far has been written, or has failed for
    /// good.
    pub async fn flush(&self) {
        let queued = self.shared.queued.load(Ordering::SeqCst);
        let mut done = self.shared.done.subscribe();
        // The sender lives as long as this recorder: `wait_for` ends only on the count.
        let _ = done.wait_for(|&n| n >= queued).await;
    }

    /// The counts so far.
    pub fn writes(&self) -> LedgerWrites {
        let s = &self.shared;
        LedgerWrites {
            queued: s.queued.load(Ordering::SeqCst),
            written: s.written.load(Ordering::SeqCst),
            duplicate: s.duplicate.load(Ordering::SeqCst),
            failed: s.failed.load(Ordering::SeqCst),
            settled_by_replay: s.settled_by_replay.load(Ordering::SeqCst),
            attempts_dropped: s.attempts_dropped.load(Ordering::SeqCst),
            intents: s.intents.load(Ordering::SeqCst),
            forgotten: s.forgotten.load(Ordering::SeqCst),
            queue_full: s.queue_full.load(Ordering::SeqCst),
        }
    }

    /// The entries that could not be written (the last 1 000), taken: write them again
    /// yourself, or to another place.
    pub fn take_failed(&self) -> Vec<Evidence> {
        std::mem::take(&mut *lock(&self.shared.failed_entries))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl fmt::Debug for LedgerRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LedgerRecorder")
            .field("writes", &self.writes())
            .finish()
    }
}

impl Recorder for LedgerRecorder {
    fn record_attempt(&self, record: &AttemptRecord) {
        let Some(call) = record.call else {
            // Without a call layer outside, there is no call to write.
            return;
        };
        let mut attempts = lock(&self.shared.attempts);
        if let Some(list) = attempts.get_mut(&call) {
            list.push(record.clone());
        } else if attempts.len() < MAX_CALLS {
            attempts.insert(call, vec![record.clone()]);
        } else {
            self.shared.attempts_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn record_call(&self, record: &CallRecord) {
        let attempts = lock(&self.shared.attempts)
            .remove(&record.call)
            .unwrap_or_default();
        if record.outcome == Outcome::Succeeded && record.replayed {
            if let Some(key) = &record.key {
                self.shared.queued.fetch_add(1, Ordering::SeqCst);
                let replayed = Write::Replayed {
                    key: key.as_str().to_owned(),
                    call: record.call.get(),
                };
                if let Err(e) = self.writes.try_send(replayed) {
                    // Best effort: the reconciler settles the key's entries all the same.
                    self.not_queued(&e);
                    self.shared.done.send_modify(|n| *n += 1);
                }
            }
            return;
        }
        if record.outcome != Outcome::Unknown {
            return;
        }
        let evidence = Evidence::from_records(record, &attempts);
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.writes.try_send(Write::Entry(evidence)) {
            self.not_queued(&e);
            let (mpsc::error::TrySendError::Full(Write::Entry(evidence))
            | mpsc::error::TrySendError::Closed(Write::Entry(evidence))) = e
            else {
                return;
            };
            // The writer is gone (its runtime shut down), or its queue is full: the entry
            // cannot be written.
            tracing::error!(
                entry = %evidence.id,
                key = evidence.key.as_deref().unwrap_or("-"),
                operation = evidence.operation.as_deref().unwrap_or("-"),
                why = if self.writes.is_closed() { "its writer is gone" } else { "its writer's queue is full" },
                "an unknown call was not written to the ledger"
            );
            fail(&self.shared, evidence);
        }
    }
}

impl IntentJournal for LedgerRecorder {
    fn begin(&self, intent: &Intent) -> impl Future<Output = Result<(), JournalError>> + Send {
        let write = self.intents.hold(Evidence::of_intent(intent), intent.hold);
        let shared = self.shared.clone();
        async move {
            // An intent already here (a write retried after its answer was lost) is written.
            write.await.map_err(JournalError::backend)?;
            shared.intents.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    fn end(&self, id: IntentId, _outcome: Outcome) {
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = self.writes.try_send(Write::Forget(EntryId::of_intent(id))) {
            // The writer is gone, or its queue is full: the intent stays in doubt, and a
            // reconciler settles it.
            self.not_queued(&e);
            self.shared.done.send_modify(|n| *n += 1);
        }
    }
}

impl LedgerRecorder {
    /// Counts a write the full queue did not take.
    fn not_queued<T>(&self, e: &mpsc::error::TrySendError<T>) {
        if matches!(e, mpsc::error::TrySendError::Full(_)) {
            self.shared.queue_full.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn fail(shared: &Shared, evidence: Evidence) {
    shared.failed.fetch_add(1, Ordering::SeqCst);
    let mut failed = lock(&shared.failed_entries);
    if failed.len() >= MAX_FAILED {
        failed.remove(0);
    }
    failed.push(evidence);
    drop(failed);
    shared.done.send_modify(|n| *n += 1);
}

/// Tries to write each entry: 8 tries, 100 ms doubling to 5 s apart.
const TRIES: u32 = 8;
const FIRST_WAIT: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_secs(5);

async fn write<L: Ledger>(ledger: Arc<L>, mut queue: mpsc::Receiver<Write>, shared: Arc<Shared>) {
    let ledger = &*ledger;
    let mut next = None;
    loop {
        let write = match next.take() {
            Some(write) => write,
            None => match queue.recv().await {
                Some(write) => write,
                None => break,
            },
        };
        let evidence = match write {
            Write::Entry(evidence) => evidence,
            Write::Replayed { key, call } => {
                settle_replayed(ledger, &key, call, &shared).await;
                shared.done.send_modify(|n| *n += 1);
                continue;
            }
            Write::Forget(id) => {
                // The intents queued behind it go in the same statement.
                let mut ids = vec![id];
                while ids.len() < FORGET_BATCH {
                    match queue.try_recv() {
                        Ok(Write::Forget(id)) => ids.push(id),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                forget(ledger, &ids, &shared).await;
                continue;
            }
        };
        let mut wait = FIRST_WAIT;
        let mut tries = 0;
        loop {
            tries += 1;
            match ledger.record(&evidence).await {
                Ok(new) => {
                    let count = if new {
                        &shared.written
                    } else {
                        &shared.duplicate
                    };
                    count.fetch_add(1, Ordering::SeqCst);
                    shared.done.send_modify(|n| *n += 1);
                    break;
                }
                Err(e) if tries < TRIES && !e.is_invalid() => {
                    tracing::warn!(
                        entry = %evidence.id,
                        error = &e as &dyn std::error::Error,
                        tries,
                        "ledger write failed; trying again"
                    );
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2).min(MAX_WAIT);
                }
                Err(e) => {
                    tracing::error!(
                        entry = %evidence.id,
                        key = evidence.key.as_deref().unwrap_or("-"),
                        operation = evidence.operation.as_deref().unwrap_or("-"),
                        error = &e as &dyn std::error::Error,
                        tries,
                        "an unknown call could not be written to the ledger"
                    );
                    fail(&shared, evidence);
                    break;
                }
            }
        }
    }
}

/// Forgets the intents of calls that ended definitively. Best effort: an intent this cannot
/// forget stays in doubt, and a reconciler finds its call's outcome.
async fn forget(ledger: &impl Ledger, ids: &[EntryId], shared: &Shared) {
    match ledger.forget_in_doubt(ids).await {
        Ok(n) => {
            shared.forgotten.fetch_add(n, Ordering::SeqCst);
        }
        Err(e) => {
            tracing::warn!(
                intents = ids.len(),
                error = &e as &dyn std::error::Error,
                "ledger: could not forget the intents of finished calls; a reconciler will settle them"
            );
        }
    }
    let n = ids.len() as u64;
    shared.done.send_modify(|d| *d += n);
}

/// Settles the unsettled entries of `key` as succeeded: call `call` with the same key was
/// answered with the server's stored result, so an earlier call with it took effect. Best
/// effort: an entry this cannot settle stays for the reconciler.
async fn settle_replayed(ledger: &impl Ledger, key: &str, call: u64, shared: &Shared) {
    let entries = match ledger.by_key(key).await {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(
                key,
                error = &e as &dyn std::error::Error,
                "ledger: could not look up the entries of a replayed key"
            );
            return;
        }
    };
    for entry in entries.iter().filter(|e| e.state.is_unsettled()) {
        let settlement = Settlement::reconciled(
            Verdict::Succeeded,
            format!(
                "call-{call} with the same key was answered with the server's stored result \
                 (idempotent-replayed): the call took effect"
            ),
        );
        match ledger
            .settle_manually(&entry.evidence.id, &settlement)
            .await
        {
            Ok(settled) if settled.is_now() => {
                shared.settled_by_replay.fetch_add(1, Ordering::SeqCst);
                tracing::info!(entry = %entry.evidence.id, key, "ledger: settled by a replay of the same key");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(entry = %entry.evidence.id, key, error = &e as &dyn std::error::Error, "ledger: could not settle an entry by its replay");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::IntentJournal;
    use crate::ledger::MemoryLedger;
    use crate::{Semantics, StopReason};

    fn unknown_call() -> CallRecord {
        let now = tokio::time::Instant::now();
        CallRecord {
            call: CallId::next(),
            key: None,
            semantics: Semantics::NonIdempotent,
            started: now,
            ended: now,
            deadline_left: None,
            attempts: 1,
            outcome: Outcome::Unknown,
            last: None,
            stop: StopReason::Unknown,
            resolution: None,
            retries: Vec::new(),
            operation: None,
            replayed: false,
        }
    }

    /// A writer that never runs (a ledger that holds it up forever): a million finished
    /// calls' intents and 10 000 unknown calls fill its queue to its bound and no further;
    /// the entries it could not take are counted and kept as failed ones, at most 1 000.
    #[tokio::test]
    async fn a_stuck_writer_holds_the_queue_at_its_bound() {
        let (recorder, writer) = LedgerRecorder::pair_with_queue(MemoryLedger::new(), 1_000);
        let queued = || recorder.writes.max_capacity() - recorder.writes.capacity();
        for _ in 0..1_000_000 {
            recorder.end(IntentId::generate(), Outcome::Succeeded);
        }
        assert_eq!(queued(), 1_000);
        for _ in 0..10_000 {
            recorder.record_call(&unknown_call());
        }
        assert_eq!(queued(), 1_000);
        let writes = recorder.writes();
        assert_eq!(writes.queue_full, 1_000_000 - 1_000 + 10_000);
        assert_eq!(writes.failed, 10_000);
        assert_eq!(recorder.take_failed().len(), MAX_FAILED);
        drop(writer);
    }
}
