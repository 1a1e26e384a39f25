//! The `reconciler` role: the ledger's `Reconciler` over the UNKNOWN calls the clients wrote,
//! and `Reconciler::settle_server` over the order service's UNKNOWN idempotency records, each
//! with a `Resolve` hook that asks the order table by key. The driver runs the same two, twice,
//! at the end.
//!
//! The client's calls (the ledger's entries):
//!
//! * the order exists: **succeeded**;
//! * a keyed order whose idempotency record is still `PROCESSING` or `UNKNOWN`, or that was
//!   paid without an order: **unknown** (the record settles first; a payment without its order
//!   is for a person);
//! * no order, and the newest entry of the key is younger than the grace (the call's deadline
//!   and a margin: a handler may still be about to commit): **unknown**, asked again later;
//! * no order past the grace: **failed**.
//!
//! The server's UNKNOWN records: the order exists: **succeeded** (the record completed with the
//! `201`, replayed from then on); paid without an order: **unknown** (stays listed for a
//! person); neither: **failed** (the record released: nothing happened, the next request with
//! the key runs it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use surely::idempotency::IdempotencyKey;
use surely::ledger::{Filter, Ledger, PostgresLedger, ReconcileRound, Reconciler, Settlement};
use surely::retry::backoff::Backoff;
use surely::retry::{Query, Resolution, Resolve, Resolving};
use surely::server::idempotency::{IdempotencyLayer, SettleRound};
use surely::server::store::{IdempotencyStore, RecordKey, RecordState};
use tokio::time::Instant;

use crate::crashpoint::{self, MID_RECONCILE};
use crate::world::{in_claim, is_keyed, RunStore, World};
use crate::{BoxError, GRACE};

/// How long a reconciler holds what it claimed.
pub(crate) const CLAIM_LEASE: Duration = Duration::from_secs(2);
/// One query's limit.
const QUERY_TIMEOUT: Duration = Duration::from_millis(800);
/// The wait before an entry left unknown is asked about again.
const AGAIN_AFTER: Duration = Duration::from_millis(300);
/// The reconciler role's wait between rounds.
const POLL: Duration = Duration::from_millis(300);
/// While the run goes on: how old an entry still unknown may get before the manual queue.
const MAX_AGE: Duration = Duration::from_secs(120);
/// At the end: what is still unknown past the grace goes to the manual queue.
const FINAL_MAX_AGE: Duration = Duration::from_secs(GRACE.as_secs() + 1);
/// The final reconciliation's limit.
const FINAL_LIMIT: Duration = Duration::from_secs(40);

/// What the resolvers look at: the order service's tables and store, and the ledger.
pub(crate) struct Facts {
    world: World,
    /// The order service's keys: PostgreSQL's table, or Redis.
    store: RunStore,
    pub(crate) ledger: PostgresLedger,
}

type Res = Response<Bytes>;

fn created(key: &str) -> Res {
    let mut res = Response::new(Bytes::from(key.to_owned()));
    *res.status_mut() = StatusCode::CREATED;
    res
}

impl Facts {
    pub(crate) fn new(world: &World) -> Result<Arc<Facts>, BoxError> {
        Ok(Arc::new(Facts {
            store: world.keys()?,
            ledger: world.ledger()?,
            world: world.clone(),
        }))
    }

    async fn count(&self, statement: &str, key: &str) -> Result<i64, BoxError> {
        let client = self.world.pool.get().await?;
        let row = client
            .query_one(&self.world.sql(statement), &[&key])
            .await?;
        Ok(row.get(0))
    }

    async fn orders(&self, key: &str) -> Result<i64, BoxError> {
        self.count("SELECT count(*) FROM {p}_orders WHERE key = $1", key)
            .await
    }

    async fn payments(&self, key: &str) -> Result<i64, BoxError> {
        self.count(
            "SELECT count(*) FROM {p}_payments WHERE order_key = $1",
            key,
        )
        .await
    }

