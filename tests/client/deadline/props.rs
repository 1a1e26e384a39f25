//! Property tests for deadline arithmetic.

use std::io;
use std::time::Duration;

use http::Request;
use proptest::prelude::*;
use surely::deadline::{Deadline, SetDeadlineLayer};
use tokio::time::Instant;
use tower::{service_fn, Layer, Service, ServiceExt};

/// About 30 years, as the crate clamps to.
const THIRTY_YEARS: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// Offsets from a base instant, up to ten years, in nanoseconds.
fn offset() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0..=10_000u64).prop_map(Duration::from_millis),
        (0..=10 * 365 * 24 * 3600 * 1_000_000_000u64).prop_map(Duration::from_nanos),
    ]
}

/// Any duration at all, extremes included.
fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        Just(THIRTY_YEARS),
        Just(THIRTY_YEARS + Duration::from_nanos(1)),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0..1_000_000_000u32).prop_map(|(s, n)| Duration::new(s, n)),
    ]
}

proptest! {
    #[test]
    fn min_is_never_later_than_either(a in offset(), b in offset()) {
        let base = Instant::now();
        let (a, b) = (Deadline::at(base + a), Deadline::at(base + b));
        let m = a.min(b);
        prop_assert!(m <= a && m <= b);
        prop_assert!(m == a || m == b);
        prop_assert_eq!(m, b.min(a));
    }

    #[test]
    fn earliest_is_never_later_than_either(
        own in proptest::option::of(offset()),
        parent in proptest::option::of(offset()),
    ) {
        let base = Instant::now();
        let own = own.map(|o| Deadline::at(base + o));
        let parent = parent.map(|o| Deadline::at(base + o));
        let child = Deadline::earliest(own, parent);
        match (own, parent) {
            (None, None) => prop_assert_eq!(child, None),
            (Some(a), None) | (None, Some(a)) => prop_assert_eq!(child, Some(a)),
            (Some(a), Some(b)) => {
                let c = child.unwrap();
                // A child deadline is never later than its parent, nor than its own.
                prop_assert!(c <= a && c <= b);
                prop_assert!(c == a || c == b);
            }
        }
        prop_assert_eq!(child, Deadline::earliest(parent, own));
    }

    #[test]
    fn remaining_at_is_monotone_and_zero_once_passed(
        at in offset(),
        t1 in offset(),
        t2 in offset(),
        past in offset(),
    ) {
        let base = Instant::now();
        let d = Deadline::at(base + at);
        let (early, late) = if t1 <= t2 { (t1, t2) } else { (t2, t1) };
        let (r_early, r_late) = (d.remaining_at(base + early), d.remaining_at(base + late));
        prop_assert!(r_late <= r_early, "{r_late:?} > {r_early:?}");
        // Exactly what is left, before it passes.
        if early <= at {
            prop_assert_eq!(r_early, at - early);
        }
        prop_assert_eq!(d.remaining_at(d.instant()), Duration::ZERO);
        prop_assert_eq!(d.remaining_at(d.instant() + past), Duration::ZERO);
    }

    #[test]
    fn after_from_never_panics_and_clamps(budget in any_duration()) {
        let now = Instant::now();
        let d = Deadline::after_from(now, budget);
        prop_assert!(d.instant() >= now);
        prop_assert_eq!(d.remaining_at(now), budget.min(THIRTY_YEARS));
        let _ = Deadline::after(budget);
    }

    /// Through the layer: whatever the parent's budget and the layer's own timeout, the
    /// header says min(parent, own) less the reserve, or the call is refused.
    #[test]
    fn the_layer_writes_the_earlier_budget_less_the_reserve(
        parent_ms in 0..100_000u64,
        own_ms in 6..100_000u64,
        reserve_ms in 0..=5u64,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let written = rt.block_on(async {
            let inner = service_fn(|r: Request<()>| async move {
                let h = r.headers().get("x-request-timeout-ms").map(|v| v.to_str().unwrap().to_owned());
                Ok::<_, io::Error>(h)
            });
            let layer = SetDeadlineLayer::builder()
                .timeout(Duration::from_millis(own_ms))
                .reserve(Duration::from_millis(reserve_ms))
                .build()
                .unwrap();
            let mut svc = layer.layer(inner);
            let parent = Deadline::after(Duration::from_millis(parent_ms));
            surely::deadline::scope(parent, async {
                svc.ready().await.unwrap().call(Request::new(())).await
            })
            .await
        });
        let budget = parent_ms.min(own_ms);
        if budget <= reserve_ms {
            let err = written.unwrap_err();
            prop_assert!(err.deadline_exceeded().unwrap().is_refused());
        } else {
            let expected = (budget - reserve_ms).to_string();
            prop_assert_eq!(written.unwrap(), Some(expected));
        }
    }
}
