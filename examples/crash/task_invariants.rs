//! The invariants of the consumer's tasks ([`tasks`](crate::tasks)), checked from the database
//! at the end: the inbox's records, its `_tasks` table, the steps the harness kept (each with
//! the schedule its transaction wrote) and the record of handler runs; and the tasks' counts
//! for the summary.
//!
//! Times are the database's clock throughout. A run's transaction start (`now()`) ties it to
//! the step it answered, if it committed one (the trigger keeps the step's `now()`), and orders
//! it after the steps before. Its start (`clock_timestamp()`) is compared with the next time
//! the last of those wrote, in microseconds as the inbox keeps it: the checks allow
//! [`TOLERANCE`], a millisecond, for that rounding.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use surely::inbox::{Consumer, Reason};

use crate::checks::Checks;
use crate::driver::Stats;
use crate::tasks::{self, after, Fate, Fates};
use crate::world::{order_created, World, CONSUMER};
use crate::BoxError;

/// How far a time kept by the inbox may be off another by rounding (see the module's docs).
const TOLERANCE: Duration = Duration::from_millis(1);

/// The inbox's record outcomes (the crate's codes in the `outcome` column).
const APPLIED: i16 = 1;
const STALE: i16 = 2;
const DISCARDED: i16 = 3;

/// A step, as the harness kept it, with the schedule its transaction wrote.
struct Step {
    attempt: i32,
    reason: String,
    delay: Duration,
    clamped_from: Option<Duration>,
    /// Its transaction's start: the run's `txn_at` that answered it.
    txn_at: SystemTime,
    /// The task's state, first time and next time once the step's transaction wrote them.
    state: Option<String>,
    first_at: Option<SystemTime>,
    next_at: Option<SystemTime>,
}

impl Step {
    /// The task's age when its inbox decided this step (what the policy's expiry is
    /// counted against).
    fn age(&self) -> Duration {
        self.first_at
            .map_or(Duration::ZERO, |f| after(self.txn_at, f))
    }
}

/// A handler run, as it recorded itself.
struct Run {
    txn_at: SystemTime,
    started: SystemTime,
}

/// A task's row in `_tasks`, if the event still has one.
struct TaskRow {
    state: String,
    reason: String,
    first_at: SystemTime,
    next_at: SystemTime,
}

/// Everything known of one order's event.
struct Ev {
    key: String,
    fate: Fate,
    record: Option<(i16, SystemTime)>,
    task: Option<TaskRow>,
    steps: Vec<Step>,
    runs: Vec<Run>,
    changes: i64,
}

/// How an event ended.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Applied,
    Stale,
    Discarded,
    Manual(String),
    Waiting,
    /// Neither recorded nor a task: lost.
    Lost,
    /// Recorded, and its task's row left behind in `_tasks`: the inbox contradicts itself.
    Both,
}

impl Ev {
    fn end(&self) -> End {
        match (&self.record, &self.task) {
            (Some(_), Some(_)) => End::Both,
            (Some((APPLIED, _)), None) => End::Applied,
            (Some((STALE, _)), None) => End::Stale,
            (Some((DISCARDED, _)), None) => End::Discarded,
            (Some(_), None) => End::Lost,
            (None, Some(t)) if t.state == "manual" => End::Manual(t.reason.clone()),
            (None, Some(_)) => End::Waiting,
            (None, None) => End::Lost,
        }
    }
}

fn name(end: &End) -> String {
    match end {
        End::Applied => "applied".into(),
        End::Stale => "stale".into(),
        End::Discarded => "discarded".into(),
        End::Manual(r) => format!("manual ({r})"),
        End::Waiting => "waiting".into(),
        End::Lost => "lost".into(),
        End::Both => "recorded, its task left behind".into(),
    }
}

