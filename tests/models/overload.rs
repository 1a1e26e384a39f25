//! The overload-and-recovery simulator (`cargo run --release --example overload`), on a
//! smaller downstream (4 workers, 100 requests a second) so that a debug build runs it
//! quickly: the same simulation core, the same scenarios and durations. A run is deterministic
//! (paused time, seeded draws), so its summaries can be asserted; nothing here reads the wall
//! clock.

// Both simulators load `examples/support/splitmix.rs` as a module of their own, as their
// examples do: two copies of one small file in this binary.
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../../examples/overload/sim.rs"]
mod sim;

use std::collections::HashMap;

use sim::{Params, Run, Scenario, Strategy, Summary};

/// The example's model, with 4 workers instead of 16.
fn params() -> Params {
    Params {
        workers: 4,
        ..Params::default()
    }
}

/// Runs the pairs on one thread each (each run is deterministic on its own).
fn runs(pairs: &[(Strategy, Scenario)], params: &Params) -> HashMap<(Strategy, Scenario), Run> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = pairs
            .iter()
            .map(|&(st, sc)| scope.spawn(move || ((st, sc), sim::run(st, sc, params).unwrap())))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn summaries(pairs: &[(Strategy, Scenario)]) -> HashMap<(Strategy, Scenario), Summary> {
    runs(pairs, &params())
        .into_iter()
        .map(|(k, run)| (k, run.summary()))
        .collect()
}

#[test]
fn drop20_naive_retries_are_metastable_and_surely_recovers() {
    use Scenario::Drop20;
    let s = summaries(&[
        (Strategy::Naive, Drop20),
        (Strategy::TowerTps, Drop20),
        (Strategy::SurelyDefault, Drop20),
        (Strategy::SurelyNoDeadline, Drop20),
        (Strategy::SurelyNoBreaker, Drop20),
    ]);
    // The model is honest: naive retries keep the downstream down after capacity returns.
    let naive = &s[&(Strategy::Naive, Drop20)];
    assert!(!naive.recovered(), "{naive:?}");
    assert!(naive.amplification_peak > 2.5, "{naive:?}");
    assert!(naive.retry_share > 1.0, "{naive:?}");
    // A 20% budget at 90% load is itself more than the capacity: tower-tps stays down too.
    let tps = &s[&(Strategy::TowerTps, Drop20)];
    assert!(!tps.recovered(), "{tps:?}");

    // surely's defaults: the issue's targets.
    let default = &s[&(Strategy::SurelyDefault, Drop20)];
    let goodput = default.goodput_share.unwrap();
    assert!(goodput >= 0.9, "goodput during the drop {goodput}");
    assert!(
        default.recovery_s.is_some_and(|r| r <= 5),
        "recovery {:?}",
        default.recovery_s
    );
    assert!(default.retry_share <= 0.10, "{default:?}");

    // Without the deadline on the wire the downstream serves callers who left: less goodput,
    // and ten times the waste.
    let no_deadline = &s[&(Strategy::SurelyNoDeadline, Drop20)];
    assert!(
        no_deadline.goodput_share.unwrap() < goodput - 0.1,
        "{no_deadline:?}"
    );
    assert!(
        no_deadline.wasted_share > 10.0 * default.wasted_share,
        "{no_deadline:?}"
    );
    // Without the breaker, the same as the defaults here (the breaker did not open).
    let no_breaker = &s[&(Strategy::SurelyNoBreaker, Drop20)];
    assert!(no_breaker.goodput_share.unwrap() >= 0.9, "{no_breaker:?}");
    assert!(no_breaker.recovery_s.is_some_and(|r| r <= 5));
}

#[test]
fn outage_brings_no_flood_at_recovery() {
    use Scenario::Outage;
    let s = summaries(&[
        (Strategy::Naive, Outage),
        (Strategy::SurelyDefault, Outage),
        (Strategy::SurelyNoBreaker, Outage),
    ]);
    let naive = &s[&(Strategy::Naive, Outage)];
    assert!(naive.amplification_peak > 2.9, "{naive:?}");
    // The budget bounds the retries of an outage; no synchronized wave after it.
    let no_breaker = &s[&(Strategy::SurelyNoBreaker, Outage)];
    assert!(
        no_breaker.recovery_s.is_some_and(|r| r <= 5),
        "{no_breaker:?}"
    );
    assert!(no_breaker.spike_after_recovery <= 1.2, "{no_breaker:?}");
    assert!(no_breaker.retry_share <= 0.10, "{no_breaker:?}");
    let default = &s[&(Strategy::SurelyDefault, Outage)];
    assert!(default.spike_after_recovery <= 1.2, "{default:?}");
    assert!(default.retry_share <= 0.10, "{default:?}");
}

