//! The backoff schedule through the public API: defaults, validation, each jitter's bounds,
//! determinism, and arithmetic that never panics however large the numbers.

use std::time::Duration;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use surely::retry::backoff::{Backoff, BackoffBuilder, Jitter};

use crate::support::time::ms;

fn take(backoff: &Backoff, n: usize) -> Vec<Duration> {
    backoff.iter().take(n).collect()
}

const ALL_JITTERS: [Jitter; 4] = [
    Jitter::None,
    Jitter::Full,
    Jitter::Equal,
    Jitter::Decorrelated,
];

// ---- defaults and shapes ------------------------------------------------------------------

#[test]
fn defaults() {
    let backoff = Backoff::exponential(ms(100)).build().unwrap();
    assert_eq!(backoff.base(), ms(100));
    // The documented defaults: each delay doubles, capped at 20 s.
    assert_eq!(backoff.multiplier(), 2.0);
    assert_eq!(backoff.cap(), Duration::from_secs(20));
    assert_eq!(backoff.jitter(), Jitter::Full);
    assert_eq!(Jitter::default(), Jitter::Full);
    assert_eq!(backoff.seed(), None);
}

#[test]
fn the_default_cap_is_never_below_the_base() {
    let backoff = Backoff::exponential(Duration::from_secs(60))
        .build()
        .unwrap();
    assert_eq!(backoff.cap(), Duration::from_secs(60));
    let backoff = backoff_none(Duration::from_secs(60), 2.0, None);
    assert!(take(&backoff, 5)
        .iter()
        .all(|d| *d == Duration::from_secs(60)));
}

fn backoff_none(base: Duration, multiplier: f64, cap: Option<Duration>) -> Backoff {
    let mut builder = Backoff::exponential(base)
        .multiplier(multiplier)
        .jitter(Jitter::None);
    if let Some(cap) = cap {
        builder = builder.cap(cap);
    }
    builder.build().unwrap()
}

#[test]
fn without_jitter_the_schedule_is_the_capped_exponential() {
    let backoff = backoff_none(ms(100), 2.0, Some(Duration::from_secs(1)));
    assert_eq!(
        take(&backoff, 7),
        [
            ms(100),
            ms(200),
            ms(400),
            ms(800),
            ms(1000),
            ms(1000),
            ms(1000)
        ]
    );

    let backoff = backoff_none(ms(100), 1.5, Some(ms(500)));
    assert_eq!(
        take(&backoff, 6),
        [
            ms(100),
            ms(150),
            ms(225),
            Duration::from_micros(337_500),
            ms(500),
            ms(500)
        ]
    );
}

#[test]
fn a_multiplier_of_one_is_constant() {
    let backoff = backoff_none(ms(250), 1.0, None);
    assert!(take(&backoff, 100).iter().all(|d| *d == ms(250)));
}

#[test]
fn constant_and_none() {
    let constant = Backoff::constant(ms(30));
    assert_eq!(constant.jitter(), Jitter::None);
    assert_eq!(constant.multiplier(), 1.0);
    assert_eq!((constant.base(), constant.cap()), (ms(30), ms(30)));
    assert!(take(&constant, 50).iter().all(|d| *d == ms(30)));

    let none = Backoff::none();
    assert!(take(&none, 50).iter().all(|d| d.is_zero()));
    assert!(take(&Backoff::constant(Duration::ZERO), 5)
        .iter()
        .all(|d| d.is_zero()));
}

#[test]
fn the_iterator_is_infinite_and_fused() {
    let backoff = Backoff::exponential(ms(1)).seed(1).build().unwrap();
    let mut delays = backoff.iter();
    assert_eq!(delays.size_hint(), (usize::MAX, None));
    assert_eq!(delays.by_ref().take(100_000).count(), 100_000);
    assert!(delays.next().is_some());
}

#[test]
fn a_backoff_reference_is_iterable() {
    let backoff = Backoff::constant(ms(5));
    let mut seen = 0;
    for delay in &backoff {
        assert_eq!(delay, ms(5));
        seen += 1;
        if seen == 3 {
            break;
        }
    }
    assert_eq!(seen, 3);
}

#[test]
fn debug_shows_the_configuration() {
    let backoff = Backoff::exponential(ms(100)).seed(9).build().unwrap();
    let debug = format!("{backoff:?}");
    assert!(debug.contains("base: 100ms"), "{debug}");
    assert!(debug.contains("jitter: Full"), "{debug}");
    assert!(debug.contains("seed: Some(9)"), "{debug}");
    let delays = format!("{:?}", backoff.iter());
    assert!(delays.starts_with("Delays"), "{delays}");
}

