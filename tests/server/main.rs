//! The server side: the idempotency layer and its stores (memory, and PostgreSQL), and the
//! adaptive limit.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod idempotency_server;
mod limit;
