//! The server's side of the deadline: read the caller's budget, cap it, refuse a spent one
//! before any handler runs, and make it current for the handler.
//!
//! The budget arrives as a *relative* value (`grpc-timeout`, or a millisecond header written by
//! the client's [`SetDeadlineLayer`](crate::deadline::SetDeadlineLayer)); an inbound header can shorten
//! the server's own budget, never lengthen it. See [`ServerDeadlineLayer`] and the
//! [deadlines chapter](crate::docs::deadlines).

pub mod future;
mod layer;
pub mod recheck;
mod service;

pub use self::layer::{ServerDeadlineLayer, ServerDeadlineLayerBuilder};
pub use self::recheck::{can_finish, Recheck, RecheckLayer};
pub use self::service::ServerDeadline;

/// What the [`ServerDeadlineLayer`] does with a malformed deadline header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Malformed {
    /// Answer 400 (HTTP) or `INVALID_ARGUMENT` (gRPC) without calling the handler. The default:
    /// a client that sends garbage has a bug worth seeing.
    #[default]
    Reject,
    /// Ignore the header, as if it were absent (the server's own maximum still applies).
    Ignore,
}
