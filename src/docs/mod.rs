//! A guide for the reviewer of an API built on surely: the questions to ask of every call
//! whose outcome you cannot always know, and where surely answers each.
//!
//! 1. [Which outcome states exist](outcomes): succeeded, failed, and *unknown*; and what each
//!    attempt's class means for the call.
//! 2. [Who retries](retries): one retry owner per chain, a budget so that an outage is not
//!    multiplied, and the requests that are never sent twice; retry amplification and hedging,
//!    measured.
//! 3. [What the key means](keys): one idempotency key per logical intent, the same on every
//!    attempt, and a server that honours it.
//! 4. [What happens at the deadline](deadlines): one budget per call, carried to every hop; no
//!    attempt started that cannot finish.
//! 5. [How to read the records](records): one line per attempt and per call, with the evidence
//!    for each decision; the server's events; metrics.
//! 6. [Across the asynchronous boundary](boundary): which segment of the outbox-to-inbox chain
//!    is exactly once and which is not, what the outbox promises, order and versions, and what
//!    to monitor.
//! 7. [When nobody knows](unknowns): the ledger of unknown calls, who settles them and how
//!    once, the manual queue, and what to monitor.
//! 8. [Overload and recovery](overload): whether a system comes back after its trigger is
//!    gone, and what deadline propagation, retry budgets and the breaker each contribute,
//!    measured.
//! 9. [The server's record of a key](server_states): what a request with the key gets in each
//!    state, an owner that dies and the recovery that follows, and the unknowns the server
//!    settles.
//! 10. [How the crate is built](architecture): its layers, bottom to top, and the rule that
//!     keeps them apart; the order of a client's layers, and why.
//! 11. [How we know](how_we_know): what is checked exhaustively (every interleaving of the
//!     shared state, the protocols' every state to a depth), what is simulated, what processes
//!     that really die show, and what none of it covers.
//! 12. [When two systems disagree](reconciliation): comparing systems' facts key by key, the
//!     rules, the grace window, differences with a repair id, repairs applied once, the manual
//!     queue.
//! 13. [The operator's surface](operators): seeing and settling what the system could not
//!     (the manual queue, the outbox's quarantine), who may, and the audit log of what they
//!     did.
//! 14. [Reviewing a chain](review): the seven questions asked of every operation, answered
//!     from the stacks' settings by `surely review`, and the findings it reports.
//!
//! Every example here is compiled and run as a test.

// A link to an item behind a feature is reference-style, and a build without the feature gets
// a definition of its label from `to_features!` below its chapter (see `links.rs`).
pub(crate) mod links;

pub mod how_we_know {
    #![doc = include_str!("how_we_know.md")]
    #![cfg_attr(
        not(feature = "hyper"),
        doc = crate::docs::links::to_features!(
            "crate::hyper::transport",
        )
    )]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::idempotency::IdempotencyLayerBuilder::recover",
            "crate::server::idempotency::IdempotencyLayer::settle_unknowns",
            "crate::server::idempotency::IdempotencyLayer",
            "crate::server::store::MemoryStore",
            "crate::server::idempotency::Ticket::checkpoint",
            "crate::server::idempotency::Ticket",
            "crate::server::idempotency::Ticket::fence",
        )
    )]
}

pub mod review {
    #![doc = include_str!("review.md")]
    #![cfg_attr(
        not(feature = "admin"),
        doc = crate::docs::links::to_features!(
            "crate::admin::AdminBuilder::review",
        )
    )]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::deadline::ServerDeadlineLayer::describe",
            "crate::server::idempotency::IdempotencyLayer::describe",
        )
    )]
    #![cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::inbox::Consumer::describe",
            "crate::ledger::Reconciler::describe",
        )
    )]
    #![cfg_attr(
        not(feature = "serde"),
        doc = crate::docs::links::to_features!(
            "crate::config::ClientConfig::apply",
        )
    )]
}

pub mod outcomes {
    #![doc = include_str!("outcomes.md")]
}

pub mod retries {
    #![doc = include_str!("retries.md")]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::deadline::ServerDeadlineLayer",
            "crate::server::deadline::ServerDeadlineLayerBuilder::trust_retry_signals",
        )
    )]
}

pub mod keys {
    #![doc = include_str!("keys.md")]
}

pub mod deadlines {
    #![doc = include_str!("deadlines.md")]
    #![cfg_attr(
        not(feature = "hyper"),
        doc = crate::docs::links::to_features!(
            "crate::hyper::transport_with",
        )
    )]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::deadline::ServerDeadlineLayer",
        )
    )]
}

