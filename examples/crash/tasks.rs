//! The inventory consumer's events as tasks that say why they wait: what each event's handler
//! answers, decided from the run's seed and the event alone (its *fate*), the consumer's short
//! policies, the record of every handler run, and the person who decides the refused ones.
//!
//! Every fate but [`Fate::AtOnce`] makes the handler answer a [`Wait`] at least once:
//!
//! | fate | share | the handler's answer |
//! | --- | --- | --- |
//! | at once | 55 % | applied at its first run |
//! | short | 13 % | business: the stock is short for 0.3 to 4 s from the event's first run (the database's clock), and the wait asks for a recheck when the restock is due; applied at the first run after it |
//! | blips | 12 % | transient: the stock service refuses the connection on the event's first 1 to 3 runs (an I/O error, turned into a wait by `?`) |
//! | paced | 10 % | paced: the first 1 or 2 runs are answered `Retry-After: 1` to `4` (seconds), read by `Wait::paced_by` |
//! | overpaced | 1 % | paced: `Retry-After: 30`, past the paced policy's longest delay: to a person at once |
//! | cancelled | 5 % | stale: the order was cancelled after its event (see below) |
//! | refused | 4 % | person: the fraud rule refuses it; at the end a person discards half of them and leaves the others in the manual queue |
//!
//! **Cancelled is simulated.** The order service has no cancellation: the seed picks the orders
//! that count as cancelled after their `OrderCreated` was emitted, their business object at
//! version 2, past the event's version 1. The handler reads that version from the fate where a
//! real one would read it from the order service, and answers `Wait::stale(2, …)`.
//!
//! The delays are short (50 ms to 4 s, expiries of 15 and 20 s), so that every task ends within
//! a run's drain; some are longer than JetStream's ack wait (2 s), so that a consumer killed
//! between a wait's commit and its `nak` (the crash point `after-schedule`) gets the delivery
//! back before the task's time, and the inbox answers it early without running the handler.
//!
//! The handler writes the inventory change **before** it answers: every wait proves that the
//! savepoint rolls the handler's write back (one change per applied event, none for the
//! others).
//!
//! **The record of runs.** A handler's writes in its transaction roll back on a wait, so each run
//! records itself in `{p}_task_runs` through a connection of its own (committed at once, before
//! the handler goes on): its event, its process, its transaction's start (`now()`, the clock the
//! inbox decides the task's schedule by) and its own start (`clock_timestamp()`). A task's steps
//! go with it once it is applied (`_task_steps` cascades from `_tasks`), so a trigger the
//! harness adds copies each step into `{p}_task_steps_kept` in the transaction that writes it.

use std::time::{Duration, SystemTime};

use surely::inbox::{Consumer, PostgresInbox, Reason, TaskState, Versions, Wait, WaitPolicy};
use surely::retry::backoff::{Backoff, Jitter};

use crate::splitmix::SplitMix;
use crate::world::{World, CONSUMER};
use crate::BoxError;

/// The variable that turns the fates on, with the run's seed: the crash driver sets it; the
/// soak, which runs the same consumer, does not, and every event is applied at once there.
pub(crate) const ENV_TASKS: &str = "CRASH_TASKS";

/// The transient policy: 100 ms doubling to 1 s, full jitter, at least 50 ms; 6 attempts in a
/// row; an expiry of 15 s.
pub(crate) const TRANSIENT_ATTEMPTS: u32 = 6;
pub(crate) const TRANSIENT_EXPIRY: Duration = Duration::from_secs(15);
/// The paced policy: as asked, at most 4 s; 5 attempts in a row; an expiry of 20 s.
pub(crate) const PACED_MAX: Duration = Duration::from_secs(4);
pub(crate) const PACED_ATTEMPTS: u32 = 5;
pub(crate) const PACED_EXPIRY: Duration = Duration::from_secs(20);
/// The business policy: a recheck every 500 ms (asked delays kept within 200 ms to 3 s); 40
/// attempts in a row; an expiry of 15 s.
pub(crate) const BUSINESS_ATTEMPTS: u32 = 40;
pub(crate) const BUSINESS_EXPIRY: Duration = Duration::from_secs(15);

/// The person who decides the refused tasks at the end.
pub(crate) const PERSON: &str = "crash person";

