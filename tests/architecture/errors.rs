//! Every public error is `Send + Sync + 'static` (the architecture chapter of the docs, "The
//! surface a release keeps"): an error that is not cannot cross a `tokio::spawn`, sit in a
//! `Box<dyn Error + Send + Sync>` (tower's `BoxError`), or go into `anyhow`.
//!
//! The list below holds a static assertion per error: this binary does not compile if one of
//! them loses an auto trait. It is complete by construction: a test reads `public-api.txt` (the
//! crate's public surface, every feature on, which `.ci/run` holds the code to) and fails if a
//! type the listing shows implementing `std::error::Error` is not in the list, or if the list
//! names one that no longer does. A generic error is asserted with a `Send + Sync` argument:
//! it is then `Send + Sync` itself.

use std::collections::BTreeSet;

/// Compiles only for a `T` that is `Send + Sync + 'static`.
fn send_sync_static<T: Send + Sync + 'static>() {}

macro_rules! public_errors {
    ($($(#[$cfg:meta])* $ty:ty,)*) => {
        /// Never called: the assertions hold once it compiles.
        #[allow(dead_code)]
        fn assertions() {
            $($(#[$cfg])* send_sync_static::<$ty>();)*
        }

        /// The errors asserted, as written (features aside).
        const ASSERTED: &[&str] = &[$(stringify!($ty)),*];
    };
}

public_errors! {
    #[cfg(feature = "admin")] surely::admin::ActionError,
    #[cfg(feature = "admin")] surely::admin::AuditError,
    surely::breaker::CircuitOpen,
    surely::budget::BudgetExhausted,
    surely::deadline::codec::ParseTimeoutError,
    surely::deadline::DeadlineExceeded,
    surely::fault::InjectedFault,
    surely::idempotency::InvalidKey,
    #[cfg(feature = "durable")] surely::inbox::InboxError<std::io::Error>,
    #[cfg(feature = "durable")] surely::inbox::UnknownReason,
    surely::journal::JournalError,
    #[cfg(feature = "durable")] surely::ledger::LedgerError,
    #[cfg(feature = "durable")] surely::outbox::InvalidEvent,
    #[cfg(feature = "durable")] surely::outbox::OutboxError,
    #[cfg(feature = "rabbitmq")] surely::outbox::RabbitError,
    #[cfg(feature = "postgres-log")] surely::outbox::LogError,
    #[cfg(feature = "durable")] surely::outbox::WebhookError,
    #[cfg(feature = "postgres")] surely::postgres::ConnectError,
    #[cfg(feature = "postgres")] surely::postgres::MigrateError,
    surely::pushback::InvalidRetryAfter,
    #[cfg(feature = "durable")] surely::reconcile::RuleError,
    #[cfg(feature = "durable")] surely::reconcile::ReconcileError,
    surely::retry::BodyNotReplayable,
    surely::review::ReviewError,
    #[cfg(feature = "server")] surely::server::idempotency::UnknownErrorCode,
    #[cfg(feature = "server")] surely::server::store::InvalidCheckpoint,
    #[cfg(feature = "server")] surely::server::store::StoreError,
    surely::timeout::BodyIdle,
    surely::timeout::Elapsed,
    surely::BoxedError,
    surely::ConfigError,
    surely::Error<std::io::Error>,
    surely::InvalidCriticality,
}

/// A type's path without its generic arguments or spaces: `surely::Error`.
fn bare(ty: &str) -> String {
    let ty: String = ty.chars().filter(|c| !c.is_whitespace()).collect();
    ty.split('<').next().unwrap_or_default().to_owned()
}

/// The types `public-api.txt` shows implementing `std::error::Error`: lines such as
/// `impl core::error::Error for surely::ConfigError` or
/// `impl<E> core::error::Error for surely::Error<E> where ...`.
fn listed_errors(listing: &str) -> BTreeSet<String> {
    listing
        .lines()
        .filter(|line| line.starts_with("impl"))
        .filter_map(|line| line.split_once(" core::error::Error for "))
        .map(|(_, ty)| bare(ty.split(" where ").next().unwrap_or(ty)))
        .collect()
}

#[test]
fn every_public_error_is_asserted_send_sync_static() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("public-api.txt");
    let listing = std::fs::read_to_string(&path).expect("public-api.txt is readable");
    let listed = listed_errors(&listing);
    assert!(
        listed.contains("surely::ConfigError"),
        "public-api.txt shows no error at all: is it the listing `scripts/public_api.sh` writes?"
    );
    let asserted: BTreeSet<String> = ASSERTED.iter().map(|t| bare(t)).collect();
    let missing: Vec<_> = listed.difference(&asserted).collect();
    assert!(
        missing.is_empty(),
        "public errors without a Send + Sync + 'static assertion in tests/architecture/errors.rs: {missing:?}"
    );
    let stale: Vec<_> = asserted.difference(&listed).collect();
    assert!(
        stale.is_empty(),
        "tests/architecture/errors.rs asserts types that public-api.txt shows as no public error: {stale:?}"
    );
}

#[test]
fn the_reader_finds_errors_in_a_listing() {
    let listing = "\
pub struct surely::ConfigError
impl core::error::Error for surely::ConfigError
impl<E> core::error::Error for surely::Error<E> where E: core::error::Error + 'static
impl core::fmt::Display for surely::Elapsed
pub fn surely::Error<E>::source(&self) -> core::option::Option<&(dyn core::error::Error + 'static)>
";
    let found: Vec<_> = listed_errors(listing).into_iter().collect();
    assert_eq!(found, ["surely::ConfigError", "surely::Error"]);
    assert_eq!(
        bare("surely::inbox::InboxError < std::io::Error >"),
        "surely::inbox::InboxError"
    );
}
