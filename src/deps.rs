//! The third-party crates whose types appear in this crate's API, re-exported in one place so
//! that a service builds against the same versions: async-nats (the outbox's JetStream
//! publisher, feature `nats`), lapin (the outbox's RabbitMQ publisher, feature `rabbitmq`),
//! deadpool-postgres and tokio-postgres (the pool and the transactions of the PostgreSQL
//! stores, feature `postgres`), pgwire-replication (the log relay's replication connection,
//! feature `postgres-log`), redis (the connection of the Redis idempotency store, feature
//! `redis`).

#[cfg(feature = "nats")]
pub use async_nats;
#[cfg(feature = "postgres")]
pub use deadpool_postgres;
#[cfg(feature = "rabbitmq")]
pub use lapin;
#[cfg(feature = "postgres-log")]
pub use pgwire_replication;
#[cfg(feature = "redis")]
pub use redis;
#[cfg(feature = "postgres")]
pub use tokio_postgres;
