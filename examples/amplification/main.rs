//! The retry-amplification simulator.
//!
//! ```text
//! cargo run --release --example amplification [-- [--csv] [--svg PATH] [--calls N] [--rate R] [--seed S]]
//! ```
//!
//! A deterministic simulation (paused tokio time, seeded random draws) of a chain of 1 to 5
//! services, each calling the next through a retry strategy, the bottom one failing. For every
//! (strategy, depth, failure model) it reports the **amplification** (bottom-service calls per
//! top-level call) and the **success rate** (the share of top-level calls that succeeded). See
//! `sim.rs` for the model.
//!
//! `surely-default` is the retry part of `surely::client()`'s defaults at every hop (the
//! settings of `RetryLayer::new()`, its `RatioBudget`, and the retry-owner marker carried from
//! hop to hop by `ServerDeadlineLayer`). The client's circuit breaker is left out: it would
//! shed most of a total outage's calls, and the table would measure load shedding instead of
//! retry amplification.

mod sim;

use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use sim::{Cell, Failure, Params, Strategy, MAX_ATTEMPTS};

/// The deepest chain simulated.
const MAX_LAYERS: usize = 5;

const USAGE: &str = "\
usage: amplification [--csv] [--svg PATH] [--calls N] [--rate R] [--seed S]

  --csv        print `strategy,layers,failure,amplification,success_rate` rows instead of a table
  --svg PATH   also write a plot of amplification against depth per strategy to PATH
  --calls N    top-level calls per cell (default 8000; at least 1)
  --rate R     top-level calls per simulated second (default 400; more than 0)
  --seed S     seed of every random draw (default 6)
  -h, --help   print this message";

#[derive(Debug)]
struct Args {
    csv: bool,
    svg: Option<String>,
    params: Params,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut out = Args {
        csv: false,
        svg: None,
        params: Params::default(),
    };
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--csv" => out.csv = true,
            "--svg" => out.svg = Some(value("--svg")?),
            "--calls" => {
                let v = value("--calls")?;
                out.params.calls =
                    v.parse().ok().filter(|&n: &u64| n >= 1).ok_or_else(|| {
                        format!("--calls: `{v}` is not a whole number of at least 1")
                    })?;
            }
            "--rate" => {
                let v = value("--rate")?;
                out.params.rate = v
                    .parse()
                    .ok()
                    .filter(|r: &f64| r.is_finite() && *r > 0.0 && *r <= 1e7)
                    .ok_or_else(|| format!("--rate: `{v}` is not a number in (0, 1e7]"))?;
            }
            "--seed" => {
                let v = value("--seed")?;
                out.params.seed = v
                    .parse()
                    .map_err(|_| format!("--seed: `{v}` is not a whole number"))?;
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(Some(out))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };

    let strategies: &[Strategy] = &Strategy::ALL;
    let cells = match simulate(strategies, &args.params) {
        Ok(cells) => cells,
        Err(e) => {
            eprintln!("error: cannot run the simulation: {e}");
            return ExitCode::FAILURE;
        }
    };

    if args.csv {
        print!("{}", sim::csv(&cells));
    } else {
        print!("{}", table(&cells, strategies, &args.params));
    }
    if let Some(path) = &args.svg {
        if let Err(e) = svg(&cells, strategies, path) {
            eprintln!("error: cannot write the plot to {path}: {e}");
            return ExitCode::FAILURE;
        }
        if !args.csv {
            println!("plot written to {path}");
        }
    }

