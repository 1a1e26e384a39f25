//! The UNKNOWN ledger: entries written as part of the call, worked down by reconcilers.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use surely::ledger::{
    Claim, Entry, EntryId, EntryState, Evidence, Filter, Ledger, LedgerError, LedgerStats, Settled,
    Settlement, Verdict,
};
use surely::record::BusinessKey;
use surely::retry::{Query, Resolve, Resolving};

pub(crate) use crate::support::call;
pub(crate) use crate::support::time::secs;

/// An order, with its number as the business key.
pub(crate) fn order(id: &str) -> Request<String> {
    let mut req = Request::post("/orders").body(id.to_owned()).unwrap();
    req.extensions_mut().insert(BusinessKey::new(id));
    req
}

/// The client stack with `$recorder` and the resolver `$resolver`, over an order service that
/// places every order and whose first reply is lost: an unknown outcome (the POST is not
/// keyed, so it is not sent again).
macro_rules! unknown_client {
    ($recorder:expr, $resolver:expr) => {
        surely::client()
            .recorder($recorder)
            .retry(|r| r.resolver($resolver))
            .build(
                tower::ServiceBuilder::new()
                    .layer(surely::fault::InjectFaultLayer::new(
                        surely::fault::Schedule::new().at(0, surely::fault::Fault::ResetAfterSend),
                    ))
                    .service(tower::service_fn(|_req: http::Request<String>| async {
                        Ok::<_, std::io::Error>(http::Response::new(String::from("placed")))
                    })),
            )
            .unwrap()
    };
}

/// The client stack with `$recorder`, over a service that answers `$status`.
macro_rules! answering_client {
    ($recorder:expr, $status:expr) => {
        surely::client()
            .recorder($recorder)
            .build(tower::service_fn(|_req: http::Request<String>| async {
                Ok::<_, std::io::Error>(
                    http::Response::builder()
                        .status($status)
                        .body(String::new())
                        .unwrap(),
                )
            }))
            .unwrap()
    };
}

mod journal;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;

/// `t` cut to the microsecond: what PostgreSQL keeps.
pub(crate) fn micros(t: std::time::SystemTime) -> std::time::SystemTime {
    use std::time::UNIX_EPOCH;
    let since = t.duration_since(UNIX_EPOCH).unwrap();
    UNIX_EPOCH + Duration::from_micros(since.as_micros() as u64)
}

/// A resolver that may decline (`None`): one that cannot query some calls.
pub(crate) struct Declining<F>(pub(crate) F);

impl<F> Resolve<String> for Declining<F>
where
    F: Fn(Query) -> Option<Resolving<String>>,
{
    fn resolve(&self, query: Query) -> Option<Resolving<String>> {
        (self.0)(query)
    }
}

/// A ledger that fails the next `n` records or settlements, as a database that is down or a
/// process that dies before its commit.
#[derive(Clone)]
pub(crate) struct FlakyLedger<L> {
    pub(crate) inner: L,
    fail_records: Arc<AtomicU32>,
    fail_settles: Arc<AtomicU32>,
    records_tried: Arc<AtomicU32>,
}

impl<L: Ledger + Clone> FlakyLedger<L> {
    pub(crate) fn new(inner: L) -> Self {
        FlakyLedger {
            inner,
            fail_records: Arc::default(),
            fail_settles: Arc::default(),
            records_tried: Arc::default(),
        }
    }

    pub(crate) fn fail_records(&self, n: u32) {
        self.fail_records.store(n, Ordering::SeqCst);
    }

    pub(crate) fn fail_settles(&self, n: u32) {
        self.fail_settles.store(n, Ordering::SeqCst);
    }

    pub(crate) fn records_tried(&self) -> u32 {
        self.records_tried.load(Ordering::SeqCst)
    }
}

