//! The client side, one module per layer or concern: classification, outcomes, the retry
//! decision matrix, retries and their owner, backoff, budgets, the breaker, hedging, timeouts,
//! deadlines (client and server halves together), replayable bodies, the client idempotency
//! key, the fault layer, the header codecs, the record layers, the one-call client stack (over
//! HTTP, and around a plain service of its own types), and its configuration from a file or the
//! environment.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod backoff;
mod breaker;
mod budget;
mod classify;
mod client;
mod codec;
mod config;
mod deadline;
mod decision_matrix;
mod defaults;
mod durations;
mod fault;
mod hedge;
mod idempotency;
mod outcome;
mod plain;
mod record;
mod replay;
mod retry;
mod retry_owner;
mod send;
mod timeout;
