//! Recovery after a takeover, and settling the records whose outcome is unknown.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};

use super::layer::Config;
use crate::classify::{AttemptClass, Classification, DeliveryPhase};
use crate::ids::{BusinessKey, Operation};
use crate::record::{AbandonedVerdict, ServerEventKind};
use crate::resolve::{Query, Resolution, Resolve};
use crate::server::store::{
    AbandonedRecord, Checkpoint, Fence, IdempotencyStore, RecordKey, RequestDigest, StoreError,
};
use crate::Semantics;

/// What a [recovery hook](super::IdempotencyLayerBuilder::recover) is given when a request takes
/// over a record whose owner's lease passed while it was still `PROCESSING`: that owner crashed,
/// hung, or was cut off, and may or may not have done its work.
#[derive(Debug)]
#[non_exhaustive]
pub struct Takeover {
    /// The record: tenant, operation, key.
    pub key: RecordKey,
    /// The new owner's fence (the previous owner's, plus one).
    pub fence: Fence,
    /// How long ago the previous owner acquired the record.
    pub age: Duration,
    /// How long the record had been held past its lease.
    pub overdue: Duration,
    /// The steps the previous owners recorded, oldest first.
    pub checkpoints: Vec<Checkpoint>,
    /// The request's digest (the same as the previous owner's: a takeover needs it).
    pub digest: RequestDigest,
    /// The request: method, target, headers and body (its extensions are left out).
    pub request: Request<Bytes>,
}

impl Takeover {
    /// The latest value the previous owners recorded under `name`.
    pub fn checkpoint(&self, name: &str) -> Option<&str> {
        crate::server::store::latest(&self.checkpoints, name)
    }
}

/// What a [recovery hook](super::IdempotencyLayerBuilder::recover) decided about the previous
/// owner's work.
#[derive(Debug)]
#[non_exhaustive]
pub enum Recovery {
    /// Run the handler again: it finds the previous owners' checkpoints on its
    /// [`Ticket`](super::Ticket), and its new fence. Right when the step the checkpoints name
    /// did not happen, or can be repeated with the id the checkpoint holds.
    Resume,
    /// The work was done: this is its answer. It is stored and replayed to every duplicate;
    /// the handler does not run.
    Completed(Response<Bytes>),
    /// The work failed for good (the payment was declined): this is its answer, stored and
    /// replayed; the handler does not run. Only once the step can no longer happen: a previous
    /// owner that only paused may still hold the checkpointed id, and "not found at the third
    /// party" is not "declined" until that id is cancelled there.
    Failed(Response<Bytes>),
    /// Nobody can tell yet: the record becomes `UNKNOWN` with this evidence, every duplicate
    /// gets `202` with [`ErrorCode::OutcomeUnknown`](super::ErrorCode::OutcomeUnknown), and
    /// [`IdempotencyLayer::settle_unknowns`](super::IdempotencyLayer::settle_unknowns) settles it
    /// later.
    Unknown(String),
}

impl Recovery {
    pub(super) fn verdict(&self) -> crate::record::RecoveryVerdict {
        use crate::record::RecoveryVerdict as V;
        match self {
            Recovery::Resume => V::Resumed,
            Recovery::Completed(_) => V::Completed,
            Recovery::Failed(_) => V::Failed,
            Recovery::Unknown(_) => V::Unknown,
        }
    }
}

/// The hook, boxed.
pub(super) type RecoverFn =
    dyn Fn(Takeover) -> Pin<Box<dyn Future<Output = Recovery> + Send>> + Send + Sync;

/// The longest evidence kept on an unknown record, in bytes; the rest is cut at a character
/// boundary.
const MAX_EVIDENCE_BYTES: usize = 2048;

