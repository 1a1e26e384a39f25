//! Everything in memory: a `MemoryInbox`, the business state, and a broker that keeps each
//! negatively acknowledged task until its delay has passed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use surely::inbox::{Consumer, InboxStats, MemoryInbox, Processed, Task, TaskState};
use surely::outbox::Event;
use tokio::time::Instant;

use crate::handlers::{handle, Books, Ctx};
use crate::world::{consumer_for, Snapshot, World};
use crate::{lock, BoxError, FETCH, ORDERS, STOCK};

#[derive(Default)]
struct Shop {
    stock: i64,
    orders: HashMap<String, (i64, String)>,
    reservations: Vec<(String, i64)>,
    approvals: HashSet<String>,
    charges: Vec<(String, i64)>,
}

/// The business state, shared by the handlers and the story.
#[derive(Clone, Default)]
pub(crate) struct MemBooks(Arc<Mutex<Shop>>);

impl Books for MemBooks {
    async fn order(&self, order: &str) -> Result<Option<(i64, String)>, BoxError> {
        Ok(lock(&self.0).orders.get(order).cloned())
    }

    async fn in_stock(&self, _sku: &str) -> Result<i64, BoxError> {
        Ok(lock(&self.0).stock)
    }

    async fn reserve(&self, order: &str, _sku: &str, qty: i64) -> Result<i64, BoxError> {
        let mut shop = lock(&self.0);
        shop.stock -= qty;
        shop.reservations.push((order.to_owned(), qty));
        Ok(shop.stock)
    }

    async fn approved(&self, order: &str) -> Result<bool, BoxError> {
        Ok(lock(&self.0).approvals.contains(order))
    }

    async fn charged(&self, order: &str, amount: i64, _: &str) -> Result<(), BoxError> {
        lock(&self.0).charges.push((order.to_owned(), amount));
        Ok(())
    }
}

/// An in-process broker: each event is due at a time; a `nak` with a delay makes it due
/// again after the delay.
#[derive(Default)]
struct Broker {
    queue: Mutex<Vec<(Instant, Event)>>,
}

impl Broker {
    fn send(&self, event: Event, after: Duration) {
        lock(&self.queue).push((Instant::now() + after, event));
    }

    async fn fetch(&self, wait: Duration) -> Vec<Event> {
        let until = Instant::now() + wait;
        loop {
            let next = {
                let mut queue = lock(&self.queue);
                let now = Instant::now();
                let (mut due, rest): (Vec<_>, Vec<_>) =
                    queue.drain(..).partition(|(at, _)| *at <= now);
                *queue = rest;
                if !due.is_empty() {
                    due.sort_by_key(|(at, _)| *at);
                    return due.into_iter().map(|(_, e)| e).collect();
                }
                queue.iter().map(|(at, _)| *at).min()
            };
            if Instant::now() >= until {
                return Vec::new();
            }
            tokio::time::sleep_until(next.map_or(until, |n| n.min(until))).await;
        }
    }
}

pub(crate) struct MemWorld {
    inbox: MemoryInbox,
    books: MemBooks,
    broker: Broker,
}

impl MemWorld {
    pub(crate) fn new() -> Self {
        MemWorld {
            inbox: MemoryInbox::new(),
            books: MemBooks::default(),
            broker: Broker::default(),
        }
    }
}

impl World for MemWorld {
    type Delivery = Event;

    fn describe(&self) -> String {
        "embedded: MemoryInbox, the business state in memory, an in-process broker that \
         redelivers a waiting task after its delay"
            .to_owned()
    }

    async fn open(&self) -> Result<(), BoxError> {
        let mut shop = lock(&self.books.0);
        shop.stock = STOCK;
        for order in ORDERS {
            shop.orders
                .insert(order.to_owned(), (1, "placed".to_owned()));
        }
        Ok(())
    }

    async fn publish(&self, event: Event) -> Result<(), BoxError> {
        self.broker.send(event, Duration::ZERO);
        Ok(())
    }

    async fn fetch(&self, wait: Duration) -> Result<Vec<Event>, BoxError> {
        Ok(self.broker.fetch(wait).await)
    }

    async fn process(
        &self,
        consumers: &[Consumer; 2],
        event: Event,
        ctx: &Ctx,
    ) -> Result<(Consumer, Event, Processed), BoxError> {
        let consumer = consumer_for(consumers, &event).clone();
        let processed = self.process_event(&consumer, &event, ctx).await?;
        match &processed {
            Processed::Waiting(waiting) => self.broker.send(event.clone(), waiting.delay),
            processed if processed.is_settled() => {}
            // In flight or parked: not with these tasks, but a broker would redeliver it.
            _ => self.broker.send(event.clone(), FETCH),
        }
        Ok((consumer, event, processed))
    }

    async fn process_event(
        &self,
        consumer: &Consumer,
        event: &Event,
        ctx: &Ctx,
    ) -> Result<Processed, BoxError> {
        Ok(self
            .inbox
            .process_task(consumer, event, || handle(&self.books, ctx, event))
            .await?)
    }

    async fn tasks(&self, consumer: &str, state: Option<TaskState>) -> Result<Vec<Task>, BoxError> {
        Ok(self.inbox.tasks(Some(consumer), state, 100))
    }

    async fn task(&self, consumer: &str, event_id: &str) -> Result<Option<Task>, BoxError> {
        Ok(self.inbox.task(consumer, event_id))
    }

    async fn retry_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<(), BoxError> {
        Ok(self.inbox.retry_task(consumer, event_id, who, why)?)
    }

    async fn discard_task(
        &self,
        consumer: &str,
        event_id: &str,
        who: &str,
        why: &str,
    ) -> Result<Bytes, BoxError> {
        Ok(self.inbox.discard_task(consumer, event_id, who, why)?)
    }

    async fn take_retried(&self, consumer: &str) -> Result<Vec<Event>, BoxError> {
        Ok(self
            .inbox
            .take_retried(consumer, 10, std::time::Duration::from_secs(30)))
    }

    fn stats(&self) -> InboxStats {
        self.inbox.stats()
    }

    async fn cancel(&self, order: &str) -> Result<i64, BoxError> {
        let mut shop = lock(&self.books.0);
        let entry = shop
            .orders
            .get_mut(order)
            .ok_or_else(|| format!("no order {order}"))?;
        *entry = (entry.0 + 1, "cancelled".to_owned());
        Ok(entry.0)
    }

    async fn replenish(&self, qty: i64) -> Result<i64, BoxError> {
        let mut shop = lock(&self.books.0);
        shop.stock += qty;
        Ok(shop.stock)
    }

    async fn approve(&self, order: &str) -> Result<(), BoxError> {
        lock(&self.books.0).approvals.insert(order.to_owned());
        Ok(())
    }

    async fn snapshot(&self) -> Result<Snapshot, BoxError> {
        let shop = lock(&self.books.0);
        Ok(Snapshot {
            stock: shop.stock,
            reservations: shop.reservations.clone(),
            charges: shop.charges.clone(),
        })
    }
}
