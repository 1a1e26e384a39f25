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
//!
//! Every example here is compiled and run as a test.

// A link to an item behind a feature is reference-style, and a build without the feature gets
// a definition of its label from `to_features!` below its chapter (see `links.rs`).
pub(crate) mod links;

pub mod how_we_know {
    #![doc = include_str!("how_we_know.md")]
}

pub mod outcomes {
    #![doc = include_str!("outcomes.md")]
}

pub mod retries {
    #![doc = include_str!("retries.md")]
}

pub mod keys {
    #![doc = include_str!("keys.md")]
}

pub mod deadlines {
    #![doc = include_str!("deadlines.md")]
}

pub mod records {
    #![doc = include_str!("records.md")]
}

pub mod boundary {
    #![doc = include_str!("boundary.md")]
}

pub mod unknowns {
    #![doc = include_str!("unknowns.md")]
}

pub mod overload {
    #![doc = include_str!("overload.md")]
}

pub mod server_states {
    #![doc = include_str!("server_states.md")]
}

pub mod architecture {
    #![doc = include_str!("architecture.md")]
}

pub mod reconciliation {
    #![doc = include_str!("reconciliation.md")]
}

pub mod operators {
    #![doc = include_str!("operators.md")]
}
