//! What the outbox and the inbox cost on this machine, against its real PostgreSQL and NATS
//! JetStream: the figures of issue 16, printed as tables.
//!
//! ```sh
//! cargo run --release --features postgres,nats --example outbox_perf
//! # fewer events, for a quick look:
//! cargo run --release --features postgres,nats --example outbox_perf -- --events 2000
//! # one part only:
//! cargo run --release --features postgres,nats --example outbox_perf -- --only inbox
//! ```
//!
//! 1. **Relay throughput into JetStream.** A backlog of committed events, published by one
//!    relay in batches (each batch's events sent together, marked in one statement), against
//!    the baseline measured in the same run: a relay that claims, publishes and marks one event
//!    per round (a transaction to claim, one to mark).
//! 2. **Commit-to-broker latency.** Events committed one by one, at a steady pace, each timed
//!    from the return of its `COMMIT` to its arrival at a NATS subscriber: a relay woken by
//!    `LISTEN/NOTIFY`, against relays that only poll (every second, the default, and every
//!    100 ms).
//! 3. **Inbox throughput.** Events applied with one transaction each (the inbox's record, a
//!    stock update, the aggregate's version, `COMMIT`), by one consumer and by four in
//!    parallel (each owning a share of the aggregates, as a partitioned consumer would); then
//!    every event delivered again: the duplicate path, where the handler does not run. The
//!    baseline, measured in the same run: the stock update alone, one transaction per event.
//!
//! Uses `SURELY_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and
//! `SURELY_TEST_NATS_URL` (default `nats://127.0.0.1:4222`); every table and stream it makes
//! has a name of its own and is dropped at the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use surely::deps::async_nats::{self, jetstream};
use surely::inbox::{PostgresInbox, Processed, Versions};
use surely::outbox::{Event, EventId, JetStreamPublisher, PostgresOutbox, Relay};
use surely::postgres::Pool;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let events = args.events;
    let pg_url = env(
        "SURELY_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let nats_url = env("SURELY_TEST_NATS_URL", "nats://127.0.0.1:4222");
    let pool = surely::postgres::connect(&pg_url)?;
    surely::postgres::migrate(&pool)
        .await
        .map_err(|e| format!("PostgreSQL at {pg_url} did not answer: {e}"))?;
    let nats = async_nats::connect(&nats_url)
        .await
        .map_err(|e| format!("NATS at {nats_url} did not answer: {e}"))?;
    let js = jetstream::new(nats.clone());
    let run = format!("perf{}", std::process::id());
    js.create_stream(jetstream::stream::Config {
        name: run.clone(),
        subjects: vec![format!("{run}.>")],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(|e| format!("JetStream at {nats_url} refused a stream: {e}"))?;

    let mut made = Vec::new();
    let result = async {
        if args.runs("relay") {
            relay_throughput(&pool, &js, &run, events, &mut made).await?;
        }
        if args.runs("latency") {
            commit_to_broker(&pool, &pg_url, &nats, &js, &run, &mut made).await?;
        }
        if args.runs("inbox") {
            inbox_throughput(&pool, &run, events / 2, &mut made).await?;
        }
        Ok::<_, BoxError>(())
    }
    .await;
    let client = pool.get().await?;
    for table in made {
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}"))
            .await?;
        client
            .execute("DELETE FROM surely_migrations WHERE target = $1", &[&table])
            .await?;
    }
    js.delete_stream(&run).await?;
    result
}

/// What to run: `--events N` (default 10 000), `--only relay|latency|inbox` (default all).
struct Args {
    events: usize,
    only: Option<String>,
}

impl Args {
    fn runs(&self, part: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == part)
    }
}