/// Takes one failure from `left`, if any are left.
fn take(left: &AtomicU32) -> bool {
    left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl<L: Ledger + Clone> Ledger for FlakyLedger<L> {
    fn record(
        &self,
        evidence: &Evidence,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        self.records_tried.fetch_add(1, Ordering::SeqCst);
        let fail = take(&self.fail_records);
        let inner = self.inner.clone();
        let evidence = evidence.clone();
        async move {
            if fail {
                return Err(LedgerError::backend("the database is down"));
            }
            inner.record(&evidence).await
        }
    }

    fn record_in_doubt(
        &self,
        evidence: &Evidence,
        hold: Duration,
    ) -> impl Future<Output = Result<bool, LedgerError>> + Send {
        self.records_tried.fetch_add(1, Ordering::SeqCst);
        let fail = take(&self.fail_records);
        let inner = self.inner.clone();
        let evidence = evidence.clone();
        async move {
            if fail {
                return Err(LedgerError::backend("the database is down"));
            }
            inner.record_in_doubt(&evidence, hold).await
        }
    }

    fn forget_in_doubt(
        &self,
        ids: &[EntryId],
    ) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        self.inner.forget_in_doubt(ids)
    }

    fn claim(
        &self,
        max: usize,
        lease: Duration,
    ) -> impl Future<Output = Result<Vec<Claim>, LedgerError>> + Send {
        self.inner.claim(max, lease)
    }

    fn settle(
        &self,
        claim: &Claim,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Settled, LedgerError>> + Send {
        let fail = take(&self.fail_settles);
        let inner = self.inner.clone();
        let (claim, settlement) = (claim.clone(), settlement.clone());
        async move {
            if fail {
                return Err(LedgerError::backend("the process died before the commit"));
            }
            inner.settle(&claim, &settlement).await
        }
    }

    fn retry_later(
        &self,
        claim: &Claim,
        note: &str,
        after: Duration,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        self.inner.retry_later(claim, note, after)
    }

    fn to_manual(
        &self,
        claim: &Claim,
        reason: &str,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send {
        self.inner.to_manual(claim, reason)
    }

    fn settle_manually(
        &self,
        id: &EntryId,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<Settled, LedgerError>> + Send {
        self.inner.settle_manually(id, settlement)
    }

    fn get(&self, id: &EntryId) -> impl Future<Output = Result<Option<Entry>, LedgerError>> + Send {
        self.inner.get(id)
    }

    fn list(
        &self,
        filter: &Filter,
    ) -> impl Future<Output = Result<Vec<Entry>, LedgerError>> + Send {
        self.inner.list(filter)
    }

    fn stats(&self) -> impl Future<Output = Result<LedgerStats, LedgerError>> + Send {
        self.inner.stats()
    }

    fn sweep(&self, retention: Duration) -> impl Future<Output = Result<u64, LedgerError>> + Send {
        self.inner.sweep(retention)
    }
}

/// A person sends a manual entry back to the reconcilers: open, claimable at once, with the
/// note; a claimed or settled entry is refused as a conflict, an unknown one as not found.
pub(crate) async fn retry_now_sends_a_manual_entry_back(ledger: impl Ledger, id: EntryId) {
    let evidence = Evidence::new("o-retry", "POST /orders").with_id(id.clone());
    ledger.record(&evidence).await.unwrap();
    let lease = Duration::from_secs(30);
    let claim = ledger.claim(10, lease).await.unwrap().remove(0);
    ledger.to_manual(&claim, "cannot query").await.unwrap();

    ledger
        .retry_now(&id, "ana: the order service is back")
        .await
        .unwrap();
    let entry = ledger.get(&id).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Open);
    assert_eq!(
        entry.note.as_deref(),
        Some("ana: the order service is back")
    );
    assert_eq!(entry.tries, 1, "kept");

    let again = ledger.claim(10, lease).await.unwrap();
    assert_eq!(again.len(), 1, "claimable at once");
    assert!(again[0].fence() > claim.fence());
    let held = ledger.retry_now(&id, "why").await.unwrap_err();
    assert!(held.is_conflict(), "{held}");
    assert_eq!(
        held.to_string(),
        format!("ledger entry {id} is claimed, not open or manual")
    );
    // The old claim is stale.
    assert!(ledger
        .to_manual(&claim, "late")
        .await
        .unwrap_err()
        .is_stale());

    let settled = Settlement::manual(Verdict::Succeeded, "ana", "found it").unwrap();
    ledger.settle_manually(&id, &settled).await.unwrap();
    assert!(ledger
        .retry_now(&id, "why")
        .await
        .unwrap_err()
        .is_conflict());
    let none = EntryId::new("unk-none").unwrap();
    assert!(ledger
        .retry_now(&none, "why")
        .await
        .unwrap_err()
        .is_not_found());
}
