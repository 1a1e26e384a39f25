//! `surely`: the operator's reads and actions over PostgreSQL, for scripts and terminals
//! (feature `cli`; the same actions as the admin's pages, written to the same audit log).
//!
//! ```text
//! surely ledger list [--state manual] [--key K] [--limit N]
//! surely ledger show ID
//! surely ledger settle ID --verdict succeeded|failed --who NAME --why TEXT
//! surely ledger retry ID --who NAME --why TEXT
//! surely outbox stats
//! surely outbox quarantine [--limit N]
//! surely outbox requeue ID --who NAME --why TEXT
//! surely outbox discard ID --who NAME --why TEXT
//! surely tasks list [--state manual|waiting|all] [--consumer C] [--limit N]
//! surely tasks show CONSUMER EVENT
//! surely tasks retry CONSUMER EVENT --who NAME --why TEXT
//! surely tasks discard CONSUMER EVENT --who NAME --why TEXT
//! surely tasks stats
//! surely idempotency unknown [--limit N]
//! surely idempotency stuck [--older-than SECS] [--limit N]
//! surely audit [--limit N]
//! surely review CHAIN.toml [--fail-on error|warning|info]
//! ```
//!
//! The database is `--database-url` or `SURELY_DATABASE_URL`; `--json` prints JSON instead of
//! text. The tables are the crate's defaults unless named (`--ledger-table` and the others).
//!
//! Exit codes, for scripts: **0** done; **1** a usage error or a value refused (a bad id, a
//! reason with a control character); **2** no such entry, event or task (in the manual
//! queue); **3** a conflict (the entry is settled or claimed, a task's stored reason is one
//! this version does not know); **4** the database could not be reached or failed.
//!
//! `surely review` needs no database: it reads a chain file and prints the seven questions of
//! every operation with the answers the settings give, the worst paths, and the findings
//! ([`surely::docs::review`]). It exits **0** when no finding is at or above `--fail-on`
//! (default `error`), **1** when one is, and **2** when the file cannot be read or is not a
//! chain (the message says its line and column).
//!
//! Who acts is `--who`, as given: whoever can run this command with the database's
//! credentials can act, so the audit log records the name they give. Keep those credentials
//! for operators ([`surely::docs::operators`]).

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use surely::admin::{Action, Admin, AuditLog};
use surely::inbox::{PostgresInbox, Task, TaskState, TaskStore};
use surely::ledger::{Entry, EntryId, EntryState, Filter, Ledger, PostgresLedger, Verdict};
use surely::outbox::{EventId, OutboxStore, PostgresOutbox};
use surely::server::store::{Fence, IdempotencyStore, PostgresStore, RecordKey};

/// The operator's reads and actions over surely's PostgreSQL tables.
#[derive(Parser, Debug)]
#[command(name = "surely", version, about)]
struct Cli {
    /// The database: postgres://user@host:port/db
    #[arg(long, env = "SURELY_DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    tables: Tables,
    #[command(subcommand)]
    command: Command,
}

