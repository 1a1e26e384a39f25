//! The stores the admin was given, behind object-safe traits: the admin holds any subset of
//! them, of any type, without a type parameter for each.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::inbox::{InboxError, Task, TaskState, TaskStats, TaskStore};
use crate::ledger::{
    Entry, EntryId, Filter, Ledger, LedgerError, LedgerStats, Settled, Settlement,
};
use crate::outbox::{Event, EventId, OutboxError, OutboxStore, Quarantined};
use crate::reconcile::{
    DifferenceStats, DifferenceStore, Item, ItemState, Marked, ReconcileError, RepairId,
};
use crate::record::OutboxStats;
use crate::server::store::{
    IdempotencyStore, RecordKey, RecordView, StoreError, StuckRecord, UnknownRecord,
};

pub(super) type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub(super) trait DynLedger: Send + Sync {
    fn list<'a>(&'a self, filter: &'a Filter) -> Fut<'a, Result<Vec<Entry>, LedgerError>>;
    fn get<'a>(&'a self, id: &'a EntryId) -> Fut<'a, Result<Option<Entry>, LedgerError>>;
    fn stats(&self) -> Fut<'_, Result<LedgerStats, LedgerError>>;
    fn settle<'a>(
        &'a self,
        id: &'a EntryId,
        settlement: &'a Settlement,
    ) -> Fut<'a, Result<Settled, LedgerError>>;
    fn retry_now<'a>(&'a self, id: &'a EntryId, note: &'a str) -> Fut<'a, Result<(), LedgerError>>;
}

impl<L: Ledger> DynLedger for L {
    fn list<'a>(&'a self, filter: &'a Filter) -> Fut<'a, Result<Vec<Entry>, LedgerError>> {
        Box::pin(Ledger::list(self, filter))
    }
    fn get<'a>(&'a self, id: &'a EntryId) -> Fut<'a, Result<Option<Entry>, LedgerError>> {
        Box::pin(Ledger::get(self, id))
    }
    fn stats(&self) -> Fut<'_, Result<LedgerStats, LedgerError>> {
        Box::pin(Ledger::stats(self))
    }
    fn settle<'a>(
        &'a self,
        id: &'a EntryId,
        settlement: &'a Settlement,
    ) -> Fut<'a, Result<Settled, LedgerError>> {
        Box::pin(Ledger::settle_manually(self, id, settlement))
    }
    fn retry_now<'a>(&'a self, id: &'a EntryId, note: &'a str) -> Fut<'a, Result<(), LedgerError>> {
        Box::pin(Ledger::retry_now(self, id, note))
    }
}

pub(super) trait DynOutbox: Send + Sync {
    fn stats(&self) -> Fut<'_, Result<OutboxStats, OutboxError>>;
    fn quarantined(&self, limit: usize) -> Fut<'_, Result<Vec<Quarantined>, OutboxError>>;
    fn quarantined_event<'a>(
        &'a self,
        id: &'a EventId,
    ) -> Fut<'a, Result<Option<Quarantined>, OutboxError>>;
    fn requeue<'a>(&'a self, id: &'a EventId) -> Fut<'a, Result<(), OutboxError>>;
    fn discard<'a>(&'a self, id: &'a EventId) -> Fut<'a, Result<Event, OutboxError>>;
}

impl<O: OutboxStore> DynOutbox for O {
    fn stats(&self) -> Fut<'_, Result<OutboxStats, OutboxError>> {
        Box::pin(OutboxStore::stats(self))
    }
    fn quarantined(&self, limit: usize) -> Fut<'_, Result<Vec<Quarantined>, OutboxError>> {
        Box::pin(OutboxStore::quarantined(self, limit))
    }
    fn quarantined_event<'a>(
        &'a self,
        id: &'a EventId,
    ) -> Fut<'a, Result<Option<Quarantined>, OutboxError>> {
        Box::pin(OutboxStore::quarantined_event(self, id))
    }
    fn requeue<'a>(&'a self, id: &'a EventId) -> Fut<'a, Result<(), OutboxError>> {
        Box::pin(OutboxStore::requeue(self, id))
    }
    fn discard<'a>(&'a self, id: &'a EventId) -> Fut<'a, Result<Event, OutboxError>> {
        Box::pin(OutboxStore::discard(self, id))
    }
}

pub(super) trait DynIdempotency: Send + Sync {
    fn unknowns(&self, limit: usize) -> Fut<'_, Result<Vec<UnknownRecord>, StoreError>>;
    fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Fut<'_, Result<Vec<StuckRecord>, StoreError>>;
    fn inspect<'a>(&'a self, key: &'a RecordKey)
        -> Fut<'a, Result<Option<RecordView>, StoreError>>;
}

