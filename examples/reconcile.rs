//! Reconciliation between systems: the seed's three differences found, each repaired once, and
//! work still in flight left alone.
//!
//! Five systems hold facts by business key: the orders (`awaiting_payment`, `paid`,
//! `cancelling`, `cancelled`), the payment channel's statement (`charged`), the inventory
//! (`reserved`, `released`), the outbox's events (`published`) and a projection that applies
//! them (`applied`). Three rules say which combinations are consistent, and which repair each
//! known difference needs:
//!
//! 1. **A charge while the order still waits for payment**: `awaiting_payment` beside
//!    `charged`, an hour old: repaired by `mark-paid`.
//! 2. **An event published but missing from the projection**: repaired by `replay-event`.
//! 3. **Inventory released while the order is still cancelling**: repaired by
//!    `finish-cancel`.
//! 4. And one that is consistent within the grace window (five minutes): an order charged
//!    twenty seconds ago, not yet marked paid. Work in flight, not a difference.
//!
//! The reconciliation runs twice. The first run finds the three differences and a repairer
//! applies each one through a `tower::Service` that keeps the repair ids it applied (a repeat
//! is answered without applying again). The second run, over the same systems, finds them
//! consistent and applies nothing. The run ends with one line per invariant, then
//! `invariants: ok`, or says what failed and exits with 1.
//!
//! ```sh
//! # everything in memory
//! cargo run --example reconcile
//!
//! # the systems' tables, the repairs' ids and the differences in PostgreSQL (a schema of its
//! # own, dropped at the end)
//! SURELY_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//!   cargo run --features postgres --example reconcile
//! ```

#[path = "support/checks.rs"]
mod checks;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use checks::Checks;
use surely::classify::BoxError;
use surely::reconcile::{
    DifferenceStore, Fact, MemoryDifferences, MemorySource, PageRequest, Reconciler, RepairAnswer,
    RepairRequest, Repairer, Rule, Source, Want,
};
use surely::record::InMemoryRecorder;

/// The systems compared, by the names the rules use.
const SYSTEMS: [&str; 5] = ["orders", "payments", "inventory", "events", "projection"];

/// Work younger than this is in flight.
const GRACE: Duration = Duration::from_secs(300);

fn rules() -> Vec<Rule> {
    vec![
        Rule::new("payment-order", ["orders", "payments"])
            .grace(GRACE)
            .consistent([Want::is("paid"), Want::is("charged")])
            .consistent([Want::Any, Want::Missing])
            .repair(
                [Want::is("awaiting_payment"), Want::is("charged")],
                "mark-paid",
            ),
        Rule::new("order-inventory", ["orders", "inventory"])
            .grace(GRACE)
            .consistent([
                Want::one_of(["awaiting_payment", "paid"]),
                Want::is("reserved"),
            ])
            .consistent([Want::is("cancelled"), Want::is("released")])
            .consistent([Want::Any, Want::Missing])
            .repair(
                [Want::is("cancelling"), Want::is("released")],
                "finish-cancel",
            ),
        Rule::new("event-projection", ["events", "projection"])
            .grace(GRACE)
            .consistent([Want::is("published"), Want::is("applied")])
            .repair([Want::is("published"), Want::Missing], "replay-event"),
    ]
}

/// The facts before the first run: (system, key, value, version, seconds ago).
const FACTS: &[(&str, &str, &str, i64, u64)] = &[
    // Consistent: paid, charged, stock reserved.
    ("orders", "o-1000", "paid", 3, 7200),
    ("payments", "o-1000", "charged", 1, 7200),
    ("inventory", "o-1000", "reserved", 1, 7200),
    // 1. Charged an hour ago; the order still waits for payment.
    ("orders", "o-1001", "awaiting_payment", 1, 3700),
    ("payments", "o-1001", "charged", 1, 3600),
    ("inventory", "o-1001", "reserved", 1, 3700),
    // 2. Published, and not in the projection.
    ("events", "e-2001", "published", 1, 1800),
    ("events", "e-2002", "published", 1, 1800),
    ("projection", "e-2002", "applied", 1, 1790),
    // 3. Stock released while the order is still cancelling.
    ("orders", "o-1003", "cancelling", 4, 2400),
    ("inventory", "o-1003", "released", 2, 2300),
    // 4. In flight: charged twenty seconds ago.
    ("orders", "o-1004", "awaiting_payment", 1, 400),
    ("payments", "o-1004", "charged", 1, 20),
    ("inventory", "o-1004", "reserved", 1, 400),
];