    // The checks go to stderr with --csv, so that stdout is exactly the CSV.
    let (report, sane) = checks(&cells);
    if args.csv {
        eprint!("{report}");
    } else {
        print!("{report}");
    }
    if sane {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs every (failure, strategy, layers) cell, each on its own current-thread runtime, spread
/// over the machine's cores (the results do not depend on how: each cell is deterministic on
/// its own). Returns them in output order.
fn simulate(strategies: &[Strategy], params: &Params) -> std::io::Result<Vec<Cell>> {
    let mut jobs = Vec::new();
    for failure in Failure::ALL {
        for &strategy in strategies {
            for layers in 1..=MAX_LAYERS {
                jobs.push((failure, strategy, layers));
            }
        }
    }
    // The deepest chains without a budget take longest: start them first.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| {
        let (_, strategy, layers) = jobs[i];
        std::cmp::Reverse((strategy == Strategy::Naive, layers))
    });
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<std::io::Result<Cell>>>> =
        Mutex::new(jobs.iter().map(|_| None).collect());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..threads.min(jobs.len()) {
            scope.spawn(|| loop {
                let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return;
                };
                let (failure, strategy, layers) = jobs[i];
                let cell = sim::run_cell(strategy, layers, failure, params);
                results.lock().unwrap_or_else(PoisonError::into_inner)[i] = Some(cell);
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(std::io::Error::other("a simulation thread stopped"))))
        .collect()
}

fn find(cells: &[Cell], strategy: Strategy, layers: usize, failure: Failure) -> Option<&Cell> {
    cells
        .iter()
        .find(|c| c.strategy == strategy && c.layers == layers && c.failure == failure)
}

fn table(cells: &[Cell], strategies: &[Strategy], params: &Params) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "retry amplification: {} top-level calls per cell, Poisson arrivals at {}/s (simulated), \
         seed {}, bottom latency {:?}",
        params.calls, params.rate, params.seed, params.latency
    );
    let _ = writeln!(
        out,
        "the bottom service answers 503 (no Retry-After) to a GET: maybe committed, safe, \
         retryable by every strategy; at most {MAX_ATTEMPTS} attempts per layer"
    );
    let _ = writeln!(
        out,
        "strategies, the same at every layer, one budget per hop:"
    );
    for &strategy in strategies {
        let _ = writeln!(out, "  {:<16}{}", strategy.name(), describe(strategy));
    }
    for failure in Failure::ALL {
        let _ = writeln!(out);
        let title = match failure {
            Failure::Always => "failure 1.0: every bottom call fails".to_owned(),
            Failure::OnePercent => {
                "failure 0.01: 1% of bottom calls fail, independently".to_owned()
            }
            Failure::Overload => format!(
                "overload: the bottom serves {:.0}/s (burst {:.0}) under {:.0}/s offered ({}x)",
                params.rate / sim::OVERLOAD_FACTOR,
                (params.rate / sim::OVERLOAD_FACTOR / 10.0).max(1.0),
                params.rate,
                sim::OVERLOAD_FACTOR
            ),
        };
        let _ = writeln!(out, "{title}");
        if failure == Failure::Overload {
            let _ = writeln!(
                out,
                "  (a refusal costs the bottom nothing and a retry is served only if capacity is free, \
                 so success is bounded by capacity whatever the strategy: what retries \
                 cost shows as amplification)"
            );
        }
        let _ = write!(out, "  {:<16}", "amplification");
        for layers in 1..=MAX_LAYERS {
            let _ = write!(out, "{:>10}", format!("N={layers}"));
        }
        let _ = write!(out, "   success rate");
        for layers in 1..=MAX_LAYERS {
            let _ = write!(out, "{:>8}", format!("N={layers}"));
        }
        let _ = writeln!(out);
        for &strategy in strategies {
            let _ = write!(out, "  {:<16}", strategy.name());
            for layers in 1..=MAX_LAYERS {
                let a =
                    find(cells, strategy, layers, failure).map_or(f64::NAN, Cell::amplification);
                let _ = write!(out, "{a:>10.3}");
            }
            let _ = write!(out, "   {:<12}", "");
            for layers in 1..=MAX_LAYERS {
                let s = find(cells, strategy, layers, failure).map_or(f64::NAN, Cell::success_rate);
                let _ = write!(out, "{s:>8.4}");
            }
            let _ = writeln!(out);
        }
    }
    let _ = writeln!(out);
    out
}