// ---- validation ---------------------------------------------------------------------------

fn build_err(builder: BackoffBuilder) -> (String, &'static str) {
    let err = builder.build().unwrap_err();
    (err.to_string(), err.setting())
}

#[test]
fn bad_configurations_are_errors_with_clear_messages() {
    assert_eq!(
        build_err(Backoff::exponential(Duration::ZERO)),
        (
            "invalid backoff base delay: must be greater than zero".to_owned(),
            "backoff base delay"
        )
    );
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(
            build_err(Backoff::exponential(ms(1)).multiplier(bad)),
            (
                "invalid backoff multiplier: must be a finite number".to_owned(),
                "backoff multiplier"
            ),
            "{bad}"
        );
    }
    for bad in [0.999, 0.0, -0.0, -2.0, f64::MIN, f64::MIN_POSITIVE] {
        assert_eq!(
            build_err(Backoff::exponential(ms(1)).multiplier(bad)),
            (
                "invalid backoff multiplier: must be at least 1.0".to_owned(),
                "backoff multiplier"
            ),
            "{bad}"
        );
    }
    assert_eq!(
        build_err(Backoff::exponential(ms(100)).cap(ms(99))),
        (
            "invalid backoff cap: must not be less than the base delay".to_owned(),
            "backoff cap"
        )
    );
    assert_eq!(
        build_err(Backoff::exponential(ms(100)).cap(Duration::ZERO)).1,
        "backoff cap"
    );
    // The edges are fine.
    Backoff::exponential(ms(100))
        .multiplier(1.0)
        .cap(ms(100))
        .build()
        .unwrap();
    Backoff::exponential(Duration::from_nanos(1))
        .multiplier(f64::MAX)
        .cap(Duration::MAX)
        .build()
        .unwrap();
}

// ---- determinism --------------------------------------------------------------------------

#[test]
fn a_seeded_backoff_replays_the_same_sequence_in_every_iterator() {
    for jitter in ALL_JITTERS {
        let backoff = Backoff::exponential(ms(10))
            .jitter(jitter)
            .seed(42)
            .build()
            .unwrap();
        let first = take(&backoff, 50);
        assert_eq!(first, take(&backoff, 50), "{jitter:?}");
        assert_eq!(first, take(&backoff.clone(), 50), "{jitter:?}");
        let again = Backoff::exponential(ms(10))
            .jitter(jitter)
            .seed(42)
            .build()
            .unwrap();
        assert_eq!(first, take(&again, 50), "{jitter:?}");
    }
}

#[test]
fn different_seeds_give_different_sequences() {
    let a = Backoff::exponential(ms(10)).seed(1).build().unwrap();
    let b = Backoff::exponential(ms(10)).seed(2).build().unwrap();
    assert_ne!(take(&a, 20), take(&b, 20));
}

#[test]
fn unseeded_iterators_draw_from_different_streams() {
    let backoff = Backoff::exponential(ms(10)).build().unwrap();
    let clone = backoff.clone();
    let sequences = [take(&backoff, 20), take(&backoff, 20), take(&clone, 20)];
    assert_ne!(sequences[0], sequences[1]);
    assert_ne!(sequences[0], sequences[2]);
    assert_ne!(sequences[1], sequences[2]);
    // And two unseeded backoffs differ from each other.
    let other = Backoff::exponential(ms(10)).build().unwrap();
    assert_ne!(take(&other, 20), sequences[0]);
}

#[test]
fn a_custom_rng_is_used_instead_of_the_seed() {
    let backoff = Backoff::exponential(ms(10)).seed(7).build().unwrap();
    let with = |seed| -> Vec<Duration> {
        backoff
            .iter_with_rng(StdRng::seed_from_u64(seed))
            .take(20)
            .collect()
    };
    assert_eq!(with(3), with(3));
    assert_ne!(with(3), with(4));
    assert_ne!(with(3), take(&backoff, 20));
}

// ---- jitter does what it says -------------------------------------------------------------