/// A source of either kind, so that one story runs on both.
#[derive(Clone)]
enum AnySource {
    Memory(MemorySource),
    #[cfg(feature = "postgres")]
    Postgres(surely::reconcile::PostgresSource),
}

impl Source for AnySource {
    async fn page(&self, request: PageRequest<'_>) -> Result<Vec<Fact>, BoxError> {
        match self {
            AnySource::Memory(s) => s.page(request).await,
            #[cfg(feature = "postgres")]
            AnySource::Postgres(s) => s.page(request).await,
        }
    }
}

/// The systems, and the repairs' target: it applies a repair once per repair id.
trait World: Clone + Send + Sync + 'static {
    fn source(&self, system: &str) -> AnySource;
    /// The comparison's as-of time (the facts' clock).
    fn now(&self) -> impl Future<Output = Result<SystemTime, BoxError>> + Send;
    /// Applies `req` unless its id was applied before; returns whether it applied it now.
    fn apply(&self, req: &RepairRequest) -> impl Future<Output = Result<bool, BoxError>> + Send;
}

/// What a repair changes: (system, new value).
fn change_of(action: &str) -> Result<(&'static str, &'static str), BoxError> {
    match action {
        "mark-paid" => Ok(("orders", "paid")),
        "finish-cancel" => Ok(("orders", "cancelled")),
        "replay-event" => Ok(("projection", "applied")),
        other => Err(format!("no repair named {other}").into()),
    }
}

// ----- in memory -----------------------------------------------------------------------------

#[derive(Clone, Default)]
struct MemWorld {
    systems: HashMap<&'static str, MemorySource>,
    applied: Arc<Mutex<Vec<String>>>,
}

impl MemWorld {
    fn new() -> Self {
        let mut w = MemWorld::default();
        for s in SYSTEMS {
            w.systems.insert(s, MemorySource::new());
        }
        let now = SystemTime::now();
        for &(system, key, value, version, ago) in FACTS {
            w.systems[system].put(key, value, version as u64, now - Duration::from_secs(ago));
        }
        w
    }
}

impl World for MemWorld {
    fn source(&self, system: &str) -> AnySource {
        AnySource::Memory(self.systems[system].clone())
    }

    async fn now(&self) -> Result<SystemTime, BoxError> {
        Ok(SystemTime::now())
    }

    async fn apply(&self, req: &RepairRequest) -> Result<bool, BoxError> {
        let (system, value) = change_of(&req.action)?;
        let mut applied = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        if applied.iter().any(|id| id == req.id.as_str()) {
            return Ok(false);
        }
        applied.push(req.id.to_string());
        let source = &self.systems[system];
        let version = source.get(&req.key).map_or(1, |f| f.version + 1);
        // The repair is a business change like any other: older than the grace window here, so
        // that the second run, at once, can compare it.
        let at = SystemTime::now() - GRACE - Duration::from_secs(1);
        source.put(req.key.clone(), value, version, at);
        Ok(true)
    }
}

