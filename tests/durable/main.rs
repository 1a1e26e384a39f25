//! What outlives a process, on the memory stores and on the machine's PostgreSQL and NATS
//! JetStream: migrations, the outbox and its relay, the inbox, the UNKNOWN ledger.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod bounds;
mod durations;
mod inbox;
mod ledger;
mod outbox;
mod postgres;
mod reconcile;

/// An error and its sources, `: `-separated: what an error-chain printer shows. The durable
/// half's errors say their cause once, in their source.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}
