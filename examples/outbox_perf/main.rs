//! What the outbox and the inbox cost on this machine, against its real PostgreSQL and NATS
//! JetStream: the figures of issue 16, printed as tables.
//!
//! ```sh
//! cargo run --release --features postgres-log,nats --example outbox_perf
//! # fewer events, for a quick look:
//! cargo run --release --features postgres-log,nats --example outbox_perf -- --events 2000
//! # one part only, fewer rounds:
//! cargo run --release --features postgres-log,nats --example outbox_perf -- --only inbox --rounds 3
//! # the log relay against the polling relay and raw publishing (`wal_level = logical`):
//! cargo run --release --features postgres-log,nats --example outbox_perf -- --only log
//! ```
//!
//! 1. **Relay throughput into JetStream.** A backlog of committed events (the table analyzed
//!    after the fill, as autovacuum does for a table that grew), drained by one relay through
//!    `Relay::run` (started, then stopped once every event is acknowledged; the time runs
//!    until `run` returns, so the last marks are in it) in batches of 100 and of 500 (each
//!    batch's events sent together, their acknowledgements awaited, marked in one statement):
//!    with its default pipeline (the next batch claimed and the last one marked while a batch
//!    is published), and with a pipeline depth of 1 (claim, publish, mark one after the
//!    other: the relay before pipelining). The baseline, measured in the same rounds: raw
//!    async-nats publishing of as many events, with the same headers, in batches of the same
//!    size (the batch sent, then its acknowledgements awaited), which is what a careful user
//!    writes by hand. The three take turns in an order that rotates from round to round; the
//!    table gives medians and ranges over the rounds, and the ratios relay ÷ raw. A relay
//!    claiming one event per round is measured once beside them; then a round's three steps,
//!    timed apart through the store; then, inside `run` (depth 1 and pipelined), the claims'
//!    and marks' mean times and the CPU per event of this process, of PostgreSQL and of the
//!    NATS server, beside raw publishing measured the same way.
//! 2. **Commit-to-broker latency.** Events committed one by one, at a steady pace, each timed
//!    from the return of its `COMMIT` to its arrival at a NATS subscriber: a relay woken by
//!    `LISTEN/NOTIFY`, against relays that only poll (every second, the default, and every
//!    100 ms).
//! 3. **Inbox throughput.** Events applied with one transaction each (the inbox's statements
//!    and a stock update, the business write), by one consumer and by four in parallel (each
//!    owning a share of the aggregates, as a partitioned consumer would): through
//!    `PostgresInbox::process` in the caller's transaction, and through
//!    `PostgresInbox::process_and_commit`; then the `process_and_commit` events delivered again
//!    (the duplicate path, where the handler does not run). The baseline, measured in every round:
//!    the stock update alone, one transaction per event. Cases alternate in order from round
//!    to round; each row gives the median and range over the rounds, the ratio to the same
//!    round's baseline, and the CPU time per event of this process and of the `postgres`
//!    processes (`/proc/<pid>/schedstat`, Linux; the server's other sessions included).
//!
//! 4. **The log relay** (`LogRelay`, the outbox read from the write-ahead log). A backlog of
//!    committed events drained into JetStream by a log relay with 500 events in flight,
//!    against raw publishing in batches of 500 and the polling relay (`Relay::run`, batches of
//!    500, pipelined), taking turns in an order that rotates from round to round: events per
//!    second, the ratios to raw publishing, and the CPU per event of this process, of
//!    PostgreSQL (its walsender's decoding included) and of the NATS server. Then
//!    commit-to-broker latency as in 2, the log relay beside the polling relay woken by
//!    `LISTEN/NOTIFY`.
//!
//! `--rounds N` (default 5) sets the rounds; `--depth N` the pipelined relay's depth (default:
//! the relay's own, 3).
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
use surely::outbox::{
    Claimed, Event, EventId, Failed, JetStreamPublisher, OutboxError, OutboxStore, PostgresOutbox,
    Relay,
};
use surely::postgres::Pool;
use surely::record::OutboxStats;
use tower::ServiceExt;

