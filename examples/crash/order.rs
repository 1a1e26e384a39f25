//! The `order` role: the order service. A hyper server with surely's `ServerDeadlineLayer` and
//! `IdempotencyLayer` over a `PostgresStore`, on the port the driver gives it (the same port
//! across restarts).
//!
//! `POST /orders` with the order's key as its body:
//!
//! 1. notes the arrival (a row in `arrivals`, committed at once: how often a request reached
//!    the handler);
//! 2. keyed requests pay: the payment id (`pay-{key}`) is recorded as the checkpoint `payment`
//!    with `PostgresStore::checkpoint_in`, in a transaction with the service's own
//!    `payment_requests` row, which holds the call's deadline on the provider's clock; the
//!    payment provider is then called with it (a row in `payments`, committed in a
//!    transaction of its own: the provider is not idempotent, a second call is a second
//!    payment, but it refuses a call that reaches it after its deadline, so that an owner
//!    stalled past its lease cannot pay after a recovery found "not paid"; a recovery trusts
//!    "not paid" only once every recorded call is past its deadline); then the checkpoint
//!    `paid` records that it went through
//!    (`Ticket::checkpoint`). [Crash point `after-payment` sits between the payment and the
//!    `paid` checkpoint.]
//! 3. one transaction: the order row, its `OrderCreated` outbox event and, for a keyed request,
//!    the idempotency record completed with the `201` (`PostgresStore::complete_in`). Before it
//!    has paid, a handler past its deadline rolls back and answers "not processed".
//!    [Crash point `after-commit` sits between the commit and the reply.]
//!
//! `POST /orders-tx` (keys `t-…`) goes through a second `IdempotencyLayer` on the same store,
//! built with `in_transaction()`: the layer claims the key in a transaction, the handler notes
//! the arrival, then writes the order row and its `OrderCreated` event through that
//! transaction's connection ([crash point `in-claim`] there, uncommitted), and the layer stores
//! the `201` and commits all three together ([crash point `after-claim-commit`] after the
//! commit, before the reply). No payment: this mode is for handlers whose every effect is in
//! the database. A killed process takes its open transaction with it.
//!
//! A request that takes over a record whose owner died goes through the recovery hook first:
//! with `paid` recorded, or nothing recorded, it resumes; with only `payment` recorded, it asks
//! the payment provider whether `pay-{key}` went through and resumes with the answer (the
//! handler then records `paid` without paying, or pays with the same id); if the provider does
//! not answer, the record becomes UNKNOWN. An incarnation started with `CRASH_HOOK=0` stands for
//! an older build without the hook: its takeovers follow the layer's rule (a record with a
//! checkpoint becomes UNKNOWN, for `Reconciler::settle_server`).
//!
//! A record whose owner died with its client has no request to take it over: every
//! [`ABANDONED_ROUND`] the service runs `IdempotencyLayer::recover_abandoned`, whose hook
//! decides without running the handler: nothing recorded, released (the order's transaction
//! rolled back with its owner); a payment recorded, the provider asked: not paid, released (the
//! next request pays with the same id); paid, UNKNOWN (paid without an order: for a person, as
//! the reconciler says); no answer, UNKNOWN. Without the hook, the layer's rule (a checkpoint:
//! UNKNOWN; none: released).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use surely::deadline::Deadline;
use surely::headers::NOT_PROCESSED;
use surely::outbox::PostgresOutbox;
use surely::server::deadline::ServerDeadlineLayer;
use surely::server::idempotency::{
    AbandonedRecovery, IdempotencyLayer, Recovery, Takeover, Ticket,
};
use surely::server::limit::AdaptiveLimitLayer;
use surely::server::store::{
    AbandonedRecord, Checkpoint, KeyedTransaction, PostgresStore, StoredResponse,
};
use surely::server::ResponseBody;
use tokio::net::TcpListener;
use tower::util::Either;
use tower::util::MapResponseLayer;
use tower::{ServiceBuilder, ServiceExt};