#[test]
fn full_jitter_spreads_over_the_whole_window() {
    let backoff = Backoff::exponential(Duration::from_secs(1))
        .multiplier(1.0)
        .seed(5)
        .build()
        .unwrap();
    let delays = take(&backoff, 2_000);
    let mean = delays.iter().sum::<Duration>() / 2_000;
    assert!(mean > ms(450) && mean < ms(550), "{mean:?}");
    assert!(delays.iter().any(|d| *d < ms(100)));
    assert!(delays.iter().any(|d| *d > ms(900)));
}

#[test]
fn equal_jitter_keeps_half() {
    let backoff = Backoff::exponential(Duration::from_secs(1))
        .multiplier(1.0)
        .jitter(Jitter::Equal)
        .seed(5)
        .build()
        .unwrap();
    let delays = take(&backoff, 2_000);
    assert!(delays.iter().all(|d| *d >= ms(500) && *d <= ms(1000)));
    let mean = delays.iter().sum::<Duration>() / 2_000;
    assert!(mean > ms(700) && mean < ms(800), "{mean:?}");
}

#[test]
fn decorrelated_jitter_starts_within_three_times_the_base_and_grows() {
    let backoff = Backoff::exponential(ms(100))
        .cap(Duration::from_secs(1000))
        .jitter(Jitter::Decorrelated)
        .seed(11)
        .build()
        .unwrap();
    for seed in 0..200 {
        let backoff = Backoff::exponential(ms(100))
            .jitter(Jitter::Decorrelated)
            .seed(seed)
            .build()
            .unwrap();
        let first = backoff.iter().next().unwrap();
        assert!(first >= ms(100) && first <= ms(300), "{first:?}");
    }
    let delays = take(&backoff, 40);
    assert!(delays.windows(2).all(|w| w[1] <= w[0] * 3));
    assert!(delays.iter().any(|d| *d > Duration::from_secs(10)));
}

// ---- no panics at the extremes ------------------------------------------------------------

#[test]
fn ten_thousand_steps_with_a_huge_multiplier_never_panic() {
    for jitter in ALL_JITTERS {
        for cap in [Duration::from_secs(30), Duration::MAX] {
            let backoff = Backoff::exponential(Duration::from_nanos(1))
                .multiplier(f64::MAX)
                .cap(cap)
                .jitter(jitter)
                .seed(3)
                .build()
                .unwrap();
            let mut last = Duration::ZERO;
            for delay in backoff.iter().take(10_000) {
                assert!(delay <= cap, "{jitter:?}");
                last = delay;
            }
            if jitter == Jitter::None {
                assert_eq!(last, cap);
            }
        }
    }
}

#[test]
fn the_largest_durations_never_panic() {
    for jitter in ALL_JITTERS {
        let backoff = Backoff::exponential(Duration::MAX)
            .jitter(jitter)
            .seed(3)
            .build()
            .unwrap();
        assert_eq!(backoff.cap(), Duration::MAX);
        for delay in backoff.iter().take(1_000) {
            match jitter {
                Jitter::None | Jitter::Decorrelated => assert_eq!(delay, Duration::MAX),
                _ => assert!(delay <= Duration::MAX),
            }
        }
    }
    assert!(take(&Backoff::constant(Duration::MAX), 10)
        .iter()
        .all(|d| *d == Duration::MAX));
}

// ---- properties ---------------------------------------------------------------------------

fn nanos(d: Duration) -> f64 {
    d.as_nanos() as f64
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        4 => (1u64..=60_000_000_000).prop_map(Duration::from_nanos),
        1 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        1 => Just(Duration::MAX),
        1 => Just(Duration::from_nanos(1)),
    ]
}

fn multiplier() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => 1.0f64..10.0,
        1 => 1.0f64..1e300,
        1 => Just(1.0),
        1 => Just(1.0 + f64::EPSILON),
        1 => Just(f64::MAX),
    ]
}

fn jitter() -> impl Strategy<Value = Jitter> {
    prop::sample::select(ALL_JITTERS.to_vec())
}

/// A valid configuration: base, multiplier, cap (at least base), jitter, seed.
fn config() -> impl Strategy<Value = (Duration, f64, Duration, Jitter, u64)> {
    (duration(), multiplier(), duration(), jitter(), any::<u64>()).prop_map(
        |(base, mult, other, jitter, seed)| {
            let (base, cap) = if other < base {
                (other, base)
            } else {
                (base, other)
            };
            (base, mult, cap, jitter, seed)
        },
    )
}