fn parse_args() -> Result<Args, BoxError> {
    let mut args = std::env::args().skip(1);
    let mut events = 10_000;
    let mut only = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--only" => {
                let part = args.next().ok_or("--only needs relay, latency or inbox")?;
                if !["relay", "latency", "inbox"].contains(&part.as_str()) {
                    return Err(format!("--only: {part:?} is not relay, latency or inbox").into());
                }
                only = Some(part);
            }
            "--events" => {
                events = args
                    .next()
                    .ok_or("--events needs a number")?
                    .parse()
                    .map_err(|e| format!("--events: {e}"))?;
                if events < 100 {
                    return Err("--events: at least 100".into());
                }
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?} (try --events N, --only relay|latency|inbox)"
                )
                .into())
            }
        }
    }
    Ok(Args { events, only })
}

/// An outbox in a table of this run's own.
async fn outbox(
    pool: &Pool,
    name: &str,
    made: &mut Vec<String>,
) -> Result<PostgresOutbox, BoxError> {
    let outbox = PostgresOutbox::new(pool.clone()).with_table(name)?;
    made.push(name.to_owned());
    outbox.migrate().await?;
    Ok(outbox)
}

fn event(
    run: &str,
    what: &str,
    n: usize,
    aggregate: &str,
    version: i64,
) -> Result<Event, BoxError> {
    let key = format!("{run} {what} {n}");
    Ok(Event::new(
        EventId::derive(&key, "OrderCreated"),
        aggregate,
        version,
        "OrderCreated",
        Bytes::from(format!(r#"{{"order":"{what}-{n}","sku":"{aggregate}"}}"#)),
    )?)
}

/// Commits `n` events, 500 per transaction (not timed).
async fn fill(outbox: &PostgresOutbox, run: &str, what: &str, n: usize) -> Result<(), BoxError> {
    let mut client = outbox.pool().get().await?;
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let txn = client.transaction().await?;
        for &i in chunk {
            outbox
                .enqueue(&txn, &event(run, what, i, "order", 1)?)
                .await?;
        }
        txn.commit().await?;
    }
    Ok(())
}

/// Runs rounds until the backlog is gone; events per second.
async fn drain<P>(relay: &mut Relay<PostgresOutbox, P>, n: usize) -> Result<f64, BoxError>
where
    P: tower::Service<Event>,
    P::Error: Into<BoxError>,
{
    let start = Instant::now();
    let mut published = 0;
    loop {
        let round = relay.run_once().await?;
        published += round.published;
        if round.claimed == 0 {
            break;
        }
    }
    if published != n {
        return Err(format!("published {published} of {n}").into());
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

async fn relay_throughput(
    pool: &Pool,
    js: &jetstream::Context,
    run: &str,
    events: usize,
    made: &mut Vec<String>,
) -> Result<(), BoxError> {
    println!("## Relay into JetStream (one relay; events already committed)\n");
    println!("| relay | events | events/s |");
    println!("| --- | ---: | ---: |");
    let baseline_events = (events / 5).max(100);
    let single = outbox(pool, &format!("{run}_single"), made).await?;
    fill(&single, run, "single", baseline_events).await?;
    let mut relay = Relay::builder(
        single,
        JetStreamPublisher::new(js.clone(), format!("{run}.single")),
    )
    .batch(1)
    .build()?;
    let baseline = drain(&mut relay, baseline_events).await?;
    println!("| baseline: one event per round | {baseline_events} | {baseline:.0} |");
    for batch in [100, 500] {
        let batched = outbox(pool, &format!("{run}_batch{batch}"), made).await?;
        fill(&batched, run, &format!("batch{batch}"), events).await?;
        let mut relay = Relay::builder(
            batched,
            JetStreamPublisher::new(js.clone(), format!("{run}.batch{batch}")),
        )
        .batch(batch)
        .build()?;
        let rate = drain(&mut relay, events).await?;
        println!(
            "| batches of {batch} | {events} | {rate:.0} ({:.1}× the baseline) |",
            rate / baseline
        );
    }
    println!();
    Ok(())
}

async fn commit_to_broker(
    pool: &Pool,
    pg_url: &str,
    nats: &async_nats::Client,
    js: &jetstream::Context,
    run: &str,
    made: &mut Vec<String>,
) -> Result<(), BoxError> {
    const EVENTS: usize = 200;
    const PACE: Duration = Duration::from_millis(7);
    println!("## Commit-to-broker latency ({EVENTS} events, one committed every {PACE:?})\n");
    println!("| relay | p50 | p99 | max |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, listen, poll) in [
        (
            "LISTEN/NOTIFY (poll 1 s as the safety net)",
            true,
            Duration::from_secs(1),
        ),
        (
            "polling every 1 s (the default)",
            false,
            Duration::from_secs(1),
        ),
        ("polling every 100 ms", false, Duration::from_millis(100)),
    ] {
        let what = if listen {
            "listen".to_owned()
        } else {
            format!("poll{}", poll.as_millis())
        };
        let outbox = outbox(pool, &format!("{run}_{what}"), made).await?;
        let subject = format!("{run}.{what}");
        let mut subscriber = nats.subscribe(format!("{subject}.>")).await?;
        nats.flush().await?;
        let mut builder =
            Relay::builder(outbox.clone(), JetStreamPublisher::new(js.clone(), subject)).poll(poll);
        if listen {
            builder = builder.wake_on(outbox.listen(pg_url).await?);
        }
        let relay = builder.build()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let relaying = tokio::spawn(relay.run(async {
            let _ = stopped.await;
        }));
        let arrived: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let seen = arrived.clone();
        let receiving = tokio::spawn(async move {
            use tokio_stream::StreamExt;
            while let Some(message) = subscriber.next().await {
                let at = Instant::now();
                let id = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                    .map(|v| v.as_str().to_owned());
                let mut seen = seen.lock().unwrap();
                if let Some(id) = id {
                    seen.entry(id).or_insert(at);
                }
                if seen.len() == EVENTS {
                    return;
                }
            }
        });
        let mut committed = HashMap::new();
        let mut client = pool.get().await?;
        let mut pace = tokio::time::interval(PACE);
        for i in 0..EVENTS {
            pace.tick().await;
            let e = event(run, &what, i, "order", 1)?;
            let txn = client.transaction().await?;
            outbox.enqueue(&txn, &e).await?;
            txn.commit().await?;
            committed.insert(e.id().as_str().to_owned(), Instant::now());
        }
        tokio::time::timeout(Duration::from_secs(30), receiving)
            .await
            .map_err(|_| "not every event reached the broker within 30 s")??;
        let _ = stop.send(());
        relaying.await?;
        let mut latency = Histogram::<u64>::new(3)?;
        for (id, at) in arrived.lock().unwrap().iter() {
            let commit = committed.get(id).ok_or("an event nobody committed")?;
            latency.record(at.saturating_duration_since(*commit).as_micros() as u64)?;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        println!(
            "| {name} | {:.1} ms | {:.1} ms | {:.1} ms |",
            ms(latency.value_at_quantile(0.5)),
            ms(latency.value_at_quantile(0.99)),
            ms(latency.max())
        );
    }
    println!();
    Ok(())
}

async fn inbox_throughput(
    pool: &Pool,
    run: &str,
    events: usize,
    made: &mut Vec<String>,
) -> Result<(), BoxError> {
    const AGGREGATES: usize = 64;
    println!("## Inbox on PostgreSQL (one transaction per event; versions in order per SKU)\n");
    println!("| consumers | path | events | events/s |");
    println!("| ---: | --- | ---: | ---: |");
    let stock = format!("{run}_stock");
    made.push(stock.clone());
    for consumers in [1usize, 4] {
        let table = format!("{run}_inbox{consumers}");
        let inbox = PostgresInbox::new(pool.clone()).with_table(&table)?;
        made.push(table.clone());
        made.push(format!("{table}_versions"));
        inbox.migrate().await?;
        {
            let client = pool.get().await?;
            client
                .batch_execute(&format!(
                    "DROP TABLE IF EXISTS {stock};
                     CREATE TABLE {stock} (sku text PRIMARY KEY, qty bigint NOT NULL);
                     INSERT INTO {stock} SELECT 'sku-' || i, 1000000 FROM generate_series(0, {}) i",
                    AGGREGATES - 1
                ))
                .await?;
        }
        // Each SKU's events in version order; consumer c owns the SKUs with index % consumers == c.
        let mut shares: Vec<Vec<Event>> = vec![Vec::new(); consumers];
        for i in 0..events {
            let sku = i % AGGREGATES;
            let version = (i / AGGREGATES) as i64 + 1;
            let e = event(
                run,
                &format!("inbox{consumers}"),
                i,
                &format!("sku-{sku}"),
                version,
            )?;
            shares[sku % consumers].push(e);
        }
        let shares = Arc::new(shares);
        // The floor: the business write alone, one transaction per event, no inbox.
        let floor = {
            let start = Instant::now();
            let mut workers = Vec::new();
            for c in 0..consumers {
                let (pool, shares, stock) = (pool.clone(), shares.clone(), stock.clone());
                workers.push(tokio::spawn(async move {
                    let mut client = pool.get().await?;
                    let update = format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = $1");
                    for e in &shares[c] {
                        let txn = client.transaction().await?;
                        txn.execute(&update, &[&e.aggregate()]).await?;
                        txn.commit().await?;
                    }
                    Ok::<_, BoxError>(())
                }));
            }
            for w in workers {
                w.await??;
            }
            let rate = events as f64 / start.elapsed().as_secs_f64();
            println!(
                "| {consumers} | baseline: the business write alone (no inbox) | {events} | {rate:.0} |"
            );
            pool.get()
                .await?
                .execute(&format!("UPDATE {stock} SET qty = 1000000"), &[])
                .await?;
            rate
        };
        for path in ["apply", "duplicate"] {
            let start = Instant::now();
            let mut workers = Vec::new();
            for c in 0..consumers {
                let (pool, inbox, shares, stock) =
                    (pool.clone(), inbox.clone(), shares.clone(), stock.clone());
                workers.push(tokio::spawn(async move {
                    let mut client = pool.get().await?;
                    let update = format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = $1");
                    let mut outcomes = [0usize; 2];
                    for e in &shares[c] {
                        let txn = client.transaction().await?;
                        let processed = inbox
                            .process(&txn, "inventory", e, Versions::InOrder, |txn| {
                                let (update, sku) = (update.clone(), e.aggregate().to_owned());
                                Box::pin(async move {
                                    txn.execute(&update, &[&sku]).await?;
                                    Ok::<_, tokio_postgres::Error>(Bytes::from_static(b"reserved"))
                                })
                            })
                            .await?;
                        txn.commit().await?;
                        match processed {
                            Processed::Applied(_) => outcomes[0] += 1,
                            Processed::Duplicate(_) => outcomes[1] += 1,
                            other => return Err(format!("unexpected {other:?}").into()),
                        }
                    }
                    Ok::<_, BoxError>(outcomes)
                }));
            }
            let mut outcomes = [0usize; 2];
            for w in workers {
                let [applied, duplicate] = w.await??;
                outcomes[0] += applied;
                outcomes[1] += duplicate;
            }
            let rate = events as f64 / start.elapsed().as_secs_f64();
            let expected = if path == "apply" {
                [events, 0]
            } else {
                [0, events]
            };
            if outcomes != expected {
                return Err(format!(
                    "{path}: applied/duplicate {outcomes:?}, expected {expected:?}"
                )
                .into());
            }
            let label = if path == "apply" {
                "applied (handler runs)"
            } else {
                "redelivered (duplicate: handler skipped)"
            };
            println!(
                "| {consumers} | {label} | {events} | {rate:.0} ({:.2}× the baseline) |",
                rate / floor
            );
        }
        let client = pool.get().await?;
        let left: i64 = client
            .query_one(
                &format!("SELECT sum(1000000 - qty)::bigint FROM {stock}"),
                &[],
            )
            .await?
            .get(0);
        if left as usize != events {
            return Err(format!("stock moved {left} times for {events} events").into());
        }
    }
    println!();
    println!("Stock moved exactly once per event in every run (checked).");
    Ok(())
}