use crate::crashpoint::{self, AFTER_CLAIM_COMMIT, AFTER_COMMIT, AFTER_PAYMENT, IN_CLAIM};
use crate::world::{in_claim, is_keyed, order_created, payment_id, RunStore, World};
use crate::{chain, BoxError, ABANDONED_ROUND, ABANDONED_TIMEOUT, LEASE, RENEW_FOR};

/// The address the order service listens on.
pub(crate) const ENV_ADDR: &str = "CRASH_ORDER_ADDR";
/// `0`: this incarnation has no recovery hook.
pub(crate) const ENV_HOOK: &str = "CRASH_HOOK";
/// The checkpoint naming the payment a handler is about to make.
const PAYMENT: &str = "payment";
/// The checkpoint saying that payment went through.
const PAID: &str = "paid";
/// The recovery hook's limit for its question to the payment provider (well under the lease).
const HOOK_QUERY: Duration = Duration::from_millis(400);
/// How long a payment call may take to reach the provider (its deadline, on the provider's
/// clock, from its intent): well under the hook's limit, which waits it out once.
const PAY_WITHIN: Duration = Duration::from_millis(150);

/// What the recovery hook found out about a payment, for the handler that resumes.
#[derive(Clone, Copy, Debug)]
enum Found {
    Paid,
    NotPaid,
}

struct Orders {
    world: World,
    /// The PostgreSQL table of keys: the claims in the handler's transaction, and (unless the
    /// keys are on Redis) the completions in it.
    store: PostgresStore,
    /// The keys are on Redis (`--store redis`): no transaction with them, so the effects are
    /// made idempotent downstream instead (the order by its key, the payment by its id).
    on_redis: bool,
    outbox: PostgresOutbox,
    /// The hook's findings, by key and the new owner's fence: the hook runs in the request's
    /// task just before the handler.
    found: Mutex<HashMap<(String, u64), Found>>,
    pid: i32,
}

/// Why a request was not carried out.
enum Refused {
    /// Nothing happened: the layer releases the record, and a retry runs the handler.
    NotProcessed(StatusCode, String),
    /// Something may have happened (a payment): answered with an error, stored and replayed,
    /// never run again blindly.
    Failed(String),
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(body.into()));
    *res.status_mut() = status;
    res
}

impl Orders {
    async fn arrive(&self, key: &str, keyed: bool, from: Option<i64>) -> Result<(), BoxError> {
        let client = self.world.pool.get().await?;
        client
            .execute(
                &self.world.sql(
                    "INSERT INTO {p}_arrivals (key, keyed, pid, client) VALUES ($1, $2, $3, $4)",
                ),
                &[&key, &keyed, &self.pid, &from],
            )
            .await?;
        Ok(())
    }

    /// The payment provider: one payment per call, in a transaction of its own. The call
    /// carries its deadline (`pay_by`, microseconds since the epoch on the provider's clock),
    /// and the provider refuses one that arrives after it: an owner stalled past its lease (a
    /// partition holds its connection) cannot pay once a recovery found "not paid" and let
    /// another owner pay. Returns whether it paid.
    async fn pay(&self, id: &str, key: &str, pay_by: i64) -> Result<bool, BoxError> {
        if self.on_redis {
            return self.pay_idempotently(id, key, pay_by).await;
        }
        let client = self.world.pool.get().await?;
        let n = client
            .execute(
                &self.world.sql(
                    "INSERT INTO {p}_payments (payment_id, order_key, pid)
                     SELECT $1, $2, $3
                     WHERE clock_timestamp() < to_timestamp($4::int8 / 1000000.0)",
                ),
                &[&id, &key, &self.pid, &pay_by],
            )
            .await?;
        Ok(n == 1)
    }