/// The tables, when not the crate's defaults.
#[derive(Args, Debug)]
struct Tables {
    /// The ledger's table.
    #[arg(long, global = true, default_value = "surely_ledger")]
    ledger_table: String,
    /// The outbox's table.
    #[arg(long, global = true, default_value = "surely_outbox")]
    outbox_table: String,
    /// The idempotency store's table.
    #[arg(long, global = true, default_value = "surely_idempotency")]
    idempotency_table: String,
    /// The audit log's table.
    #[arg(long, global = true, default_value = "surely_admin_audit")]
    audit_table: String,
    /// The inbox's table (its tasks are in `<table>_tasks`).
    #[arg(long, global = true, default_value = "surely_inbox")]
    inbox_table: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The UNKNOWN ledger.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// The outbox's quarantine.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// The inbox's tasks: those in the manual queue, and those waiting.
    #[command(subcommand)]
    Tasks(TasksCommand),
    /// The idempotency store's records that need a person.
    #[command(subcommand)]
    Idempotency(IdempotencyCommand),
    /// Reviews a call chain's settings (a TOML chain file): the seven questions of every
    /// operation, the worst paths, the findings. Needs no database.
    Review {
        /// The chain file.
        file: std::path::PathBuf,
        /// Exit 1 when a finding is at or above this severity: error, warning or info.
        #[arg(long, default_value = "error")]
        fail_on: String,
    },
    /// The audit log, newest first.
    Audit {
        /// At most this many lines.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

/// Who acts, and why: required for every action.
#[derive(Args, Debug)]
struct Why {
    /// Who acts (kept in the audit log).
    #[arg(long)]
    who: String,
    /// Why (kept in the audit log, and as the settlement's evidence).
    #[arg(long)]
    why: String,
}

#[derive(Subcommand, Debug)]
enum LedgerCommand {
    /// The entries in a state (the manual queue unless told), oldest first.
    List {
        /// in_doubt, open, claimed, manual or settled.
        #[arg(long, default_value = "manual")]
        state: String,
        /// Only this key's.
        #[arg(long)]
        key: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One entry, with every attempt.
    Show {
        /// The entry's id.
        id: String,
    },
    /// Settle an entry by hand.
    Settle {
        /// The entry's id.
        id: String,
        /// succeeded or failed.
        #[arg(long)]
        verdict: String,
        #[command(flatten)]
        why: Why,
    },
    /// Send an entry back to the reconcilers, now.
    Retry {
        /// The entry's id.
        id: String,
        #[command(flatten)]
        why: Why,
    },
}

#[derive(Subcommand, Debug)]
enum OutboxCommand {
    /// The backlog, the oldest waiting event's age, the quarantine, and how far a log relay's
    /// slot is behind.
    Stats,
    /// The quarantined events, oldest first.
    Quarantine {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Publish a quarantined event again.
    Requeue {
        /// The event's id.
        id: String,
        #[command(flatten)]
        why: Why,
    },
    /// Never publish a quarantined event.
    Discard {
        /// The event's id.
        id: String,
        #[command(flatten)]
        why: Why,
    },
}

#[derive(Subcommand, Debug)]
enum TasksCommand {
    /// The tasks in a state (the manual queue unless told), oldest first.
    List {
        /// manual, waiting or all.
        #[arg(long, default_value = "manual")]
        state: String,
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One task, with every attempt's reason.
    Show {
        /// The consumer it belongs to.
        consumer: String,
        /// Its event's id.
        event: String,
    },
    /// Send a task in the manual queue back to its handler.
    Retry {
        /// The consumer it belongs to.
        consumer: String,
        /// Its event's id.
        event: String,
        #[command(flatten)]
        why: Why,
    },
    /// Discard a task in the manual queue: recorded as processed, never run.
    Discard {
        /// The consumer it belongs to.
        consumer: String,
        /// Its event's id.
        event: String,
        #[command(flatten)]
        why: Why,
    },
    /// The tasks counted by state and reason, with the oldest's age.
    Stats,
}

#[derive(Subcommand, Debug)]
enum IdempotencyCommand {
    /// The UNKNOWN records, oldest first.
    Unknown {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// The records still processing after a while.
    Stuck {
        /// Seconds since their owner acquired them.
        #[arg(long, default_value_t = 300)]
        older_than: u64,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
}

/// A failure, with its exit code.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(m: impl ToString) -> Self {
        Failure {
            code: 1,
            message: m.to_string(),
        }
    }
    fn not_found(m: impl ToString) -> Self {
        Failure {
            code: 2,
            message: m.to_string(),
        }
    }
    fn backend(m: impl ToString) -> Self {
        Failure {
            code: 4,
            message: m.to_string(),
        }
    }
}

/// An error and its causes in one line: each message along `source()`, joined by `": "` (the
/// crate's errors say their cause once, in `source()`, not in their message).
fn said(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Text as a terminal may show it: control characters escaped (an entry's evidence comes from
/// elsewhere, and an escape sequence in it must not reach the terminal).
fn plain(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn secs(d: Duration) -> u64 {
    d.as_secs()
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn entry_json(e: &Entry) -> Value {
    let ev = &e.evidence;
    json!({
        "id": ev.id.as_str(),
        "state": e.state.as_str(),
        "key": ev.key,
        "operation": ev.operation,
        "stop": ev.stop.as_str(),
        "recorded_at": unix(ev.recorded_at),
        "age_secs": secs(e.age),
        "tries": e.tries,
        "note": e.note,
        "attempts": ev.attempts.iter().map(|a| json!({
            "attempt": a.attempt,
            "started_at": unix(a.started_at),
            "took_ms": a.took.as_millis() as u64,
            "class": a.class.as_str(),
            "phase": a.phase.as_str(),
            "timeout": a.timeout,
            "hedge": a.hedge,
            "cancelled": a.cancelled,
            "downstream_id": a.downstream_id,
        })).collect::<Vec<_>>(),
        "settlement": e.settlement.as_ref().map(|s| json!({
            "verdict": s.verdict.as_str(),
            "evidence": s.evidence,
            "at": unix(s.at),
        })),
    })
}

fn task_json(t: &Task) -> Value {
    json!({
        "consumer": t.consumer,
        "event": t.event.id().as_str(),
        "aggregate": t.event.aggregate(),
        "version": t.event.version(),
        "kind": t.event.kind(),
        "state": t.state.code(),
        "reason": t.reason.code(),
        "attempts": t.attempts,
        "age_secs": secs(t.age),
        "due_in_ms": t.due_in.map(|d| d.as_millis() as u64),
        "why": t.why,
        "steps": t.steps.iter().map(|s| json!({
            "attempt": s.attempt,
            "at": unix(s.at),
            "reason": s.reason.code(),
            "why": s.why,
            "delay_ms": s.delay.as_millis() as u64,
            "clamped_from_ms": s.clamped_from.map(|d| d.as_millis() as u64),
        })).collect::<Vec<_>>(),
    })
}

fn opt(s: &Option<String>) -> String {
    plain(s.as_deref().unwrap_or("-"))
}

/// `surely review`: 0 clean, 1 a finding at or above `fail_on`, 2 a file that cannot be read
/// or reviewed.
fn review(file: &std::path::Path, fail_on: &str, json: bool) -> ExitCode {
    let fail = |message: String| {
        if json {
            eprintln!("{}", json!({ "error": message, "exit": 2 }));
        } else {
            eprintln!("surely: {}", plain(&message));
        }
        ExitCode::from(2)
    };
    let Some(fail_on) = surely::review::Severity::parse(fail_on) else {
        return fail(format!(
            "--fail-on: `{fail_on}` is not error, warning or info"
        ));
    };
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => return fail(format!("{}: {e}", file.display())),
    };
    let review = match surely::review::Chain::from_toml(&text).and_then(|c| c.review()) {
        Ok(review) => review,
        Err(e) => return fail(format!("{}: {e}", file.display())),
    };
    if json {
        match serde_json::to_string_pretty(&review) {
            Ok(text) => println!("{text}"),
            Err(e) => return fail(format!("the review as JSON: {e}")),
        }
    } else {
        print!("{review}");
    }
    if review.fails(fail_on) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn run(cli: Cli) -> Result<Option<Value>, Failure> {
    let url = cli.database_url.ok_or_else(|| {
        Failure::usage("no database: give --database-url or set SURELY_DATABASE_URL")
    })?;
    let pool = surely::postgres::connect(&url).map_err(|e| Failure::usage(said(&e)))?;
    let t = &cli.tables;
    let ledger = PostgresLedger::new(pool.clone())
        .with_table(&t.ledger_table)
        .map_err(|e| Failure::usage(said(&e)))?;
    let outbox = PostgresOutbox::new(pool.clone())
        .with_table(&t.outbox_table)
        .map_err(|e| Failure::usage(said(&e)))?;
    let store = PostgresStore::new(pool.clone())
        .with_table(&t.idempotency_table)
        .map_err(|e| Failure::usage(said(&e)))?;
    let inbox = PostgresInbox::new(pool.clone())
        .with_table(&t.inbox_table)
        .map_err(|e| Failure::usage(said(&e)))?;
    let audit = AuditLog::postgres(pool)
        .with_table(&t.audit_table)
        .map_err(|e| Failure::usage(said(&e)))?;
    let json = cli.json;
    let act = |action: Action, why: Why| {
        let admin = Admin::builder()
            .ledger(ledger.clone())
            .outbox(outbox.clone())
            .tasks(inbox.clone())
            .audit(audit.clone())
            .build();
        async move {
            admin.act(&why.who, action, &why.why).await.map_err(|e| {
                let code = if e.is_not_found() {
                    2
                } else if e.is_conflict() {
                    3
                } else if e.is_unavailable() {
                    4
                } else {
                    1
                };
                Failure {
                    code,
                    message: said(&e),
                }
            })?;
            Ok::<_, Failure>(())
        }
    };
    let entry_id = |id: &str| EntryId::new(id).map_err(|e| Failure::usage(said(&e)));
    let event_id = |id: &str| EventId::new(id).map_err(|e| Failure::usage(said(&e)));
    let ledger_failed = |e: surely::ledger::LedgerError| {
        if e.is_invalid() {
            Failure::usage(said(&e))
        } else {
            Failure::backend(said(&e))
        }
    };
    match cli.command {
        Command::Ledger(LedgerCommand::List { state, key, limit }) => {
            let state = EntryState::parse(&state).ok_or_else(|| {
                Failure::usage("--state is one of in_doubt, open, claimed, manual, settled")
            })?;
            let mut filter = Filter::new().state(state).limit(limit);
            if let Some(key) = key {
                filter = filter.key(key);
            }
            let entries = ledger.list(&filter).await.map_err(ledger_failed)?;
            if json {
                return Ok(Some(Value::Array(entries.iter().map(entry_json).collect())));
            }
            for e in &entries {
                println!(
                    "{}\t{}\t{}\t{}\ttries {}\t{}s\t{}",
                    e.evidence.id,
                    e.state.as_str(),
                    opt(&e.evidence.key),
                    opt(&e.evidence.operation),
                    e.tries,
                    secs(e.age),
                    opt(&e.note)
                );
            }
            Ok(None)
        }
        Command::Ledger(LedgerCommand::Show { id }) => {
            let id = entry_id(&id)?;
            let e = ledger
                .get(&id)
                .await
                .map_err(ledger_failed)?
                .ok_or_else(|| Failure::not_found(format!("no ledger entry {id}")))?;
            if json {
                return Ok(Some(entry_json(&e)));
            }
            let ev = &e.evidence;
            println!("entry      {}", ev.id);
            println!("state      {}", e.state.as_str());
            println!("key        {}", opt(&ev.key));
            println!("operation  {}", opt(&ev.operation));
            println!("stopped    {}", ev.stop.as_str());
            println!("age        {}s, {} tries", secs(e.age), e.tries);
            println!("note       {}", opt(&e.note));
            for a in &ev.attempts {
                println!(
                    "attempt {}  {} ms  {}  {}  timeout {}  downstream {}",
                    a.attempt,
                    a.took.as_millis(),
                    a.class.as_str(),
                    a.phase.as_str(),
                    opt(&a.timeout),
                    opt(&a.downstream_id)
                );
            }
            if let Some(s) = &e.settlement {
                println!("settled    {}: {}", s.verdict.as_str(), plain(&s.evidence));
            }
            Ok(None)
        }
        Command::Ledger(LedgerCommand::Settle { id, verdict, why }) => {
            let entry = entry_id(&id)?;
            let verdict = Verdict::parse(&verdict)
                .ok_or_else(|| Failure::usage("--verdict is succeeded or failed"))?;
            act(Action::Settle { entry, verdict }, why).await?;
            done(json, "settled", &id)
        }
        Command::Ledger(LedgerCommand::Retry { id, why }) => {
            act(Action::RetryNow(entry_id(&id)?), why).await?;
            done(json, "sent back", &id)
        }
        Command::Outbox(OutboxCommand::Stats) => {
            let s = outbox
                .stats()
                .await
                .map_err(|e| Failure::backend(said(&e)))?;
            if json {
                return Ok(Some(json!({
                    "backlog": s.backlog,
                    "oldest_secs": s.oldest.map(secs),
                    "quarantined": s.quarantined,
                    "log_lag_bytes": s.log_lag_bytes,
                    "log_lag_secs": s.log_lag.map(secs),
                })));
            }
            println!("backlog\t{}", s.backlog);
            println!(
                "oldest\t{}",
                s.oldest
                    .map_or("none".to_owned(), |d| format!("{}s", secs(d)))
            );
            println!("quarantined\t{}", s.quarantined);
            match (s.log_lag_bytes, s.log_lag) {
                (Some(bytes), lag) => {
                    println!("log lag\t{bytes} bytes");
                    if let Some(lag) = lag {
                        println!("log confirmed\t{}s ago", secs(lag));
                    }
                }
                (None, _) => println!("log lag\tno log relay's slot"),
            }
            Ok(None)
        }
        Command::Outbox(OutboxCommand::Quarantine { limit }) => {
            let events = outbox
                .quarantined(limit)
                .await
                .map_err(|e| Failure::backend(said(&e)))?;
            if json {
                return Ok(Some(Value::Array(
                    events
                        .iter()
                        .map(|q| {
                            json!({
                                "id": q.event.id().as_str(),
                                "aggregate": q.event.aggregate(),
                                "version": q.event.version(),
                                "kind": q.event.kind(),
                                "failures": q.failures,
                                "last_error": q.last_error,
                                "age_secs": secs(q.age),
                            })
                        })
                        .collect(),
                )));
            }
            for q in &events {
                println!(
                    "{}\t{}\t{}\t{} failures\t{}s\t{}",
                    plain(q.event.id().as_str()),
                    plain(q.event.kind()),
                    plain(q.event.aggregate()),
                    q.failures,
                    secs(q.age),
                    opt(&q.last_error)
                );
            }
            Ok(None)
        }
        Command::Outbox(OutboxCommand::Requeue { id, why }) => {
            act(Action::Requeue(event_id(&id)?), why).await?;
            done(json, "requeued", &id)
        }
        Command::Outbox(OutboxCommand::Discard { id, why }) => {
            act(Action::Discard(event_id(&id)?), why).await?;
            done(json, "discarded", &id)
        }
        Command::Tasks(cmd) => {
            let inbox_failed = |e: surely::inbox::InboxError| {
                if e.is_unknown_reason() {
                    Failure {
                        code: 3,
                        message: said(&e),
                    }
                } else {
                    Failure::backend(said(&e))
                }
            };
            match cmd {
                TasksCommand::List {
                    state,
                    consumer,
                    limit,
                } => {
                    let state = match state.as_str() {
                        "manual" => Some(TaskState::Manual),
                        "waiting" => Some(TaskState::Waiting),
                        "all" => None,
                        _ => return Err(Failure::usage("--state is one of manual, waiting, all")),
                    };
                    let tasks = TaskStore::list(&inbox, consumer.as_deref(), state, limit)
                        .await
                        .map_err(inbox_failed)?;
                    if json {
                        return Ok(Some(Value::Array(tasks.iter().map(task_json).collect())));
                    }
                    for t in &tasks {
                        println!(
                            "{}\t{}\t{}\t{}\t{} attempts\t{}s\t{}",
                            plain(&t.consumer),
                            plain(t.event.id().as_str()),
                            t.state.code(),
                            t.reason.code(),
                            t.attempts,
                            secs(t.age),
                            plain(&t.why)
                        );
                    }
                    Ok(None)
                }
                TasksCommand::Show { consumer, event } => {
                    let t = TaskStore::get(&inbox, &consumer, &event)
                        .await
                        .map_err(inbox_failed)?
                        .ok_or_else(|| {
                            Failure::not_found(format!("no task of {consumer} for event {event}"))
                        })?;
                    if json {
                        return Ok(Some(task_json(&t)));
                    }
                    println!(
                        "task      {} of {}",
                        plain(t.event.id().as_str()),
                        plain(&t.consumer)
                    );
                    println!("state     {} ({})", t.state.code(), t.reason.code());
                    println!(
                        "event     {} v{} {}",
                        plain(t.event.aggregate()),
                        t.event.version(),
                        plain(t.event.kind())
                    );
                    println!("attempts  {}", t.attempts);
                    println!("age       {}s", secs(t.age));
                    println!("why       {}", plain(&t.why));
                    for s in &t.steps {
                        let clamped = s
                            .clamped_from
                            .map(|d| format!(" (asked {} ms)", d.as_millis()))
                            .unwrap_or_default();
                        println!(
                            "  #{}  {}  {} ms{}  {}",
                            s.attempt,
                            s.reason.code(),
                            s.delay.as_millis(),
                            clamped,
                            plain(&s.why)
                        );
                    }
                    Ok(None)
                }
                TasksCommand::Retry {
                    consumer,
                    event,
                    why,
                } => {
                    let event = event_id(&event)?;
                    let id = format!("{consumer} {}", event.as_str());
                    act(Action::RetryTask { consumer, event }, why).await?;
                    done(json, "sent back", &id)
                }
                TasksCommand::Discard {
                    consumer,
                    event,
                    why,
                } => {
                    let event = event_id(&event)?;
                    let id = format!("{consumer} {}", event.as_str());
                    act(Action::DiscardTask { consumer, event }, why).await?;
                    done(json, "discarded", &id)
                }
                TasksCommand::Stats => {
                    let stats = TaskStore::stats(&inbox).await.map_err(inbox_failed)?;
                    if json {
                        return Ok(Some(json!({
                            "counts": stats.counts.iter().map(|c| json!({
                                "state": c.state.code(),
                                "reason": c.reason.code(),
                                "tasks": c.tasks,
                                "oldest_secs": secs(c.oldest),
                            })).collect::<Vec<_>>(),
                            "unknown": stats.unknown,
                        })));
                    }
                    for c in &stats.counts {
                        println!(
                            "{}\t{}\t{}\toldest {}s",
                            c.state.code(),
                            c.reason.code(),
                            c.tasks,
                            secs(c.oldest)
                        );
                    }
                    if stats.unknown > 0 {
                        println!("held\tunknown reason\t{}", stats.unknown);
                    }
                    Ok(None)
                }
            }
        }
        Command::Idempotency(cmd) => {
            let row = |k: &RecordKey, fence: Fence, evidence: String, age: Duration| {
                let (tenant, op) = (k.tenant().to_owned(), k.operation().to_owned());
                (
                    tenant,
                    op,
                    k.key().as_str().to_owned(),
                    fence.get(),
                    evidence,
                    secs(age),
                )
            };
            let rows: Vec<(String, String, String, u64, String, u64)> = match cmd {
                IdempotencyCommand::Unknown { limit } => store
                    .unknowns(limit)
                    .await
                    .map_err(|e| Failure::backend(said(&e)))?
                    .into_iter()
                    .map(|r| row(&r.key, r.fence, r.evidence, r.age))
                    .collect(),
                IdempotencyCommand::Stuck { older_than, limit } => store
                    .stuck(Duration::from_secs(older_than), limit)
                    .await
                    .map_err(|e| Failure::backend(said(&e)))?
                    .into_iter()
                    .map(|r| row(&r.key, r.fence, String::new(), r.age))
                    .collect(),
            };
            if json {
                return Ok(Some(Value::Array(
                    rows.iter()
                        .map(|(tenant, op, key, fence, evidence, age)| {
                            json!({"tenant": tenant, "operation": op, "key": key,
                                   "fence": fence, "evidence": evidence, "age_secs": age})
                        })
                        .collect(),
                )));
            }
            for (tenant, op, key, fence, evidence, age) in &rows {
                println!(
                    "{}\t{}\t{}\tfence {fence}\t{age}s\t{}",
                    plain(tenant),
                    plain(op),
                    plain(key),
                    plain(evidence)
                );
            }
            Ok(None)
        }
        // Answered in `main`, before any database.
        Command::Review { .. } => Ok(None),
        Command::Audit { limit } => {
            let lines = audit
                .list(limit)
                .await
                .map_err(|e| Failure::backend(said(&e)))?;
            if json {
                return Ok(Some(Value::Array(
                    lines
                        .iter()
                        .map(|l| {
                            json!({"id": l.id, "at": unix(l.at), "who": l.who,
                                   "action": l.action.as_str(), "target": l.target,
                                   "why": l.why, "outcome": l.outcome})
                        })
                        .collect(),
                )));
            }
            for l in &lines {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    l.id,
                    httpdate::fmt_http_date(l.at),
                    plain(&l.who),
                    l.action,
                    plain(&l.target),
                    plain(&l.why),
                    opt(&l.outcome)
                );
            }
            Ok(None)
        }
    }
}

fn done(json: bool, what: &str, id: &str) -> Result<Option<Value>, Failure> {
    if json {
        return Ok(Some(json!({ "done": what, "id": id })));
    }
    println!("{what} {}", plain(id));
    Ok(None)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return ExitCode::from(if usage { 1 } else { 0 });
        }
    };
    let json = cli.json;
    if let Command::Review { file, fail_on } = &cli.command {
        return review(file, fail_on, json);
    }
    match run(cli).await {
        Ok(Some(value)) => {
            println!("{value}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(f) => {
            if json {
                eprintln!("{}", json!({ "error": f.message, "exit": f.code }));
            } else {
                eprintln!("surely: {}", plain(&f.message));
            }
            ExitCode::from(f.code)
        }
    }
}
