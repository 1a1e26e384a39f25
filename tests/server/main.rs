//! The server side: the idempotency layer and its stores (memory, PostgreSQL and Redis), the
//! adaptive limit, and the server layers configured from a file or the environment.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod config;
mod defaults;
mod durations;
mod idempotency_draft;
mod idempotency_server;
mod limit;
mod maintenance;
mod problems;
mod shape;