/// The inventory consumer: the durable consumer's name, events in order, and short policies,
/// so that every task ends within a run's drain.
pub(crate) fn consumer() -> Result<Consumer, BoxError> {
    let ms = Duration::from_millis;
    let transient = Backoff::exponential(ms(100))
        .cap(Duration::from_secs(1))
        .jitter(Jitter::Full)
        .build()?;
    Ok(Consumer::builder(CONSUMER)
        .versions(Versions::InOrder)
        .policy(
            Reason::Transient,
            WaitPolicy::new(transient)
                .at_least(ms(50))
                .attempts(TRANSIENT_ATTEMPTS)
                .expire_after(TRANSIENT_EXPIRY),
        )
        .policy(
            Reason::Paced,
            WaitPolicy::new(Backoff::constant(Duration::from_secs(1)))
                .at_most(PACED_MAX)
                .attempts(PACED_ATTEMPTS)
                .expire_after(PACED_EXPIRY),
        )
        .policy(
            Reason::Business,
            WaitPolicy::new(Backoff::constant(ms(500)))
                .at_least(ms(200))
                .at_most(Duration::from_secs(3))
                .attempts(BUSINESS_ATTEMPTS)
                .expire_after(BUSINESS_EXPIRY),
        )
        .build()?)
}

/// What an event's handler answers, run after run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Applied at its first run.
    AtOnce,
    /// The stock is short for this long from the event's first run.
    Short(Duration),
    /// The stock service refuses the connection on this many first runs.
    Blips(u32),
    /// The first `runs` runs are asked to come back in `secs` seconds.
    Paced { runs: u32, secs: u64 },
    /// Asked to come back in 30 s, past the paced policy's longest delay.
    Overpaced,
    /// The order was cancelled after its event (simulated: see the module's docs).
    Cancelled,
    /// The fraud rule refuses it; whether the person discards it at the end.
    Refused { discard: bool },
}

impl Fate {
    /// The fate's name, for the summary.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fate::AtOnce => "at once",
            Fate::Short(_) => "short",
            Fate::Blips(_) => "blips",
            Fate::Paced { .. } => "paced",
            Fate::Overpaced => "overpaced",
            Fate::Cancelled => "cancelled",
            Fate::Refused { .. } => "refused",
        }
    }

    /// The reason its waits give, if it waits.
    pub(crate) fn reason(self) -> Option<Reason> {
        match self {
            Fate::AtOnce => None,
            Fate::Short(_) => Some(Reason::Business),
            Fate::Blips(_) => Some(Reason::Transient),
            Fate::Paced { .. } | Fate::Overpaced => Some(Reason::Paced),
            Fate::Cancelled => Some(Reason::Stale),
            Fate::Refused { .. } => Some(Reason::Person),
        }
    }
}

/// The fates of a run's events.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fates {
    seed: u64,
    /// Every event applied at once: a run whose consumer has no tasks (RabbitMQ's).
    at_once: bool,
}

impl Fates {
    pub(crate) fn new(seed: u64) -> Fates {
        Fates {
            seed,
            at_once: false,
        }
    }

    /// The same seed, every event's fate [`Fate::AtOnce`]: the run's consumer has no tasks.
    pub(crate) fn all_at_once(self) -> Fates {
        Fates {
            at_once: true,
            ..self
        }
    }

    /// The fates, if the driver turned them on for this process.
    pub(crate) fn from_env() -> Result<Option<Fates>, BoxError> {
        match std::env::var(ENV_TASKS) {
            Ok(seed) => Ok(Some(Fates::new(seed.parse().map_err(|e| {
                format!("{ENV_TASKS} must be a seed, not {seed:?}: {e}")
            })?))),
            Err(_) => Ok(None),
        }
    }

    /// The fate of the event `event_id`: from the seed and the id alone.
    pub(crate) fn of(self, event_id: &str) -> Fate {
        if self.at_once {
            return Fate::AtOnce;
        }
        // FNV-1a over the id, mixed with the seed: the same event has the same fate in every
        // process of the run.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in event_id.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut rng = SplitMix::new(h ^ self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (pick, a, b) = (rng.unit(), rng.next_u64(), rng.next_u64());
        match pick {
            p if p < 0.55 => Fate::AtOnce,
            p if p < 0.68 => Fate::Short(Duration::from_millis(300 + a % 3_700)),
            p if p < 0.80 => Fate::Blips(1 + (a % 3) as u32),
            p if p < 0.90 => Fate::Paced {
                runs: 1 + (a % 2) as u32,
                secs: 1 + b % 4,
            },
            p if p < 0.91 => Fate::Overpaced,
            p if p < 0.96 => Fate::Cancelled,
            _ => Fate::Refused {
                discard: a.is_multiple_of(2),
            },
        }
    }
}

/// A handler run, as its record told it: the how-manyth run of its event, and how long after
/// the event's first run it started (the database's clock).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub(crate) number: i64,
    pub(crate) since_first: Duration,
}

/// The statement that records a run and reads the run's number and its time since the event's
/// first run: `$1` event, `$2` process, `$3` the transaction's start, `$4` the run's start.
pub(crate) const RECORD_RUN: &str = "WITH new AS (
        INSERT INTO {p}_task_runs (event_id, pid, txn_at, started) VALUES ($1, $2, $3, $4))
    SELECT count(*) + 1,
        (extract(epoch FROM $4::timestamptz - COALESCE(min(started), $4::timestamptz)) * 1000000)::int8
    FROM {p}_task_runs WHERE event_id = $1";

