//! Recovery after a takeover, and settling the records whose outcome is unknown.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};

use super::layer::Config;
use crate::classify::{AttemptClass, Classification, DeliveryPhase};
use crate::ids::{BusinessKey, Operation};
use crate::record::ServerEventKind;
use crate::resolve::{Query, Resolution, Resolve};
use crate::server::store::{
    Checkpoint, Fence, IdempotencyStore, RecordKey, RequestDigest, StoreError,
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