mod log;

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
            relay_throughput(&pool, &js, &run, &args, &mut made).await?;
        }
        if args.runs("latency") {
            commit_to_broker(&pool, &pg_url, &nats, &js, &run, &mut made).await?;
        }
        if args.runs("inbox") {
            inbox_throughput(&pool, &run, events / 5, args.rounds, &mut made).await?;
        }
        if args.runs("log") {
            log::throughput(&pool, &pg_url, &js, &run, &args, &mut made).await?;
            log::latency(&pool, &pg_url, &nats, &js, &run, &mut made).await?;
        }
        Ok::<_, BoxError>(())
    }
    .await;
    let client = pool.get().await?;
    for table in made {
        // An outbox's table comes with its slots' table and its publication.
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}_slots; DROP TABLE IF EXISTS {table};
                 DROP PUBLICATION IF EXISTS {table}_publication"
            ))
            .await?;
        client
            .execute("DELETE FROM surely_migrations WHERE target = $1", &[&table])
            .await?;
    }
    js.delete_stream(&run).await?;
    result
}

/// What to run: `--events N` (default 10 000), `--rounds N` (default 5), `--only
/// relay|latency|inbox|log` (default all), `--depth N` (default: the relay's).
struct Args {
    events: usize,
    rounds: usize,
    only: Option<String>,
    depth: Option<usize>,
}

impl Args {
    fn runs(&self, part: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == part)
    }
}

fn parse_args() -> Result<Args, BoxError> {
    let mut args = std::env::args().skip(1);
    let mut events = 10_000;
    let mut rounds = 5;
    let mut only = None;
    let mut depth = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--only" => {
                let part = args.next().ok_or("--only needs relay, latency, inbox or log")?;
                if !["relay", "latency", "inbox", "log"].contains(&part.as_str()) {
                    return Err(format!("--only: {part:?} is not relay, latency, inbox or log").into());
                }
                only = Some(part);
            }
            "--rounds" => {
                rounds = args
                    .next()
                    .ok_or("--rounds needs a number")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?;
                if rounds == 0 {
                    return Err("--rounds: at least 1".into());
                }
            }
            "--depth" => {
                depth = Some(
                    args.next()
                        .ok_or("--depth needs a number")?
                        .parse()
                        .map_err(|e| format!("--depth: {e}"))?,
                );
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
                    "unknown argument {other:?} (try --events N, --rounds N, --depth N, --only relay|latency|inbox|log)"
                )
                .into())
            }
        }
    }
    Ok(Args {
        events,
        rounds,
        only,
        depth,
    })
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

/// Commits `n` events, 500 per transaction, then has the table analyzed, as autovacuum does
/// for a table that grew (not timed).
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
    client
        .batch_execute(&format!("ANALYZE {}", outbox.table()))
        .await?;
    Ok(())
}

/// A relay over `outbox`, publishing into JetStream under `subject`, in batches of `batch`
/// with a pipeline of `depth` (`None`: the relay's default), run as a user runs it
/// (`Relay::run`) until it has published the `n` events of the backlog: stopped once the last
/// acknowledgement is in, timed until `run` returns (its last marks included). Events per
/// second; an error unless every event was published and marked.
async fn drain<St: OutboxStore + Clone>(
    outbox: &St,
    js: &jetstream::Context,
    subject: String,
    batch: usize,
    depth: Option<usize>,
    n: usize,
) -> Result<f64, BoxError> {
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let all_acked = Arc::new(tokio::sync::Notify::new());
    let (count, done) = (acked.clone(), all_acked.clone());
    let publisher = JetStreamPublisher::new(js.clone(), subject).map_result(move |r| {
        if r.is_ok() && count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == n {
            done.notify_one();
        }
        r
    });
    let mut builder = Relay::builder(outbox.clone(), publisher).batch(batch);
    if let Some(depth) = depth {
        builder = builder.pipeline_depth(depth);
    }
    let relay = builder.build()?;
    let start = Instant::now();
    relay
        .run(async {
            // A bound, should an event never be acknowledged: the check below says so.
            let _ = tokio::time::timeout(Duration::from_secs(300), all_acked.notified()).await;
        })
        .await;
    let took = start.elapsed();
    let backlog = outbox.stats().await?.backlog;
    let published = acked.load(std::sync::atomic::Ordering::Relaxed);
    if published != n || backlog != 0 {
        return Err(format!("published {published} of {n}, {backlog} left unmarked").into());
    }
    Ok(n as f64 / took.as_secs_f64())
}