    /// Whether the key's idempotency record is `PROCESSING` or `UNKNOWN`.
    async fn record_open(&self, key: &str) -> Result<bool, BoxError> {
        // The order service's records: one tenant, the operation named by method and path.
        let path = if in_claim(key) {
            "/orders-tx"
        } else {
            "/orders"
        };
        let record = RecordKey::new("", format!("POST {path}"), IdempotencyKey::new(key)?);
        Ok(match self.store.inspect(&record).await? {
            Some(view) => matches!(
                view.state,
                RecordState::Processing { .. } | RecordState::Unknown { .. }
            ),
            None => false,
        })
    }

    /// The age of the key's newest ledger entry.
    async fn youngest_entry(&self, key: &str) -> Result<Option<Duration>, BoxError> {
        Ok(self.ledger.by_key(key).await?.iter().map(|e| e.age).min())
    }

    /// The answer about a client's call.
    pub(crate) async fn about_call(&self, key: &str) -> Result<Resolution<Res>, BoxError> {
        if self.orders(key).await? > 0 {
            return Ok(Resolution::Succeeded(created(key)));
        }
        if is_keyed(key) && (self.record_open(key).await? || self.payments(key).await? > 0) {
            return Ok(Resolution::Unknown);
        }
        match self.youngest_entry(key).await? {
            Some(age) if age < GRACE => Ok(Resolution::Unknown),
            _ => Ok(Resolution::Failed),
        }
    }

    /// The answer about the server's UNKNOWN record.
    async fn about_record(&self, key: &str) -> Result<Resolution<Res>, BoxError> {
        if self.orders(key).await? > 0 {
            return Ok(Resolution::Succeeded(created(key)));
        }
        if self.payments(key).await? > 0 {
            return Ok(Resolution::Unknown);
        }
        Ok(Resolution::Failed)
    }
}

/// A resolver over the facts: for the client's calls or for the server's records. The crash
/// point `mid-reconcile` sits between the answer and its settlement.
#[derive(Clone)]
pub(crate) struct Asks {
    facts: Arc<Facts>,
    server: bool,
}

impl Resolve<Res> for Asks {
    fn resolve(&self, q: Query) -> Option<Resolving<Res>> {
        let facts = self.facts.clone();
        let server = self.server;
        Some(Resolving::new(async move {
            let Some(key) = q.key.map(|k| k.as_str().to_owned()) else {
                return Resolution::Unknown;
            };
            let answer = if server {
                facts.about_record(&key).await
            } else {
                facts.about_call(&key).await
            };
            crashpoint::at(MID_RECONCILE).await;
            answer.unwrap_or(Resolution::Unknown)
        }))
    }
}

/// The two reconcilers and the layer `settle_server` works on.
pub(crate) struct Reconcilers {
    calls: CallReconciler,
    records: CallReconciler,
    layer: IdempotencyLayer<RunStore>,
}

type CallReconciler = Reconciler<PostgresLedger, Asks, Res>;

fn reconciler(
    facts: &Arc<Facts>,
    server: bool,
    max_age: Duration,
) -> Result<CallReconciler, BoxError> {
    let asks = Asks {
        facts: facts.clone(),
        server,
    };
    Ok(Reconciler::builder(facts.ledger.clone(), asks)
        .batch(32)
        .lease(CLAIM_LEASE)
        .query_timeout(QUERY_TIMEOUT)
        .backoff(Backoff::constant(AGAIN_AFTER))
        .max_tries(1_000)
        .max_age(max_age)
        .alert_after(Duration::from_secs(3600))
        .no_sweep()
        .build()?)
}

pub(crate) fn reconcilers(facts: &Arc<Facts>, max_age: Duration) -> Result<Reconcilers, BoxError> {
    Ok(Reconcilers {
        calls: reconciler(facts, false, max_age)?,
        records: reconciler(facts, true, max_age)?,
        layer: IdempotencyLayer::builder(facts.store.clone()).build()?,
    })
}

impl Reconcilers {
    /// One round of each.
    pub(crate) async fn round(&mut self) -> Result<(ReconcileRound, SettleRound), BoxError> {
        let calls = self.calls.run_once().await?;
        let records = self.records.settle_server(&self.layer).await?;
        Ok((calls, records))
    }
}