/// Whether `fate` may end as `end` (a wait into the manual queue by the policy, and a task
/// still waiting, are checked against the policy in [`Evidence::check`]).
fn allowed(fate: Fate, end: &End) -> bool {
    let reason = fate.reason().map(Reason::code);
    match (fate, end) {
        (_, End::Lost | End::Both) => false,
        (Fate::AtOnce | Fate::Short(_) | Fate::Blips(_) | Fate::Paced { .. }, End::Applied) => true,
        (Fate::Short(_) | Fate::Blips(_) | Fate::Paced { .. }, End::Manual(r)) => {
            Some(r.as_str()) == reason
        }
        (Fate::Short(_) | Fate::Blips(_) | Fate::Paced { .. }, End::Waiting) => true,
        (Fate::Overpaced, End::Manual(r)) => r == "paced",
        (Fate::Cancelled, End::Stale) => true,
        (Fate::Refused { discard: true }, End::Discarded) => true,
        (Fate::Refused { discard: false }, End::Manual(r)) => r == "person",
        _ => false,
    }
}

/// The evidence of every order's event, read once.
pub(crate) struct Evidence {
    events: Vec<Ev>,
    /// Event ids with a change, a record, a run or a step and no order.
    stray: Vec<String>,
    consumer: Consumer,
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// Reads the evidence of the events of `orders`' keys.
pub(crate) async fn load(
    world: &World,
    orders: &HashMap<String, i64>,
    changes: &HashMap<String, i64>,
    fates: Fates,
) -> Result<Evidence, BoxError> {
    let client = world.pool.get().await?;
    let c: [&(dyn surely::deps::tokio_postgres::types::ToSql + Sync); 1] = [&CONSUMER];
    let mut records: HashMap<String, (i16, SystemTime)> = HashMap::new();
    for r in client
        .query(
            &world.sql("SELECT event_id, outcome, processed_at FROM {p}_inbox WHERE consumer = $1"),
            &c,
        )
        .await?
    {
        records.insert(r.get(0), (r.get(1), r.get(2)));
    }
    let mut task_rows: HashMap<String, TaskRow> = HashMap::new();
    for r in client
        .query(
            &world.sql(
                "SELECT event_id, state, reason, first_at, next_at FROM {p}_inbox_tasks
                 WHERE consumer = $1",
            ),
            &c,
        )
        .await?
    {
        task_rows.insert(
            r.get(0),
            TaskRow {
                state: r.get(1),
                reason: r.get(2),
                first_at: r.get(3),
                next_at: r.get(4),
            },
        );
    }
    let mut steps: HashMap<String, Vec<Step>> = HashMap::new();
    for r in client
        .query(
            &world.sql(
                "SELECT event_id, attempt, reason, delay_us, clamped_from_us, txn_at, state,
                    first_at, next_at
                 FROM {p}_task_steps_kept WHERE consumer = $1 ORDER BY event_id, attempt",
            ),
            &c,
        )
        .await?
    {
        steps.entry(r.get(0)).or_default().push(Step {
            attempt: r.get(1),
            reason: r.get(2),
            delay: micros(r.get(3)),
            clamped_from: r.get::<_, Option<i64>>(4).map(micros),
            txn_at: r.get(5),
            state: r.get(6),
            first_at: r.get(7),
            next_at: r.get(8),
        });
    }
    let mut runs: HashMap<String, Vec<Run>> = HashMap::new();
    for r in client
        .query(
            &world.sql(
                "SELECT event_id, txn_at, started FROM {p}_task_runs ORDER BY event_id, started",
            ),
            &[],
        )
        .await?
    {
        runs.entry(r.get(0)).or_default().push(Run {
            txn_at: r.get(1),
            started: r.get(2),
        });
    }
    let mut events = Vec::with_capacity(orders.len());
    let mut ids = std::collections::HashSet::new();
    let mut keys: Vec<&String> = orders.keys().collect();
    keys.sort();
    for key in keys {
        let id = order_created(key)?.id().as_str().to_owned();
        ids.insert(id.clone());
        events.push(Ev {
            key: key.clone(),
            fate: fates.of(&id),
            record: records.get(&id).copied(),
            task: task_rows.remove(&id),
            steps: steps.remove(&id).unwrap_or_default(),
            runs: runs.remove(&id).unwrap_or_default(),
            changes: changes.get(&id).copied().unwrap_or(0),
        });
    }
    let mut stray: Vec<String> = records
        .keys()
        .chain(changes.keys())
        .filter(|id| !ids.contains(*id))
        .chain(task_rows.keys())
        .chain(steps.keys())
        .chain(runs.keys())
        .cloned()
        .collect();
    stray.sort();
    stray.dedup();
    Ok(Evidence {
        events,
        stray,
        consumer: tasks::consumer()?,
    })
}

/// `count x` entries of a map, joined.
fn listed<K: std::fmt::Display>(counts: &BTreeMap<K, usize>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Evidence {
    /// Invariant 3: one inventory change per applied event, none for the others.
    pub(crate) fn check_changes(&self, stats: &Stats, checks: &mut Checks) {
        let (mut applied, mut twice, mut missing, mut not_applied) = (0, vec![], vec![], vec![]);
        for e in &self.events {
            let end = e.end();
            // Applied: its record says so (a task row left behind is invariant 9's).
            let recorded_applied = e.record.is_some_and(|(outcome, _)| outcome == APPLIED);
            match (recorded_applied, e.changes) {
                (true, 1) => applied += 1,
                (true, 0) => missing.push(e.key.clone()),
                (true, n) => twice.push(format!("{} x{n}", e.key)),
                (false, 0) => {}
                (false, n) => not_applied.push(format!("{} x{n} ({})", e.key, name(&end))),
            }
        }
        checks.invariant(
            twice.is_empty() && missing.is_empty() && not_applied.is_empty() && self.stray.is_empty(),
            format!(
                "3. one inventory change per applied event, none for a stale, manual or discarded one (the handler writes it before it answers): \
                 {applied} applied once, {} more than once{}, {} applied without one{}, {} with one though not applied{}, {} events of no order{}; \
                 {} duplicate deliveries absorbed by the inbox",
                twice.len(),
                crate::invariants::some(&twice),
                missing.len(),
                crate::invariants::some(&missing),
                not_applied.len(),
                crate::invariants::some(&not_applied),
                self.stray.len(),
                crate::invariants::some(&self.stray),
                stats.notes.get("duplicate-absorbed").unwrap_or(&0)
            ),
        );
    }

    /// Invariants 9 to 11, printed; the summary's lines on the tasks.
    pub(crate) fn check(&self, stats: &Stats, checks: &mut Checks) -> Vec<String> {
        let policy = |reason: &str| {
            Reason::from_code(reason)
                .ok()
                .and_then(|r| self.consumer.policy(r))
        };

        // 9. Every event ends as its fate allows, none lost; one still waiting comes back
        //    within its policy's expiry.
        let mut ends: BTreeMap<String, usize> = BTreeMap::new();
        let mut wrong = Vec::new();
        let mut waiting_late = Vec::new();
        for e in &self.events {
            let end = e.end();
            *ends.entry(name(&end)).or_default() += 1;
            if !allowed(e.fate, &end) {
                wrong.push(format!("{} {} ended {}", e.key, e.fate.name(), name(&end)));
            }
            if let (End::Waiting, Some(t)) = (&end, &e.task) {
                let expiry = policy(&t.reason).map_or(Duration::ZERO, |p| p.expiry());
                if after(t.next_at, t.first_at) > expiry + TOLERANCE {
                    waiting_late.push(format!("{} ({})", e.key, t.reason));
                }
            }
        }
        checks.invariant(
            wrong.is_empty() && waiting_late.is_empty(),
            format!(
                "9. every event ends as its fate allows (applied, stale, in the manual queue or discarded), none lost: {}; \
                 {} ended otherwise{}; {} waiting past their policy's expiry{}",
                listed(&ends),
                wrong.len(),
                crate::invariants::some(&wrong),
                waiting_late.len(),
                crate::invariants::some(&waiting_late)
            ),
        );

        // 10. No handler run earlier than its task's schedule allowed, none after its task
        //     went to a person, none after its event was recorded.
        let (mut runs, mut after_wait, mut early, mut past_manual, mut past_record) =
            (0, 0, vec![], vec![], vec![]);
        let mut closest: Option<Duration> = None;
        let mut committed_nothing = 0;
        let mut most_runs = 0;
        for e in &self.events {
            most_runs = most_runs.max(e.runs.len());
            for r in &e.runs {
                runs += 1;
                let own = e.steps.iter().any(|s| s.txn_at == r.txn_at)
                    || e.record.is_some_and(|(_, at)| at == r.txn_at);
                if !own {
                    committed_nothing += 1;
                }
                if let Some((_, at)) = e.record
                    && r.txn_at > at
                {
                    past_record.push(e.key.clone());
                }
                // The task's schedule when the run's transaction began: the one its last step
                // before wrote.
                let Some(prev) = e.steps.iter().rev().find(|s| s.txn_at < r.txn_at) else {
                    continue;
                };
                let Some(due) = prev
                    .next_at
                    .filter(|_| prev.state.as_deref() == Some("waiting"))
                else {
                    past_manual.push(e.key.clone());
                    continue;
                };
                after_wait += 1;
                if r.started + TOLERANCE < due {
                    early.push(format!(
                        "{} run {}ms before its time (attempt {} {})",
                        e.key,
                        after(due, r.started).as_millis(),
                        prev.attempt,
                        prev.reason
                    ));
                } else {
                    let margin = after(r.started, due);
                    closest = Some(closest.map_or(margin, |c| c.min(margin)));
                }
            }
        }
        checks.invariant(
            early.is_empty() && past_manual.is_empty() && past_record.is_empty(),
            format!(
                "10. no handler run earlier than its task's schedule allowed (its start at or after the next time its last step wrote, the database's clock, within {}ms): \
                 {runs} runs, {after_wait} after a wait, the closest {} after its time; {} before it{}; \
                 {} after the task went to a person{}; {} after the event was recorded{}",
                TOLERANCE.as_millis(),
                closest.map_or("-".to_owned(), |c| format!("{:.1}ms", c.as_secs_f64() * 1000.0)),
                early.len(),
                crate::invariants::some(&early),
                past_manual.len(),
                crate::invariants::some(&past_manual),
                past_record.len(),
                crate::invariants::some(&past_record)
            ),
        );

        // 11. Attempts within the policies' bounds: numbered from 1 without a gap; no streak of
        //     one reason longer than its policy allows; every delay ends within the policy's
        //     expiry (counted from the first wait); a paced delay shorter than asked only where
        //     the expiry cut it; a wait that came back and went to a person only past its
        //     expiry or its attempts.
        let mut bad = Vec::new();
        let mut longest_streak: BTreeMap<String, usize> = BTreeMap::new();
        let mut steps_by: BTreeMap<String, usize> = BTreeMap::new();
        let mut events_by: BTreeMap<String, usize> = BTreeMap::new();
        let mut clamped_by: BTreeMap<String, usize> = BTreeMap::new();
        let mut manual_by: BTreeMap<String, usize> = BTreeMap::new();
        let mut most_attempts = 0;
        for e in &self.events {
            if e.steps.is_empty() {
                continue;
            }
            most_attempts = most_attempts.max(e.steps.len());
            let mut seen: Vec<&str> = Vec::new();
            let mut streak = 0;
            for (i, s) in e.steps.iter().enumerate() {
                *steps_by.entry(s.reason.clone()).or_default() += 1;
                if !seen.contains(&s.reason.as_str()) {
                    seen.push(&s.reason);
                    *events_by.entry(s.reason.clone()).or_default() += 1;
                }
                if s.clamped_from.is_some() {
                    *clamped_by.entry(s.reason.clone()).or_default() += 1;
                }
                if s.attempt != i as i32 + 1 {
                    bad.push(format!("{} attempt {} is step {}", e.key, s.attempt, i + 1));
                }
                streak = if i > 0 && e.steps[i - 1].reason == s.reason {
                    streak + 1
                } else {
                    1
                };
                let longest = longest_streak.entry(s.reason.clone()).or_default();
                *longest = (*longest).max(streak);
                let Some(p) = policy(&s.reason) else {
                    // Person: a manual step; stale leaves no step.
                    if !s.delay.is_zero() {
                        bad.push(format!("{} {} step with a delay", e.key, s.reason));
                    }
                    *manual_by.entry(s.reason.clone()).or_default() += 1;
                    continue;
                };
                if streak > p.max_attempts() as usize {
                    bad.push(format!(
                        "{} {streak} {} attempts in a row (policy {})",
                        e.key,
                        s.reason,
                        p.max_attempts()
                    ));
                }
                let age = s.age();
                if s.delay.is_zero() {
                    // To a person: by the policy only (a pace over its longest delay, the
                    // attempts in a row, or the expiry).
                    let over_pace = s.reason == "paced" && e.fate == Fate::Overpaced;
                    if !(over_pace
                        || streak >= p.max_attempts() as usize
                        || age + TOLERANCE >= p.expiry())
                    {
                        bad.push(format!(
                            "{} {} to a person after {}ms, streak {streak}",
                            e.key,
                            s.reason,
                            age.as_millis()
                        ));
                    }
                    *manual_by.entry(s.reason.clone()).or_default() += 1;
                    continue;
                }
                if age + s.delay > p.expiry() + TOLERANCE {
                    bad.push(format!(
                        "{} {} delay ends {}ms past the expiry",
                        e.key,
                        s.reason,
                        (age + s.delay - p.expiry()).as_millis()
                    ));
                }
                if s.delay > p.max() + TOLERANCE || s.delay + TOLERANCE < p.min() {
                    let cut = age + s.delay + TOLERANCE >= p.expiry();
                    if !cut {
                        bad.push(format!(
                            "{} {} delay {}ms outside {}..{}ms",
                            e.key,
                            s.reason,
                            s.delay.as_millis(),
                            p.min().as_millis(),
                            p.max().as_millis()
                        ));
                    }
                }
                if s.reason == "paced"
                    && let Some(asked) = s.clamped_from.filter(|a| *a > s.delay)
                    && age + s.delay + TOLERANCE < p.expiry()
                {
                    bad.push(format!(
                        "{} paced {}ms sooner than asked ({}ms)",
                        e.key,
                        after_d(asked, s.delay).as_millis(),
                        asked.as_millis()
                    ));
                }
            }
        }
        checks.invariant(
            bad.is_empty(),
            format!(
                "11. attempts within the policies' bounds, none looping: numbered without a gap, streaks within the attempts allowed \
                 (longest: {}; allowed transient {}, paced {}, business {}), every delay within the policy's bounds and ending within its expiry, \
                 paced never sooner than asked, to a person only by the policy: {} steps, at most {most_attempts} for one event, at most {most_runs} runs for one event; {} out of bounds{}",
                listed(&longest_streak),
                tasks::TRANSIENT_ATTEMPTS,
                tasks::PACED_ATTEMPTS,
                tasks::BUSINESS_ATTEMPTS,
                steps_by.values().sum::<usize>(),
                bad.len(),
                crate::invariants::some(&bad)
            ),
        );

        let mut fates: BTreeMap<&str, usize> = BTreeMap::new();
        let mut applied_after_wait = 0;
        for e in &self.events {
            *fates.entry(e.fate.name()).or_default() += 1;
            if e.end() == End::Applied && !e.steps.is_empty() {
                applied_after_wait += 1;
            }
        }
        let by_reason: Vec<String> = Reason::ALL
            .iter()
            .map(|r| r.code())
            .filter(|r| *r != "stale")
            .map(|r| {
                format!(
                    "{r} {} events, {} attempts, {} clamped, {} to a person",
                    events_by.get(r).unwrap_or(&0),
                    steps_by.get(r).unwrap_or(&0),
                    clamped_by.get(r).unwrap_or(&0),
                    manual_by.get(r).unwrap_or(&0)
                )
            })
            .collect();
        let stale = ends.get("stale").copied().unwrap_or(0);
        vec![
            format!(
                "{} events by fate: {}",
                self.events.len(),
                listed(&fates)
            ),
            format!(
                "waits by reason: {}; stale {stale} (recorded as no-ops, no step)",
                by_reason.join("; ")
            ),
            format!(
                "ended: {}; {applied_after_wait} applied after a wait",
                listed(&ends)
            ),
            format!(
                "handler runs {runs} ({committed_nothing} committed nothing: killed or failed before the commit); \
                 early deliveries answered without the handler {}",
                stats.notes.get("task-early").unwrap_or(&0)
            ),
        ]
    }
}

/// `a - b`, or zero.
fn after_d(a: Duration, b: Duration) -> Duration {
    a.saturating_sub(b)
}