    /// The payment provider as a service on Redis needs it: idempotent by the payment's id
    /// (one per order key), so that a key whose record Redis lost, run again, pays nothing
    /// twice. Returns whether the payment is made (now or before).
    async fn pay_idempotently(&self, id: &str, key: &str, pay_by: i64) -> Result<bool, BoxError> {
        let mut client = self.world.pool.get().await?;
        let txn = client.transaction().await?;
        txn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&id])
            .await?;
        let row = txn
            .query_one(
                &self.world.sql(
                    "SELECT EXISTS (SELECT 1 FROM {p}_payments WHERE payment_id = $1),
                            clock_timestamp() < to_timestamp($2::int8 / 1000000.0)",
                ),
                &[&id, &pay_by],
            )
            .await?;
        let (paid, in_time): (bool, bool) = (row.get(0), row.get(1));
        if !paid && in_time {
            txn.execute(
                &self.world.sql(
                    "INSERT INTO {p}_payments (payment_id, order_key, pid) VALUES ($1, $2, $3)",
                ),
                &[&id, &key, &self.pid],
            )
            .await?;
        }
        txn.commit().await?;
        Ok(paid || in_time)
    }

    /// What the provider says of `id`: how many payments it holds, and whether every call
    /// recorded for it is past its deadline, so that none can still land. A recovery takes
    /// "not paid" as final only then; before, it waits for the deadline (at most
    /// `PAY_WITHIN`) and asks again.
    async fn payments(&self, id: &str) -> Result<i64, BoxError> {
        for _ in 0..2 {
            let client = self.world.pool.get().await?;
            let row = client
                .query_one(
                    &self.world.sql(
                        "SELECT (SELECT count(*) FROM {p}_payments WHERE payment_id = $1),
                                COALESCE((SELECT max(pay_by) FROM {p}_payment_requests
                                          WHERE payment_id = $1) <= clock_timestamp(), true)",
                    ),
                    &[&id],
                )
                .await?;
            let (paid, settled): (i64, bool) = (row.get(0), row.get(1));
            if paid > 0 || settled {
                return Ok(paid);
            }
            drop(client);
            tokio::time::sleep(PAY_WITHIN).await;
        }
        Err(format!("a call for {id} may still reach the provider").into())
    }

    /// Pays for `key` once across owners: skips a payment a previous owner recorded as paid,
    /// or that the recovery hook found at the provider.
    async fn pay_once(
        &self,
        key: &str,
        ticket: &Ticket,
        deadline: Option<Deadline>,
    ) -> Result<(), Refused> {
        if ticket.recorded(PAID).is_some() {
            return Ok(());
        }
        let id = payment_id(key);
        let fence = ticket.fence().get();
        let pay = match ticket.recorded(PAYMENT) {
            None => {
                if deadline.is_some_and(Deadline::is_expired) {
                    return Err(Refused::NotProcessed(
                        StatusCode::GATEWAY_TIMEOUT,
                        "past the deadline".into(),
                    ));
                }
                true
            }
            Some(_) => {
                let found = self
                    .found
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&(key.to_owned(), fence));
                match found {
                    Some(Found::Paid) => false,
                    Some(Found::NotPaid) => true,
                    // Only a takeover brings a previous owner's checkpoints, and the hook
                    // answered for it; never pay blindly.
                    None => {
                        return Err(Refused::Failed(format!(
                            "{id} was recorded by a previous owner and no recovery finding came with the takeover"
                        )))
                    }
                }
            }
        };
        if pay {
            // Each call records its intent (and its deadline) first: a new owner's call after
            // a recovery found "not paid" carries a deadline of its own.
            let pay_by = self
                .record_intent(&id, key, ticket)
                .await
                .map_err(|e| Refused::NotProcessed(StatusCode::SERVICE_UNAVAILABLE, e))?;
            // The provider may have taken it even if the call failed: never "not processed".
            let paid = self
                .pay(&id, key, pay_by)
                .await
                .map_err(|e| Refused::Failed(format!("the payment {id} failed: {e}")))?;
            if !paid {
                return Err(Refused::Failed(format!(
                    "the payment {id} reached the provider after its deadline: refused, not paid"
                )));
            }
            crashpoint::at(AFTER_PAYMENT).await;
        }
        ticket.checkpoint(PAID, &id).await.map_err(|e| {
            if e.is_stale() && crashpoint::resumed() {
                // Paused past the lease while another owner took the key over: refused.
                crashpoint::say(&format!(
                    "note late-write-refused:order-checkpoint key {key} n 1"
                ));
            }
            Refused::Failed(format!("the checkpoint {PAID}={id} failed: {e}"))
        })
    }

    /// The checkpoint `payment` and the service's own request row, in one transaction. The
    /// row holds the call's deadline on the provider's clock (the database's), `PAY_WITHIN`
    /// from now: returned, in microseconds since the epoch, for the call to carry.
    async fn record_intent(&self, id: &str, key: &str, ticket: &Ticket) -> Result<i64, String> {
        let go = async {
            let mut client = self.world.pool.get().await?;
            let txn = client.transaction().await?;
            let within = PAY_WITHIN.as_micros() as i64;
            let row = txn
                .query_one(
                    &self.world.sql(
                        "INSERT INTO {p}_payment_requests (payment_id, order_key, pid, pay_by)
                         VALUES ($1, $2, $3, clock_timestamp() + $4::int8 * interval '1 microsecond')
                         RETURNING (extract(epoch FROM pay_by) * 1000000)::int8",
                    ),
                    &[&id, &key, &self.pid, &within],
                )
                .await?;
            if self.on_redis {
                // No transaction with Redis: the intent's row first, then its checkpoint. A
                // crash between the two leaves a row and no checkpoint: no payment was made.
                txn.commit().await?;
                ticket.checkpoint(PAYMENT, id).await?;
            } else {
                self.store
                    .checkpoint_in(&txn, ticket, &Checkpoint::new(PAYMENT, id)?)
                    .await?;
                txn.commit().await?;
            }
            Ok::<_, BoxError>(row.get::<_, i64>(0))
        };
        go.await.map_err(|e| chain(&*e))
    }

    /// The order, its event and (keyed) the idempotency record, in one transaction. With
    /// `deadline`, rolls back if it has passed before the commit.
    async fn write_order(
        &self,
        key: &str,
        ticket: Option<&Ticket>,
        stored: &StoredResponse,
        deadline: Option<Deadline>,
    ) -> Result<bool, BoxError> {
        let event = order_created(key)?;
        let mut client = self.world.pool.get().await?;
        let txn = client.transaction().await?;
        if self.on_redis && ticket.is_some() {
            // Idempotent by the key: a run again after Redis lost the record writes nothing.
            txn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&key])
                .await?;
            let written = txn
                .execute(
                    &self.world.sql(
                        "INSERT INTO {p}_orders (key, keyed, pid) SELECT $1, true, $2
                         WHERE NOT EXISTS (SELECT 1 FROM {p}_orders WHERE key = $1)",
                    ),
                    &[&key, &self.pid],
                )
                .await?;
            if written == 1 {
                self.outbox.enqueue(&txn, &event).await?;
            } else {
                crashpoint::say(&format!("note order-again-absorbed {key}"));
            }
        } else {
            txn.execute(
                &self
                    .world
                    .sql("INSERT INTO {p}_orders (key, keyed, pid) VALUES ($1, $2, $3)"),
                &[&key, &ticket.is_some(), &self.pid],
            )
            .await?;
            self.outbox.enqueue(&txn, &event).await?;
            if let Some(ticket) = ticket {
                self.store.complete_in(&txn, ticket, stored).await?;
            }
        }
        if deadline.is_some_and(Deadline::is_expired) {
            txn.rollback().await?;
            return Ok(false);
        }
        txn.commit().await?;
        Ok(true)
    }

    async fn create(
        &self,
        key: &str,
        ticket: Option<Ticket>,
        deadline: Option<Deadline>,
        from: Option<i64>,
    ) -> Result<Response<Full<Bytes>>, Refused> {
        let not_processed =
            |e: BoxError| Refused::NotProcessed(StatusCode::SERVICE_UNAVAILABLE, chain(&*e));
        self.arrive(key, ticket.is_some(), from)
            .await
            .map_err(not_processed)?;
        if let Some(ticket) = &ticket {
            self.pay_once(key, ticket, deadline).await?;
        }
        let body = Bytes::from(key.to_owned());
        let stored = StoredResponse::new(StatusCode::CREATED, &HeaderMap::new(), body.clone());
        // Once paid, the order is written whatever the deadline: the payment is not undone.
        let check = if ticket.is_some() { None } else { deadline };
        match self.write_order(key, ticket.as_ref(), &stored, check).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(Refused::NotProcessed(
                    StatusCode::GATEWAY_TIMEOUT,
                    "past the deadline: rolled back".into(),
                ))
            }
            Err(e) if ticket.is_some() => {
                return Err(Refused::Failed(format!(
                    "paid, and the order's write failed: {}",
                    chain(&*e)
                )))
            }
            Err(e) => return Err(not_processed(e)),
        }
        crashpoint::at(AFTER_COMMIT).await;
        Ok(reply(StatusCode::CREATED, body))
    }

    /// The recovery hook: decides from the checkpoints, and asks the provider about a payment
    /// recorded as started and not as done.
    async fn recover(self: Arc<Self>, t: Takeover) -> Recovery {
        let key = t.key.key().as_str().to_owned();
        let fence = t.fence.get();
        if t.checkpoint(PAID).is_some() {
            crashpoint::say(&format!("note takeover {key} paid-recorded"));
            return Recovery::Resume;
        }
        let Some(id) = t.checkpoint(PAYMENT).map(str::to_owned) else {
            // It never reached the provider; its transaction rolled back with it.
            crashpoint::say(&format!("note takeover {key} nothing-recorded"));
            return Recovery::Resume;
        };
        match tokio::time::timeout(HOOK_QUERY, self.payments(&id)).await {
            Ok(Ok(n)) => {
                let found = if n > 0 { Found::Paid } else { Found::NotPaid };
                crashpoint::say(&format!("note takeover {key} asked-provider-{found:?}"));
                self.found
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((key, fence), found);
                Recovery::Resume
            }
            Ok(Err(e)) => {
                crashpoint::say(&format!("note takeover {key} provider-failed"));
                Recovery::Unknown(format!("the payment provider failed for {id}: {e}"))
            }
            Err(_) => {
                crashpoint::say(&format!("note takeover {key} provider-silent"));
                Recovery::Unknown(format!(
                    "the payment provider did not answer for {id} within {}ms",
                    HOOK_QUERY.as_millis()
                ))
            }
        }
    }
}

