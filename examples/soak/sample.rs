//! One sample: each process's memory and descriptors, the database's connections, each of the
//! run's tables, the calls' latency over the interval, the ledger and the idempotency records;
//! and the CSV they make.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use surely::ledger::Ledger;

use crate::world::World;
use crate::BoxError;

/// Where the run is when a sample is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Warmup,
    Steady,
    /// From the backlog's insert until it is swept.
    Backlog,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Warmup => "warmup",
            Phase::Steady => "steady",
            Phase::Backlog => "backlog",
        }
    }
}

/// A process's figures.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProcStat {
    pub(crate) pid: u32,
    pub(crate) rss_kb: u64,
    pub(crate) fds: u64,
}

/// Reads `/proc/PID/status` (VmRSS) and counts `/proc/PID/fd`.
pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(ProcStat { pid, rss_kb, fds })
}

/// A table's rows (exact) and dead tuples (the statistics' figure).
#[derive(Clone, Debug)]
pub(crate) struct TableStat {
    pub(crate) table: String,
    pub(crate) rows: i64,
    pub(crate) dead: i64,
}

#[derive(Clone, Debug)]
pub(crate) struct Sample {
    /// Seconds since the roles served.
    pub(crate) t: f64,
    pub(crate) phase: Phase,
    pub(crate) calls: usize,
    pub(crate) p50_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) pg_conns: i64,
    pub(crate) ledger_open: u64,
    pub(crate) processing: i64,
    /// `PROCESSING` for more than twice the lease.
    pub(crate) stuck: i64,
    /// `PROCESSING` for more than twice the lease and a round of the maintenance: a record a
    /// recovery running every round would have taken over.
    pub(crate) stuck_past_round: i64,
    /// By process name (the roles, `driver`, `nats`): its figures if it runs.
    pub(crate) procs: Vec<(&'static str, Option<ProcStat>)>,
    pub(crate) tables: Vec<TableStat>,
}

impl Sample {
    pub(crate) fn rows(&self, suffix: &str) -> Option<i64> {
        self.tables
            .iter()
            .find(|t| t.table == suffix)
            .map(|t| t.rows)
    }
}

/// The `q` quantile (0..=1) of sorted values, nearest rank.
pub(crate) fn quantile(sorted: &[u64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1] as f64 / 1000.0)
}

/// The database's part of a sample: the run's connections (their `application_name`), tables
/// (by suffix), open ledger entries,
/// `PROCESSING` records and those past `2 x lease`.
pub(crate) async fn database(
    world: &World,
    tables: &[String],
    lease: Duration,
    every: Duration,
) -> Result<Db, BoxError> {
    let client = world.pool.get().await?;
    let conns: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&world.prefix],
        )
        .await?
        .get(0);
    let mut stats = Vec::with_capacity(tables.len());
    for suffix in tables {
        let table = world.t(suffix);
        let rows: i64 = client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await?
            .get(0);
        let dead: i64 = client
            .query_opt(
                "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = $1",
                &[&table],
            )
            .await?
            .map_or(0, |r| r.get(0));
        stats.push(TableStat {
            table: suffix.clone(),
            rows,
            dead,
        });
    }
    // State 0 is `PROCESSING` in the store's table.
    let row = client
        .query_one(
            &world.sql(
                "SELECT count(*),
                     count(*) FILTER (WHERE acquired_at <= now() - make_interval(secs => $1)),
                     count(*) FILTER (WHERE acquired_at <= now() - make_interval(secs => $2))
                 FROM {p}_idem WHERE state = 0",
            ),
            &[
                &(2.0 * lease.as_secs_f64()),
                &((2 * lease + every).as_secs_f64()),
            ],
        )
        .await?;
    drop(client);
    let ledger = world.ledger()?.stats().await?;
    Ok(Db {
        conns,
        tables: stats,
        ledger_open: ledger.in_doubt + ledger.open + ledger.claimed,
        processing: row.get(0),
        stuck: row.get(1),
        stuck_past_round: row.get(2),
    })
}

/// The database's part of a sample.
pub(crate) struct Db {
    pub(crate) conns: i64,
    pub(crate) tables: Vec<TableStat>,
    pub(crate) ledger_open: u64,
    pub(crate) processing: i64,
    pub(crate) stuck: i64,
    pub(crate) stuck_past_round: i64,
}

/// The CSV of the samples: one line each, the header from the first.
pub(crate) fn write_csv(path: &Path, samples: &[Sample]) -> Result<(), BoxError> {
    let Some(first) = samples.first() else {
        return Ok(());
    };
    let mut out = String::from(
        "t_s,phase,calls,p50_ms,p99_ms,pg_connections,ledger_open,processing,processing_past_2x_lease",
    );
    for (name, _) in &first.procs {
        write!(out, ",rss_kb_{name},fds_{name},pid_{name}")?;
    }
    for t in &first.tables {
        write!(out, ",rows_{0},dead_{0}", t.table)?;
    }
    out.push('\n');
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    for s in samples {
        write!(
            out,
            "{:.1},{},{},{},{},{},{},{},{}",
            s.t,
            s.phase.name(),
            s.calls,
            opt(s.p50_ms),
            opt(s.p99_ms),
            s.pg_conns,
            s.ledger_open,
            s.processing,
            s.stuck
        )?;
        for (_, p) in &s.procs {
            match p {
                Some(p) => write!(out, ",{},{},{}", p.rss_kb, p.fds, p.pid)?,
                None => out.push_str(",,,"),
            }
        }
        for t in &s.tables {
            write!(out, ",{},{}", t.rows, t.dead)?;
        }
        out.push('\n');
    }
    std::fs::write(path, out)?;
    Ok(())
}