/// The version a cancelled order is at: past its `OrderCreated`'s.
const CANCELLED_AT: i64 = 2;

/// What the handler answers on `run`, for an event of `version` and `fate` whose order is `key`.
pub(crate) fn answer(fate: Fate, run: Run, key: &str, version: i64) -> Result<(), Wait> {
    let n = run.number;
    match fate {
        Fate::AtOnce => Ok(()),
        Fate::Short(short) => match short.checked_sub(run.since_first) {
            Some(left) if !left.is_zero() => Err(Wait::business(format_args!(
                "no stock for order {key}: the restock is due in {}ms",
                left.as_millis()
            ))
            .after(left)),
            _ => Ok(()),
        },
        Fate::Blips(blips) if n <= i64::from(blips) => {
            let refused = std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                format!("the stock service refused the connection (run {n})"),
            );
            Err(refused.into())
        }
        Fate::Blips(_) => Ok(()),
        Fate::Paced { runs, secs } if n <= i64::from(runs) => {
            Err(Wait::paced_by(&retry_after(secs)))
        }
        Fate::Paced { .. } => Ok(()),
        Fate::Overpaced => Err(Wait::paced_by(&retry_after(30))),
        // The version check a handler makes against the business object (here, the fate).
        Fate::Cancelled if version < CANCELLED_AT => Err(Wait::stale(
            CANCELLED_AT,
            format_args!("order {key} was cancelled after its OrderCreated"),
        )),
        Fate::Cancelled => Ok(()),
        Fate::Refused { .. } => Err(Wait::person(
            "fraud rule",
            format_args!("order {key} is over the customer's limit"),
        )),
    }
}

/// A 429's headers: `Retry-After: secs`.
fn retry_after(secs: u64) -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
    headers
}

/// The run's tables for the tasks' evidence (after the inbox's migrations): the runs, and a
/// copy of every step that outlives its task, with what its transaction decided: its start
/// (`now()`, the run's `txn_at`), and the task's state, first time and next time as the
/// schedule it wrote before the step says them.
pub(crate) fn schema(world: &World) -> String {
    let inbox = world.t("inbox");
    let steps = format!("{inbox}_task_steps");
    world.sql(&format!(
        "CREATE TABLE {{p}}_task_runs (event_id text NOT NULL, pid int NOT NULL,
             txn_at timestamptz NOT NULL, started timestamptz NOT NULL);
         CREATE INDEX {{p}}_task_runs_event ON {{p}}_task_runs (event_id);
         CREATE TABLE {{p}}_task_steps_kept (consumer text NOT NULL, event_id text NOT NULL,
             attempt integer NOT NULL, at timestamptz NOT NULL, reason text NOT NULL,
             why text NOT NULL, delay_us bigint NOT NULL, clamped_from_us bigint,
             txn_at timestamptz NOT NULL, state text, first_at timestamptz,
             next_at timestamptz);
         CREATE FUNCTION {{p}}_keep_step() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO {{p}}_task_steps_kept
                 SELECT NEW.consumer, NEW.event_id, NEW.attempt, NEW.at, NEW.reason, NEW.why,
                     NEW.delay_us, NEW.clamped_from_us, now(), t.state, t.first_at, t.next_at
                 FROM (SELECT 1) one LEFT JOIN {inbox}_tasks t
                     ON t.consumer = NEW.consumer AND t.event_id = NEW.event_id;
             RETURN NEW;
         END $$;
         CREATE TRIGGER {{p}}_keep_step AFTER INSERT ON {steps}
             FOR EACH ROW EXECUTE FUNCTION {{p}}_keep_step();"
    ))
}

/// The person at the end: discards the refused tasks whose fate says so, with who and why, and
/// leaves the rest of the manual queue as it is. How many it discarded, of how many there.
pub(crate) async fn person(
    inbox: &PostgresInbox,
    fates: Fates,
) -> Result<(usize, usize), BoxError> {
    let manual = inbox
        .tasks(Some(CONSUMER), Some(TaskState::Manual), 1_000_000)
        .await?;
    let mut discarded = 0;
    for task in &manual {
        let id = task.event.id().as_str();
        if fates.of(id) == (Fate::Refused { discard: true }) {
            inbox
                .discard_task(
                    CONSUMER,
                    id,
                    PERSON,
                    "the refusal stands: the order is void",
                )
                .await?;
            discarded += 1;
        }
    }
    Ok((discarded, manual.len()))
}

/// A timestamp's distance after another (zero if it is not after).
pub(crate) fn after(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or(Duration::ZERO)
}
