//! The `surely` command line (feature `cli`), run as a built binary against the machine's
//! PostgreSQL, in tables of the test's own: reads, actions, `--json`, and the exit codes.

use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use surely::admin::AuditLog;
use surely::ledger::{EntryId, EntryState, Evidence, Ledger, PostgresLedger};
use surely::outbox::{Event, EventId, OutboxStore, PostgresOutbox, Relay};
use surely::server::store::PostgresStore;
use tower::service_fn;

use crate::support::names::unique;
use crate::support::postgres::{self, did_not_answer, url};

struct Tables {
    inbox: surely::inbox::PostgresInbox,
    ledger: PostgresLedger,
    outbox: PostgresOutbox,
    store: PostgresStore,
    audit: String,
}

impl Tables {
    async fn new(test: &str) -> Self {
        let pool = postgres::pool();
        let ledger = PostgresLedger::new(pool.clone())
            .with_table(&unique("surely_cli_ledger"))
            .unwrap();
        ledger
            .migrate()
            .await
            .unwrap_or_else(|e| did_not_answer(test, e));
        let outbox = PostgresOutbox::new(pool.clone())
            .with_table(&unique("surely_cli_outbox"))
            .unwrap();
        outbox.migrate().await.unwrap();
        let store = PostgresStore::new(pool.clone())
            .with_table(&unique("surely_cli_idem"))
            .unwrap();
        store.migrate().await.unwrap();
        let inbox = surely::inbox::PostgresInbox::new(pool.clone())
            .with_table(&unique("surely_cli_inbox"))
            .unwrap();
        inbox.migrate().await.unwrap();
        let audit = unique("surely_cli_audit");
        AuditLog::postgres(pool)
            .with_table(&audit)
            .unwrap()
            .migrate()
            .await
            .unwrap();
        Tables {
            inbox,
            ledger,
            outbox,
            store,
            audit,
        }
    }

