//! Tasks that say why they wait (`surely::docs::boundary`, "Why a task waits"): the seed's three
//! cases end to end, and a person's side of the manual queue, through the inbox's public API.
//!
//! Two consumers take tasks from one broker: `inventory` reserves stock for orders, `payments`
//! charges them through a payment channel (an axum service on 127.0.0.1 that allows one charge
//! a second and answers `429 Too Many Requests` with `Retry-After` in between). Each handler
//! answers `Ok`, or a `Wait` that says why the task cannot be done now; the consumer's policy for
//! that reason decides when it comes back. The policies are short, so that the run takes about
//! two seconds of real time: a business recheck of at least 300 ms, a pace of at most 5 s.
//!
//! 1. **Stock short, then replenished** (`business`). Order o-1 needs 5 of sku-42, and 2 are in
//!    stock. The reservation answers `Wait::business(..)` and asks to be rechecked in 100 ms,
//!    when the supplier says its delivery lands; the policy's shortest recheck is 300 ms, so the
//!    delay is raised to it, and the clamp is recorded. The delivery lands meanwhile, and the
//!    recheck reserves, once.
//! 2. **A rate-limited payment channel** (`paced`). Order o-3's charge gets `429` with
//!    `Retry-After: 1` (the channel has just served another merchant); the task answers
//!    `Wait::paced_by(&headers)` and comes back no sooner than the channel asked, which the
//!    channel itself measures.
//! 3. **An order cancelled while its reservation is queued** (`stale`). Order o-2 is cancelled
//!    (version 2) after its reservation task (version 1) was published and before it is
//!    processed. The handler reads the order's version and answers `Wait::stale(2, ..)`: the
//!    task is recorded as a no-op, never applied, and its record names both versions.
//! 4. **The person's side** (`person`). Orders o-4 and o-5 are charged more than the 10 000
//!    limit: the limit rule refuses both with `Wait::person(..)`, and they go to the manual
//!    queue. A person (ana) reads it with each task's evidence, approves o-4 and retries its
//!    task (handed back by `take_retried`: it meets the rate limit, and is paced like any
//!    other), and discards o-5, a duplicate order; a redelivery of o-5 runs nothing.
//!
//! Every delivery prints the task's attempt (why it waits, for how long, what the policy
//! changed) or its outcome; then each task's path, and one line per invariant (each reservation
//! applied once, the channel never called sooner than its `Retry-After`, the stale task never
//! applied, no task before its time, no task left waiting or in the manual queue), then
//! `invariants: ok`, or says what failed and exits with 1.
//!
//! Two modes:
//!
//! ```sh
//! # MemoryInbox, the business state in memory, and an in-process broker that redelivers a
//! # waiting task after the delay it was given
//! cargo run --example waits
//!
//! # PostgresInbox and the business state in PostgreSQL (tables of the run's own), NATS
//! # JetStream as the broker (a stream and a pull consumer of the run's own): each delivery
//! # through `PostgresInbox::process_jetstream_task`, which `nak`s a waiting task with its
//! # delay; tables and stream dropped at the end
//! SURELY_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! SURELY_NATS_URL=nats://127.0.0.1:4222 \
//!   cargo run --features postgres,nats --example waits
//! ```
//!
//! (`--postgres URL --nats URL` on the command line do the same as the variables.) A URL that
//! does not answer ends the run with an error; there is no fallback to memory.

#[path = "../support/checks.rs"]
mod checks;

mod channel;
#[cfg(all(feature = "postgres", feature = "nats"))]
mod durable;
mod handlers;
mod memory;
mod story;
mod world;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use surely::inbox::{Consumer, Reason, WaitPolicy};
use surely::outbox::{Event, EventId};
use surely::retry::backoff::{Backoff, Jitter};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ----- the figures -------------------------------------------------------------------------------

/// The item the orders reserve, its stock at the start, and the supplier's delivery.
pub(crate) const SKU: &str = "sku-42";
pub(crate) const STOCK: i64 = 2;
pub(crate) const DELIVERY: i64 = 10;
/// What the supplier says about its delivery (sooner than the business policy's shortest
/// recheck, which raises it), and when the delivery lands after the first shortage.
pub(crate) const SUPPLIER_ETA: Duration = Duration::from_millis(100);
pub(crate) const SUPPLIER_LANDS: Duration = Duration::from_millis(100);
/// The business policy: a recheck every 500 ms unless the handler asks, never sooner than
/// 300 ms nor later than 2 s, a person after 10 s.
const RECHECK: Duration = Duration::from_millis(500);
pub(crate) const RECHECK_MIN: Duration = Duration::from_millis(300);
const RECHECK_MAX: Duration = Duration::from_secs(2);
const BUSINESS_EXPIRY: Duration = Duration::from_secs(10);
/// The paced policy: as the channel asks, up to 5 s (a longer pace goes to a person), for 30 s.
const PACE_MAX: Duration = Duration::from_secs(5);
const PACED_EXPIRY: Duration = Duration::from_secs(30);
/// The channel allows one charge per this long, and answers within this.
pub(crate) const CHANNEL_GAP: Duration = Duration::from_secs(1);
pub(crate) const CHANNEL_TIMEOUT: Duration = Duration::from_secs(2);
/// A charge over this needs a person's approval.
pub(crate) const LIMIT: i64 = 10_000;
/// The person at the manual queue.
pub(crate) const PERSON: &str = "ana";
/// How long a broker's fetch waits for a delivery.
pub(crate) const FETCH: Duration = Duration::from_millis(100);
/// The run gives up past this.
pub(crate) const STORY_LIMIT: Duration = Duration::from_secs(20);

