//! The server side: the idempotency layer and its stores (memory, and PostgreSQL).

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod idempotency_server;