impl Orders {
    /// The abandoned-record hook: no request, so never the handler; the payment provider
    /// asked about a payment recorded as started.
    async fn abandoned(self: Arc<Self>, r: AbandonedRecord) -> AbandonedRecovery {
        let key = r.key.key().as_str().to_owned();
        let Some(id) = r
            .checkpoint(PAYMENT)
            .or(r.checkpoint(PAID))
            .map(str::to_owned)
        else {
            crashpoint::say(&format!("note abandoned {key} nothing-recorded"));
            return AbandonedRecovery::Released;
        };
        match tokio::time::timeout(HOOK_QUERY, self.payments(&id)).await {
            Ok(Ok(0)) => {
                crashpoint::say(&format!("note abandoned {key} not-paid"));
                AbandonedRecovery::Released
            }
            Ok(Ok(_)) => {
                crashpoint::say(&format!("note abandoned {key} paid"));
                AbandonedRecovery::Unknown(format!(
                    "{id} was paid and the order was never written; its owner died with its client"
                ))
            }
            Ok(Err(e)) => {
                crashpoint::say(&format!("note abandoned {key} provider-failed"));
                AbandonedRecovery::Unknown(format!("the payment provider failed for {id}: {e}"))
            }
            Err(_) => {
                crashpoint::say(&format!("note abandoned {key} provider-silent"));
                AbandonedRecovery::Unknown(format!(
                    "the payment provider did not answer for {id} within {}ms",
                    HOOK_QUERY.as_millis()
                ))
            }
        }
    }
}

