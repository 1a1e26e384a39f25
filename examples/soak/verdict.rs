//! The soak's invariants, from the samples, the calls' latencies and SQL: one line each, then
//! `invariants: ok` or what failed; and the figures of the first and last tenth.

use std::collections::BTreeMap;

use crate::checks::Checks;
use crate::chores::{self, Settings, ORDER_RECOVERS_ABANDONED};
use crate::driver::{Call, Options, ROLES};
use crate::sample::{quantile, Phase, Sample};
use crate::world::World;
use crate::BoxError;

/// The fewest calls a tenth needs for its p99 to be compared.
const MIN_TENTH_CALLS: usize = 100;
/// The fewest calls the backlog check's window needs: in a run of three minutes or more, and
/// in a shorter one (CI's minute, whose timings are reported, not checked).
const MIN_WINDOW_CALLS: usize = 400;
const MIN_WINDOW_CALLS_SHORT: usize = 100;
/// The tables' slack: a quarter over the prediction, and 50 rows.
const SLACK_FACTOR: f64 = 1.25;
const SLACK_ROWS: f64 = 50.0;

/// The backlog check's times (seconds since the start).
#[derive(Default)]
pub(crate) struct Backlog {
    /// The insert's start, end, and rows.
    pub(crate) inserted: Option<(f64, f64, u64)>,
    /// When its last row was swept.
    pub(crate) swept: Option<f64>,
    pub(crate) error: Option<String>,
}

/// Everything the run measured.
pub(crate) struct Run<'a> {
    pub(crate) world: &'a World,
    pub(crate) opts: &'a Options,
    pub(crate) settings: &'a Settings,
    pub(crate) samples: &'a [Sample],
    pub(crate) calls: &'a [Call],
    /// When the client's calls met a fault.
    pub(crate) windows: &'a [(f64, f64, &'static str)],
    pub(crate) backlog: &'a Backlog,
    /// The broker's longest outage, seconds.
    pub(crate) broker_outage: f64,
    pub(crate) outcomes: &'a BTreeMap<String, u64>,
    pub(crate) faults: &'a BTreeMap<&'a str, usize>,
    pub(crate) kills: &'a BTreeMap<&'static str, u32>,
    pub(crate) unexpected: &'a [String],
    pub(crate) failures: &'a [String],
    pub(crate) dropped: u64,
    /// When the load stopped.
    pub(crate) end: f64,
}

impl Run<'_> {
    /// Whether a call was in flight while a fault met the client.
    fn hit(&self, c: &Call) -> bool {
        let started = c.started();
        self.windows
            .iter()
            .any(|(from, to, _)| started <= *to && c.at >= *from)
    }

    /// The latencies (µs, sorted) of the calls that ended in `(from, to]` and met no fault.
    fn clean(&self, from: f64, to: f64) -> Vec<u64> {
        let mut us: Vec<u64> = self
            .calls
            .iter()
            .filter(|c| c.at > from && c.at <= to && !self.hit(c))
            .map(|c| c.us)
            .collect();
        us.sort_unstable();
        us
    }
}

