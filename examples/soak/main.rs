//! The soak: the whole order story as a service, at a steady load for minutes or hours, with
//! periodic faults, sampled every few seconds; then the invariants of a system that stays
//! bounded: its tables, its memory, its latency.
//!
//! One binary plays every role, as the crash harness's does (its roles are reused here:
//! `examples/crash/{order,pipeline,client,reconcile,world,crashpoint}.rs`); the driver starts
//! each as a process of the same executable, on the real PostgreSQL and a NATS JetStream:
//!
//! * **order**: the order service: hyper, `ServerDeadlineLayer`, the adaptive concurrency limit
//!   (`surely::server::limit::AdaptiveLimitLayer`), and `IdempotencyLayer` on `PostgresStore`
//!   (the order row, its outbox event and the idempotency record in one transaction), with a
//!   short retention of completed records;
//! * **relay**: the outbox to JetStream;
//! * **consumer**: the inventory service, JetStream through its PostgreSQL inbox;
//! * **reconciler**: the ledger's `Reconciler` and `settle_server` over the order service's
//!   UNKNOWN records;
//! * **client**: the steady load, `--rate` calls a second, keyed (`k-`, `t-`) and unkeyed (`u-`)
//!   as the crash harness's client places them, through `surely::client::http()` with the intent
//!   journal and the `LedgerRecorder`. It reports each call's latency to the driver on its
//!   standard output (`@@ latency MICROS OUTCOME`); the driver keeps them.
//!
//! Each role that owns tables runs a `surely::maintenance::Maintenance` with `PostgresLeases`,
//! its chores listed in one function per role in `chores.rs`, with the retentions the driver
//! passes. The client talks to the order service through the driver's TCP proxy, which is where
//! replies get lost.
//!
//! # The faults
//!
//! From the seed, every 20 to 60 s (a run of less than three minutes: every tenth of it), one
//! of, in a shuffled cycle:
//!
//! * **lost replies**: the proxy drops the next few replies of the order service (it reads
//!   them, then closes both sides): the order committed, its caller never hears; keyed calls
//!   are sent again and replayed, unkeyed ones end unknown and go to the ledger;
//! * **relay killed**: SIGKILL, restarted at once;
//! * **broker restart**: the NATS server the run started for itself (`nats-server -js` on a
//!   port of its own, its store in a directory of the run's) is stopped, and started again
//!   2 s later; the run's broker is never the machine's, so nothing else on the machine loses
//!   its broker, and it is gone at the end whatever happens;
//! * **order killed**: SIGKILL, restarted 5 s later, past the client's deadline, so that
//!   records whose caller gave up stay `PROCESSING` until something recovers them.
//!
//! In a run of three minutes or more, the kills stop two minutes before the backlog check:
//! the order service and the relay then each have an incarnation that lives to the end, more
//! than half of the run, whose RSS invariant 2 checks; lost replies and broker restarts go on
//! to the end. No fault is injected near the backlog check (below: from two minutes before it
//! to four after; 12 s and 15 s in a shorter run), and the calls a fault met (those in flight
//! during it) are left out of the latency comparisons, not of the CSV.
//!
//! # The samples
//!
//! Every `--sample` seconds: each role's RSS (`VmRSS`) and open file descriptors (and the
//! driver's and the broker's), the run's connections to PostgreSQL (`pg_stat_activity`, by the
//! `application_name` every connection of the run's carries), each of the run's
//! tables' rows (an exact `count(*)`: they are small) and dead tuples (`pg_stat_user_tables`,
//! the statistics collector's figure, which lags), the calls' p50 and p99 over the interval,
//! the ledger's open entries (in doubt, open, claimed), the idempotency records `PROCESSING`,
//! and those `PROCESSING` for more than twice the lease. Written to `target/soak/RUN.csv`, and
//! plotted in `target/soak/RUN.svg` (rows per table, RSS per process, p50/p99).
//!
//! # The backlog check
//!
//! Half-way through the time after the warm-up, `--backlog N` completed idempotency records
//! are inserted with SQL, their retention set to end 30 s later (3 s in a run under three
//! minutes), and the table is vacuumed: a table whose retention is shortened, or whose first
//! sweep starts, holds rows it wrote over weeks and that the autovacuum saw meanwhile, while
//! 100 000 rows inserted at once leave a whole table to vacuum, which the autovacuum otherwise
//! does while the sweep runs (x2 on the p99 in a run of five minutes; x1.0 once vacuumed
//! first). Once
//! their retention ends, the order service's maintenance sweeps them down in bounded batches.
//! The p99 of the calls made while it does is compared with the p99 of the calls of two
//! windows as long, one just before the insert and one just after the window during: a p99 of
//! a few hundred calls swings by a factor of two from one ten-second sample to the next, and
//! the two sides keep one quiet (or one noisy) stretch from setting the bar. The window during
//! needs at least 400 calls (100 in a run under three minutes), those without twice that: a
//! sweep quicker than that at the run's rate gets a window stretched to those calls (and says
//! so); with fewer calls all the same, the check says so and fails rather than pass on a
//! sample that cannot tell.
//!
//! # The invariants
//!
//! After the warm-up (`--warmup`), one line each, then `invariants: ok` or the failures (exit 1):
//!
//! 1. each table with a retention stays under what the rate and the retention predict
//!    (`rate x share x (retention + safety window + 2 rounds) x 1.25 + 50` rows, plus the rate
//!    times the longest broker outage for the outbox), at every sample outside the backlog check;
//!    the tables with no retention yet are listed, with their growth;
//! 2. each process's RSS, the mean of the last tenth of its samples against the first tenth's,
//!    grows by at most 10 % (for each role, its incarnation that lived longest, if it saw at
//!    least half of the samples);
//! 3. the last tenth's p99 is at most 1.5 times the first tenth's (each tenth needs at least 100
//!    calls, or the check fails saying it cannot tell);
//! 4. no idempotency record `PROCESSING` past twice its lease and a round of the maintenance
//!    (the period a recovery running every round needs), at any sample: the order service
//!    recovers abandoned records with its own rounds (`chores::ORDER_RECOVERS_ABANDONED`);
//! 5. the p99 during the backlog's sweep is at most 1.2 times the p99 without;
//! 6. one order per key, and one inventory change per order's event (once the relay and the
//!    consumer have drained).
//!
//! # Running it
//!
//! ```sh
//! # PostgreSQL at postgres://postgres@127.0.0.1:5432/test (or --postgres URL, or
//! # SURELY_POSTGRES_URL); nats-server installed at /usr/sbin/nats-server (or --nats-server PATH)
//! cargo run --release --all-features --example soak -- --minutes 10 --seed 1
//! # CI's minute, short retentions:
//! cargo run --all-features --example soak -- --minutes 1 --seed 1 --sample 5 --rate 50 --timings report
//! ```
//!
//! Options: `--minutes N` (10), `--seed S` (from the clock), `--rate R` (calls a second, 20),
//! `--sample SECS` (10), `--retention SECS` (each table's retention: 10 for a run of at most two
//! minutes, 60 otherwise), `--warmup SECS` (twice the retention and its safety window, at most a
//! third of the run), `--backlog N` (20 000 for a run of at most two minutes, 100 000
//! otherwise), `--workers N` (the client's calls in flight at most, 16), `--batch N` (the rows
//! a maintenance batch does at most, 500), `--duty D` (the share of a round its batches work,
//! the crate's default), `--postgres URL`,
//! `--nats-server PATH`, `--timings check|report` (whether checks 3 and 5 count towards the
//! verdict: `check` by default; CI's minute says `report`, as the repository asserts no timing
//! on a shared machine), `--verbose` (every start and kill, and the roles' own output).
//!
//! The latency is the client's, from its call into the stack to the answer: it includes the
//! intent journal's ledger write and the harness's oracle (a line synced to disk), the same for
//! every call.
//!
//! Every wait is bounded; the roles, the proxy and the broker go with the driver, and the run's
//! tables and stream are dropped at the end.