// ----- PostgreSQL ----------------------------------------------------------------------------

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use surely::postgres::Pool;
    use surely::reconcile::PostgresSource;

    #[derive(Clone)]
    pub(crate) struct PgWorld {
        pub(crate) pool: Pool,
        pub(crate) schema: String,
    }

    impl PgWorld {
        pub(crate) async fn new(url: &str) -> Result<Self, BoxError> {
            let pool = surely::postgres::connect(url)?;
            let schema = format!("surely_reconcile_example_{}", std::process::id());
            let client = pool.get().await?;
            let mut ddl = format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
                 CREATE TABLE {schema}.applied_repairs (id text PRIMARY KEY);"
            );
            for s in SYSTEMS {
                ddl.push_str(&format!(
                    "CREATE TABLE {schema}.{s} (key text COLLATE \"C\" PRIMARY KEY,
                         value text NOT NULL, version bigint NOT NULL, at timestamptz NOT NULL);"
                ));
            }
            client.batch_execute(&ddl).await?;
            for &(system, key, value, version, ago) in FACTS {
                client
                    .execute(
                        &format!(
                            "INSERT INTO {schema}.{system} VALUES ($1, $2, $3,
                                 now() - $4::int8 * interval '1 second')"
                        ),
                        &[&key, &value, &version, &(ago as i64)],
                    )
                    .await?;
            }
            Ok(PgWorld { pool, schema })
        }

        pub(crate) async fn drop(&self) -> Result<(), BoxError> {
            let client = self.pool.get().await?;
            client
                .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
                .await?;
            client
                .execute(
                    "DELETE FROM surely_migrations WHERE target = $1",
                    &[&format!("{}.differences", self.schema)],
                )
                .await?;
            Ok(())
        }
    }

    impl World for PgWorld {
        fn source(&self, system: &str) -> AnySource {
            AnySource::Postgres(PostgresSource::new(
                self.pool.clone(),
                format!(
                    "SELECT key, value, version, at FROM {}.{system}",
                    self.schema
                ),
            ))
        }

        async fn now(&self) -> Result<SystemTime, BoxError> {
            Ok(self
                .pool
                .get()
                .await?
                .query_one("SELECT now()", &[])
                .await?
                .get(0))
        }

        async fn apply(&self, req: &RepairRequest) -> Result<bool, BoxError> {
            let (system, value) = change_of(&req.action)?;
            let key = std::str::from_utf8(&req.key)?;
            let mut client = self.pool.get().await?;
            // The repair id and the change in one transaction: applied once, whoever sends it.
            let txn = client.transaction().await?;
            let first = txn
                .execute(
                    &format!(
                        "INSERT INTO {}.applied_repairs VALUES ($1) ON CONFLICT DO NOTHING",
                        self.schema
                    ),
                    &[&req.id.as_str()],
                )
                .await?;
            if first == 1 {
                txn.execute(
                    &format!(
                        "INSERT INTO {s}.{system} VALUES ($1, $2, 1,
                             now() - $3::int8 * interval '1 second')
                         ON CONFLICT (key) DO UPDATE SET value = $2,
                             version = {s}.{system}.version + 1, at = EXCLUDED.at",
                        s = self.schema
                    ),
                    &[&key, &value, &(GRACE.as_secs() as i64 + 1)],
                )
                .await?;
            }
            txn.commit().await?;
            Ok(first == 1)
        }
    }
}

// ----- the story -----------------------------------------------------------------------------

