//! Hedging against a slow tail, measured: a server whose latency is 10 ms for 98% of attempts
//! and 200 ms for 2%, called without hedging, with tower's `Hedge`, and with surely's
//! `HedgeLayer`, on paused tokio time (a deterministic simulation: the times are simulated, the
//! run takes a second or two).
//!
//! ```text
//! cargo run --example hedging [calls] [seed]
//! ```
//!
//! The target for surely's hedge: p99 at most 3 × p50, with at most 5% extra load.

mod sim;

const USAGE: &str = "usage: hedging [calls (default 20000, at least 100)] [seed (default 7)]";

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
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
    print!("{report}");
    let s = report.surely;
    let met = s.p99 <= s.p50 * 3 && s.extra_load <= 0.05;
    println!(
        "target (surely: p99 ≤ 3 × p50, extra load ≤ 5%): {}",
        if met { "met" } else { "MISSED" }
    );
}