/// `evidence`, cut to [`MAX_EVIDENCE_BYTES`], control characters (a NUL, which PostgreSQL's
/// text refuses, among them) made spaces.
pub(super) fn bounded(evidence: String) -> String {
    let mut evidence = if evidence.contains(char::is_control) {
        evidence
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    } else {
        evidence
    };
    if evidence.len() > MAX_EVIDENCE_BYTES {
        let mut end = MAX_EVIDENCE_BYTES;
        while !evidence.is_char_boundary(end) {
            end -= 1;
        }
        evidence.truncate(end);
    }
    evidence
}

/// The decision without a hook: a record without checkpoints runs again (its effects commit
/// with its transaction, or never happened); one with checkpoints never runs blindly again.
pub(super) fn by_rule(checkpoints: &[Checkpoint]) -> Recovery {
    if checkpoints.is_empty() {
        return Recovery::Resume;
    }
    let steps: Vec<String> = checkpoints.iter().map(|c| format!("{c:?}")).collect();
    Recovery::Unknown(bounded(format!(
        "taken over after the previous owner recorded {}; no recovery hook to ask",
        steps.join(", ")
    )))
}

/// What one [`settle_unknowns`](super::IdempotencyLayer::settle_unknowns) round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SettleRound {
    /// Unknown records read.
    pub seen: usize,
    /// Settled as done: completed with the resolver's answer, replayed from now on.
    pub completed: usize,
    /// Settled as not done: released, so that the client's next request runs it.
    pub released: usize,
    /// Still unknown: the resolver could not tell, declined, or did not answer in time.
    pub unknown: usize,
}

impl fmt::Display for SettleRound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} unknown records: {} completed, {} released, {} still unknown",
            self.seen, self.completed, self.released, self.unknown
        )
    }
}

