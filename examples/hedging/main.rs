//! Hedging against a slow tail, measured: a server whose latency is 10 ms for 98% of attempts
//! and 200 ms for 2%, called without hedging, with tower's `Hedge`, and with surely's
//! `HedgeLayer`, on paused tokio time (a deterministic simulation: the times are simulated, the
//! run takes a second or two).
//!
//! ```text
//! cargo run --example hedging [-- [--csv] [--svg PATH] [calls] [seed]]
//! ```
//!
//! `--csv` prints the summary rows as CSV (the target line goes to stderr); `--svg PATH` also
//! writes a plot of each configuration's p50, p99 and p99.9.
//!
//! The target for surely's hedge: p99 at most 3 × p50, with at most 5% extra load.

mod sim;

const USAGE: &str = "\
usage: hedging [--csv] [--svg PATH] [calls (default 20000, at least 100)] [seed (default 7)]

  --csv        print `hedging,p50_ms,p99_ms,p999_ms,p99_over_p50,extra_load` rows instead of a table
  --svg PATH   also write a plot of the latency percentiles per configuration to PATH";

/// The positional argument at `i` as a number, its default if absent, or a usage error.
fn arg<T: std::str::FromStr>(args: &[String], i: usize, name: &str, default: T) -> T {
    match args.get(i) {
        None => default,
        Some(a) => a.parse().unwrap_or_else(|_| {
            eprintln!("hedging: {name} must be a number, not {a:?}\n{USAGE}");
            std::process::exit(2);
        }),
    }
}

/// The three configurations of a report, with their names.
fn rows(report: &sim::Report) -> [(&'static str, sim::Stats); 3] {
    [
        ("none", report.none),
        ("tower Hedge", report.tower),
        ("surely hedge", report.surely),
    ]
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The summary rows, with a header.
fn csv(report: &sim::Report) -> String {
    let mut out = String::from("hedging,p50_ms,p99_ms,p999_ms,p99_over_p50,extra_load\n");
    for (name, s) in rows(report) {
        out += &format!(
            "{name},{:.3},{:.3},{:.3},{:.4},{:.6}\n",
            ms(s.p50),
            ms(s.p99),
            ms(s.p999),
            s.p99.as_secs_f64() / s.p50.as_secs_f64(),
            s.extra_load
        );
    }
    out
}

/// A small plot: latency (log scale) at p50, p99 and p99.9, one line per configuration.
fn svg(report: &sim::Report, path: &str) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let root = SVGBackend::new(path, (640, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = rows(report)
        .iter()
        .map(|(_, s)| ms(s.p999))
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Hedging against a slow tail ({} calls)", report.calls),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(-0.2f64..2.2, (5.0f64..top * 1.5).log_scale())?;
    let names = ["p50", "p99", "p99.9"];
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms, log)")
        .x_labels(3)
        .x_label_formatter(&|x| {
            let i = x.round();
            match names.get(i as usize) {
                Some(name) if (x - i).abs() < 0.01 => (*name).to_owned(),
                _ => String::new(),
            }
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    for ((name, s), color) in rows(report).into_iter().zip([RED, BLUE, GREEN]) {
        let points: Vec<(f64, f64)> = [s.p50, s.p99, s.p999]
            .into_iter()
            .enumerate()
            .map(|(i, d)| (i as f64, ms(d)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
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
    root.present()?;
    Ok(())
}

fn main() {
    let mut csv_out = false;
    let mut svg_path = None;
    let mut args = Vec::new();
    let mut all = std::env::args().skip(1);
    while let Some(a) = all.next() {
        match a.as_str() {
            "--csv" => csv_out = true,
            "--svg" => match all.next() {
                Some(path) => svg_path = Some(path),
                None => {
                    eprintln!("hedging: --svg needs a path\n{USAGE}");
                    std::process::exit(2);
                }
            },
            _ => args.push(a),
        }
    }
    if args.len() > 2 || args.iter().any(|a| a == "-h" || a == "--help") {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let calls: usize = arg(&args, 0, "calls", 20_000);
    let seed: u64 = arg(&args, 1, "seed", 7);
    if calls < 100 {
        eprintln!("hedging: calls must be at least 100 for percentiles to mean anything\n{USAGE}");
        std::process::exit(2);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let report = rt.block_on(sim::run(calls, seed));
    if csv_out {
        print!("{}", csv(&report));
    } else {
        print!("{report}");
    }
    if let Some(path) = &svg_path {
        if let Err(e) = svg(&report, path) {
            eprintln!("hedging: cannot write the plot to {path}: {e}");
            std::process::exit(1);
        }
        if !csv_out {
            println!("plot written to {path}");
        }
    }
    let s = report.surely;
    let met = s.p99 <= s.p50 * 3 && s.extra_load <= 0.05;
    let target = format!(
        "target (surely: p99 ≤ 3 × p50, extra load ≤ 5%): {}",
        if met { "met" } else { "MISSED" }
    );
    // With --csv, stdout is exactly the CSV.
    if csv_out {
        eprintln!("{target}");
    } else {
        println!("{target}");
    }
}
