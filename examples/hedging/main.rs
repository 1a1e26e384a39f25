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

fn main() {
    let mut args = std::env::args().skip(1);
    let calls = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let seed = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
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