async fn story<W: World, St: DifferenceStore + Clone>(
    world: W,
    store: St,
) -> Result<bool, BoxError> {
    let records = InMemoryRecorder::new();
    let mut builder = Reconciler::builder(store.clone()).recorder(records.clone());
    for s in SYSTEMS {
        builder = builder.source(s, world.source(s));
    }
    for rule in rules() {
        builder = builder.rule(rule);
    }
    let mut reconciler = builder.build()?;

    // The repairs' target: counts what it was sent and what it applied.
    let sent: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let applied: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let (w, s, a) = (world.clone(), sent.clone(), applied.clone());
    let target = tower::service_fn(move |req: RepairRequest| {
        let (w, s, a) = (w.clone(), s.clone(), a.clone());
        async move {
            *s.lock().unwrap().entry(req.id.to_string()).or_default() += 1;
            println!(
                "    repair {} {} for {} (try {})",
                req.id,
                req.action,
                String::from_utf8_lossy(&req.key),
                req.attempt
            );
            if w.apply(&req).await? {
                *a.lock().unwrap().entry(req.id.to_string()).or_default() += 1;
            }
            Ok::<_, BoxError>(RepairAnswer::Applied)
        }
    });
    let mut repairer = Repairer::builder(store.clone(), target)
        .name("reconcile-example")
        .build()?;

    let mut checks = Checks::default();
    let mut runs = Vec::new();
    for run in 1..=2 {
        println!("run {run}");
        let pass = reconciler.run_once(world.now().await?).await?;
        println!(
            "  compared {} keys: {} rule checks consistent, {} in flight, {} differences ({} new, {} known)",
            pass.keys, pass.consistent, pass.in_flight, pass.differences, pass.new, pass.known
        );
        for item in store.list(None, 100).await? {
            let d = &item.difference;
            println!(
                "    {} {} at {}: {} ({})",
                d.id,
                d.rule,
                d.key_display(),
                d.action.as_deref().unwrap_or("manual"),
                item.state.as_str()
            );
        }
        // The same facts again, before any repair: the same items, nothing new.
        let same = reconciler.run_once(world.now().await?).await?;
        println!(
            "  the same facts again: {} differences ({} new, {} known)",
            same.differences, same.new, same.known
        );
        checks.check(
            same.new == 0 && same.known == pass.differences,
            format!(
                "run {run}: a rerun over the same facts recorded {} new",
                same.new
            ),
        );
        let before: u32 = applied.lock().unwrap().values().sum();
        let mut round_total = surely::reconcile::RepairRound::default();
        loop {
            let round = repairer.run_once().await?;
            round_total.claimed += round.claimed;
            round_total.repaired += round.repaired;
            if round.claimed == 0 {
                break;
            }
        }
        let after: u32 = applied.lock().unwrap().values().sum();
        println!(
            "  repairer: {} claimed, {} repaired; {} applied by the target",
            round_total.claimed,
            round_total.repaired,
            after - before
        );
        runs.push((pass, round_total, after - before));
    }

    let items = store.list(None, 100).await?;
    let mut rules_found: Vec<(String, String)> = items
        .iter()
        .map(|i| (i.difference.rule.clone(), i.difference.key_display()))
        .collect();
    rules_found.sort();
    checks.check(
        rules_found
            == [
                ("event-projection".to_owned(), "e-2001".to_owned()),
                ("order-inventory".to_owned(), "o-1003".to_owned()),
                ("payment-order".to_owned(), "o-1001".to_owned()),
            ],
        format!("the three differences, and only them, were found: {rules_found:?}"),
    );
    let sent = sent.lock().unwrap().clone();
    let applied = applied.lock().unwrap().clone();
    println!("invariants");
    checks.invariant(
        items.len() == 3
            && items.iter().all(|i| {
                i.state == surely::reconcile::ItemState::Repaired
                    && applied.get(i.difference.id.as_str()) == Some(&1)
            })
            && applied.len() == 3,
        format!(
            "one repair per difference: {} differences, {} repairs applied, each once",
            items.len(),
            applied.values().sum::<u32>()
        ),
    );
    let (second, second_round, second_applied) = runs[1];
    checks.invariant(
        second.new == 0 && second_round.claimed == 0 && second_applied == 0,
        format!(
            "the second run applies nothing: {} new differences, {} claimed, {} applied",
            second.new, second_round.claimed, second_applied
        ),
    );
    let flagged_in_flight = items.iter().any(|i| i.difference.key.as_ref() == b"o-1004");
    checks.invariant(
        !flagged_in_flight && runs[0].0.in_flight >= 1,
        format!(
            "nothing in flight flagged: o-1004 (charged 20 s ago, grace {} s) has no difference; {} check(s) in flight",
            GRACE.as_secs(),
            runs[0].0.in_flight
        ),
    );
    let reports = records.reconcile_reports();
    checks.invariant(
        reports.first().map(|r| r.open()) == Some(3) && reports.last().map(|r| r.open()) == Some(0),
        format!(
            "open differences reported by rule: {:?} after the first pass, {} after the second",
            reports
                .first()
                .map(|r| r.open_by_rule.clone())
                .unwrap_or_default(),
            reports.last().map_or(0, |r| r.open())
        ),
    );
    checks.check(
        sent.values().all(|&n| n == 1),
        format!("every repair id was sent once: {sent:?}"),
    );
    Ok(checks.verdict())
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str) -> Result<bool, BoxError> {
    let world = pg::PgWorld::new(url).await?;
    let store = surely::reconcile::PostgresDifferences::new(world.pool.clone())
        .with_table(&format!("{}.differences", world.schema))?;
    store.migrate().await?;
    let ran = story(world.clone(), store).await;
    world.drop().await?;
    ran
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &str) -> Result<bool, BoxError> {
    Err(
        "SURELY_POSTGRES_URL is set, but this build lacks the cargo feature `postgres`: \
         run `cargo run --features postgres --example reconcile`"
            .into(),
    )
}

#[tokio::main]
async fn main() {
    let url = std::env::var("SURELY_POSTGRES_URL")
        .ok()
        .filter(|v| !v.is_empty());
    let ran = match url {
        None => {
            println!("mode: memory");
            story(MemWorld::new(), MemoryDifferences::new()).await
        }
        Some(url) => {
            println!("mode: PostgreSQL");
            postgres(&url).await
        }
    };
    match ran {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