fn build(base: Duration, mult: f64, cap: Duration, jitter: Jitter, seed: u64) -> Backoff {
    Backoff::exponential(base)
        .multiplier(mult)
        .cap(cap)
        .jitter(jitter)
        .seed(seed)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_delay_is_within_its_jitters_bounds(
        (base, mult, cap, jitter, seed) in config(),
        steps in 1usize..200,
    ) {
        let backoff = build(base, mult, cap, jitter, seed);
        // The exponential schedule each jitter draws under is the one without jitter.
        let exps = take(&build(base, mult, cap, Jitter::None, seed), steps);
        let delays = take(&backoff, steps);
        let mut previous = base;
        for (n, (delay, exp)) in delays.iter().zip(&exps).enumerate() {
            let (delay, exp) = (*delay, *exp);
            prop_assert!(delay <= cap, "step {}: {:?} > cap {:?}", n, delay, cap);
            match jitter {
                Jitter::None => prop_assert_eq!(delay, exp),
                Jitter::Full => prop_assert!(delay <= exp, "step {}: {:?} > {:?}", n, delay, exp),
                Jitter::Equal => prop_assert!(
                    delay >= exp / 2 && delay <= exp,
                    "step {}: {:?} not in [{:?}/2, {:?}]", n, delay, exp, exp
                ),
                Jitter::Decorrelated => {
                    prop_assert!(delay >= base, "step {}: {:?} < base {:?}", n, delay, base);
                    prop_assert!(
                        delay <= previous.saturating_mul(3),
                        "step {}: {:?} > 3 * {:?}", n, delay, previous
                    );
                    previous = delay;
                }
                _ => unreachable!(),
            }
        }
    }

    #[test]
    fn without_jitter_the_schedule_is_min_cap_base_times_multiplier_to_the_n(
        (base, mult, cap, _jitter, seed) in config(),
        steps in 1usize..300,
    ) {
        let delays = take(&build(base, mult, cap, Jitter::None, seed), steps);
        if base.as_nanos() <= 1 << 53 {
            // Exactly representable: the first retry waits exactly the base.
            prop_assert_eq!(delays[0], base);
        }
        for (n, delay) in delays.iter().enumerate() {
            prop_assert!(*delay >= base && *delay <= cap);
            let expected = (nanos(base) * mult.powf(n as f64)).min(nanos(cap));
            let error = (nanos(*delay) - expected).abs();
            prop_assert!(
                error <= expected * 1e-9 + 1.0,
                "step {}: {:?}, expected {} ns", n, delay, expected
            );
        }
        // Non-decreasing, and once at the cap it stays there.
        prop_assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        if let Some(at) = delays.iter().position(|d| *d == cap) {
            prop_assert!(delays[at..].iter().all(|d| *d == cap));
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_sequence(
        (base, mult, cap, jitter, seed) in config(),
    ) {
        let a = build(base, mult, cap, jitter, seed);
        let b = build(base, mult, cap, jitter, seed);
        let first = take(&a, 64);
        prop_assert_eq!(&first, &take(&a, 64));
        prop_assert_eq!(&first, &take(&b, 64));
    }

    #[test]
    fn any_configuration_is_an_error_or_a_schedule_never_a_panic(
        base in prop_oneof![Just(Duration::ZERO), duration()],
        mult in prop_oneof![
            proptest::num::f64::ANY,
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            -1e9f64..1e9,
        ],
        cap in prop::option::of(prop_oneof![Just(Duration::ZERO), duration()]),
        jitter in jitter(),
        seed in prop::option::of(any::<u64>()),
    ) {
        let mut builder = Backoff::exponential(base).multiplier(mult).jitter(jitter);
        if let Some(cap) = cap {
            builder = builder.cap(cap);
        }
        if let Some(seed) = seed {
            builder = builder.seed(seed);
        }
        let valid = !base.is_zero()
            && mult.is_finite()
            && mult >= 1.0
            && cap.is_none_or(|cap| cap >= base);
        match builder.build() {
            Ok(backoff) => {
                prop_assert!(valid, "accepted {:?} {} {:?}", base, mult, cap);
                prop_assert_eq!(backoff.seed(), seed);
                let cap = backoff.cap();
                prop_assert!(cap >= base);
                for delay in backoff.iter().take(100) {
                    prop_assert!(delay <= cap);
                }
            }
            Err(err) => {
                prop_assert!(!valid, "rejected {:?} {} {:?}: {}", base, mult, cap, err);
                prop_assert!(err.setting().starts_with("backoff "));
            }
        }
    }
}