/// `POST /orders-tx`: the order and its event, written in the transaction in which the layer
/// claimed the key; the layer commits them with the key's record.
async fn handle_in_claim(
    orders: Arc<Orders>,
    req: Request<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let key = String::from_utf8_lossy(
        &body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default(),
    )
    .into_owned();
    let Some(txn) = parts.extensions.get::<KeyedTransaction>().cloned() else {
        return Ok(reply(StatusCode::BAD_REQUEST, "t-… keys come keyed"));
    };
    if !in_claim(&key) {
        return Ok(reply(StatusCode::BAD_REQUEST, "only t-… keys here"));
    }
    let deadline = parts.extensions.get::<Deadline>().copied();
    let from = parts
        .headers
        .get(crate::client::CLIENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let written = async {
        orders.arrive(&key, true, from).await?;
        let event = order_created(&key)?;
        let client = txn.client().await?;
        client
            .execute(
                &orders
                    .world
                    .sql("INSERT INTO {p}_orders (key, keyed, pid) VALUES ($1, $2, $3)"),
                &[&key, &true, &orders.pid],
            )
            .await?;
        orders.outbox.enqueue(&client, &event).await?;
        Ok::<_, BoxError>(())
    };
    let not_processed = |status: StatusCode, why: String| {
        // The layer rolls the transaction back: nothing of it stays.
        let mut res = reply(status, why);
        res.headers_mut()
            .insert(NOT_PROCESSED, HeaderValue::from_static("true"));
        res
    };
    if let Err(e) = written.await {
        return Ok(not_processed(StatusCode::SERVICE_UNAVAILABLE, chain(&*e)));
    }
    crashpoint::at(IN_CLAIM).await;
    if deadline.is_some_and(Deadline::is_expired) {
        return Ok(not_processed(
            StatusCode::GATEWAY_TIMEOUT,
            "past the deadline: rolled back".into(),
        ));
    }
    Ok(reply(StatusCode::CREATED, key))
}

async fn handle(
    orders: Arc<Orders>,
    req: Request<Full<Bytes>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    // On Redis there is no claim in a transaction: `/orders-tx` is served here too.
    let tx_path = orders.on_redis && parts.uri.path() == "/orders-tx";
    if parts.method != Method::POST || (parts.uri.path() != "/orders" && !tx_path) {
        return Ok(reply(StatusCode::NOT_FOUND, ""));
    }
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let key = String::from_utf8_lossy(&body).into_owned();
    let ticket = parts.extensions.get::<Ticket>().cloned();
    if ticket.is_some() != is_keyed(&key) {
        return Ok(reply(
            StatusCode::BAD_REQUEST,
            "k-… keys come keyed, u-… keys not",
        ));
    }
    let deadline = parts.extensions.get::<Deadline>().copied();
    // Which client incarnation sent it: whether a killed client's call went out at all.
    let from = parts
        .headers
        .get(crate::client::CLIENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    Ok(match orders.create(&key, ticket, deadline, from).await {
        Ok(res) => res,
        Err(Refused::NotProcessed(status, why)) => {
            let mut res = reply(status, why);
            res.headers_mut()
                .insert(NOT_PROCESSED, HeaderValue::from_static("true"));
            res
        }
        Err(Refused::Failed(why)) => reply(StatusCode::INTERNAL_SERVER_ERROR, why),
    })
}

/// What a harness adds to the order service: the adaptive concurrency limit in front of both
/// idempotency layers (inside the deadline layer), and the layers' retention of completed
/// records (default: the layer's own).
#[derive(Default)]
pub(crate) struct Extras {
    pub(crate) limit: Option<AdaptiveLimitLayer>,
    pub(crate) retention: Option<Duration>,
}

pub(crate) async fn run() -> Result<(), BoxError> {
    serve(Extras::default()).await
}

/// The order service, with what `extras` adds.
pub(crate) async fn serve(extras: Extras) -> Result<(), BoxError> {
    let stopped = crashpoint::control();
    let world = World::from_env()?;
    let addr: SocketAddr = std::env::var(ENV_ADDR)?.parse()?;
    let hook = std::env::var(ENV_HOOK).map_or(true, |v| v != "0");
    world.reach_postgres().await?;
    let keys = world.keys()?;
    let orders = Arc::new(Orders {
        store: world.store()?,
        on_redis: matches!(keys, RunStore::Redis(_)),
        outbox: world.outbox()?,
        world,
        found: Mutex::new(HashMap::new()),
        pid: std::process::id() as i32,
    });
    let mut builder = IdempotencyLayer::builder(keys)
        .lease(LEASE)
        .renew_for(RENEW_FOR)
        .abandoned_timeout(ABANDONED_TIMEOUT);
    let mut claims = IdempotencyLayer::builder(orders.store.clone())
        .lease(LEASE)
        .in_transaction();
    if let Some(retention) = extras.retention {
        builder = builder.retention(retention);
        claims = claims.retention(retention);
    }
    if hook {
        let o = orders.clone();
        builder = builder.recover(move |t: Takeover| o.clone().recover(t));
        let o = orders.clone();
        builder = builder.recover_abandoned(move |r: AbandonedRecord| o.clone().abandoned(r));
    }
    let layer = builder.build()?;
    // The rounds over abandoned records, for as long as the process lives.
    let rounds = layer.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(ABANDONED_ROUND);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match rounds.recover_abandoned(100).await {
                Ok(round) if round.seen > 0 => crashpoint::say(&format!(
                    "note abandoned-round seen {} completed {} failed {} unknown {} released {} left {}",
                    round.seen,
                    round.completed,
                    round.failed,
                    round.unknown,
                    round.released,
                    round.left
                )),
                Ok(_) => {}
                // Said, and tried again next round.
                Err(e) => crashpoint::say(&format!("note abandoned-round-failed {}", chain(&e))),
            }
        }
    });
    let claims = claims.build()?;
    let o = orders.clone();
    let in_claim = ServiceBuilder::new()
        .layer(
            ServerDeadlineLayer::builder()
                .max(Duration::from_secs(10))
                .build()?,
        )
        .layer(optional(extras.limit.clone()))
        .layer(claims)
        .service_fn(move |req| handle_in_claim(o.clone(), req));
    let orders_on_redis = orders.on_redis;
    let plain = ServiceBuilder::new()
        .layer(
            ServerDeadlineLayer::builder()
                .max(Duration::from_secs(10))
                .build()?,
        )
        .layer(optional(extras.limit))
        .layer(layer)
        .service_fn(move |req| handle(orders.clone(), req));
    let on_redis = orders_on_redis;
    let svc = tower::service_fn(move |req: Request<hyper::body::Incoming>| {
        let claimed = req.method() == Method::POST && req.uri().path() == "/orders-tx" && !on_redis;
        let (plain, in_claim) = (plain.clone(), in_claim.clone());
        async move {
            if !claimed {
                return plain.oneshot(req).await;
            }
            let res = in_claim.oneshot(req).await?;
            if res.status() == StatusCode::CREATED
                && !res.headers().contains_key("idempotent-replayed")
            {
                crashpoint::at(AFTER_CLAIM_COMMIT).await;
            }
            Ok(res)
        }
    });
    let listener = listen(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    crashpoint::ready();
    let stop = crashpoint::stop_of(stopped);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return Ok(()),
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let svc = TowerToHyperService::new(svc.clone());
                tokio::spawn(async move {
                    // A connection that breaks ends here; the client sees it.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        }
    }
}

/// The handler's body wrapped as the limit's.
type Wrap<B> = MapResponseLayer<fn(Response<B>) -> Response<ResponseBody<B>>>;

/// The limit when the run has one; without, the same answer type (the handler's body in a
/// [`ResponseBody`]), so both services have one type.
fn optional<B>(limit: Option<AdaptiveLimitLayer>) -> Either<AdaptiveLimitLayer, Wrap<B>> {
    match limit {
        Some(limit) => Either::Left(limit),
        None => Either::Right(MapResponseLayer::new(|res: Response<B>| {
            res.map(ResponseBody::new)
        })),
    }
}

/// The service's listener on `addr`, shared (`SO_REUSEPORT`) with another incarnation that
/// still holds it: one paused by the driver while this one takes over. The kernel spreads new
/// connections over both, as a load balancer would over a live instance and a stalled one.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}