#[path = "../support/checks.rs"]
mod checks;
#[path = "../support/http_client.rs"]
mod http_client;
#[allow(dead_code)]
#[path = "../support/splitmix.rs"]
mod splitmix;

// The crash harness's roles and their world: not every piece of them is used here.
#[allow(dead_code)]
#[path = "../crash/client.rs"]
mod client;
#[allow(dead_code)]
#[path = "../crash/crashpoint.rs"]
mod crashpoint;
#[allow(dead_code)]
#[path = "../crash/order.rs"]
mod order;
#[allow(dead_code)]
#[path = "../crash/pipeline.rs"]
mod pipeline;
#[allow(dead_code)]
#[path = "../crash/reconcile.rs"]
mod reconcile;
#[allow(dead_code)]
#[path = "../crash/tasks.rs"]
mod tasks;
#[allow(dead_code)]
#[path = "../crash/world.rs"]
mod world;

mod broker;
mod chores;
mod driver;
mod plot;
mod proxy;
mod roles;
mod sample;
mod verdict;

use std::process::ExitCode;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// The crash harness's roles read these from the crate's root.
#[path = "../crash/settings.rs"]
mod settings;
pub(crate) use settings::*;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, rest) = match args.first().map(String::as_str) {
        Some(r @ ("driver" | "order" | "relay" | "consumer" | "client" | "reconciler")) => {
            (r.to_owned(), &args[1..])
        }
        _ => ("driver".to_owned(), &args[..]),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("soak {role}: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ran = rt.block_on(async {
        match role.as_str() {
            "order" => roles::order().await.map(|()| true),
            "relay" => roles::relay().await.map(|()| true),
            "consumer" => roles::consumer().await.map(|()| true),
            "client" => client::run().await.map(|()| true),
            "reconciler" => roles::reconciler().await.map(|()| true),
            _ => driver::main(rest).await,
        }
    });
    rt.shutdown_timeout(Duration::from_millis(200));
    match ran {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("soak {role}: {}", chain(&*e));
            ExitCode::from(2)
        }
    }
}
