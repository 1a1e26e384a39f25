//! The story: the tasks published, delivered until each has ended, a person at the manual
//! queue, each task's path, the redeliveries, and the invariants.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use surely::inbox::{Consumer, Processed, Reason, TaskState};
use surely::outbox::Event;
use tokio::time::Instant;

use crate::channel::Channel;
use crate::checks::Checks;
use crate::handlers::Ctx;
use crate::world::{consumer_for, World};
use crate::{
    inventory, label, ms, order_of, payments, task, text, times, BoxError, DELIVERY, FETCH,
    O1_NEEDS, PERSON, RECHECK_MIN, RESERVE, SKU, STOCK, STORY_LIMIT, SUPPLIER_LANDS, TASKS,
};

/// How a task ended.
#[derive(Clone, Debug, PartialEq)]
enum End {
    Applied(String),
    Stale { current: i64 },
    Discarded(String),
}

/// A task's path: its attempts and outcome, as the log printed them.
struct Path {
    event: Event,
    consumer: String,
    /// The short form of each step, for the summary.
    steps: Vec<String>,
    /// Each wait the handler answered: the handler's run it followed (from 0), and the delay.
    waits: Vec<(usize, Reason, Duration)>,
    end: Option<(Instant, End)>,
}

impl Path {
    fn new(event: &Event, consumer: &Consumer) -> Path {
        Path {
            event: event.clone(),
            consumer: consumer.name().to_owned(),
            steps: Vec::new(),
            waits: Vec::new(),
            end: None,
        }
    }
}

/// A settled task delivered again: what the inbox answered, and whether its handler ran.
struct Redelivered {
    order: String,
    processed: Processed,
    ran: bool,
}

struct Story<'w, W: World> {
    world: &'w W,
    ctx: Ctx,
    consumers: [Consumer; 2],
    start: Instant,
    paths: BTreeMap<String, Path>,
    replenish_at: Option<Instant>,
    replenished: bool,
    person_acted: bool,
    checks: Checks,
}