/// A latency check: an invariant, or with `--timings report` a line that says how it came out
/// and counts for nothing.
fn timing(checks: &mut Checks, checked: bool, ok: bool, what: String) {
    if checked {
        checks.invariant(ok, what);
    } else {
        let came = if ok { "within" } else { "OVER  " };
        println!("  {came} {what} (reported, not checked: --timings report)");
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.1}ms"))
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

pub(crate) async fn check(run: &Run<'_>) -> Result<bool, BoxError> {
    let warmup = run.opts.warmup.as_secs_f64();
    let rate = run.opts.rate;
    let after: Vec<&Sample> = run.samples.iter().filter(|s| s.t >= warmup).collect();
    let tenth = |n: usize| (n / 10).max(1);
    let mut checks = Checks::default();

    println!();
    let outcomes: Vec<String> = run
        .outcomes
        .iter()
        .map(|(o, n)| format!("{o} {n}"))
        .collect();
    let faults: Vec<String> = run.faults.iter().map(|(f, n)| format!("{f} {n}")).collect();
    let kills: Vec<String> = run.kills.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "Calls: {} in {:.0}s ({}); faults: {} ({}); kills: {}; replies lost {}; the broker's longest outage {:.1}s; {} exits not caused by the driver{}",
        run.calls.len(),
        run.end,
        outcomes.join(", "),
        run.faults.values().sum::<usize>(),
        faults.join(", "),
        if kills.is_empty() { "none".to_owned() } else { kills.join(", ") },
        run.dropped,
        run.broker_outage,
        run.unexpected.len(),
        run.unexpected
            .first()
            .map_or(String::new(), |u| format!(" (first: {u})"))
    );
    let hit = run.calls.iter().filter(|c| run.hit(c)).count();
    println!(
        "  {hit} calls were in flight while a fault met the client: left out of the latency comparisons"
    );

    // The figures: first and last tenth after the warm-up.
    if after.len() >= 2 {
        let n = tenth(after.len());
        let (first, last) = (&after[..n], &after[after.len() - n..]);
        println!(
            "Figures after the warm-up ({} samples; the first and last {n}: {:.0}s-{:.0}s and {:.0}s-{:.0}s):",
            after.len(),
            first[0].t,
            first[n - 1].t,
            last[0].t,
            last[n - 1].t
        );
        for (i, (name, _)) in after[0].procs.iter().enumerate() {
            let rss = |ss: &[&Sample]| {
                mean(
                    ss.iter()
                        .filter_map(|s| s.procs.get(i)?.1)
                        .map(|p| p.rss_kb as f64 / 1024.0),
                )
            };
            let fds = |ss: &[&Sample]| {
                mean(
                    ss.iter()
                        .filter_map(|s| s.procs.get(i)?.1)
                        .map(|p| p.fds as f64),
                )
            };
            println!(
                "  RSS {name:<10} {:>7} -> {:>7} MiB   fds {:>5} -> {:>5}",
                rss(first).map_or("-".to_owned(), |v| format!("{v:.1}")),
                rss(last).map_or("-".to_owned(), |v| format!("{v:.1}")),
                fds(first).map_or("-".to_owned(), |v| format!("{v:.0}")),
                fds(last).map_or("-".to_owned(), |v| format!("{v:.0}"))
            );
        }
        for (i, t) in after[0].tables.iter().enumerate() {
            let rows =
                |ss: &[&Sample]| mean(ss.iter().filter_map(|s| Some(s.tables.get(i)?.rows as f64)));
            let dead =
                |ss: &[&Sample]| mean(ss.iter().filter_map(|s| Some(s.tables.get(i)?.dead as f64)));
            let max = after
                .iter()
                .filter_map(|s| s.tables.get(i))
                .map(|x| x.rows)
                .max();
            println!(
                "  rows {:<20} {:>8.0} -> {:>8.0} (max {:>8}); dead tuples {:>7.0} -> {:>7.0}",
                t.table,
                rows(first).unwrap_or(0.0),
                rows(last).unwrap_or(0.0),
                max.unwrap_or(0),
                dead(first).unwrap_or(0.0),
                dead(last).unwrap_or(0.0)
            );
        }
        let pg = |ss: &[&Sample]| mean(ss.iter().map(|s| s.pg_conns as f64));
        let ledger = |ss: &[&Sample]| mean(ss.iter().map(|s| s.ledger_open as f64));
        println!(
            "  PostgreSQL connections {:.0} -> {:.0}; open ledger entries {:.1} -> {:.1}",
            pg(first).unwrap_or(0.0),
            pg(last).unwrap_or(0.0),
            ledger(first).unwrap_or(0.0),
            ledger(last).unwrap_or(0.0)
        );
    }

    println!("Invariants (after the warm-up of {warmup:.0}s):");
    // 1. Each table with a retention under its bound.
    let outside: Vec<&&Sample> = after.iter().filter(|s| s.phase != Phase::Backlog).collect();
    let bounds = chores::bounds(run.settings);
    for b in &bounds {
        let mut predicted = rate * b.share * b.horizon.as_secs_f64();
        let mut extra = String::new();
        if b.waits_for_broker {
            // Events wait while the broker is down, and while a killed relay comes back.
            let waits = run.broker_outage + 2.0;
            predicted += rate * b.share * waits;
            extra = format!(" + {waits:.1}s of broker outage and relay restart");
        }
        let bound = (predicted * SLACK_FACTOR + SLACK_ROWS).ceil() as i64;
        let max = outside.iter().filter_map(|s| s.rows(b.table)).max();
        let held = max.is_some_and(|m| m <= bound);
        checks.invariant(
            held,
            format!(
                "1. table {} under its bound: at most {} rows in {} samples outside the backlog check; bound {bound} = {rate} calls/s x {:.2} x ({:.0}s retention, safety window and two rounds{extra}) x {SLACK_FACTOR} + {SLACK_ROWS}",
                b.table,
                max.map_or("(no sample)".to_owned(), |m| m.to_string()),
                outside.len(),
                b.share,
                b.horizon.as_secs_f64()
            ),
        );
    }
    let swept: Vec<&str> = bounds.iter().map(|b| b.table).collect();
    let growing: Vec<String> = [
        "inbox",
        "orders",
        "inventory_changes",
        "arrivals",
        "payments",
    ]
    .iter()
    .filter(|t| !swept.contains(t))
    .filter_map(|t| {
        let (a, z) = (outside.first()?, outside.last()?);
        let (ra, rz) = (a.rows(t)?, z.rows(t)?);
        let per_s = (rz - ra) as f64 / (z.t - a.t).max(1.0);
        Some(format!("{t} {ra} -> {rz} ({per_s:.1} rows/s)"))
    })
    .collect();
    println!(
        "  (no retention, not bounded here: {}; the inbox waits on its retention chore, the others are the services' own tables)",
        growing.join(", ")
    );

    // 2. RSS growth per process, its longest-lived incarnation.
    for role in ROLES {
        let name = role.name();
        let mut by_pid: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for s in &after {
            if let Some((_, Some(p))) = s.procs.iter().find(|(n, _)| *n == name) {
                by_pid.entry(p.pid).or_default().push(p.rss_kb);
            }
        }
        let longest = by_pid.iter().max_by_key(|(_, v)| v.len());
        match longest {
            Some((pid, rss)) if rss.len() >= 2 && rss.len() * 2 >= after.len() => {
                let n = tenth(rss.len());
                let first = rss[..n].iter().sum::<u64>() as f64 / n as f64;
                let last = rss[rss.len() - n..].iter().sum::<u64>() as f64 / n as f64;
                let growth = last / first - 1.0;
                checks.invariant(
                    growth <= 0.10,
                    format!(
                        "2. RSS of {name} (pid {pid}, {} samples) grows at most 10 %: {:.1} -> {:.1} MiB ({:+.1} %)",
                        rss.len(),
                        first / 1024.0,
                        last / 1024.0,
                        growth * 100.0
                    ),
                );
            }
            _ => println!(
                "  not checked: 2. RSS of {name}: no incarnation saw half of the {} samples ({} incarnations)",
                after.len(),
                by_pid.len()
            ),
        }
    }

    // 3. The last tenth's p99 against the first tenth's.
    let span = (run.end - warmup).max(0.0);
    let first = run.clean(warmup, warmup + span / 10.0);
    let last = run.clean(run.end - span / 10.0, run.end);
    let (p99_first, p99_last) = (quantile(&first, 0.99), quantile(&last, 0.99));
    if first.len() < MIN_TENTH_CALLS || last.len() < MIN_TENTH_CALLS {
        checks.invariant(
            false,
            format!(
                "3. last tenth's p99 at most 1.5 x the first's: CANNOT SAY, too few calls ({} and {}, at least {MIN_TENTH_CALLS} each)",
                first.len(),
                last.len()
            ),
        );
    } else {
        let (a, z) = (p99_first.unwrap_or(0.0), p99_last.unwrap_or(0.0));
        timing(
            &mut checks,
            run.opts.timings_checked,
            z <= 1.5 * a,
            format!(
                "3. last tenth's p99 at most 1.5 x the first's: {} ({} calls) -> {} ({} calls), x{:.2}; p50 {} -> {}",
                ms(p99_first),
                first.len(),
                ms(p99_last),
                last.len(),
                z / a.max(1e-9),
                ms(quantile(&first, 0.5)),
                ms(quantile(&last, 0.5))
            ),
        );
    }

    // 4. No record PROCESSING past twice its lease (and a round of the maintenance).
    let max_stuck = after.iter().map(|s| s.stuck).max().unwrap_or(0);
    let max_long = after.iter().map(|s| s.stuck_past_round).max().unwrap_or(0);
    let last_stuck = after.last().map_or(0, |s| s.stuck);
    let what = format!(
        "4. no record PROCESSING past twice its lease ({:.0}s) and a round ({:.0}s): at most {max_long} at a sample; past twice the lease alone at most {max_stuck}, {last_stuck} at the last sample",
        2.0 * crate::LEASE.as_secs_f64(),
        run.settings.every.as_secs_f64()
    );
    if ORDER_RECOVERS_ABANDONED {
        checks.invariant(max_long == 0, what);
    } else {
        println!(
            "  WAITING on recovery: {what} (the order service's maintenance does not recover abandoned records yet: not a pass, not a failure)"
        );
    }

    // 5. The p99 while the backlog is swept.
    match (run.backlog.inserted, run.backlog.swept, &run.backlog.error) {
        (_, _, Some(e)) => checks.invariant(false, format!("5. the backlog's sweep: {e}")),
        (Some((from, to, rows)), Some(swept), None) => {
            let took = swept - to;
            let min_calls = if run.opts.is_short() {
                MIN_WINDOW_CALLS_SHORT
            } else {
                MIN_WINDOW_CALLS
            };
            // A window long enough for its calls, even if the sweep was quicker; the calls
            // without are those of as long a window before the insert and of one after the
            // window during, so that neither a drift nor one quiet stretch sets the bar.
            let min_len = min_calls as f64 / rate * 1.2;
            let len = took.max(min_len);
            let during = run.clean(to, to + len);
            let (before, after) = (
                run.clean(from - len, from),
                run.clean(to + len, to + 2.0 * len),
            );
            let mut without = [before.as_slice(), after.as_slice()].concat();
            without.sort_unstable();
            let stretched = if took < min_len {
                format!(
                    " (the sweep took {took:.1}s; the window stretched to {len:.1}s for its calls)"
                )
            } else {
                String::new()
            };
            if during.len() < min_calls || without.len() < 2 * min_calls {
                checks.invariant(
                    false,
                    format!(
                        "5. p99 while a backlog of {rows} rows is swept at most 1.2 x without: CANNOT SAY, too few calls ({} during, {} without; at least {min_calls} during and twice that without){stretched}",
                        during.len(),
                        without.len()
                    ),
                );
            } else {
                let (d, w) = (quantile(&during, 0.99), quantile(&without, 0.99));
                let (dv, wv) = (d.unwrap_or(0.0), w.unwrap_or(0.0));
                timing(
                    &mut checks,
                    run.opts.timings_checked,
                    dv <= 1.2 * wv,
                    format!(
                        "5. p99 while a backlog of {rows} rows is swept at most 1.2 x without: {} ({} calls, the sweep {took:.1}s, {:.0} rows/s) against {} ({} calls before and after: {} and {} alone), x{:.2}{stretched}",
                        ms(d),
                        during.len(),
                        rows as f64 / took.max(0.001),
                        ms(w),
                        without.len(),
                        ms(quantile(&before, 0.99)),
                        ms(quantile(&after, 0.99)),
                        dv / wv.max(1e-9)
                    ),
                );
            }
        }
        (Some((_, _, rows)), None, None) => checks.invariant(
            false,
            format!("5. the backlog of {rows} rows was not swept before the end"),
        ),
        (None, _, None) => checks.invariant(false, "5. the backlog was never inserted"),
    }

    // 6. One order per key, one inventory change per order's event.
    let client = run.world.pool.get().await?;
    let count = |sql: &str| {
        let sql = run.world.sql(sql);
        let client = &client;
        async move { Ok::<i64, BoxError>(client.query_one(&sql, &[]).await?.get(0)) }
    };
    let orders = count("SELECT count(*) FROM {p}_orders").await?;
    let twice = count(
        "SELECT count(*) FROM (SELECT key FROM {p}_orders GROUP BY key HAVING count(*) > 1) x",
    )
    .await?;
    let applied_twice = count(
        "SELECT count(*) FROM (SELECT event_id FROM {p}_inventory_changes GROUP BY event_id HAVING count(*) > 1) x",
    )
    .await?;
    let missing = count(
        "SELECT count(*) FROM {p}_orders o WHERE NOT EXISTS
             (SELECT 1 FROM {p}_inventory_changes i WHERE i.order_key = o.key)",
    )
    .await?;
    let stray = count(
        "SELECT count(*) FROM {p}_inventory_changes i WHERE NOT EXISTS
             (SELECT 1 FROM {p}_orders o WHERE o.key = i.order_key)",
    )
    .await?;
    checks.invariant(
        twice == 0 && applied_twice == 0 && missing == 0 && stray == 0,
        format!(
            "6. one order per key and one inventory change per order's event: {orders} orders, {twice} keys with more than one; events applied more than once {applied_twice}, orders without their change {missing}, changes for no order {stray}"
        ),
    );
    for f in run.failures {
        checks.check(false, f.clone());
    }
    Ok(checks.verdict())
}