async fn relay_throughput(
    pool: &Pool,
    js: &jetstream::Context,
    run: &str,
    args: &Args,
    made: &mut Vec<String>,
) -> Result<(), BoxError> {
    let (events, rounds) = (args.events, args.rounds);
    println!("## Relay into JetStream (one relay, `Relay::run`; events already committed)\n");
    let baseline_events = (events / 5).max(100);
    let single = outbox(pool, &format!("{run}_single"), made).await?;
    fill(&single, run, "single", baseline_events).await?;
    let single = drain(
        &single,
        js,
        format!("{run}.single"),
        1,
        Some(1),
        baseline_events,
    )
    .await?;
    println!("One event per round (a claim, a publish, a mark): {single:.0} events/s.\n");
    let depth = args
        .depth
        .map_or_else(|| "default".to_owned(), |d| d.to_string());
    println!(
        "Batches, against raw async-nats publishing of the same events in the same batches \
         (the batch sent, then its acknowledgements awaited), the three taking turns, \
         {rounds} rounds of {events} events; the relay pipelined (depth {depth}) and one \
         round at a time (depth 1):\n"
    );
    println!(
        "| batch | raw publish, events/s | relay pipelined, events/s | relay depth 1, events/s \
         | pipelined ÷ raw | depth 1 ÷ raw |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for batch in [100, 500] {
        let mut rates: [Vec<f64>; 3] = Default::default();
        let (mut piped_ratio, mut one_ratio) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let what = format!("batch{batch}r{round}");
            let piped = outbox(pool, &format!("{run}_{what}p"), made).await?;
            fill(&piped, run, &format!("{what}p"), events).await?;
            let one = outbox(pool, &format!("{run}_{what}s"), made).await?;
            fill(&one, run, &format!("{what}s"), events).await?;
            let raw_events = (0..events)
                .map(|i| event(run, &format!("raw{what}"), i, "order", 1))
                .collect::<Result<Vec<_>, _>>()?;
            let mut got = [0.0; 3];
            for turn in 0..3 {
                let case = (round + turn) % 3;
                got[case] = match case {
                    0 => raw_publish(js, &format!("{run}.raw{what}"), &raw_events, batch).await?,
                    1 => {
                        drain(
                            &piped,
                            js,
                            format!("{run}.{what}p"),
                            batch,
                            args.depth,
                            events,
                        )
                        .await?
                    }
                    _ => drain(&one, js, format!("{run}.{what}s"), batch, Some(1), events).await?,
                };
            }
            for (case, rate) in got.iter().enumerate() {
                rates[case].push(*rate);
            }
            piped_ratio.push(got[1] / got[0]);
            one_ratio.push(got[2] / got[0]);
        }
        println!(
            "| {batch} | {} | {} | {} | {} | {} |",
            spread(&rates[0], 0),
            spread(&rates[1], 0),
            spread(&rates[2], 0),
            spread(&piped_ratio, 2),
            spread(&one_ratio, 2)
        );
    }
    println!();
    // Where a relay's round goes: its three steps timed apart, through the store itself.
    println!("A round's steps, timed apart (mean per batch over {events} events):\n");
    println!("| batch | claim | publish (raw, as above) | mark published |");
    println!("| ---: | ---: | ---: | ---: |");
    for batch in [100, 500] {
        let what = format!("steps{batch}");
        let table = outbox(pool, &format!("{run}_{what}"), made).await?;
        fill(&table, run, &what, events).await?;
        let (mut claim, mut publish, mut mark, mut batches) = (0.0, 0.0, 0.0, 0);
        loop {
            let start = Instant::now();
            let claimed = table.claim(batch, Duration::from_secs(30)).await?;
            let claimed_at = Instant::now();
            if claimed.is_empty() {
                break;
            }
            let events: Vec<Event> = claimed.iter().map(|c| c.event.clone()).collect();
            raw_publish(js, &format!("{run}.{what}"), &events, batch).await?;
            let published_at = Instant::now();
            if table.published_all(&claimed).await? != claimed.len() {
                return Err("a mark was refused".into());
            }
            claim += (claimed_at - start).as_secs_f64();
            publish += (published_at - claimed_at).as_secs_f64();
            mark += published_at.elapsed().as_secs_f64();
            batches += 1;
        }
        let ms = |s: f64| format!("{:.2} ms", s * 1000.0 / f64::from(batches));
        println!(
            "| {batch} | {} | {} | {} |",
            ms(claim),
            ms(publish),
            ms(mark)
        );
    }
    println!();
    relay_breakdown(pool, js, run, args, made).await
}

