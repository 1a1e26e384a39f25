//! Part 4: the log relay, against raw publishing and the polling relay in the same rounds.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use surely::deps::async_nats::{self, jetstream};
use surely::outbox::{JetStreamPublisher, LogRelay, LogSource, PostgresOutbox, Relay};
use surely::postgres::Pool;
use tower::ServiceExt;

use super::{cpu_now, cpu_of, drain, event, fill, outbox, raw_publish, spread, Args, BoxError};

/// The window: events in flight for the log relay, the batch for the others.
const WINDOW: usize = 500;

/// One drain: events per second and CPU µs per event of this process, PostgreSQL (and, of
/// it, the walsenders: the log's decoding) and NATS.
#[derive(Clone, Copy, Default)]
struct Drained {
    rate: f64,
    mine: f64,
    postgres: f64,
    walsender: f64,
    nats: f64,
}

/// The walsenders' CPU time when a log relay had published its last event.
static WALSENDER: AtomicU64 = AtomicU64::new(0);

/// The CPU time so far, in nanoseconds, of PostgreSQL's walsenders (the processes whose
/// title names them), Linux; zero elsewhere.
fn walsenders() -> u64 {
    std::fs::read_dir("/proc")
        .map(|procs| {
            procs
                .flatten()
                .filter(|p| {
                    std::fs::read(p.path().join("cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("walsender"))
                })
                .map(|p| super::on_cpu(&p.path().join("schedstat")))
                .sum()
        })
        .unwrap_or(0)
}

/// Runs `case`, `n` events long, and measures it: until it returns, or until the instant it
/// returns (the last acknowledgement of a log relay, whose confirmation of the slot follows on
/// its own).
async fn measured<F>(n: usize, case: F) -> Result<Drained, BoxError>
where
    F: std::future::Future<Output = Result<Option<Instant>, BoxError>>,
{
    let (mine, postgres, nats) = (cpu_now().0, cpu_of("postgres"), cpu_of("nats-server"));
    let walsender = walsenders();
    let start = Instant::now();
    let end = case.await?.unwrap_or_else(Instant::now);
    // A walsender ends with its relay, taking its CPU time out of the sum: `drain_log` reads
    // it while the relay still runs.
    let walsender = WALSENDER
        .swap(0, Ordering::Relaxed)
        .saturating_sub(walsender);
    let took = end.saturating_duration_since(start).as_secs_f64();
    let per = |ns: u64| ns as f64 / 1000.0 / n as f64;
    Ok(Drained {
        rate: n as f64 / took,
        mine: per(cpu_now().0.saturating_sub(mine)),
        postgres: per(cpu_of("postgres").saturating_sub(postgres)),
        walsender: per(walsender),
        nats: per(cpu_of("nats-server").saturating_sub(nats)),
    })
}

/// An outbox table of the run's own with a slot whose catch-up is done (a relay ran on it
/// once, on an empty table), so that a backlog filled afterwards is read from the log alone.
async fn slotted(
    pool: &Pool,
    pg_url: &str,
    js: &jetstream::Context,
    name: &str,
    made: &mut Vec<String>,
) -> Result<(PostgresOutbox, LogSource), BoxError> {
    let outbox = outbox(pool, name, made).await?;
    outbox.create_slot(name).await?;
    let source = LogSource::new(pg_url, name)?;
    let relay = LogRelay::builder(
        outbox.clone(),
        source.clone(),
        JetStreamPublisher::new(js.clone(), name.to_owned()),
    )
    .build()?;
    relay
        .run(tokio::time::sleep(Duration::from_millis(300)))
        .await?;
    // Its walsender ends a moment after the relay: the next relay finds the slot free.
    let client = pool.get().await?;
    for _ in 0..200 {
        let active: bool = client
            .query_one(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&name],
            )
            .await?
            .get(0);
        if !active {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok((outbox, source))
}

/// A log relay with `WINDOW` events in flight, run until it has published `n` events;
/// returns when the last acknowledgement came.
async fn drain_log(
    outbox: &PostgresOutbox,
    source: &LogSource,
    js: &jetstream::Context,
    subject: String,
    n: usize,
) -> Result<Option<Instant>, BoxError> {
    let acked = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(tokio::sync::Notify::new());
    let last = Arc::new(Mutex::new(None));
    let (count, done, at) = (acked.clone(), all.clone(), last.clone());
    let publisher = JetStreamPublisher::new(js.clone(), subject).map_result(move |r| {
        if r.is_ok() && count.fetch_add(1, Ordering::Relaxed) + 1 == n {
            *at.lock().unwrap() = Some(Instant::now());
            done.notify_one();
        }
        r
    });
    let relay = LogRelay::builder(outbox.clone(), source.clone(), publisher)
        .max_in_flight(WINDOW)
        .build()?;
    relay
        .run(async {
            let _ = tokio::time::timeout(Duration::from_secs(300), all.notified()).await;
            WALSENDER.store(walsenders(), Ordering::Relaxed);
        })
        .await?;
    let published = acked.load(Ordering::Relaxed);
    if published != n {
        return Err(format!("the log relay published {published} of {n}").into());
    }
    let last = *last.lock().unwrap();
    Ok(last)
}

pub(super) async fn throughput(
    pool: &Pool,
    pg_url: &str,
    js: &jetstream::Context,
    run: &str,
    args: &Args,
    made: &mut Vec<String>,
) -> Result<(), BoxError> {
    let (events, rounds) = (args.events, args.rounds);
    println!("## The log relay into JetStream (events already committed)\n");
    println!(
        "Raw async-nats publishing in batches of {WINDOW}, the log relay with {WINDOW} events \
         in flight, the polling relay (`Relay::run`, batches of {WINDOW}, pipelined), taking \
         turns, {rounds} rounds of {events} events; medians (ranges); CPU in µs per event:\n"
    );
    println!(
        "| case | events/s | ÷ raw | CPU relay | CPU PostgreSQL | of it, walsender | CPU NATS \
         | PostgreSQL ÷ polling |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut got: [Vec<Drained>; 3] = Default::default();
    let (mut log_ratio, mut poll_ratio, mut pg_ratio) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let what = format!("log{round}");
        let (log_outbox, source) =
            slotted(pool, pg_url, js, &format!("{run}_{what}l"), made).await?;
        fill(&log_outbox, run, &format!("{what}l"), events).await?;
        let poll_outbox = outbox(pool, &format!("{run}_{what}p"), made).await?;
        fill(&poll_outbox, run, &format!("{what}p"), events).await?;
        let raw_events = (0..events)
            .map(|i| event(run, &format!("raw{what}"), i, "order", 1))
            .collect::<Result<Vec<_>, _>>()?;
        let mut this = [Drained::default(); 3];
        for turn in 0..3 {
            let case = (round + turn) % 3;
            this[case] = match case {
                0 => {
                    measured(events, async {
                        raw_publish(js, &format!("{run}.raw{what}"), &raw_events, WINDOW).await?;
                        Ok(None)
                    })
                    .await?
                }
                1 => {
                    measured(
                        events,
                        drain_log(&log_outbox, &source, js, format!("{run}.{what}l"), events),
                    )
                    .await?
                }
                _ => {
                    measured(events, async {
                        drain(
                            &poll_outbox,
                            js,
                            format!("{run}.{what}p"),
                            WINDOW,
                            None,
                            events,
                        )
                        .await?;
                        Ok(None)
                    })
                    .await?
                }
            };
        }
        log_outbox.drop_slot(&format!("{run}_{what}l")).await?;
        log_ratio.push(this[1].rate / this[0].rate);
        poll_ratio.push(this[2].rate / this[0].rate);
        pg_ratio.push(this[1].postgres / this[2].postgres);
        for (case, d) in this.iter().enumerate() {
            got[case].push(*d);
        }
    }
    let col = |case: usize, f: fn(&Drained) -> f64, digits: usize| {
        spread(&got[case].iter().map(f).collect::<Vec<_>>(), digits)
    };
    for (case, name, ratio) in [
        (0, "raw publish", None),
        (1, "log relay", Some(&log_ratio)),
        (2, "polling relay", Some(&poll_ratio)),
    ] {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            col(case, |d| d.rate, 0),
            ratio.map_or_else(|| "1".to_owned(), |r| spread(r, 2)),
            col(case, |d| d.mine, 1),
            col(case, |d| d.postgres, 1),
            col(case, |d| d.walsender, 1),
            col(case, |d| d.nats, 1),
            match case {
                1 => spread(&pg_ratio, 2),
                2 => "1".to_owned(),
                _ => String::new(),
            }
        );
    }
    println!();
    Ok(())
}

pub(super) async fn latency(
    pool: &Pool,
    pg_url: &str,
    nats: &async_nats::Client,
    js: &jetstream::Context,
    run: &str,
    made: &mut Vec<String>,
) -> Result<(), BoxError> {
    const EVENTS: usize = 500;
    const PACE: Duration = Duration::from_millis(5);
    println!("## Commit-to-broker latency, the log relay ({EVENTS} events, one committed every {PACE:?})\n");
    println!("| relay | p50 | p99 | max |");
    println!("| --- | ---: | ---: | ---: |");
    for log in [true, false] {
        let what = if log { "lat_log" } else { "lat_listen" };
        let name = format!("{run}_{what}");
        let subject = format!("{run}.{what}");
        let subscriber = nats.subscribe(format!("{subject}.>")).await?;
        nats.flush().await?;
        let publisher = JetStreamPublisher::new(js.clone(), subject);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        let (outbox, relaying) = if log {
            let (outbox, source) = slotted(pool, pg_url, js, &name, made).await?;
            let relay = LogRelay::builder(outbox.clone(), source, publisher).build()?;
            let task =
                tokio::spawn(async move { relay.run(stopped).await.map_err(BoxError::from) });
            (outbox, task)
        } else {
            let outbox = outbox(pool, &name, made).await?;
            let relay = Relay::builder(outbox.clone(), publisher)
                .wake_on(outbox.listen(pg_url).await?)
                .build()?;
            let task = tokio::spawn(async move {
                relay.run(stopped).await;
                Ok::<_, BoxError>(())
            });
            (outbox, task)
        };
        let latency = super::paced(pool, &outbox, subscriber, run, what, EVENTS, PACE).await?;
        let _ = stop.send(());
        relaying.await??;
        if log {
            outbox.drop_slot(&name).await?;
        }
        let name = if log {
            "log relay"
        } else {
            "polling relay woken by LISTEN/NOTIFY"
        };
        super::latency_row(name, &latency);
    }
    println!();
    Ok(())
}