/// The issue's targets with the breaker on, at the example's scale (16 workers): back within
/// 5 s of every trigger, `drop20`'s goodput and retries, and no flood after the outage. The
/// breaker got here by counting neither a timeout of an attempt given too little budget nor a
/// refusal for a spent deadline: before, a half-open probe that woke with almost no budget
/// failed and reopened the breaker for good.
#[test]
fn surely_default_meets_the_targets_at_the_examples_scale() {
    let params = Params::default();
    let pairs = [
        (Strategy::SurelyDefault, Scenario::Drop20),
        (Strategy::SurelyDefault, Scenario::Ramp),
        (Strategy::SurelyDefault, Scenario::Outage),
        (Strategy::Naive, Scenario::Drop20),
    ];
    let runs = runs(&pairs, &params);
    for (key, run) in &runs {
        let summary = run.summary();
        if key.0 == Strategy::Naive {
            assert!(!summary.recovered(), "{key:?}: {summary:?}");
            continue;
        }
        assert!(
            summary.recovery_s.is_some_and(|r| r <= 5),
            "{key:?}: {summary:?}"
        );
        match key.1 {
            Scenario::Drop20 => {
                assert!(summary.goodput_share.unwrap() >= 0.9, "{summary:?}");
                assert!(summary.retry_share <= 0.10, "{summary:?}");
            }
            Scenario::Outage => assert!(summary.spike_after_recovery <= 1.2, "{summary:?}"),
            Scenario::Ramp | Scenario::Surge2x | Scenario::Slowdown => {}
        }
    }
}

#[test]
fn a_run_is_deterministic_and_the_csv_has_the_issue_header() {
    let a = sim::run(Strategy::SurelyDefault, Scenario::Outage, &params()).unwrap();
    let b = sim::run(Strategy::SurelyDefault, Scenario::Outage, &params()).unwrap();
    assert_eq!(a, b);
    let csv = sim::csv(&[a.summary()]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "strategy,scenario,amplification_peak,goodput_share,recovery_s,recovered,spike_after_recovery,retry_share,accepted_p99_ratio"
    );
    assert_eq!(lines.len(), 2);
    let fields: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(fields.len(), 9, "{}", lines[1]);
    assert_eq!(&fields[..2], ["surely-default", "outage"]);
    // No capacity during an outage: no goodput share. A run that did not recover has no
    // recovery time.
    assert_eq!(fields[3], "");
    assert_eq!(fields[5] == "true", !fields[4].is_empty());
    // The series has one line per second, and the steady state is the offered load.
    assert!(a.buckets.len() >= a.end());
    let steady = a.steady_load();
    assert!((80.0..100.0).contains(&steady), "{steady}");
}

/// Issue 27's targets, at the example's scale (16 workers): offered twice the capacity for
/// 30 s, the server's adaptive limit keeps the goodput at capacity and the latency of the work
/// it accepts within twice the steady state, and the system is back within 2 s. Without the
/// limit the same clients keep the goodput (the deadline on the wire lets the server drop work
/// nobody waits for) but accepted work waits for the whole budget; without retries' care
/// (`none`) the system collapses and does not come back.
#[test]
fn surge2x_the_server_limit_keeps_goodput_and_latency() {
    let params = Params::default();
    let pairs = [
        (Strategy::SurelyLimit, Scenario::Surge2x),
        (Strategy::SurelyDefault, Scenario::Surge2x),
        (Strategy::None, Scenario::Surge2x),
        (Strategy::SurelyLimit, Scenario::Slowdown),
    ];
    let runs = runs(&pairs, &params);
    let s = |st, sc| runs[&(st, sc)].summary();

    let limit = s(Strategy::SurelyLimit, Scenario::Surge2x);
    assert!(limit.goodput_share.unwrap() >= 0.95, "{limit:?}");
    assert!(limit.accepted_p99_ratio.unwrap() <= 2.0, "{limit:?}");
    assert!(limit.recovery_s.is_some_and(|r| r <= 2), "{limit:?}");
    assert_eq!(limit.wasted_share, 0.0, "{limit:?}");

    let without = s(Strategy::SurelyDefault, Scenario::Surge2x);
    assert!(without.accepted_p99_ratio.unwrap() > 5.0, "{without:?}");
    let none = s(Strategy::None, Scenario::Surge2x);
    assert!(none.goodput_share.unwrap() < 0.5, "{none:?}");
    assert!(!none.recovered(), "{none:?}");

    // Capacity halved: the limit still turns it all into goodput.
    let slow = s(Strategy::SurelyLimit, Scenario::Slowdown);
    assert!(slow.goodput_share.unwrap() >= 0.95, "{slow:?}");
    assert!(slow.recovery_s.is_some_and(|r| r <= 2), "{slow:?}");
}

/// The same targets on the test's smaller downstream (4 workers), for this seed. (On 4
/// workers at 90 % load the queue is bursty enough that, for some seeds, the limit refuses
/// in a steady second long after the surge: see the overload chapter.)
#[test]
fn surge2x_the_server_limit_at_four_workers() {
    let s = summaries(&[(Strategy::SurelyLimit, Scenario::Surge2x)]);
    let limit = &s[&(Strategy::SurelyLimit, Scenario::Surge2x)];
    assert!(limit.goodput_share.unwrap() >= 0.95, "{limit:?}");
    assert!(limit.accepted_p99_ratio.unwrap() <= 2.0, "{limit:?}");
    assert!(limit.recovery_s.is_some_and(|r| r <= 2), "{limit:?}");
}