impl<S: IdempotencyStore> DynIdempotency for S {
    fn unknowns(&self, limit: usize) -> Fut<'_, Result<Vec<UnknownRecord>, StoreError>> {
        Box::pin(IdempotencyStore::unknowns(self, limit))
    }
    fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Fut<'_, Result<Vec<StuckRecord>, StoreError>> {
        Box::pin(IdempotencyStore::stuck(self, older_than, limit))
    }
    fn inspect<'a>(
        &'a self,
        key: &'a RecordKey,
    ) -> Fut<'a, Result<Option<RecordView>, StoreError>> {
        Box::pin(IdempotencyStore::inspect(self, key))
    }
}

pub(super) trait DynDifferences: Send + Sync {
    fn list(
        &self,
        state: Option<ItemState>,
        limit: usize,
    ) -> Fut<'_, Result<Vec<Item>, ReconcileError>>;
    fn get<'a>(&'a self, id: &'a RepairId) -> Fut<'a, Result<Option<Item>, ReconcileError>>;
    fn stats(&self) -> Fut<'_, Result<DifferenceStats, ReconcileError>>;
    fn resolve<'a>(
        &'a self,
        id: &'a RepairId,
        who: &'a str,
        why: &'a str,
    ) -> Fut<'a, Result<Marked, ReconcileError>>;
}

impl<D: DifferenceStore> DynDifferences for D {
    fn list(
        &self,
        state: Option<ItemState>,
        limit: usize,
    ) -> Fut<'_, Result<Vec<Item>, ReconcileError>> {
        Box::pin(DifferenceStore::list(self, state, limit))
    }
    fn get<'a>(&'a self, id: &'a RepairId) -> Fut<'a, Result<Option<Item>, ReconcileError>> {
        Box::pin(DifferenceStore::get(self, id))
    }
    fn stats(&self) -> Fut<'_, Result<DifferenceStats, ReconcileError>> {
        Box::pin(DifferenceStore::stats(self))
    }
    fn resolve<'a>(
        &'a self,
        id: &'a RepairId,
        who: &'a str,
        why: &'a str,
    ) -> Fut<'a, Result<Marked, ReconcileError>> {
        Box::pin(DifferenceStore::resolve_manually(self, id, who, why))
    }
}

pub(super) trait DynTasks: Send + Sync {
    fn list<'a>(
        &'a self,
        state: Option<TaskState>,
        limit: usize,
    ) -> Fut<'a, Result<Vec<Task>, InboxError>>;
    fn get<'a>(
        &'a self,
        consumer: &'a str,
        event: &'a str,
    ) -> Fut<'a, Result<Option<Task>, InboxError>>;
    fn retry<'a>(
        &'a self,
        consumer: &'a str,
        event: &'a str,
        who: &'a str,
        why: &'a str,
    ) -> Fut<'a, Result<(), InboxError>>;
    fn discard<'a>(
        &'a self,
        consumer: &'a str,
        event: &'a str,
        who: &'a str,
        why: &'a str,
    ) -> Fut<'a, Result<bytes::Bytes, InboxError>>;
    fn stats(&self) -> Fut<'_, Result<TaskStats, InboxError>>;
}

impl<T: TaskStore> DynTasks for T {
    fn list<'a>(
        &'a self,
        state: Option<TaskState>,
        limit: usize,
    ) -> Fut<'a, Result<Vec<Task>, InboxError>> {
        Box::pin(TaskStore::list(self, None, state, limit))
    }
    fn get<'a>(
        &'a self,
        consumer: &'a str,
        event: &'a str,
    ) -> Fut<'a, Result<Option<Task>, InboxError>> {
        Box::pin(TaskStore::get(self, consumer, event))
    }
    fn retry<'a>(
        &'a self,
        consumer: &'a str,
        event: &'a str,
        who: &'a str,
        why: &'a str,
    ) -> Fut<'a, Result<(), InboxError>> {
        Box::pin(TaskStore::retry(self, consumer, event, who, why))
    }
    fn discard<'a>(
        &'a self,
        consumer: &'a str,
        event: &'a str,
        who: &'a str,
        why: &'a str,
    ) -> Fut<'a, Result<bytes::Bytes, InboxError>> {
        Box::pin(TaskStore::discard(self, consumer, event, who, why))
    }
    fn stats(&self) -> Fut<'_, Result<TaskStats, InboxError>> {
        Box::pin(TaskStore::stats(self))
    }
}