/// The outbox, with the time its claims and its marks of published events take, summed.
#[derive(Clone)]
struct Timed {
    inner: PostgresOutbox,
    spent: Arc<Mutex<Spent>>,
}

#[derive(Clone, Copy, Default)]
struct Spent {
    claims: u32,
    claim: Duration,
    marks: u32,
    mark: Duration,
}

impl OutboxStore for Timed {
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Claimed>, OutboxError> {
        let start = Instant::now();
        let out = self.inner.claim(max, lease).await;
        let mut spent = self.spent.lock().unwrap();
        spent.claims += 1;
        spent.claim += start.elapsed();
        out
    }

    async fn published(&self, claimed: &Claimed) -> Result<(), OutboxError> {
        self.inner.published(claimed).await
    }

    async fn published_all(&self, claimed: &[Claimed]) -> Result<usize, OutboxError> {
        let start = Instant::now();
        let out = self.inner.published_all(claimed).await;
        if !claimed.is_empty() {
            let mut spent = self.spent.lock().unwrap();
            spent.marks += 1;
            spent.mark += start.elapsed();
        }
        out
    }

    async fn failed(
        &self,
        claimed: &Claimed,
        error: &str,
        retry_after: Duration,
        quarantine_after: u32,
    ) -> Result<Failed, OutboxError> {
        self.inner
            .failed(claimed, error, retry_after, quarantine_after)
            .await
    }

    async fn sweep(&self, retention: Duration) -> Result<u64, OutboxError> {
        self.inner.sweep(retention).await
    }

    async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        self.inner.stats().await
    }
}