fn describe(strategy: Strategy) -> &'static str {
    match strategy {
        Strategy::Naive => "3 attempts, no budget, no backoff",
        Strategy::TowerTps => {
            "tower Retry + TpsBudget::default() (20% + 10/s over 10 s, one deposit per call), \
             3 attempts, no backoff"
        }
        Strategy::SurelyDefault => {
            "surely::client()'s retry defaults = RetryLayer::new() (RatioBudget: 10% or 10/s, \
             whichever is larger, over 10 s; backoff 100 ms full jitter), retry-owner marker \
             on; the client's breaker left out"
        }
        Strategy::SurelyRatio => "RetryLayer, RatioBudget::default(), no owner marker",
        Strategy::SurelyBucket => {
            "RetryLayer, TokenBucket::default() (10 tokens, 0.1 per success), no owner marker"
        }
    }
}

/// The targets of issue 6. Returns the report, and whether the simulator itself is sane (the
/// naive sanity check; a missed `surely-default` target is a finding, not a simulator failure).
fn checks(cells: &[Cell]) -> (String, bool) {
    let mut out = String::new();
    let mut sane = true;
    fn line(out: &mut String, ok: bool, text: String) {
        let _ = writeln!(out, "{} {text}", if ok { "ok    " } else { "MISSED" });
    }
    match find(cells, Strategy::Naive, 5, Failure::Always) {
        Some(c) => {
            let ok = c.bottom_calls == 243 * c.calls;
            sane &= ok;
            line(
                &mut out,
                ok,
                format!(
                    "sanity: naive, N=5, failure 1.0: amplification {:.4} (3^5 = 243 expected)",
                    c.amplification()
                ),
            );
        }
        None => sane = false,
    }
    if let Some(c) = find(cells, Strategy::SurelyDefault, 5, Failure::Always) {
        line(
            &mut out,
            c.amplification() <= 1.10,
            format!(
                "target: surely-default, N=5, failure 1.0: amplification {:.4} <= 1.10",
                c.amplification()
            ),
        );
    }
    if let Some(c) = find(cells, Strategy::SurelyDefault, 5, Failure::OnePercent) {
        line(
            &mut out,
            c.success_rate() >= 0.99,
            format!(
                "target: surely-default, N=5, failure 0.01: success rate {:.4} >= 0.99",
                c.success_rate()
            ),
        );
    }
    (out, sane)
}

fn svg(
    cells: &[Cell],
    strategies: &[Strategy],
    path: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let root = SVGBackend::new(path, (1500, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Retry amplification: bottom-service calls per top-level call",
        ("sans-serif", 22),
    )?;
    let panels = root.split_evenly((1, Failure::ALL.len()));
    let colors = [RED, BLUE, GREEN, MAGENTA, BLACK, CYAN];
    for (panel, failure) in panels.iter().zip(Failure::ALL) {
        let caption = match failure {
            Failure::Always => "failure 1.0".to_owned(),
            Failure::OnePercent => "failure 0.01".to_owned(),
            Failure::Overload => format!("overload ({}x capacity)", sim::OVERLOAD_FACTOR),
        };
        let top = cells
            .iter()
            .filter(|c| c.failure == failure && strategies.contains(&c.strategy))
            .map(Cell::amplification)
            .fold(1.0_f64, f64::max);
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(1f64..MAX_LAYERS as f64, (0.98f64..top * 1.25).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("layers (N)")
            .y_desc("amplification (log)")
            .x_labels(MAX_LAYERS)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.2}"))
            .draw()?;
        for (&strategy, color) in strategies.iter().zip(colors) {
            let points: Vec<(f64, f64)> = (1..=MAX_LAYERS)
                .filter_map(|n| {
                    find(cells, strategy, n, failure).map(|c| (n as f64, c.amplification()))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(strategy.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