    /// Runs `surely` with these tables and `args`.
    fn run(&self, args: &[&str]) -> Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_surely"))
            .args([
                "--ledger-table",
                self.ledger.table(),
                "--outbox-table",
                self.outbox.table(),
                "--idempotency-table",
                self.store.table(),
                "--audit-table",
                &self.audit,
                "--inbox-table",
                self.inbox.table(),
            ])
            .args(args)
            .env("SURELY_DATABASE_URL", url())
            .output()
            .unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.run(&all);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    async fn forget(&self) {
        let pool = self.ledger.pool();
        let (l, o, s) = (self.ledger.table(), self.outbox.table(), self.store.table());
        let attempts = format!("{l}_attempts");
        let i = self.inbox.table();
        let versions = format!("{i}_versions");
        postgres::forget(
            pool,
            &[&attempts, l, o, s, &self.audit, i, &versions],
            &[l, o, s, &self.audit, i],
        )
        .await;
    }
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

#[tokio::test]
async fn cli_reads_and_acts_with_exit_codes_for_scripts() {
    let t = Tables::new("cli_reads_and_acts_with_exit_codes_for_scripts").await;
    let id = EntryId::new(unique("unk-cli")).unwrap();
    let evidence = Evidence::new("o-\u{1b}[31mred", "POST /orders").with_id(id.clone());
    t.ledger.record(&evidence).await.unwrap();
    let claim = t
        .ledger
        .claim(1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0);
    t.ledger.to_manual(&claim, "cannot query").await.unwrap();
    let mut client = t.outbox.pool().get().await.unwrap();
    let txn = client.transaction().await.unwrap();
    for n in ["evt-cli-1", "evt-cli-2"] {
        let e = Event::new(
            EventId::new(n).unwrap(),
            "order o-1",
            1,
            "OrderCreated",
            "x",
        )
        .unwrap();
        t.outbox.enqueue(&txn, &e).await.unwrap();
    }
    txn.commit().await.unwrap();
    drop(client);
    let refuse = service_fn(|_: Event| async { Err::<(), _>(std::io::Error::other("down")) });
    Relay::builder(t.outbox.clone(), refuse)
        .quarantine_after(1)
        .build()
        .unwrap()
        .run_once()
        .await
        .unwrap();

    // Reads.
    let list = t.json(&["ledger", "list"]);
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(list[0]["note"], "cannot query");
    let text = t.run(&["ledger", "list"]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains(id.as_str()) && !text.contains('\u{1b}'),
        "escaped: {text:?}"
    );
    assert_eq!(t.json(&["ledger", "show", id.as_str()])["state"], "manual");
    assert_eq!(
        t.json(&["outbox", "quarantine"]).as_array().unwrap().len(),
        2
    );
    let stats = t.json(&["outbox", "stats"]);
    assert_eq!(stats["quarantined"], 2);
    assert!(stats["log_lag_bytes"].is_null(), "no log relay: {stats}");
    assert!(t
        .json(&["idempotency", "unknown"])
        .as_array()
        .unwrap()
        .is_empty());
    assert!(t
        .json(&["idempotency", "stuck", "--older-than", "1"])
        .as_array()
        .unwrap()
        .is_empty());

    // Actions, and their exit codes.
    let settle = |who: &str, why: &str| {
        t.run(&[
            "ledger",
            "settle",
            id.as_str(),
            "--verdict",
            "succeeded",
            "--who",
            who,
            "--why",
            why,
        ])
    };
    assert_eq!(code(&settle("ana", "a\u{7}bell")), 1, "a control character");
    assert_eq!(code(&settle("", "why")), 1, "no who");
    assert_eq!(code(&settle("ana", "found in the order table")), 0);
    let entry = t.ledger.get(&id).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Settled);
    let again = settle("ana", "again");
    assert_eq!(
        code(&again),
        3,
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let missing = [
        "ledger",
        "settle",
        "unk-none",
        "--verdict",
        "failed",
        "--who",
        "a",
        "--why",
        "w",
    ];
    assert_eq!(code(&t.run(&missing)), 2);
    assert_eq!(code(&t.run(&["ledger", "show", "bad id!"])), 1);
    assert_eq!(code(&t.run(&["ledger", "show", "unk-none"])), 2);
    assert_eq!(
        code(&t.run(&[
            "outbox",
            "requeue",
            "evt-cli-1",
            "--who",
            "bo",
            "--why",
            "broker back"
        ])),
        0
    );
    assert_eq!(
        code(&t.run(&[
            "outbox",
            "discard",
            "evt-cli-2",
            "--who",
            "bo",
            "--why",
            "test event"
        ])),
        0
    );
    assert_eq!(
        code(&t.run(&[
            "outbox",
            "discard",
            "evt-cli-2",
            "--who",
            "bo",
            "--why",
            "again"
        ])),
        2
    );
    assert_eq!(t.outbox.stats().await.unwrap().quarantined, 0);

    let audit = t.json(&["audit"]);
    let seen: Vec<(&str, &str, &str)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["who"].as_str().unwrap(),
                l["action"].as_str().unwrap(),
                l["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert_eq!(seen[1], ("bo", "outbox.discard", "done"));
    assert_eq!(
        seen[3],
        (
            "a",
            "ledger.settle",
            "refused (not found): no ledger entry unk-none"
        )
    );
    assert_eq!(seen[5], ("ana", "ledger.settle", "done"));

    // Usage, help, and a database that does not answer.
    assert_eq!(code(&t.run(&[])), 1);
    assert_eq!(code(&t.run(&["--help"])), 0);
    assert_eq!(code(&t.run(&["ledger", "list", "--state", "nope"])), 1);
    let down = std::process::Command::new(env!("CARGO_BIN_EXE_surely"))
        .args([
            "--database-url",
            "postgres://postgres@127.0.0.1:1/test",
            "--json",
            "ledger",
            "list",
        ])
        .output()
        .unwrap();
    assert_eq!(code(&down), 4);
    let err: Value = serde_json::from_slice(&down.stderr).unwrap();
    assert_eq!(err["exit"], 4);
    let none = std::process::Command::new(env!("CARGO_BIN_EXE_surely"))
        .args(["audit"])
        .env_remove("SURELY_DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(code(&none), 1);
    t.forget().await;
}

#[tokio::test]
async fn cli_lists_shows_retries_and_discards_tasks() {
    use surely::inbox::{Consumer, Wait};
    let t = Tables::new("cli_lists_shows_retries_and_discards_tasks").await;
    let payments = Consumer::builder("payments").build().unwrap();
    for (id, wait) in [
        (
            "charge-1",
            Wait::person("limit rule", "over \u{1b}[31m10 000 EUR"),
        ),
        ("charge-2", Wait::person("limit rule", "over 10 000 EUR")),
        ("charge-3", Wait::business("the card is not verified")),
    ] {
        let event = Event::new(EventId::new(id).unwrap(), "order o-9", 1, "Charge", "{}").unwrap();
        let mut wait = Some(wait);
        t.inbox
            .process_task_and_commit(&payments, &event, move |_txn| {
                let wait = wait.take();
                Box::pin(async move { Err(wait.unwrap()) })
            })
            .await
            .unwrap();
    }
    let listed = t.json(&["tasks", "list"]);
    let events: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        ["charge-1", "charge-2"],
        "the manual queue, oldest first"
    );
    let waiting = t.json(&[
        "tasks",
        "list",
        "--state",
        "waiting",
        "--consumer",
        "payments",
    ]);
    assert_eq!(waiting[0]["reason"], "business");
    let shown = t.run(&["tasks", "show", "payments", "charge-1"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    // The handler's escape sequence never reached the store, nor the terminal.
    assert!(
        text.contains("person") && text.contains("over  [31m10 000"),
        "{text}"
    );
    assert!(!text.contains('\u{1b}'));
    let stats = t.json(&["tasks", "stats"]);
    assert_eq!(stats["counts"].as_array().unwrap().len(), 2, "{stats}");

    let retried = t.run(&[
        "tasks", "retry", "payments", "charge-1", "--who", "ana", "--why", "verified",
    ]);
    assert_eq!(
        code(&retried),
        0,
        "{}",
        String::from_utf8_lossy(&retried.stderr)
    );
    assert_eq!(
        t.inbox
            .take_retried("payments", 10, Duration::from_secs(30))
            .await
            .unwrap()
            .len(),
        1
    );
    let discarded = t.run(&[
        "tasks", "discard", "payments", "charge-2", "--who", "ana", "--why", "paid",
    ]);
    assert_eq!(code(&discarded), 0);
    let again = t.run(&[
        "tasks", "discard", "payments", "charge-2", "--who", "ana", "--why", "paid",
    ]);
    assert_eq!(code(&again), 2, "no such task in the manual queue");
    let bad = t.run(&[
        "tasks", "retry", "payments", "charge-3", "--who", "", "--why", "x",
    ]);
    assert_eq!(code(&bad), 1, "{}", String::from_utf8_lossy(&bad.stderr));
    let missing = t.run(&["tasks", "show", "payments", "nope"]);
    assert_eq!(code(&missing), 2);
    let odd = t.run(&["tasks", "list", "--state", "odd"]);
    assert_eq!(code(&odd), 1);
    let audit = t.json(&["audit"]);
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["action"].as_str().unwrap())
        .collect();
    assert!(
        actions.contains(&"inbox.retry_task") && actions.contains(&"inbox.discard_task"),
        "{actions:?}"
    );
    t.forget().await;
}