/// Where a relay's time goes as `run` drains a backlog, pipelined and not: the claims and
/// marks timed inside the run (mean per batch: they overlap the publishes when pipelined),
/// and the CPU per event of this process, of PostgreSQL and of the NATS server, with how many
/// of the machine's cores they kept busy together; raw publishing of as many events first,
/// measured the same way.
async fn relay_breakdown(
    pool: &Pool,
    js: &jetstream::Context,
    run: &str,
    args: &Args,
    made: &mut Vec<String>,
) -> Result<(), BoxError> {
    let events = args.events;
    println!("Inside `run` (one run each, {events} events):\n");
    println!(
        "| batch | depth | events/s | wall per batch | claim | mark | CPU µs/event: relay, \
         PostgreSQL, NATS | cores busy |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for batch in [100, 500] {
        let raw_events = (0..events)
            .map(|i| event(run, &format!("insideraw{batch}"), i, "order", 1))
            .collect::<Result<Vec<_>, _>>()?;
        let (mine, nats) = (cpu_now().0, cpu_of("nats-server"));
        let start = Instant::now();
        let rate = raw_publish(js, &format!("{run}.insideraw{batch}"), &raw_events, batch).await?;
        let wall = start.elapsed();
        let (mine, nats) = (cpu_now().0 - mine, cpu_of("nats-server") - nats);
        println!(
            "| {batch} | raw | {rate:.0} | {:.2} ms | | | {:.1} / 0 / {:.1} | {:.2} |",
            wall.as_secs_f64() * 1000.0 / events.div_ceil(batch) as f64,
            mine as f64 / 1000.0 / events as f64,
            nats as f64 / 1000.0 / events as f64,
            (mine + nats) as f64 / 1e9 / wall.as_secs_f64()
        );
        for depth in [Some(1), args.depth.or(Some(3))] {
            let what = format!("inside{batch}d{}", depth.unwrap_or(0));
            let table = Timed {
                inner: outbox(pool, &format!("{run}_{what}"), made).await?,
                spent: Arc::default(),
            };
            fill(&table.inner, run, &what, events).await?;
            let (mine, postgres, nats) = (cpu_now(), cpu_of("postgres"), cpu_of("nats-server"));
            let start = Instant::now();
            let rate = drain(&table, js, format!("{run}.{what}"), batch, depth, events).await?;
            let wall = start.elapsed();
            let mine = cpu_now().0 - mine.0;
            let postgres = cpu_of("postgres") - postgres;
            let nats = cpu_of("nats-server") - nats;
            let spent = *table.spent.lock().unwrap();
            let per_event = |ns: u64| ns as f64 / 1000.0 / events as f64;
            let ms = |d: Duration, n: u32| {
                format!("{:.2} ms", d.as_secs_f64() * 1000.0 / f64::from(n.max(1)))
            };
            let batches = events.div_ceil(batch) as u32;
            println!(
                "| {batch} | {} | {rate:.0} | {} | {} | {} | {:.1} / {:.1} / {:.1} | {:.2} |",
                depth.unwrap_or(3),
                ms(wall, batches),
                ms(spent.claim, spent.claims),
                ms(spent.mark, spent.marks),
                per_event(mine),
                per_event(postgres),
                per_event(nats),
                (mine + postgres + nats) as f64 / 1e9 / wall.as_secs_f64()
            );
        }
    }
    println!();
    Ok(())
}

/// What a careful user writes by hand with async-nats: each batch's publishes sent (with the
/// headers the publisher writes), then their acknowledgements awaited; events per second.
async fn raw_publish(
    js: &jetstream::Context,
    prefix: &str,
    events: &[Event],
    batch: usize,
) -> Result<f64, BoxError> {
    let start = Instant::now();
    for chunk in events.chunks(batch) {
        let mut acks = Vec::with_capacity(chunk.len());
        for e in chunk {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, e.id().as_str());
            headers.insert("Surely-Aggregate", e.aggregate());
            headers.insert("Surely-Version", e.version().to_string().as_str());
            headers.insert("Surely-Kind", e.kind());
            acks.push(
                js.publish_with_headers(
                    format!("{prefix}.{}", e.kind()),
                    headers,
                    e.payload().clone(),
                )
                .await?,
            );
        }
        for ack in acks {
            ack.await?;
        }
    }
    Ok(events.len() as f64 / start.elapsed().as_secs_f64())
}

/// The median of `values` and their range, with `digits` decimals.
fn spread(values: &[f64], digits: usize) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    format!(
        "{median:.digits$} ({:.digits$}–{:.digits$})",
        v[0],
        v[v.len() - 1]
    )
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
        let subscriber = nats.subscribe(format!("{subject}.>")).await?;
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
        let latency = paced(pool, &outbox, subscriber, run, &what, EVENTS, PACE).await?;
        let _ = stop.send(());
        relaying.await?;
        latency_row(name, &latency);
    }
    println!();
    Ok(())
}