impl<W: World> Story<'_, W> {
    fn at(&self) -> String {
        format!("+{:>5} ms", self.start.elapsed().as_millis())
    }

    fn say(&self, who: &str, what: impl std::fmt::Display) {
        println!("  {} {who:<12} {what}", self.at());
    }

    /// A line under the last one, indented to its text.
    fn more(&self, what: impl std::fmt::Display) {
        println!("{:27}{what}", "");
    }

    /// Prints what a delivery of `event` came to (`ran`: its handler ran), and keeps it in the
    /// task's path.
    async fn note(
        &mut self,
        consumer: &Consumer,
        event: &Event,
        processed: &Processed,
        ran: bool,
    ) -> Result<(), BoxError> {
        let id = event.id().as_str();
        let who = label(event);
        let (line, step, end) = match processed {
            Processed::Waiting(w) if w.early => (
                format!(
                    "early delivery: not run, its time is in {} ({} wait)",
                    ms(w.delay),
                    w.reason
                ),
                None,
                None,
            ),
            Processed::Waiting(w) => {
                // The inbox's evidence: the last step holds the handler's explanation.
                let task = self.world.task(consumer.name(), id).await?;
                let why = task
                    .and_then(|t| t.steps.last().map(|s| s.why.clone()))
                    .unwrap_or_default();
                let clamp = match w.clamped_from {
                    Some(asked) if asked < w.delay => {
                        format!(" (asked {}, raised by the policy)", ms(asked))
                    }
                    Some(asked) => format!(" (asked {}, lowered by the policy)", ms(asked)),
                    None => String::new(),
                };
                (
                    format!(
                        "attempt {}: {}, back in {}{clamp}: {why}",
                        w.attempts,
                        w.reason,
                        ms(w.delay)
                    ),
                    Some(format!("{} {}{clamp}", w.reason, ms(w.delay))),
                    None,
                )
            }
            Processed::Manual { reason } => {
                let task = self.world.task(consumer.name(), id).await?;
                let (attempts, why) = task.map_or((0, String::new()), |t| (t.attempts, t.why));
                (
                    format!("attempt {attempts}: {reason}, to the manual queue: {why}"),
                    ran.then(|| format!("{reason}: manual queue")),
                    None,
                )
            }
            Processed::Applied(result) => (
                format!("applied: {}", text(result)),
                Some("applied".to_owned()),
                Some(End::Applied(text(result))),
            ),
            Processed::Stale { applied } => (
                format!(
                    "stale: order {} is at version {applied}, the task was for version {}; \
                     recorded as a no-op, never applied",
                    order_of(event),
                    event.version()
                ),
                Some(format!("stale (order at version {applied})")),
                Some(End::Stale { current: *applied }),
            ),
            Processed::Duplicate(result) => (
                format!("a duplicate: not run (recorded: {})", text(result)),
                None,
                None,
            ),
            other => (format!("{other:?}"), None, None),
        };
        self.say(&who, line);
        let run = self.ctx.runs(event).len().saturating_sub(1);
        let path = (self.paths.entry(id.to_owned())).or_insert_with(|| Path::new(event, consumer));
        if let Processed::Waiting(w) = processed
            && ran
        {
            path.waits.push((run, w.reason, w.delay));
        }
        path.steps.extend(step);
        if let Some(end) = end {
            path.end.get_or_insert((Instant::now(), end));
        }
        // The supplier's delivery lands a little after the first shortage.
        if event.kind() == RESERVE && processed.delay().is_some() && self.replenish_at.is_none() {
            self.replenish_at = Some(Instant::now() + SUPPLIER_LANDS);
        }
        Ok(())
    }

    /// Publishes the tasks, and cancels o-2 while its reservation is queued.
    async fn begin(&mut self) -> Result<(), BoxError> {
        self.world.open().await?;
        println!("Published, in this order (each a task at version 1 of its order):");
        for (order, kind, n) in TASKS {
            let event = task(order, kind, n)?;
            let what = match kind {
                RESERVE => format!("reserve {n} of {SKU} for {order}"),
                _ => format!("charge {n} for {order}"),
            };
            println!(
                "  {:<12} {what} ({})",
                label(&event),
                consumer_for(&self.consumers, &event).name()
            );
            let path = Path::new(&event, consumer_for(&self.consumers, &event));
            self.paths.insert(event.id().as_str().to_owned(), path);
            self.world.publish(event).await?;
        }
        println!(
            "  {SKU}: {STOCK} in stock; the payment channel takes one charge a second, and has \
             just taken one"
        );
        let version = self.world.cancel("o-2").await?;
        println!(
            "  order o-2 cancelled while its reservation is queued: the order is at version \
             {version}"
        );
        println!();
        println!("Deliveries:");
        Ok(())
    }

    /// Delivers until every task has ended and none is left waiting, or the time is up.
    async fn run(&mut self) -> Result<(), BoxError> {
        let limit = self.start + STORY_LIMIT;
        loop {
            let now = Instant::now();
            if now >= limit {
                println!(
                    "  {} the tasks did not all end within {}",
                    self.at(),
                    ms(STORY_LIMIT)
                );
                return Ok(());
            }
            for delivery in self.world.fetch(FETCH).await? {
                let before = self.ctx.total();
                let (consumer, event, processed) = self
                    .world
                    .process(&self.consumers, delivery, &self.ctx)
                    .await?;
                let ran = self.ctx.total() > before;
                self.note(&consumer, &event, &processed, ran).await?;
            }
            self.supplier().await?;
            self.person().await?;
            self.due_retried().await?;
            if self.settled().await? {
                return Ok(());
            }
        }
    }

    async fn supplier(&mut self) -> Result<(), BoxError> {
        if let Some(at) = self.replenish_at
            && !self.replenished
            && Instant::now() >= at
        {
            let stock = self.world.replenish(DELIVERY).await?;
            self.replenished = true;
            self.say(
                "supplier",
                format!("{DELIVERY} of {SKU} delivered: {stock} in stock"),
            );
        }
        Ok(())
    }

    /// The person at the payments' manual queue, once both refused charges are in it.
    async fn person(&mut self) -> Result<(), BoxError> {
        if self.person_acted {
            return Ok(());
        }
        let name = self.consumers[1].name().to_owned();
        let manual = self.world.tasks(&name, Some(TaskState::Manual)).await?;
        if manual.len() < 2 {
            return Ok(());
        }
        self.person_acted = true;
        self.say(
            PERSON,
            format!("reads the {name} manual queue: {} tasks", manual.len()),
        );
        for listed in &manual {
            let id = listed.event.id().as_str();
            let task = self
                .world
                .task(&name, id)
                .await?
                .ok_or("a task left the queue")?;
            self.more(format!(
                "{}: {} ({}) after {} attempt(s): {}",
                label(&task.event),
                task.state.code(),
                task.reason,
                task.attempts,
                task.why
            ));
            for step in &task.steps {
                self.more(format!(
                    "  attempt {}: {}, {:?}",
                    step.attempt, step.reason, step.why
                ));
            }
        }
        for task in &manual {
            let id = task.event.id().as_str();
            match order_of(&task.event).as_str() {
                "o-4" => {
                    self.world.approve("o-4").await?;
                    let why = "customer verified by phone: o-4's amount approved";
                    self.world.retry_task(&name, id, PERSON, why).await?;
                    self.say(PERSON, format!("approves o-4, retries its task: {why}"));
                    self.step(id, format!("retried by {PERSON}"));
                }
                _ => {
                    let why = "a duplicate of o-4, placed twice by the customer";
                    let result = self.world.discard_task(&name, id, PERSON, why).await?;
                    self.say(
                        PERSON,
                        format!(
                            "discards {}'s task: {}",
                            order_of(&task.event),
                            text(&result)
                        ),
                    );
                    self.step(id, format!("discarded by {PERSON}"));
                    if let Some(path) = self.paths.get_mut(id) {
                        path.end = Some((Instant::now(), End::Discarded(text(&result))));
                    }
                }
            }
        }
        Ok(())
    }

    fn step(&mut self, id: &str, step: String) {
        if let Some(path) = self.paths.get_mut(id) {
            path.steps.push(step);
        }
    }

    /// Takes the retried tasks that are due from the inbox, and processes them. Their broker
    /// messages were acknowledged when they went to the manual queue, so the inbox delivers
    /// them from the retry on: one that waits again is handed out again when its time comes.
    async fn due_retried(&mut self) -> Result<(), BoxError> {
        for consumer in self.consumers.clone() {
            for event in self.world.take_retried(consumer.name()).await? {
                self.say(
                    consumer.name(),
                    format!("takes the retried task {} from the inbox", label(&event)),
                );
                let before = self.ctx.total();
                let processed = self
                    .world
                    .process_event(&consumer, &event, &self.ctx)
                    .await?;
                let ran = self.ctx.total() > before;
                self.note(&consumer, &event, &processed, ran).await?;
            }
        }
        Ok(())
    }

    /// Whether every task ended and none is left waiting or in the manual queue.
    async fn settled(&self) -> Result<bool, BoxError> {
        if self.paths.values().any(|p| p.end.is_none()) {
            return Ok(false);
        }
        for consumer in &self.consumers {
            if !self.world.tasks(consumer.name(), None).await?.is_empty() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn path(&self, order: &str) -> Option<&Path> {
        self.paths.values().find(|p| order_of(&p.event) == order)
    }

    fn summary(&self) {
        println!();
        println!("Paths, task by task:");
        let mut paths: Vec<&Path> = self.paths.values().collect();
        paths.sort_by_key(|p| order_of(&p.event));
        for path in paths {
            let end = match &path.end {
                Some((at, End::Applied(r))) => {
                    format!("applied at +{} ms: {r}", (*at - self.start).as_millis())
                }
                Some((at, End::Stale { current })) => format!(
                    "recorded stale at +{} ms (order at version {current}), never applied",
                    (*at - self.start).as_millis()
                ),
                Some((at, End::Discarded(r))) => {
                    format!("ended at +{} ms: {r}", (*at - self.start).as_millis())
                }
                None => "not ended".to_owned(),
            };
            let runs = times(self.ctx.runs(&path.event).len());
            let steps: Vec<&str> = path
                .steps
                .iter()
                .map(String::as_str)
                .filter(|s| {
                    !matches!(*s, "applied")
                        && !s.starts_with("stale")
                        && !s.starts_with("discarded")
                })
                .collect();
            let steps = if steps.is_empty() {
                String::new()
            } else {
                format!("{} -> ", steps.join(" -> "))
            };
            println!(
                "  {:<12} ({}, ran {runs}): {steps}{end}",
                label(&path.event),
                path.consumer
            );
        }
    }

    /// The redeliveries after the end: each settled task is a duplicate, and runs nothing.
    async fn redeliver(&mut self) -> Result<Vec<Redelivered>, BoxError> {
        println!();
        println!(
            "Redeliveries of settled tasks (as a broker may make after a lost acknowledgement):"
        );
        let mut out = Vec::new();
        let mut events: Vec<Event> = self.paths.values().map(|p| p.event.clone()).collect();
        events.sort_by_key(order_of);
        for event in events {
            let consumer = consumer_for(&self.consumers, &event).clone();
            let before = self.ctx.total();
            let processed = self
                .world
                .process_event(&consumer, &event, &self.ctx)
                .await?;
            let ran = self.ctx.total() > before;
            self.note(&consumer, &event, &processed, ran).await?;
            out.push(Redelivered {
                order: order_of(&event),
                processed,
                ran,
            });
        }
        Ok(out)
    }

    /// One line per invariant, over the whole run.
    async fn invariants(&mut self, redelivered: &[Redelivered]) -> Result<(), BoxError> {
        println!();
        println!("Invariants:");
        let mut checks = std::mem::take(&mut self.checks);
        let books = self.world.snapshot().await?;
        let reserved = |order: &str| -> Vec<i64> {
            let mine = books.reservations.iter().filter(|(o, _)| o == order);
            mine.map(|(_, qty)| *qty).collect()
        };
        let charged = |order: &str| books.charges.iter().filter(|(o, _)| o == order).count();
        let ended = |order: &str| self.path(order).and_then(|p| p.end.as_ref()).map(|e| &e.1);

        // Stock short, then replenished: rechecked on the business policy, applied once.
        let o1 = self.path("o-1").ok_or("no path for o-1")?;
        let waits: Vec<String> = o1
            .waits
            .iter()
            .map(|(_, reason, delay)| format!("{reason} {}", ms(*delay)))
            .collect();
        let business = !o1.waits.is_empty()
            && (o1.waits.iter()).all(|(_, r, d)| *r == Reason::Business && *d >= RECHECK_MIN);
        let stock = STOCK + DELIVERY - O1_NEEDS;
        checks.invariant(
            business
                && matches!(ended("o-1"), Some(End::Applied(_)))
                && reserved("o-1") == [O1_NEEDS]
                && books.stock == stock,
            format!(
                "stock short then replenished: o-1 waited {} (the business policy's floor: {}), \
                 then was reserved {} ({:?}); stock {STOCK} + {DELIVERY} - {O1_NEEDS} = {}",
                waits.join(", "),
                ms(RECHECK_MIN),
                times(reserved("o-1").len()),
                reserved("o-1"),
                books.stock
            ),
        );

        // Paced: the channel never called sooner than it asked, as the channel measured it.
        let calls = self.ctx.channel.calls();
        let mut gaps = Vec::new();
        let mut too_soon = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            let Some(asked) = call.retry_after else {
                continue;
            };
            let Some(next) = calls[i + 1..].iter().find(|c| c.order == call.order) else {
                too_soon.push(format!("{} never called again", call.order));
                continue;
            };
            let gap = next.at - call.at;
            gaps.push(format!(
                "{} called again {} after a 429 with Retry-After: {}",
                call.order,
                ms(gap),
                asked.as_secs()
            ));
            if gap < asked {
                too_soon.push(call.order.clone());
            }
        }
        let o3_paced =
            (self.path("o-3")).is_some_and(|p| p.waits.iter().any(|(_, r, _)| *r == Reason::Paced));
        checks.invariant(
            o3_paced && !gaps.is_empty() && too_soon.is_empty() && charged("o-3") == 1,
            format!(
                "paced: the channel was never called sooner than its Retry-After: {}; \
                 o-3 charged {}",
                gaps.join(", "),
                times(charged("o-3"))
            ),
        );

        // Stale by version: never applied, and its record names both versions.
        let record = match redelivered.iter().find(|r| r.order == "o-2") {
            Some(Redelivered {
                processed: Processed::Duplicate(record),
                ..
            }) => text(record),
            _ => String::new(),
        };
        checks.invariant(
            matches!(ended("o-2"), Some(End::Stale { current: 2 }))
                && reserved("o-2").is_empty()
                && record.contains("version 1")
                && record.contains("at 2"),
            format!(
                "stale never applied: o-2 reserved {} times; the inbox's record: {record:?}",
                reserved("o-2").len()
            ),
        );

        // The person's side: one task retried and charged, one discarded and never run again.
        let refused = (self.path("o-4"))
            .is_some_and(|p| p.steps.first().is_some_and(|s| s.starts_with("person")));
        let discarded = matches!(ended("o-5"), Some(End::Discarded(r)) if r.contains(PERSON));
        let o5_runs = self
            .path("o-5")
            .map_or(0, |p| self.ctx.runs(&p.event).len());
        checks.invariant(
            refused
                && matches!(ended("o-4"), Some(End::Applied(_)))
                && charged("o-4") == 1
                && discarded
                && charged("o-5") == 0
                && o5_runs == 1,
            format!(
                "the manual queue: o-4 refused by the limit rule, retried by {PERSON}, charged \
                 {}; o-5 discarded by {PERSON}, charged {} times, its handler ran {}",
                times(charged("o-4")),
                charged("o-5"),
                times(o5_runs)
            ),
        );

        // No task before its time: each run after a wait came no sooner than the delay.
        let mut early = Vec::new();
        let mut comebacks = 0;
        for path in self.paths.values() {
            let runs = self.ctx.runs(&path.event);
            for (run, _, delay) in &path.waits {
                let (Some(a), Some(b)) = (runs.get(*run), runs.get(run + 1)) else {
                    continue;
                };
                comebacks += 1;
                if *b - *a < *delay {
                    let (task, gap) = (label(&path.event), ms(*b - *a));
                    early.push(format!("{task} ran {gap} after a wait of {}", ms(*delay)));
                }
            }
        }
        checks.invariant(
            early.is_empty() && comebacks > 0,
            match early.is_empty() {
                true => format!(
                    "no task ran before its time: {comebacks} comebacks, none sooner than its delay"
                ),
                false => format!("tasks ran before their time: {}", early.join(", ")),
            },
        );

        // Nothing left waiting or in the manual queue, nor in the broker; redeliveries run
        // nothing.
        let mut left = Vec::new();
        for consumer in &self.consumers {
            let tasks = self.world.tasks(consumer.name(), None).await?;
            left.push((consumer.name().to_owned(), tasks.len()));
        }
        let in_broker = self.world.fetch(Duration::from_millis(200)).await?.len();
        let ran = redelivered.iter().filter(|r| r.ran).count();
        let duplicates = (redelivered.iter())
            .filter(|r| matches!(r.processed, Processed::Duplicate(_)))
            .count();
        let all_ended = self.paths.values().all(|p| p.end.is_some());
        checks.invariant(
            left.iter().all(|(_, n)| *n == 0)
                && in_broker == 0
                && all_ended
                && ran == 0
                && duplicates == redelivered.len(),
            format!(
                "no task left waiting or in the manual queue ({}), {in_broker} left in the \
                 broker; {} redeliveries: {duplicates} duplicates, {ran} run",
                (left.iter().map(|(c, n)| format!("{c} {n}")))
                    .collect::<Vec<_>>()
                    .join(", "),
                redelivered.len()
            ),
        );

        let stats = self.world.stats();
        checks.invariant(
            stats.applied == 3 && stats.stale == 1 && stats.to_manual == 2,
            format!(
                "the inbox's counts: applied {}, stale {}, waits {}, to the manual queue {}, \
                 duplicates {}",
                stats.applied, stats.stale, stats.waits, stats.to_manual, stats.duplicates
            ),
        );
        self.checks = checks;
        Ok(())
    }
}

/// Tells the story in `world`: whether every invariant held.
pub(crate) async fn run<W: World>(world: &W) -> Result<bool, BoxError> {
    println!("Mode: {}", world.describe());
    println!();
    let channel = Channel::serve().await?;
    let mut story = Story {
        world,
        ctx: Ctx {
            channel,
            runs: Arc::default(),
        },
        consumers: [inventory()?, payments()?],
        start: Instant::now(),
        paths: BTreeMap::new(),
        replenish_at: None,
        replenished: false,
        person_acted: false,
        checks: Checks::default(),
    };
    story.begin().await?;
    story.run().await?;
    story.summary();
    let redelivered = story.redeliver().await?;
    story.invariants(&redelivered).await?;
    Ok(story.checks.verdict())
}
