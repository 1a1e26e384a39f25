//! The retry-amplification simulator (`cargo run --release --example amplification`), on
//! reduced but representative runs: the same simulation core, fewer top-level calls. A run is
//! deterministic (paused time, seeded draws), so the counts it simulates can be asserted.

// Both simulators load `examples/support/splitmix.rs` as a module of their own, as their
// examples do: two copies of one small file in this binary.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../../examples/amplification/sim.rs"]
mod sim;

use sim::{run_cell, Cell, Failure, Params, Strategy};

/// `calls` top-level calls at the example's rate (400 a simulated second) and seed.
fn run(strategy: Strategy, layers: usize, failure: Failure, calls: u64) -> Cell {
    let params = Params {
        calls,
        ..Params::default()
    };
    run_cell(strategy, layers, failure, &params).expect("a current-thread runtime")
}

#[test]
fn naive_retries_multiply_by_three_per_layer() {
    for layers in 1..=5 {
        let cell = run(Strategy::Naive, layers, Failure::Always, 40);
        assert_eq!(
            cell.bottom_calls,
            3u64.pow(layers as u32) * 40,
            "3^{layers} bottom calls per top-level call"
        );
        assert_eq!(cell.successes, 0);
    }
    // The issue's sanity check.
    assert_eq!(
        run(Strategy::Naive, 5, Failure::Always, 40).amplification(),
        243.0
    );
}

#[test]
fn surely_default_keeps_99_percent_success_at_one_percent_failure() {
    let cell = run(Strategy::SurelyDefault, 5, Failure::OnePercent, 4000);
    assert!(
        cell.success_rate() >= 0.99,
        "success rate {}",
        cell.success_rate()
    );
    // The failures are retried at the top only: about 1% more bottom calls.
    assert!(
        cell.amplification() > 1.005 && cell.amplification() < 1.02,
        "amplification {}",
        cell.amplification()
    );
}

#[test]
fn surely_default_retries_once_per_chain_whatever_the_depth() {
    // 4000 calls at 400/s: 10 s, inside one budget window.
    let one = run(Strategy::SurelyDefault, 1, Failure::Always, 4000);
    let five = run(Strategy::SurelyDefault, 5, Failure::Always, 4000);
    assert_eq!(
        one.bottom_calls, five.bottom_calls,
        "the hops below the top leave retries to it"
    );
    // The top's budget: 10% of the 4000 first attempts (the reserve of 10/s over the 10 s
    // window, 100 retries, is a floor under it, not an addition). All of it is spent, no more.
    assert_eq!(five.bottom_calls, 4000 + 400);
    assert_eq!(five.successes, 0);
}

#[test]
fn surely_default_meets_the_full_failure_target() {
    let cell = run(Strategy::SurelyDefault, 5, Failure::Always, 4000);
    assert!(
        cell.amplification() <= 1.10,
        "amplification {}",
        cell.amplification()
    );
    // The reserve is a floor under the 10%, not an addition: the budget spends its 10%.
    assert!(cell.amplification() > 1.09, "and spends its 10%");
}

#[test]
fn without_the_owner_marker_retries_compound_with_depth() {
    let ratio_1 = run(Strategy::SurelyRatio, 1, Failure::Always, 2000);
    let ratio_5 = run(Strategy::SurelyRatio, 5, Failure::Always, 2000);
    let tps_5 = run(Strategy::TowerTps, 5, Failure::Always, 2000);
    let default_5 = run(Strategy::SurelyDefault, 5, Failure::Always, 2000);
    assert!(
        ratio_5.amplification() > ratio_1.amplification() * 1.4,
        "{} vs {}",
        ratio_5.amplification(),
        ratio_1.amplification()
    );
    assert!(
        tps_5.amplification() > ratio_5.amplification(),
        "tower's default budget allows 20%"
    );
    assert!(default_5.amplification() < ratio_5.amplification());
}

#[test]
fn a_token_bucket_stops_retrying_in_an_outage() {
    let short = run(Strategy::SurelyBucket, 5, Failure::Always, 1000);
    let long = run(Strategy::SurelyBucket, 5, Failure::Always, 2000);
    // A handful of retries per hop, until five failures more than successes have emptied half
    // of each hop's bucket; then none, however long the outage lasts.
    let extra = long.bottom_calls - long.calls;
    assert!(
        extra > 0 && extra <= 30,
        "{extra} retries reached the bottom"
    );
    assert_eq!(short.bottom_calls - short.calls, extra);
}

#[test]
fn under_overload_budgets_bound_the_extra_load() {
    let naive = run(Strategy::Naive, 3, Failure::Overload, 800);
    let default = run(Strategy::SurelyDefault, 3, Failure::Overload, 800);
    assert!(
        naive.amplification() > 10.0,
        "naive {}",
        naive.amplification()
    );
    assert!(
        default.amplification() < 1.4,
        "surely-default {}",
        default.amplification()
    );
    // The bottom serves 1/1.2 of the offered load, give or take its burst and the tail.
    assert!(
        (0.8..0.95).contains(&default.success_rate()),
        "{}",
        default.success_rate()
    );
}

#[test]
fn a_run_is_deterministic() {
    let a = run(Strategy::SurelyDefault, 3, Failure::Overload, 600);
    let b = run(Strategy::SurelyDefault, 3, Failure::Overload, 600);
    assert_eq!(a, b);
    let a = run(Strategy::SurelyRatio, 2, Failure::OnePercent, 600);
    let b = run(Strategy::SurelyRatio, 2, Failure::OnePercent, 600);
    assert_eq!(a, b);
}

#[test]
fn the_csv_has_the_issue_header_and_one_row_per_cell() {
    let cells = [
        run(Strategy::Naive, 2, Failure::Always, 10),
        run(Strategy::SurelyDefault, 1, Failure::OnePercent, 10),
        run(Strategy::SurelyBucket, 3, Failure::Overload, 10),
    ];
    let csv = sim::csv(&cells);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "strategy,layers,failure,amplification,success_rate"
    );
    assert_eq!(lines[1], "naive,2,1.0,9.0000,0.0000");
    assert!(
        lines[2].starts_with("surely-default,1,0.01,"),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].starts_with("surely-bucket,3,overload,"),
        "{}",
        lines[3]
    );
    assert_eq!(lines.len(), 4);
    for line in &lines[1..] {
        let fields: Vec<&str> = line.split(',').collect();
        assert_eq!(fields.len(), 5, "{line}");
        let amplification: f64 = fields[3].parse().unwrap();
        let success: f64 = fields[4].parse().unwrap();
        assert!(
            amplification >= 1.0 && (0.0..=1.0).contains(&success),
            "{line}"
        );
    }
}