/// Commits `events` events into `outbox` one by one, one every `pace`, while a relay publishes
/// them, and times each from the return of its `COMMIT` to its arrival at `subscriber` (the
/// first copy, by `Nats-Msg-Id`).
async fn paced(
    pool: &Pool,
    outbox: &PostgresOutbox,
    mut subscriber: async_nats::Subscriber,
    run: &str,
    what: &str,
    events: usize,
    pace: Duration,
) -> Result<Histogram<u64>, BoxError> {
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
            if seen.len() == events {
                return;
            }
        }
    });
    let mut committed = HashMap::new();
    let mut client = pool.get().await?;
    let mut pace = tokio::time::interval(pace);
    for i in 0..events {
        pace.tick().await;
        let e = event(run, what, i, "order", 1)?;
        let txn = client.transaction().await?;
        outbox.enqueue(&txn, &e).await?;
        txn.commit().await?;
        committed.insert(e.id().as_str().to_owned(), Instant::now());
    }
    tokio::time::timeout(Duration::from_secs(30), receiving)
        .await
        .map_err(|_| "not every event reached the broker within 30 s")??;
    let mut latency = Histogram::<u64>::new(3)?;
    for (id, at) in arrived.lock().unwrap().iter() {
        let commit = committed.get(id).ok_or("an event nobody committed")?;
        latency.record(at.saturating_duration_since(*commit).as_micros() as u64)?;
    }
    Ok(latency)
}

/// A row of a latency table: the relay's name, p50, p99 and max.
fn latency_row(name: &str, latency: &Histogram<u64>) {
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "| {name} | {:.1} ms | {:.1} ms | {:.1} ms |",
        ms(latency.value_at_quantile(0.5)),
        ms(latency.value_at_quantile(0.99)),
        ms(latency.max())
    );
}

/// The CPU time so far, in nanoseconds, of this process (its threads) and of the PostgreSQL
/// server's processes: the first field of `/proc/<pid>/schedstat` (Linux), summed; zeros
/// elsewhere.
fn cpu_now() -> (u64, u64) {
    let mine = std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .map(|t| on_cpu(&t.path().join("schedstat")))
                .sum()
        })
        .unwrap_or(0);
    (mine, cpu_of("postgres"))
}

/// The CPU time so far, in nanoseconds, of the processes named `comm`: their threads'
/// `/proc/<pid>/task/<tid>/schedstat` (Linux), summed; zero elsewhere.
fn cpu_of(comm: &str) -> u64 {
    std::fs::read_dir("/proc")
        .map(|procs| {
            procs
                .flatten()
                .filter(|p| {
                    std::fs::read_to_string(p.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == comm)
                })
                .flat_map(|p| {
                    std::fs::read_dir(p.path().join("task"))
                        .into_iter()
                        .flatten()
                })
                .flatten()
                .map(|t| on_cpu(&t.path().join("schedstat")))
                .sum()
        })
        .unwrap_or(0)
}

fn on_cpu(path: &std::path::Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// One measured case: events per second, and microseconds of CPU per event in this process
/// and in PostgreSQL.
#[derive(Clone, Copy, Default)]
struct Measured {
    rate: f64,
    mine_us: f64,
    postgres_us: f64,
}

async fn measure<F>(events: usize, case: F) -> Result<Measured, BoxError>
where
    F: std::future::Future<Output = Result<(), BoxError>>,
{
    let (mine, postgres) = cpu_now();
    let start = Instant::now();
    case.await?;
    let elapsed = start.elapsed().as_secs_f64();
    let (mine_after, postgres_after) = cpu_now();
    let per_event = |ns: u64| ns as f64 / 1000.0 / events as f64;
    Ok(Measured {
        rate: events as f64 / elapsed,
        mine_us: per_event(mine_after.saturating_sub(mine)),
        postgres_us: per_event(postgres_after.saturating_sub(postgres)),
    })
}

/// Each consumer's events, with the SKU its handler updates.
type Shares = Arc<Vec<Vec<(Event, String)>>>;

/// The inbox's cases, each measured in every round.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum InboxCase {
    /// The business write alone, one transaction per event.
    Baseline,
    /// `PostgresInbox::process` in the caller's transaction, which the caller commits.
    Caller,
    /// `PostgresInbox::process_and_commit`.
    Own,
    /// The `Own` case's events delivered again.
    Duplicate,
}

