//! The tasks' handlers, the same in both modes: what they read and write of the business goes
//! through [`Books`], in memory or in the inbox's transaction.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::StatusCode;
use surely::inbox::Wait;
use surely::outbox::Event;
use tokio::time::Instant;

use crate::channel::Channel;
use crate::{lock, ms, text, BoxError, CHARGE, LIMIT, RESERVE, SUPPLIER_ETA};

/// What a handler reads and writes of the business: in memory, or in the inbox's transaction.
pub(crate) trait Books: Sync {
    /// The order's version and status.
    fn order(
        &self,
        order: &str,
    ) -> impl Future<Output = Result<Option<(i64, String)>, BoxError>> + Send;
    /// What is in stock of `sku` (in the transaction, locked until it ends).
    fn in_stock(&self, sku: &str) -> impl Future<Output = Result<i64, BoxError>> + Send;
    /// Takes `qty` of `sku` for `order`; what is left.
    fn reserve(
        &self,
        order: &str,
        sku: &str,
        qty: i64,
    ) -> impl Future<Output = Result<i64, BoxError>> + Send;
    /// Whether a person approved a charge over the limit for `order`.
    fn approved(&self, order: &str) -> impl Future<Output = Result<bool, BoxError>> + Send;
    /// Keeps the channel's `reference` for a charge of `amount` to `order`.
    fn charged(
        &self,
        order: &str,
        amount: i64,
        reference: &str,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// What the handlers share: the channel, and when each task's handler ran.
#[derive(Clone)]
pub(crate) struct Ctx {
    pub(crate) channel: Channel,
    pub(crate) runs: Arc<Mutex<HashMap<String, Vec<Instant>>>>,
}

impl Ctx {
    fn ran(&self, event: &Event) {
        lock(&self.runs)
            .entry(event.id().as_str().to_owned())
            .or_default()
            .push(Instant::now());
    }

    /// The handlers' runs, all tasks together.
    pub(crate) fn total(&self) -> usize {
        lock(&self.runs).values().map(Vec::len).sum()
    }

    pub(crate) fn runs(&self, event: &Event) -> Vec<Instant> {
        lock(&self.runs)
            .get(event.id().as_str())
            .cloned()
            .unwrap_or_default()
    }
}

/// A store or the channel failed: a transient wait, the error kept as its source.
fn blip(e: BoxError) -> Wait {
    Wait::transient(&e).caused_by(e)
}

/// A task's handler, the same in both modes.
pub(crate) async fn handle<B: Books>(books: &B, ctx: &Ctx, event: &Event) -> Result<Bytes, Wait> {
    ctx.ran(event);
    let payload = text(event.payload());
    let words: Vec<&str> = payload.split_whitespace().collect();
    match (event.kind(), words.as_slice()) {
        (RESERVE, [order, sku, qty]) => match qty.parse() {
            Ok(qty) => reserve(books, event, order, sku, qty).await,
            Err(_) => Err(malformed(event, &payload)),
        },
        (CHARGE, [order, amount]) => match amount.parse() {
            Ok(amount) => charge(books, ctx, order, amount).await,
            Err(_) => Err(malformed(event, &payload)),
        },
        _ => Err(malformed(event, &payload)),
    }
}

/// A payload this consumer cannot read: a person looks at it.
fn malformed(event: &Event, payload: &str) -> Wait {
    Wait::person(
        "the payload check",
        format!("a {} task with payload {payload:?}", event.kind()),
    )
}

async fn reserve<B: Books>(
    books: &B,
    event: &Event,
    order: &str,
    sku: &str,
    qty: i64,
) -> Result<Bytes, Wait> {
    let Some((version, status)) = books.order(order).await.map_err(blip)? else {
        return Err(Wait::person(
            "the order check",
            format!("order {order} does not exist"),
        ));
    };
    if version > event.version() {
        return Err(Wait::stale(version, format!("order {order} is {status}")));
    }
    let in_stock = books.in_stock(sku).await.map_err(blip)?;
    if in_stock < qty {
        let why = format!(
            "{in_stock} of {sku} in stock, {qty} needed; the supplier's delivery is due in {}",
            ms(SUPPLIER_ETA)
        );
        return Err(Wait::business(why).after(SUPPLIER_ETA));
    }
    let left = books.reserve(order, sku, qty).await.map_err(blip)?;
    Ok(format!("reserved {qty} of {sku}, {left} left").into())
}

async fn charge<B: Books>(books: &B, ctx: &Ctx, order: &str, amount: i64) -> Result<Bytes, Wait> {
    if amount > LIMIT && !books.approved(order).await.map_err(blip)? {
        return Err(Wait::person(
            "the payment limit rule",
            format!("{amount} is over the {LIMIT} limit, and order {order} has no approval"),
        ));
    }
    let answer = ctx.channel.charge(order, amount).await.map_err(blip)?;
    match answer.status {
        StatusCode::CREATED => {
            books
                .charged(order, amount, &answer.body)
                .await
                .map_err(blip)?;
            Ok(format!("charged {amount}: {}", answer.body).into())
        }
        StatusCode::TOO_MANY_REQUESTS => Err(Wait::paced_by(&answer.headers)),
        other => Err(Wait::transient(format!("the channel answered {other}"))),
    }
}
