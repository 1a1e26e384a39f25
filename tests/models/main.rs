//! The models and the simulations, in one binary: what is checked exhaustively or simulated
//! rather than run against the real services (`docs::how_we_know`).
//!
//! * [`protocols`]: the server's key protocol, the relay and the inbox, and the leased work
//!   queue as state machines, every reachable state checked with `stateright` (the models are
//!   the workspace's crate `surely-protocols`, built optimised);
//! * [`network`]: the real client stack against the real server layer over turmoil's simulated
//!   network, seeded and replayable;
//! * [`amplification`] and [`overload`]: the examples' simulators (`examples/amplification`,
//!   `examples/overload`) on reduced runs.
//!
//! `cargo test --release --test models -- --nocapture` runs them all; a module's name filters
//! (`cargo test --release --test models network::`).

mod amplification;
mod network;
mod overload;
mod protocols;