/// One round over the store's unknown records; see
/// [`IdempotencyLayer::settle_unknowns`](super::IdempotencyLayer::settle_unknowns).
pub(super) async fn settle<St, R>(
    config: &Config<St>,
    resolver: &R,
    query_timeout: Duration,
    limit: usize,
) -> Result<SettleRound, StoreError>
where
    St: IdempotencyStore,
    R: Resolve<Response<Bytes>>,
{
    let mut round = SettleRound::default();
    for record in config.store.unknowns(limit).await? {
        round.seen += 1;
        let query = Query {
            key: Some(BusinessKey::new(record.key.key().as_str())),
            operation: Some(Operation::named(record.key.operation())),
            semantics: Semantics::Keyed,
            attempts: u32::try_from(record.fence.get()).unwrap_or(u32::MAX),
            last: Classification::new(AttemptClass::MaybeCommitted, DeliveryPhase::ResponseStarted),
        };
        let answer = match resolver.resolve(query) {
            Some(mut resolving) => tokio::time::timeout(query_timeout, resolving.future())
                .await
                .unwrap_or(Resolution::Unknown),
            None => Resolution::Unknown,
        };
        let (settled, happened) = match answer {
            Resolution::Succeeded(res) => {
                let (head, body) = res.into_parts();
                let settled = match config.to_store(&record.key, &head, &body) {
                    Ok(stored) => {
                        config
                            .store
                            .complete(&record.key, record.fence, &stored, config.retention)
                            .await
                    }
                    Err(e) => Err(StoreError::backend(e)),
                };
                (settled, true)
            }
            Resolution::Failed => (config.store.release(&record.key, record.fence).await, false),
            Resolution::Unknown => {
                round.unknown += 1;
                continue;
            }
        };
        match settled {
            Ok(()) => {
                if happened {
                    round.completed += 1;
                } else {
                    round.released += 1;
                }
                let kind = ServerEventKind::Settled {
                    fence: record.fence,
                    happened,
                };
                config.emit_record(kind, &record.key);
            }
            // Settled meanwhile by another round: nothing left to do.
            Err(e) if e.is_stale() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(round)
}

/// What an [abandoned-record hook](super::IdempotencyLayerBuilder::recover_abandoned) decided
/// about a record whose owner died with its client. The handler never runs again here: there
/// is no request to run it with.
#[derive(Debug)]
#[non_exhaustive]
pub enum AbandonedRecovery {
    /// The work was done: this is its answer, stored and replayed to the next request with
    /// the key.
    Completed(Response<Bytes>),
    /// The work failed for good: this is its answer, stored and replayed. Only once the step
    /// can no longer happen, as for [`Recovery::Failed`].
    Failed(Response<Bytes>),
    /// Nobody can tell yet: the record becomes `UNKNOWN` with this evidence, and
    /// [`settle_unknowns`](super::IdempotencyLayer::settle_unknowns) settles it later.
    Unknown(String),
    /// Nothing happened (no step was taken, or the one taken is known not to have happened):
    /// the record is released, and the next request with the key runs it.
    Released,
}

impl AbandonedRecovery {
    fn verdict(&self) -> AbandonedVerdict {
        match self {
            AbandonedRecovery::Completed(_) => AbandonedVerdict::Completed,
            AbandonedRecovery::Failed(_) => AbandonedVerdict::Failed,
            AbandonedRecovery::Unknown(_) => AbandonedVerdict::Unknown,
            AbandonedRecovery::Released => AbandonedVerdict::Released,
        }
    }
}

/// The abandoned-record hook, boxed.
pub(super) type AbandonedFn = dyn Fn(AbandonedRecord) -> Pin<Box<dyn Future<Output = AbandonedRecovery> + Send>>
    + Send
    + Sync;

/// The decision without a hook: a record without checkpoints never reached a step outside
/// (released: the next request runs it); one with checkpoints may have, and becomes
/// `UNKNOWN`, naming them.
pub(super) fn abandoned_by_rule(checkpoints: &[Checkpoint]) -> AbandonedRecovery {
    if checkpoints.is_empty() {
        return AbandonedRecovery::Released;
    }
    let steps: Vec<String> = checkpoints.iter().map(|c| format!("{c:?}")).collect();
    AbandonedRecovery::Unknown(bounded(format!(
        "abandoned by its owner after it recorded {}; no abandoned-record hook to ask",
        steps.join(", ")
    )))
}

/// What one [`recover_abandoned`](super::IdempotencyLayer::recover_abandoned) round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AbandonedRound {
    /// Abandoned records taken over.
    pub seen: usize,
    /// Completed with the hook's answer, replayed from now on.
    pub completed: usize,
    /// Completed with the hook's answer of a failure for good, replayed from now on.
    pub failed: usize,
    /// Marked `UNKNOWN`, to settle later.
    pub unknown: usize,
    /// Released: the next request with the key runs it.
    pub released: usize,
    /// Left as they were, `PROCESSING` under the round's fence until its lease passes, for a
    /// later round: the hook panicked or timed out, or the store failed to record the
    /// decision.
    pub left: usize,
}

impl fmt::Display for AbandonedRound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} abandoned records: {} completed, {} failed, {} unknown, {} released, {} left for \
             the next round",
            self.seen, self.completed, self.failed, self.unknown, self.released, self.left
        )
    }
}

/// Asks `hook` about `record` on a task of its own, for at most `timeout`: `Err` with why not
/// when it panicked or did not answer in time (the task is then stopped).
async fn ask(
    hook: Arc<AbandonedFn>,
    record: AbandonedRecord,
    timeout: Duration,
) -> Result<AbandonedRecovery, AbandonedVerdict> {
    let mut task = tokio::spawn(async move { hook(record).await });
    match tokio::time::timeout(timeout, &mut task).await {
        Ok(Ok(decided)) => Ok(decided),
        Ok(Err(e)) if e.is_panic() => Err(AbandonedVerdict::HookPanicked),
        // Cancelled: the runtime is shutting down.
        Ok(Err(_)) => Err(AbandonedVerdict::HookTimedOut),
        Err(_) => {
            task.abort();
            Err(AbandonedVerdict::HookTimedOut)
        }
    }
}