/// Runs `case` over each consumer's share (each a task with a connection of its own), checking
/// every outcome.
async fn inbox_case(
    pool: &Pool,
    inbox: &PostgresInbox,
    stock: &str,
    shares: &Shares,
    case: InboxCase,
) -> Result<(), BoxError> {
    let mut workers = Vec::new();
    for c in 0..shares.len() {
        let (pool, inbox, shares) = (pool.clone(), inbox.clone(), shares.clone());
        let update = format!("UPDATE {stock} SET qty = qty - 1 WHERE sku = $1");
        workers.push(tokio::spawn(async move {
            let mut client = pool.get().await?;
            for (e, sku) in &shares[c] {
                let processed = match case {
                    InboxCase::Baseline => {
                        let txn = client.transaction().await?;
                        txn.execute(&update, &[sku]).await?;
                        txn.commit().await?;
                        continue;
                    }
                    InboxCase::Caller => {
                        let txn = client.transaction().await?;
                        let (update, sku) = (update.clone(), sku.clone());
                        let processed = inbox
                            .process(&txn, "inventory", e, Versions::InOrder, |txn| {
                                Box::pin(async move {
                                    txn.execute(&update, &[&sku]).await?;
                                    Ok::<_, tokio_postgres::Error>(Bytes::from_static(b"reserved"))
                                })
                            })
                            .await?;
                        txn.commit().await?;
                        processed
                    }
                    InboxCase::Own | InboxCase::Duplicate => {
                        let (update, sku) = (update.clone(), sku.clone());
                        inbox
                            .process_and_commit("inventory", e, Versions::InOrder, |txn| {
                                Box::pin(async move {
                                    txn.execute(&update, &[&sku]).await?;
                                    Ok::<_, tokio_postgres::Error>(Bytes::from_static(b"reserved"))
                                })
                            })
                            .await?
                    }
                };
                let expected = if case == InboxCase::Duplicate {
                    matches!(processed, Processed::Duplicate(_))
                } else {
                    matches!(processed, Processed::Applied(_))
                };
                if !expected {
                    return Err(format!("{case:?}: unexpected {processed:?}").into());
                }
            }
            Ok::<_, BoxError>(())
        }));
    }
    for w in workers {
        w.await??;
    }
    Ok(())
}

