//! Classification through the public API: the attempt table (`surely::docs::outcomes`) for the
//! four request semantics, the call outcome over several attempts, pushback parsing, error
//! classification (including a real hyper-util client against 127.0.0.1), and closure
//! classifiers.

mod closure;
mod errors;
#[cfg(feature = "http2")]
mod h2_refused;
#[cfg(feature = "hyper")]
mod hyper_client;
mod pushback;
mod semantics;
mod support;
mod table;
mod tally;