/// One round over the store's abandoned records; see
/// [`IdempotencyLayer::recover_abandoned`](super::IdempotencyLayer::recover_abandoned).
pub(super) async fn recover_abandoned<St: IdempotencyStore>(
    config: &Config<St>,
    limit: usize,
) -> Result<AbandonedRound, StoreError> {
    let mut round = AbandonedRound::default();
    // The round's lease covers the hook's whole time: no request takes the record over while
    // the hook decides.
    let lease = config.lease.max(config.abandoned_timeout);
    let taken = match config
        .store
        .take_abandoned(config.abandoned_grace, lease, limit)
        .await
    {
        Ok(taken) => taken,
        Err(e) => {
            tracing::warn!(
                error = &e as &dyn std::error::Error,
                "abandoned-record recovery: the store failed to take records over"
            );
            config.emit_report(ServerEventKind::AbandonedRoundFailed);
            return Err(e);
        }
    };
    for record in taken {
        round.seen += 1;
        let (key, fence) = (record.key.clone(), record.fence);
        let decided = match &config.recover_abandoned {
            Some(hook) => ask(hook.clone(), record, config.abandoned_timeout).await,
            None => Ok(abandoned_by_rule(&record.checkpoints)),
        };
        let verdict = match decided {
            Ok(decided) => {
                let verdict = decided.verdict();
                match settle_abandoned(config, &key, fence, decided).await {
                    Ok(()) => verdict,
                    // Moved meanwhile by someone else (an operator, or a request after a
                    // round slower than its lease): theirs stands.
                    Err(e) if e.is_stale() => {
                        round.seen -= 1;
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!(
                            tenant = key.tenant(),
                            operation = key.operation(),
                            key = key.key().as_str(),
                            fence = fence.get(),
                            error = &e as &dyn std::error::Error,
                            "abandoned-record recovery: the store failed to record the decision; left for the next round"
                        );
                        AbandonedVerdict::StoreFailed
                    }
                }
            }
            Err(why) => {
                tracing::warn!(
                    tenant = key.tenant(),
                    operation = key.operation(),
                    key = key.key().as_str(),
                    fence = fence.get(),
                    "abandoned-record recovery: the hook {}; left for the next round",
                    if why == AbandonedVerdict::HookPanicked {
                        "panicked"
                    } else {
                        "did not answer in time"
                    }
                );
                why
            }
        };
        match verdict {
            AbandonedVerdict::Completed => round.completed += 1,
            AbandonedVerdict::Failed => round.failed += 1,
            AbandonedVerdict::Unknown => round.unknown += 1,
            AbandonedVerdict::Released => round.released += 1,
            _ => round.left += 1,
        }
        config.emit_record(ServerEventKind::Abandoned { fence, verdict }, &key);
    }
    Ok(round)
}

/// Records `decided` on the record taken with `fence`.
async fn settle_abandoned<St: IdempotencyStore>(
    config: &Config<St>,
    key: &RecordKey,
    fence: Fence,
    decided: AbandonedRecovery,
) -> Result<(), StoreError> {
    match decided {
        AbandonedRecovery::Completed(res) | AbandonedRecovery::Failed(res) => {
            let (head, body) = res.into_parts();
            let stored = config
                .to_store(key, &head, &body)
                .map_err(StoreError::backend)?;
            config
                .store
                .complete(key, fence, &stored, config.retention)
                .await
        }
        AbandonedRecovery::Unknown(evidence) => {
            config
                .store
                .mark_unknown(key, fence, &bounded(evidence))
                .await
        }
        AbandonedRecovery::Released => config.store.release(key, fence).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_is_bounded_and_has_no_control_characters() {
        assert_eq!(bounded("a\u{0}b\nc".to_owned()), "a b c");
        let long = "é".repeat(2000);
        let cut = bounded(long);
        assert!(cut.len() <= MAX_EVIDENCE_BYTES);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
