//! The server half of the contract: what a service does so that its callers' retries are safe.
//!
//! A client can retry a POST only if the server honours its key, and a deadline helps only if
//! the server reads it. The layers here are the server's side of what the client layers send:
//!
//! * [`deadline`]: [`ServerDeadlineLayer`](deadline::ServerDeadlineLayer) reads the caller's
//!   budget (`grpc-timeout` or a millisecond header), caps it by the server's own maximum,
//!   refuses a request whose budget is spent before any handler runs, and makes the deadline
//!   current for the handler, so every client stack called inside inherits it;
//! * [`idempotency`]: [`IdempotencyLayer`](idempotency::IdempotencyLayer) honours the
//!   `Idempotency-Key`: the first request with a key runs, a duplicate waits (409) or gets the
//!   stored response, another body under the same key is refused;
//! * [`limit`]: [`AdaptiveLimitLayer`](limit::AdaptiveLimitLayer) admits as many requests at
//!   once as the service can take without queueing, learns that number, and refuses the rest
//!   at once (`503`, `Retry-After`, not processed), the least critical first;
//! * `config` (feature `serde`): the settings of both layers, read from a file or the
//!   environment;
//! * [`store`]: where the keys' records live, in memory, (feature `postgres`) in PostgreSQL,
//!   completed inside the handler's own transaction, or (feature `redis`) in Redis, cache-grade.
//!
//! These sit above the client layers and their composition (a handler's own outgoing calls use
//! the client stack), and below the durable half (outbox, inbox, ledger).

mod answer;
mod body;
#[cfg(feature = "serde")]
pub mod config;
pub mod deadline;
pub mod idempotency;
pub mod limit;
pub mod problem;
pub mod store;

pub use body::ResponseBody;