/// The tasks' kinds: `inventory` reserves stock, `payments` charges.
pub(crate) const RESERVE: &str = "Reserve";
pub(crate) const CHARGE: &str = "Charge";
/// The tasks, in the order they are published: the order, the kind, the quantity or amount.
pub(crate) const TASKS: [(&str, &str, i64); 5] = [
    ("o-1", RESERVE, O1_NEEDS),
    ("o-2", RESERVE, 1),
    ("o-3", CHARGE, 40),
    ("o-4", CHARGE, 25_000),
    ("o-5", CHARGE, 18_000),
];
/// What o-1 needs, more than the stock holds.
pub(crate) const O1_NEEDS: i64 = 5;
/// The orders, each placed at version 1.
pub(crate) const ORDERS: [&str; 5] = ["o-1", "o-2", "o-3", "o-4", "o-5"];

/// The task of `order`: version 1 of the order, as it was when the task was published.
pub(crate) fn task(order: &str, kind: &str, amount: i64) -> Result<Event, BoxError> {
    let about = format!("order {order}");
    let payload = match kind {
        RESERVE => format!("{order} {SKU} {amount}"),
        _ => format!("{order} {amount}"),
    };
    Ok(Event::new(
        EventId::derive(&about, kind),
        about,
        1,
        kind,
        payload,
    )?)
}

/// `reserve o-1`, `charge o-3`: a task as the log names it.
pub(crate) fn label(event: &Event) -> String {
    format!("{} {}", event.kind().to_lowercase(), order_of(event))
}

/// The order a task is for: the first word of its payload.
pub(crate) fn order_of(event: &Event) -> String {
    text(event.payload())
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_owned()
}

/// The consumer that reserves stock: a slow business recheck, and short blips.
pub(crate) fn inventory() -> Result<Consumer, BoxError> {
    let business = WaitPolicy::new(Backoff::constant(RECHECK))
        .at_least(RECHECK_MIN)
        .at_most(RECHECK_MAX)
        .attempts(20)
        .expire_after(BUSINESS_EXPIRY);
    Ok(Consumer::builder("inventory")
        .policy(Reason::Transient, transient()?)
        .policy(Reason::Business, business)
        .build()?)
}

/// The consumer that charges: paced by the channel, and short blips.
pub(crate) fn payments() -> Result<Consumer, BoxError> {
    let paced = WaitPolicy::new(Backoff::constant(CHANNEL_GAP))
        .at_most(PACE_MAX)
        .attempts(10)
        .expire_after(PACED_EXPIRY);
    Ok(Consumer::builder("payments")
        .policy(Reason::Transient, transient()?)
        .policy(Reason::Paced, paced)
        .build()?)
}

/// A blip (the channel unreachable, a lost connection): 100 ms doubling to 1 s, full jitter,
/// five attempts in a row, a person after 10 s.
fn transient() -> Result<WaitPolicy, BoxError> {
    let backoff = Backoff::exponential(Duration::from_millis(100))
        .cap(Duration::from_secs(1))
        .jitter(Jitter::Full)
        .build()?;
    Ok(WaitPolicy::new(backoff)
        .attempts(5)
        .expire_after(Duration::from_secs(10)))
}

/// A lock, even one a panicking thread left.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A duration as the log prints it: milliseconds, or seconds past ten.
pub(crate) fn ms(d: Duration) -> String {
    if d < Duration::from_secs(10) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// `once`, `twice`, `3 times`.
pub(crate) fn times(n: usize) -> String {
    match n {
        1 => "once".to_owned(),
        2 => "twice".to_owned(),
        n => format!("{n} times"),
    }
}

/// Bytes as text, for the log.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An error and its sources, on one line.
pub(crate) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

#[path = "../support/mode.rs"]
mod mode;
use mode::{mode, Mode};

// ----- the modes ---------------------------------------------------------------------------------

#[cfg(not(all(feature = "postgres", feature = "nats")))]
async fn durable(_: &str, _: &str) -> Result<bool, BoxError> {
    Err(
        "PostgreSQL and NATS URLs were given, but this build lacks the cargo features \
         `postgres` and `nats`: run `cargo run --features postgres,nats --example waits` \
         (or `--all-features`)"
            .into(),
    )
}

#[cfg(all(feature = "postgres", feature = "nats"))]
async fn durable(postgres: &str, nats: &str) -> Result<bool, BoxError> {
    let world = durable::PgWorld::connect(postgres, nats).await?;
    let ran = story::run(&world).await;
    match world.clean_up().await {
        Ok(what) => eprintln!("waits: dropped {what}"),
        Err(e) => eprintln!("waits: could not clean up: {}", chain(&*e)),
    }
    ran
}

#[tokio::main]
async fn main() {
    let ran = match mode() {
        Ok(Mode::Memory) => story::run(&memory::MemWorld::new()).await,
        Ok(Mode::Durable { postgres, nats }) => durable(&postgres, &nats).await,
        Err(e) => Err(e),
    };
    match ran {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("waits: {}", chain(&*e));
            std::process::exit(1);
        }
    }
}
