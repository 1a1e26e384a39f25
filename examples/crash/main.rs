//! Crashes are real: the order story with every service a separate OS process, killed with
//! SIGKILL and restarted, on a real PostgreSQL and a real NATS JetStream; then the invariants,
//! checked with SQL.
//!
//! One binary plays every role, chosen by its first argument; the driver starts the others as
//! processes of the same executable:
//!
//! * **driver** (the default): the supervisor. It makes the run's tables and stream (a prefix of
//!   the run's own, dropped at the end), starts the roles, kills them and restarts them, and
//!   checks the result.
//! * **order**: the order service. A hyper server with surely's `IdempotencyLayer` on a
//!   `PostgresStore`: the order row, its `OrderCreated` outbox event and the idempotency record
//!   (`PostgresStore::complete_in`) commit in one transaction. A keyed order also pays first at a
//!   payment provider (a table written in a transaction of its own: not idempotent, each call a
//!   payment), recorded with checkpoints, and a recovery hook reads them after a takeover so that
//!   the payment is never made twice. Every quarter of a second it runs a round over the
//!   records whose owner died with its client (`IdempotencyLayer::recover_abandoned`), whose
//!   hook asks the provider the same way and never runs the handler. Orders whose keys begin `t-` go to `POST /orders-tx`,
//!   behind a second layer built with `in_transaction()`: the key is claimed in the transaction
//!   that writes the order and its event, and the record commits with them; no payment.
//! * **relay**: the outbox relay, PostgreSQL to JetStream.
//! * **consumer**: the inventory service, a JetStream consumer with a PostgreSQL inbox, each
//!   event a task (`PostgresInbox::process_task_and_commit`, then the acknowledgement, or the
//!   negative one with the task's delay): its handler writes one inventory change, in a table
//!   with no unique constraint (a second change would be a second row), and answers `Ok` or why
//!   it waits, deterministically from the seed and the event (`tasks.rs`): the stock short for a
//!   while (business), the stock service refusing the connection (transient), a `Retry-After`
//!   (paced, one of them past the policy's longest delay), the order cancelled (stale,
//!   simulated), the fraud rule (a person). Each run records its start through a connection of
//!   its own; a trigger keeps every task's steps.
//! * **client**: places orders through `surely::client::http()`, keyed (`Idempotency-Key`,
//!   retried with it; `k-` and `t-` keys, half each) and unkeyed (a POST never sent twice: in doubt, it ends unknown), with a
//!   `LedgerRecorder` writing every unknown call to the `PostgresLedger`. It keeps an append-only
//!   oracle file, each line synced: `started KEY` before a call, `ended KEY OUTCOME` after it.
//! * **reconciler**: the ledger's `Reconciler`, and `Reconciler::settle_server` for the order
//!   service's UNKNOWN idempotency records, both asking the order table by key.
//! * **admin**: a person at surely's admin (`Admin::act`, audited in a table of the run's own),
//!   settling ledger entries by hand from the order table, racing the reconciler, and
//!   discarding the tasks whose refusal stands (`admin.rs`).
//!
//! # The kills
//!
//! Each process incarnation may be armed (`CRASH_AT=POINT:N`) with one crash point: the `N`-th
//! time it reaches the point it prints `@@ crashpoint POINT` and waits; the driver reads the line
//! and kills it. The points: `after-commit` (order: committed, not replied), `after-payment`
//! (order: paid, the checkpoint not written), `in-claim` (order, a `t-` key: the order and its
//! event written in the claim's transaction, not committed), `after-claim-commit` (order, a `t-`
//! key: the layer committed, the reply not sent), `after-publish` (relay: published, not marked),
//! `after-apply` (consumer: committed, not acknowledged), `after-schedule` (consumer: a task's
//! wait committed, its `nak` not sent), `after-answer` (consumer: the handler's change written
//! and its answer decided, not committed), `mid-reconcile` (reconciler: an entry
//! or record claimed and its answer found, not settled), `in-doubt` (client: a call ended
//! unknown, its ledger write not yet confirmed), `admin-begun` (admin: the audit line written,
//! the settlement not made), `admin-acted` (admin: the settlement made, its outcome not
//! audited). Besides, the driver kills a role at random
//! times. A killed role is restarted at once; some order incarnations start without the recovery
//! hook (`--hookless`, 10 % by default), as an older build in a rolling deploy would.
//!
//! After `--kills N` kills the driver stops killing: the client stops, the reconciler and the
//! admin stop, a
//! client asks again (the same key) for every keyed order left in doubt whose ledger entries are
//! not all settled, the relay and the consumer drain (every order's event recorded or in the
//! manual queue), a person discards half of the tasks the fraud rule refused, and
//! reconciliation runs twice. One line per invariant, then `invariants: ok` (or the failures,
//! and exit code 1):
//!
//! 1. one order per key (and a call that succeeded has its order, one that failed has none; an
//!    unkeyed write reached the handler at most once);
//! 2. one payment per order key, no repeat after a takeover;
//! 3. one inventory change per applied event, none for one that ended stale, in the manual queue
//!    or discarded;
//! 4. every unknown the client saw is in the ledger, settled once or in the manual queue, and a
//!    verdict agrees with the order table (succeeded: the order exists; failed: it does not);
//! 5. every call a killed client had started is answered, or in the ledger (the client journals
//!    every order's intent before it sends it: `ClientBuilder::journal`) and settled once or in
//!    the manual queue;
//! 6. once the client and the reconciler stopped, and before anything sends a key again, no
//!    idempotency record stays `PROCESSING` for longer than twice the lease, a round's interval
//!    and the hook's limit: the order service's rounds over abandoned records recover them
//!    without a request;
//! 7. no idempotency record `PROCESSING` past its lease after the recovery;
//! 8. reconciliation run twice gives the same result;
//! 9. every event ends as its fate allows (applied, stale, in the manual queue, discarded, or
//!    still waiting within its policy's expiry), none lost;
//! 10. no handler run started before its task's schedule allowed (the previous step's time and
//!     delay, the database's clock, within a millisecond of rounding), none after its task went
//!     to a person or its event was recorded;
//! 11. attempts within the policies' bounds: numbered without a gap, no streak of a reason past
//!     its attempts, every delay within its bounds and ending within its expiry, a pace never
//!     shortened (but at the expiry), the manual queue reached only by the policy;
//! 12. with `--pauses`: the pauses happened, each process continued past its lease, and the
//!     late writes their fences refused are counted (see below);
//! 13. the admin's actions audited before they were taken: a settlement `done` in the log was
//!     made; one whose line has no outcome (the admin killed between) was made or not, never
//!     half; no entry settled by the admin without its line.
//!
//! Then a summary: the calls, the tasks (events by fate; waits by reason, with their attempts,
//! clamped delays and those to a person; how they ended; handler runs, and early deliveries
//! answered without one), the kills (by point and random), the restarts, the slowest recovery
//! (from a kill to the role serving again), the time taken and the kills per minute.
//!
//! # Running it
//!
//! ```sh
//! # PostgreSQL at postgres://postgres@127.0.0.1:5432/test and NATS (JetStream on) at
//! # nats://127.0.0.1:4222, or --postgres URL --nats URL (or SURELY_POSTGRES_URL, SURELY_NATS_URL)
//! cargo run --release --all-features --example crash -- --kills 60 --seed 7
//! ```
//!
//! Options: `--kills N` (60), `--seed S` (from the clock if absent), `--workers N` (the client's
//! calls in flight, 4), `--hookless SHARE` (0.1), `--timeout SECS` (the chaos's limit: 4 s a
//! kill, 10 s a pause, at least 2 minutes), `--verbose` (every start, kill, pause and role's
//! line), `--partitions N`, `--pauses N`, `--broker nats|rabbitmq` and
//! `--store postgres|redis`.
//!
//! # Pauses
//!
//! A lease protects against an owner that died, and also against one that only stopped: a
//! process stalled by its host (a long GC, a VM migration, SIGSTOP) wakes up after its lease
//! believing it still owns the work. `--pauses N` does that to the services, one at a time at
//! seeded moments: the driver arms a role's process to pause at its point (`pause POINT:1` on
//! its standard input), and when it reaches it (`@@ pausepoint POINT`), stops it with SIGSTOP,
//! starts another instance of the role beside it, waits past the lease, and continues it
//! (SIGCONT and `resume`). The continued process goes on past the point for two seconds beside
//! the instance that took over, then goes (SIGKILL). The points:
//!
//! * the order service **mid-handler**, `after-payment` (paid, the checkpoint not written),
//!   stopped past twice its lease and an abandoned round: the other instance (both listen on
//!   the port, `SO_REUSEPORT`, so the kernel gives the stalled one its share of connections, as
//!   a load balancer would) takes the key over, and the stalled one's checkpoint is refused by
//!   its fence (`late-write-refused:order-checkpoint`);
//! * the relay **mid-publish**, `after-publish` (published, not marked), stopped past twice its
//!   claim's lease: the other relay claims the events again, publishes them (JetStream drops
//!   the duplicates by message id) and marks them; the stalled relay's marks are refused
//!   (`late-write-refused:relay-mark`). The log relay has no claims and is not paused;
//! * the consumer **mid-apply**, `after-answer` (the inventory change written, not
//!   committed), stopped past the ack wait: JetStream delivers the event to the other instance,
//!   which waits on the event's lock that the stalled transaction holds. Here the lock and the
//!   inbox's key are the fence: when the stalled one commits, the other finds the event
//!   recorded and applies nothing (a duplicate absorbed);
//! * the reconciler **mid-settle**, `mid-reconcile` (an entry claimed and its answer found),
//!   stopped past its claim's lease: the other reconciler claims and settles the entry, and
//!   the stalled one's settlement is refused (`late-write-refused:reconciler-settle`), or its
//!   query timed out while it stood and it gives the entry up, refused the same way.
//!
//! Invariant 12 says the pauses happened (each stopped at its point, continued) and counts the
//! late writes their fences refused; a late write that was taken instead would break 1 to 4 or
//! 8 (a second order or payment, a second inventory change, a settlement changed). A pause armed
//! whose point does not come within six seconds (no order to pay, no entry to settle) is
//! disarmed and tried on another role.
//!
//! ```sh
//! cargo run --release --all-features --example crash -- --kills 60 --seed 7 --pauses 8
//! ```
//!
//! # Partitions
//!
//! `--partitions N` (as root, with `ip` and `nft`: `apt-get install -y nftables`) runs the order
//! service in a network namespace of its own, joined to the host by a veth pair, and opens `N`
//! seeded windows during the kills, each 0.3 to 1.5 s: **cut** (nftables inside the namespace
//! drops everything on its veth: the client cannot reach the order service, nor it PostgreSQL),
//! **loss** (one packet in ten dropped, `numgen random mod 10 0 drop`), or **delay** (the driver's
//! TCP relay to PostgreSQL holds every chunk 200 ms; this kernel has no `netem`). PostgreSQL
//! listens on 127.0.0.1 of the host only, so the order service reaches it through that relay on
//! the host's veth address. If the namespace cannot be made, the run says why and exits with an
//! error; it never passes without its partitions. The namespace goes at the end.
//!
//! ```sh
//! cargo run --release --all-features --example crash -- --kills 60 --seed 7 --partitions 20
//! ```
//!
//! # Through RabbitMQ
//!
//! `--broker rabbitmq` (and `--amqp URL`, or `SURELY_AMQP_URL`; by default the machine's
//! `amqp://guest:guest@127.0.0.1:5672/%2f`) sends the events through RabbitMQ instead of
//! JetStream: the relay publishes with `RabbitPublisher` to a topic exchange named as the run's
//! prefix (each event's confirm awaited), and the consumer takes them from the queue bound to it
//! with `PostgresInbox::process_amqp` (acknowledged after the inbox's commit, requeued when the
//! handler fails, dead-lettered to `<prefix>.dead` when a message is not an event; a prefetch
//! of four). That consumer has no tasks: every event's fate is "at once". A consumer killed
//! between its commit and its acknowledgement gets the message again (RabbitMQ redelivers
//! what a closed channel left unacknowledged), and the inbox absorbs it. Invariant 14: nothing
//! dead-lettered, and the redeliveries absorbed; 3 and 9 say each event applied once, none
//! lost. RabbitMQ has no acknowledgement deadline, so a paused consumer keeps its messages
//! until it goes: nothing takes its work over meanwhile. The log relay reads for JetStream
//! only (`--relay log` with `--broker rabbitmq` is refused).
//!
//! ```sh
//! cargo run --release --all-features --example crash -- --kills 60 --seed 7 --broker rabbitmq
//! ```
//!
//! # The keys on Redis
//!
//! `--store redis` keeps the order service's idempotency keys on a Redis of the run's own
//! (`redis-server` on a free port, no persistence) instead of PostgreSQL, and restarts it
//! every 15 kills: each restart loses every key, as the store's docs warn. Redis has no
//! transaction with the order's write, so the service does what those docs ask of work on
//! Redis: its effects are idempotent downstream. The order is written once per key (an
//! advisory lock on the key and `INSERT ... WHERE NOT EXISTS`, its event with it), the payment
//! provider takes one payment per payment id, and the payment's checkpoint follows its intent's
//! row instead of sharing its transaction. `/orders-tx` is served by the same layer (no claim
//! in a transaction on Redis). The reconciler's server records and the checks read the keys
//! on Redis. Invariant 15 counts the restarts, the keys whose handler ran more than once, and
//! the orders written again that their key absorbed; 1 and 2 still say one order and one
//! payment per key.
//!
//! ```sh
//! cargo run --release --all-features --example crash -- --kills 60 --seed 7 --store redis
//! ```
//!
//! # Replaying a seed
//!
//! Every decision comes from the seed: which incarnation of each role is armed at which point
//! and hit, which start without the hook, when and which role the random kills hit, which calls
//! are keyed. The run prints its seed and the command that replays it, first and again when it
//! fails. A replay repeats the schedule; the interleaving with real clocks (the database, the
//! broker, the network stack) is the machine's, so a failure that depends on a narrow race may
//! need a few replays. A failed run keeps its oracle file and says where; with
//! `CRASH_KEEP_FAILED=1` in the environment it keeps its tables and stream too, for a look at
//! what the invariant counted (drop them by hand after).
//!
//! Every loop is bounded: a role that does not serve within 15 s of its start, kills that do not
//! add up within the limit, a drain or a reconciliation that does not finish, each end the run
//! with an error, never a hang.

