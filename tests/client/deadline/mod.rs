//! The deadline layers through the public API: the client `SetDeadlineLayer`, the
//! `ServerDeadlineLayer`, both together over a real hyper server, and property tests for the
//! deadline arithmetic.

mod client;
mod e2e;
mod props;
mod server;
mod support;
