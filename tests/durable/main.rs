//! What outlives a process, on the memory stores and on the machine's PostgreSQL and NATS
//! JetStream: migrations, the outbox and its relay, the inbox, the UNKNOWN ledger.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod durations;
mod inbox;
mod ledger;
mod outbox;
mod postgres;
mod reconcile;