pub(crate) async fn run() -> Result<(), BoxError> {
    let stopped = crashpoint::control();
    let world = World::from_env()?;
    world.reach_postgres().await?;
    let facts = Facts::new(&world)?;
    let mut both = reconcilers(&facts, MAX_AGE)?;
    crashpoint::ready();
    let stop = crashpoint::stop_of(stopped);
    tokio::pin!(stop);
    loop {
        match both.round().await {
            Ok((calls, records)) => {
                if calls.stale > 0 && crashpoint::resumed() {
                    // Paused past the claim's lease while another reconciler took the entries
                    // over: their settlements are refused.
                    crashpoint::say(&format!(
                        "note late-write-refused:reconciler-settle n {}",
                        calls.stale
                    ));
                }
                let settled = calls.succeeded + calls.failed + calls.to_manual;
                if settled + records.completed + records.released > 0 {
                    crashpoint::say(&format!(
                        "note reconciled succeeded {} failed {} manual {} completed {} released {}",
                        calls.succeeded,
                        calls.failed,
                        calls.to_manual,
                        records.completed,
                        records.released
                    ));
                }
            }
            Err(e) => eprintln!("reconciler: {e}"),
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// What the final reconciliation did.
pub(crate) struct Final {
    /// The first reconciliation's rounds, summed.
    pub(crate) calls: ReconcileRound,
    pub(crate) records: SettleRound,
    pub(crate) rounds: usize,
    /// The second reconciliation's round.
    pub(crate) again_calls: ReconcileRound,
    pub(crate) again_records: SettleRound,
    /// Whether the ledger and the server's unknown records were the same after the second.
    pub(crate) same: bool,
    /// Entries left open or claimed after the first reconciliation (it ran out of time).
    pub(crate) left_open: u64,
}

/// The ledger's entries and the server's unknown records, as they stand.
async fn snapshot(facts: &Facts) -> Result<BTreeMap<String, String>, BoxError> {
    let mut all = BTreeMap::new();
    for e in facts.ledger.list(&Filter::new().limit(1_000_000)).await? {
        let verdict = e.settlement.as_ref().map_or(String::new(), describe);
        all.insert(
            format!("entry {}", e.evidence.id),
            format!("{} {verdict}", e.state.as_str()),
        );
    }
    for u in facts.store.unknowns(100_000).await? {
        all.insert(
            format!("record {}", u.key.key().as_str()),
            format!("unknown fence {}", u.fence.get()),
        );
    }
    Ok(all)
}

fn describe(s: &Settlement) -> String {
    format!("{} {}", s.verdict.as_str(), s.evidence)
}

fn add(sum: &mut ReconcileRound, r: &ReconcileRound) {
    sum.claimed += r.claimed;
    sum.succeeded += r.succeeded;
    sum.failed += r.failed;
    sum.already += r.already;
    sum.retried += r.retried;
    sum.to_manual += r.to_manual;
    sum.stale += r.stale;
    sum.errors += r.errors;
}

/// Reconciliation, twice: the first until nothing is open (what stays unknown past the grace
/// goes to the manual queue), then a second, fresh pair of reconcilers for one round.
pub(crate) async fn twice(world: &World) -> Result<Final, BoxError> {
    let facts = Facts::new(world)?;
    let mut first = reconcilers(&facts, FINAL_MAX_AGE)?;
    let mut calls = ReconcileRound::default();
    let mut records = SettleRound::default();
    let mut rounds = 0;
    let until = Instant::now() + FINAL_LIMIT;
    let left_open = loop {
        let (c, r) = first.round().await?;
        rounds += 1;
        add(&mut calls, &c);
        records.seen += r.seen;
        records.completed += r.completed;
        records.released += r.released;
        records.unknown += r.unknown;
        let stats = facts.ledger.stats().await?;
        // An intent in doubt is claimed once its hold (the call's deadline and the journal's
        // grace) has passed: wait for it too.
        let open = stats.in_doubt + stats.open + stats.claimed;
        if open == 0 || Instant::now() >= until {
            break open;
        }
        tokio::time::sleep(AGAIN_AFTER).await;
    };
    let before = snapshot(&facts).await?;
    let mut second = reconcilers(&facts, FINAL_MAX_AGE)?;
    let (again_calls, again_records) = second.round().await?;
    let after = snapshot(&facts).await?;
    Ok(Final {
        calls,
        records,
        rounds,
        again_calls,
        again_records,
        same: before == after,
        left_open,
    })
}
