//! How long to wait before each retry: exponential growth, a cap, and jitter.
//!
//! A [`Backoff`] is a validated configuration; [`Backoff::iter`] turns it into [`Delays`], an
//! `Iterator<Item = Duration>` whose first item is the wait before the *first retry* (the
//! second attempt), the next one the wait before the second retry, and so on. The iterator never
//! ends: how many attempts a call gets is the retry layer's decision (its attempt limit, its
//! retry budget, the call's deadline), not the schedule's. Use [`Iterator::take`] to bound it
//! yourself.
//!
//! # Why jitter
//!
//! When a server stumbles, every client that was talking to it fails at about the same moment.
//! With a plain exponential schedule they all come back at the same moment too, after 100 ms,
//! then 200 ms, then 400 ms: a thundering herd that hits the recovering server in synchronised
//! waves, each one as large as the load that knocked it over. Jitter spreads each wave out over
//! its whole window, so the server sees a steady trickle instead. The AWS Architecture blog's
//! "Exponential Backoff And Jitter" measured this: with jitter, competing clients finish with
//! far fewer calls in total and far less time spent, and the formulas here are that post's.
//!
//! # Which to choose
//!
//! - [`Jitter::Full`], the default: the least total work for the server, and AWS's
//!   recommendation. A retry may happen almost at once, which is fine for a server that is
//!   overloaded as a whole rather than by one client.
//! - [`Jitter::Equal`]: when you want a guaranteed minimum wait (half the exponential delay)
//!   as well as a spread.
//! - [`Jitter::Decorrelated`]: each wait depends on the previous one rather than on the attempt
//!   number, so schedules of different clients drift apart even faster. Stateful, and ignores
//!   the multiplier.
//! - [`Jitter::None`]: for tests and for a single client that nobody else competes with.
//!
//! A server's own pushback (`Retry-After`, `grpc-retry-pushback-ms`) wins over the computed
//! delay: this schedule is only what the client does when the server says nothing.
//!
//! # Determinism
//!
//! Jitter draws from a random number generator. Give the builder a [`seed`](BackoffBuilder::seed)
//! and every iterator made by that `Backoff` replays the same sequence, which is what a test
//! wants (and what production does not: there, leave the seed out). Without a seed, the
//! `Backoff` takes a key from the operating system's entropy when it is built, and each
//! iterator gets its own stream from that key and a counter shared by all clones, so concurrent
//! calls never wait in lockstep. To supply your own generator, use [`Backoff::iter_with_rng`].
//!
//! ```
//! use std::time::Duration;
//! use surely::retry::backoff::{Backoff, Jitter};
//!
//! // 100 ms, doubling, never more than 5 s, with full jitter; seeded for a repeatable test.
//! let backoff = Backoff::exponential(Duration::from_millis(100))
//!     .cap(Duration::from_secs(5))
//!     .jitter(Jitter::Full)
//!     .seed(7)
//!     .build()?;
//!
//! let delays: Vec<Duration> = backoff.iter().take(4).collect();
//! for (n, delay) in delays.iter().enumerate() {
//!     // Full jitter: anywhere between zero and the exponential delay.
//!     assert!(*delay <= Duration::from_millis(100) * 2u32.pow(n as u32));
//! }
//! // Same seed, same sequence.
//! assert_eq!(delays, backoff.iter().take(4).collect::<Vec<_>>());
//!
//! // Without jitter, the plain capped exponential schedule.
//! let plain = Backoff::exponential(Duration::from_secs(1))
//!     .cap(Duration::from_secs(5))
//!     .jitter(Jitter::None)
//!     .build()?;
//! let secs: Vec<u64> = plain.iter().take(5).map(|d| d.as_secs()).collect();
//! assert_eq!(secs, [1, 2, 4, 5, 5]);
//! # Ok::<(), surely::ConfigError>(())
//! ```

pub use crate::backoff::{Backoff, BackoffBuilder, Delays, Jitter};