async fn inbox_throughput(
    pool: &Pool,
    run: &str,
    events: usize,
    rounds: usize,
    made: &mut Vec<String>,
) -> Result<(), BoxError> {
    const AGGREGATES: usize = 64;
    println!(
        "## Inbox on PostgreSQL (one transaction per event; versions in order per SKU; \
         {rounds} rounds of {events} events per case, cases alternated)\n"
    );
    println!(
        "| consumers | case | events/s, median (range) | ÷ baseline, median (range) | \
         CPU µs/event: this process + PostgreSQL |"
    );
    println!("| ---: | --- | ---: | ---: | ---: |");
    let stock = format!("{run}_stock");
    made.push(stock.clone());
    for consumers in [1usize, 4] {
        let table = format!("{run}_inbox{consumers}");
        let inbox = PostgresInbox::new(pool.clone()).with_table(&table)?;
        made.push(format!("{table}_task_steps"));
        made.push(format!("{table}_tasks"));
        made.push(table.clone());
        made.push(format!("{table}_versions"));
        inbox.migrate().await?;
        pool.get()
            .await?
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {stock};
                 CREATE TABLE {stock} (sku text PRIMARY KEY, qty bigint NOT NULL);
                 INSERT INTO {stock} SELECT 'sku-' || i, 1000000 FROM generate_series(0, {}) i",
                AGGREGATES - 1
            ))
            .await?;
        let cases = [InboxCase::Baseline, InboxCase::Caller, InboxCase::Own];
        let mut results: HashMap<&str, Vec<Measured>> = HashMap::new();
        let mut ratios: HashMap<&str, Vec<f64>> = HashMap::new();
        for round in 0..rounds {
            // Each case's events in version order per aggregate, on aggregates of their own;
            // consumer c owns the SKUs with index % consumers == c.
            let share = |case: InboxCase| -> Result<Shares, BoxError> {
                let mut shares: Vec<Vec<(Event, String)>> = vec![Vec::new(); consumers];
                for i in 0..events {
                    let sku = i % AGGREGATES;
                    let version = (i / AGGREGATES) as i64 + 1;
                    let what = format!("inbox{consumers}{case:?}{round}");
                    let e = event(run, &what, i, &format!("{what}-sku-{sku}"), version)?;
                    shares[sku % consumers].push((e, format!("sku-{sku}")));
                }
                Ok(Arc::new(shares))
            };
            let mut measured = HashMap::new();
            let mut order = cases;
            order.rotate_left(round % cases.len());
            let own = share(InboxCase::Own)?;
            for case in order {
                let shares = if case == InboxCase::Own {
                    own.clone()
                } else {
                    share(case)?
                };
                let m = measure(events, inbox_case(pool, &inbox, &stock, &shares, case)).await?;
                measured.insert(case, m);
            }
            let m = measure(
                events,
                inbox_case(pool, &inbox, &stock, &own, InboxCase::Duplicate),
            )
            .await?;
            measured.insert(InboxCase::Duplicate, m);
            let baseline = measured[&InboxCase::Baseline].rate;
            for (case, label) in CASE_LABELS {
                results.entry(label).or_default().push(measured[&case]);
                if case != InboxCase::Baseline {
                    ratios
                        .entry(label)
                        .or_default()
                        .push(measured[&case].rate / baseline);
                }
            }
        }
        for (_, label) in CASE_LABELS {
            let r = &results[label];
            let rates: Vec<f64> = r.iter().map(|m| m.rate).collect();
            let mine: Vec<f64> = r.iter().map(|m| m.mine_us).collect();
            let postgres: Vec<f64> = r.iter().map(|m| m.postgres_us).collect();
            let ratio = ratios.get(label).map_or("—".to_owned(), |v| spread(v, 2));
            println!(
                "| {consumers} | {label} | {} | {ratio} | {} + {} |",
                spread(&rates, 0),
                median(&mine),
                median(&postgres)
            );
        }
        let client = pool.get().await?;
        let moved: i64 = client
            .query_one(
                &format!("SELECT sum(1000000 - qty)::bigint FROM {stock}"),
                &[],
            )
            .await?
            .get(0);
        let expected = rounds * events * cases.len();
        if moved as usize != expected {
            return Err(format!("stock moved {moved} times for {expected} events").into());
        }
    }
    println!();
    println!("Stock moved exactly once per event applied, in every run (checked).");
    Ok(())
}

const CASE_LABELS: [(InboxCase, &str); 4] = [
    (
        InboxCase::Baseline,
        "baseline: the business write alone, no inbox",
    ),
    (
        InboxCase::Caller,
        "applied: `process` in the caller's transaction",
    ),
    (InboxCase::Own, "applied: `process_and_commit`"),
    (
        InboxCase::Duplicate,
        "redelivered (duplicate): `process_and_commit`",
    ),
];

fn median(values: &[f64]) -> String {
    let s = spread(values, 0);
    s.split(' ').next().unwrap_or_default().to_owned()
}