pub mod records {
    #![doc = include_str!("records.md")]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::idempotency",
            "crate::server::idempotency::IdempotencyLayerBuilder::recorder",
            "crate::record::Recorder::record_server",
            "crate::record::ServerEvent",
            "crate::server::idempotency::IdempotencyLayer::report_stuck",
            "crate::server::limit",
            "crate::server::limit::AdaptiveLimitLayerBuilder::recorder",
            "crate::record::Recorder::record_limit",
            "crate::record::RefusalReason",
            "crate::server::deadline::RecheckLayer",
            "crate::server::limit::AdaptiveLimitLayer::report",
        )
    )]
    #![cfg_attr(
        not(feature = "tonic"),
        doc = crate::docs::links::to_features!(
            "crate::grpc::GrpcTransport",
        )
    )]
}

pub mod boundary {
    #![doc = include_str!("boundary.md")]
    #![cfg_attr(
        not(feature = "postgres"),
        doc = crate::docs::links::to_features!("crate::postgres::connect")
    )]
    #![cfg_attr(
        not(all(feature = "durable", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "crate::inbox::PostgresInbox",
        )
    )]
    #![cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::outbox",
            "crate::outbox::Relay",
            "crate::outbox::EventId",
            "crate::inbox",
            "crate::outbox::WebhookPublisher",
            "crate::outbox::Event",
            "crate::inbox::Versions",
            "crate::inbox::Wait",
            "crate::inbox::MemoryInbox::process_task",
            "crate::inbox::WaitPolicy::default_for",
            "crate::inbox::Wait::paced_by",
            "crate::inbox::Wait::stale",
            "crate::inbox::Wait::person",
            "crate::inbox::Consumer",
            "crate::inbox::Waiting",
            "crate::inbox::Step",
            "crate::inbox::TaskStore",
            "crate::inbox::InboxError",
            "crate::outbox::RelayBuilder::recorder",
            "crate::inbox::InboxStats",
            "crate::outbox::Wakeup",
        )
    )]
}

pub mod unknowns {
    #![doc = include_str!("unknowns.md")]
    #![cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::ledger",
            "crate::ledger::LedgerRecorder",
            "crate::ledger::Evidence",
            "crate::ledger::LedgerWrites::failed",
            "crate::ledger::LedgerRecorder::take_failed",
            "crate::ledger::LedgerRecorder::flush",
            "crate::ledger::Reconciler",
            "crate::ledger::Settled::Already",
            "crate::ledger::Ledger::settle_manually",
            "crate::ledger::Settlement::manual",
            "crate::ledger::LedgerStats",
            "crate::ledger::ReconcilerBuilder::alert_after",
            "crate::ledger::Ledger::sweep",
            "crate::ledger::MemoryLedger",
        )
    )]
}

pub mod overload {
    #![doc = include_str!("overload.md")]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::limit::AdaptiveLimitLayer",
            "crate::server::deadline::RecheckLayer",
            "crate::server::deadline::can_finish",
            "crate::server::limit::AdaptiveLimitLayerBuilder::partition",
        )
    )]
}

pub mod server_states {
    #![doc = include_str!("server_states.md")]
    #![cfg_attr(
        not(all(feature = "durable", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "crate::outbox::PostgresOutbox::enqueue",
        )
    )]
    #![cfg_attr(
        not(all(feature = "durable", feature = "server")),
        doc = crate::docs::links::to_features!(
            "crate::ledger::Reconciler::settle_server",
        )
    )]
    #![cfg_attr(
        not(all(feature = "server", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "crate::server::store::PostgresStore::checkpoint_in",
            "crate::server::idempotency::IdempotencyLayerBuilder::in_transaction",
            "crate::server::store::PostgresStore",
            "crate::server::store::PostgresStore::complete_in",
        )
    )]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::store::StoredResponse::buffer",
            "crate::record::ServerEventKind::StoredAnswerDiffers",
            "crate::server::idempotency::IdempotencyLayerBuilder::max_stored_bytes",
            "crate::server::ResponseBody",
        )
    )]
    #![cfg_attr(
        not(any(feature = "server", feature = "durable")),
        doc = crate::docs::links::to_features!(
            "crate::maintenance::Chore",
            "crate::maintenance::Maintenance",
        )
    )]
    #![cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::ledger::Reconciler",
        )
    )]
    #![cfg_attr(
        not(feature = "postgres"),
        doc = crate::docs::links::to_features!(
            "crate::postgres::InTransaction",
        )
    )]
    #![cfg_attr(
        not(feature = "redis"),
        doc = crate::docs::links::to_features!(
            "crate::server::store::RedisStore",
            "crate::server::store::RedisStore::with_backstop",
            "crate::server::store::RedisStore::cluster",
        )
    )]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::idempotency::IdempotencyLayer",
            "crate::server::store",
            "crate::server::store::IdempotencyStore::inspect",
            "crate::server::store::RecordState",
            "crate::server::idempotency::Reference",
            "crate::server::idempotency::IdempotencyLayerBuilder::rebuild",
            "crate::server::idempotency::IdempotencyLayerBuilder",
            "crate::server::idempotency::Seal",
            "crate::server::idempotency::IdempotencyLayer::sweep",
            "crate::server::idempotency::Ticket::checkpoint",
            "crate::server::idempotency::IdempotencyLayerBuilder::recover",
            "crate::server::idempotency::IdempotencyLayer::settle_unknowns",
            "crate::server::store::IdempotencyStore::unknowns",
            "crate::record::ServerEventKind",
            "crate::server::idempotency::IdempotencyLayer::recover_abandoned",
            "crate::server::store::IdempotencyStore::take_abandoned",
            "crate::server::idempotency::IdempotencyLayerBuilder::recover_abandoned",
            "crate::server::store::AbandonedRecord",
            "crate::server::idempotency::IdempotencyLayerBuilder::abandoned_grace",
            "crate::server::idempotency::IdempotencyLayer::recoverer",
            "crate::server::idempotency::IdempotencyLayer::sweeper",
            "crate::server::idempotency::IdempotencyLayerBuilder::abandoned_timeout",
            "crate::record::ServerEventKind::Abandoned",
            "crate::server::store::Checkpoint",
            "crate::server::store::MemoryStore",
            "crate::server::problem",
            "crate::server::idempotency::IdempotencyLayerBuilder::problem_base",
        )
    )]
}