#[path = "../support/checks.rs"]
mod checks;
#[path = "../support/http_client.rs"]
mod http_client;
#[path = "../support/splitmix.rs"]
mod splitmix;

mod admin;
mod client;
mod crashpoint;
mod driver;
mod invariants;
mod order;
mod partition;
mod pipeline;
mod reconcile;
mod settings;
mod task_invariants;
mod tasks;
mod world;

use std::process::ExitCode;
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) use settings::*;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, rest) = match args.first().map(String::as_str) {
        Some(
            r @ ("driver" | "order" | "relay" | "consumer" | "client" | "reconciler" | "admin"),
        ) => (r.to_owned(), &args[1..]),
        _ => ("driver".to_owned(), &args[..]),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("crash {role}: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ran = rt.block_on(async {
        match role.as_str() {
            "order" => order::run().await.map(|()| true),
            "relay" => pipeline::run_relay().await.map(|()| true),
            "consumer" => pipeline::run_consumer().await.map(|()| true),
            "client" => client::run().await.map(|()| true),
            "reconciler" => reconcile::run().await.map(|()| true),
            "admin" => admin::run().await.map(|()| true),
            _ => driver::main(rest).await,
        }
    });
    // Tasks still waiting (a listener, a writer) are not waited for.
    rt.shutdown_timeout(Duration::from_millis(200));
    match ran {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("crash {role}: {}", chain(&*e));
            ExitCode::from(2)
        }
    }
}