pub mod architecture {
    #![doc = include_str!("architecture.md")]
    #![cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::inbox::InboxError::Handler",
        )
    )]
}

pub mod reconciliation {
    #![doc = include_str!("reconciliation.md")]
    #![cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::reconcile",
            "crate::reconcile::Source",
            "crate::reconcile::Rule",
            "crate::reconcile::Difference",
            "crate::reconcile::RepairId",
            "crate::reconcile::DifferenceStore",
            "crate::reconcile::MemoryDifferences",
            "crate::reconcile::Reconciler",
            "crate::reconcile::Repairer",
            "crate::reconcile::Want",
            "crate::reconcile::Rule::consistent",
            "crate::reconcile::Rule::repair",
            "crate::reconcile::RuleError",
            "crate::reconcile::DifferenceStore::record",
            "crate::reconcile::RepairRequest",
            "crate::reconcile::RepairAnswer::Applied",
            "crate::reconcile::RepairAnswer::Refused",
            "crate::reconcile::RuleError::GraceTooLong",
            "crate::reconcile::RepairerBuilder::name",
            "crate::reconcile::DifferenceStore::resolve_manually",
            "crate::reconcile::DifferenceStats",
            "crate::reconcile::RepairRequest::seen",
        )
    )]
}

pub mod operators {
    #![doc = include_str!("operators.md")]
    #![cfg_attr(
        not(all(any(feature = "server", feature = "durable"), feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "crate::maintenance::PostgresLeases",
        )
    )]
    #![cfg_attr(
        not(all(feature = "durable", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "crate::inbox::PostgresInbox::sweeper",
            "crate::outbox::PostgresOutbox::sweeper",
            "crate::ledger::PostgresLedger::sweeper",
            "crate::reconcile::PostgresDifferences::sweeper",
        )
    )]
    #![cfg_attr(
        not(any(feature = "server", feature = "durable")),
        doc = crate::docs::links::to_features!(
            "crate::maintenance::Maintenance",
            "crate::maintenance::MIN_RETENTION",
            "crate::maintenance::MaintenanceBuilder::duty",
            "crate::maintenance::MaintenanceHandle::last_reports",
        )
    )]
    #![cfg_attr(
        not(feature = "admin"),
        doc = crate::docs::links::to_features!(
            "crate::admin::AuditLog::sweeper",
            "crate::admin",
            "crate::admin::Admin::act",
            "crate::admin::Admin",
        )
    )]
    #![cfg_attr(
        not(feature = "durable"),
        doc = crate::docs::links::to_features!(
            "crate::outbox::OutboxStore::quarantined",
            "crate::outbox::OutboxStore::requeue",
            "crate::outbox::OutboxStore::discard",
            "crate::ledger::Ledger::settle_manually",
            "crate::ledger::Ledger::retry_now",
            "crate::inbox::TaskStore",
            "crate::outbox::RelayBuilder::no_sweep",
            "crate::ledger::ReconcilerBuilder::no_sweep",
            "crate::inbox::Processed::Stale",
            "crate::inbox::Processed::Duplicate",
            "crate::inbox::Versions::Any",
        )
    )]
    #![cfg_attr(
        not(feature = "server"),
        doc = crate::docs::links::to_features!(
            "crate::server::idempotency::IdempotencyLayerBuilder::archive",
            "crate::server::idempotency::IdempotencyLayer::sweeper",
            "crate::server::idempotency::IdempotencyLayer::sweep",
            "crate::server::idempotency::IdempotencyLayer::recoverer",
            "crate::server::idempotency::IdempotencyLayerBuilder::abandoned_grace",
        )
    )]
}
