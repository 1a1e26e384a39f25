//! Server pushback: `Retry-After` and `grpc-retry-pushback-ms`, parsed and carried by the
//! classification.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use proptest::prelude::*;
use surely::classify::{AttemptClass, Classification, DeliveryPhase};
use surely::headers::GRPC_RETRY_PUSHBACK_MS;
use surely::pushback::Pushback;
use surely::pushback::{parse_grpc_pushback, parse_retry_after};
use surely::Semantics;

use super::support::{self, imf_fixdate, SEMANTICS};

/// The longest wait a pushback header reads as: past every client's cap (`MAX_DURATION`).
const THIRTY_YEARS: Duration = Duration::from_secs(30 * 365 * 86_400);

/// Wed, 21 Oct 2015 07:28:00 GMT.
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_445_412_480)
}

fn retry_after(value: &'static str) -> Result<Duration, surely::pushback::InvalidRetryAfter> {
    parse_retry_after(&HeaderValue::from_static(value), now())
}

#[test]
fn retry_after_delay_seconds() {
    assert_eq!(retry_after("0"), Ok(Duration::ZERO));
    assert_eq!(retry_after("2"), Ok(Duration::from_secs(2)));
    assert_eq!(retry_after("120"), Ok(Duration::from_secs(120)));
    assert_eq!(retry_after("007"), Ok(Duration::from_secs(7)));
    // Absurd delays are thirty years rather than an error: still past every client's cap
    // (at most `MAX_DURATION`), so the retry layer stops rather than retry sooner.
    assert_eq!(retry_after("99999999999999999999999999"), Ok(THIRTY_YEARS));
}

#[test]
fn retry_after_http_date() {
    // The three formats RFC 9110 §5.6.7 makes recipients accept.
    assert_eq!(
        retry_after("Wed, 21 Oct 2015 07:29:00 GMT"),
        Ok(Duration::from_secs(60))
    );
    assert_eq!(
        retry_after("Wednesday, 21-Oct-15 07:29:00 GMT"),
        Ok(Duration::from_secs(60))
    );
    assert_eq!(
        retry_after("Wed Oct 21 07:29:00 2015"),
        Ok(Duration::from_secs(60))
    );
    // Now, and in the past: no wait at all.
    assert_eq!(
        retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
        Ok(Duration::ZERO)
    );
    assert_eq!(
        retry_after("Thu, 01 Jan 1970 00:00:00 GMT"),
        Ok(Duration::ZERO)
    );
}

#[test]
fn retry_after_garbage_is_an_error() {
    for value in [
        "",
        "soon",
        "-1",
        "+5",
        "1.5",
        "5s",
        "0x10",
        "Wed, 21 Oct 2015 25:29:00 GMT",
        "Thu, 21 Oct 2015 07:29:00 GMT", // wrong weekday
        "21 Oct 2015",
    ] {
        let err = retry_after(value).expect_err(value);
        assert_eq!(
            err.to_string(),
            "invalid retry-after: expected delay-seconds or an HTTP-date"
        );
    }
    // Not even UTF-8.
    let opaque = HeaderValue::from_bytes(b"\xff\xfe").unwrap();
    assert!(parse_retry_after(&opaque, now()).is_err());
}

#[test]
fn grpc_pushback_valid_negative_garbage() {
    let parse = |v: &'static str| parse_grpc_pushback(&HeaderValue::from_static(v));
    assert_eq!(parse("0"), Pushback::After(Duration::ZERO));
    assert_eq!(parse("250"), Pushback::After(Duration::from_millis(250)));
    assert_eq!(
        parse("99999999999999999999999"),
        Pushback::After(THIRTY_YEARS)
    );
    for stop in ["-1", "-250", "", "abc", "1.5", "250ms", " 1"] {
        assert_eq!(parse(stop), Pushback::Stop, "{stop:?}");
    }
    assert_eq!(GRPC_RETRY_PUSHBACK_MS.as_str(), "grpc-retry-pushback-ms");
}

#[test]
fn a_503_with_retry_after_carries_the_delay() {
    for semantics in SEMANTICS {
        let req = support::http_request(semantics);
        let c = support::classify_head(&req, &support::response(503, &[("retry-after", "2")]));
        assert_eq!(c.class(), AttemptClass::Rejected);
        assert_eq!(c.pushback(), Some(Pushback::After(Duration::from_secs(2))));
        assert!(c.is_retryable(semantics));
    }
}

#[test]
fn pushback_on_other_rejections_and_conflicts() {
    let req = support::http_request(Semantics::Keyed);
    let c = support::classify_head(&req, &support::response(429, &[("retry-after", "7")]));
    assert_eq!(c.pushback(), Some(Pushback::After(Duration::from_secs(7))));
    let c = support::classify_head(&req, &support::response(409, &[("retry-after", "1")]));
    assert_eq!(c.class(), AttemptClass::Rejected);
    assert_eq!(c.pushback(), Some(Pushback::After(Duration::from_secs(1))));
    // A date in the past (by the system clock): come back now.
    let c = support::classify_head(
        &req,
        &support::response(503, &[("retry-after", "Thu, 01 Jan 1970 00:00:00 GMT")]),
    );
    assert_eq!(c.pushback(), Some(Pushback::After(Duration::ZERO)));
    // A date far ahead: some positive wait.
    let c = support::classify_head(
        &req,
        &support::response(503, &[("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT")]),
    );
    assert!(matches!(c.pushback(), Some(Pushback::After(d)) if d > Duration::from_secs(3600)));
}

#[test]
fn a_malformed_retry_after_counts_as_absent() {
    let req = support::http_request(Semantics::NonIdempotent);
    for bad in ["soon", "-1", " 5", "1.5", ""] {
        // A 503 with a Retry-After that does not parse is a 503 without one: maybe committed.
        let c = support::classify_head(&req, &support::response(503, &[("retry-after", bad)]));
        assert_eq!(c.class(), AttemptClass::MaybeCommitted, "{bad:?}");
        assert_eq!(c.pushback(), None, "{bad:?}");
    }
    // And it does not make a keyed request's 409 an in-flight one.
    let keyed = support::http_request(Semantics::Keyed);
    let c = support::classify_head(&keyed, &support::response(409, &[("retry-after", "soon")]));
    assert_eq!(c.class(), AttemptClass::Conflict);
}

#[test]
fn a_success_carries_no_pushback() {
    for semantics in SEMANTICS {
        let req = support::http_request(semantics);
        for pairs in [
            &[][..],
            &[("retry-after", "5")],
            &[("grpc-retry-pushback-ms", "-1")],
        ] {
            let c = support::classify_head(&req, &support::response(200, pairs));
            assert_eq!(c, Classification::success(), "{semantics:?} {pairs:?}");
        }
        let grpc = support::grpc_request(semantics);
        let c = support::classify_head(
            &grpc,
            &support::response(
                200,
                &[("grpc-status", "0"), ("grpc-retry-pushback-ms", "10")],
            ),
        );
        assert_eq!(c, Classification::success());
    }
}

#[test]
fn stop_forbids_a_retry_whatever_the_class() {
    for class in [AttemptClass::Rejected, AttemptClass::MaybeCommitted] {
        let c = Classification::new(class, DeliveryPhase::Sent).with_pushback(Some(Pushback::Stop));
        for semantics in SEMANTICS {
            assert!(!c.is_retryable(semantics), "{class:?} {semantics:?}");
        }
        let after = c.with_pushback(Some(Pushback::After(Duration::from_millis(5))));
        assert!(after.is_retryable(Semantics::Keyed));
    }
}

#[test]
fn grpc_pushback_in_trailers_only_and_in_trailers() {
    for semantics in SEMANTICS {
        let req = support::grpc_request(semantics);

        let stop = support::classify_head(
            &req,
            &support::response(
                200,
                &[("grpc-status", "14"), ("grpc-retry-pushback-ms", "-1")],
            ),
        );
        assert_eq!(stop.class(), AttemptClass::Rejected);
        assert_eq!(stop.pushback(), Some(Pushback::Stop));
        assert!(!stop.is_retryable(semantics), "{semantics:?}");

        let after = support::classify_head(
            &req,
            &support::response(
                200,
                &[("grpc-status", "14"), ("grpc-retry-pushback-ms", "250")],
            ),
        );
        assert_eq!(
            after.pushback(),
            Some(Pushback::After(Duration::from_millis(250)))
        );
        assert!(after.is_retryable(semantics), "{semantics:?}");

        let trailers = support::headers(&[("grpc-status", "14"), ("grpc-retry-pushback-ms", "x")]);
        let c =
            support::classify_response(&req, &support::response(200, &[])).resolve(Some(&trailers));
        assert_eq!(c.class(), AttemptClass::MaybeCommitted);
        assert_eq!(c.pushback(), Some(Pushback::Stop));
        assert!(!c.is_retryable(semantics), "{semantics:?}");
    }
}

/// A plain HTTP response may carry the gRPC header too (a gRPC-aware proxy); it wins over
/// `Retry-After`.
#[test]
fn grpc_pushback_wins_over_retry_after() {
    let req = support::http_request(Semantics::Safe);
    let c = support::classify_head(
        &req,
        &support::response(
            503,
            &[("retry-after", "2"), ("grpc-retry-pushback-ms", "100")],
        ),
    );
    assert_eq!(
        c.pushback(),
        Some(Pushback::After(Duration::from_millis(100)))
    );
}

/// A gRPC response with a non-200 status comes from a proxy, which speaks HTTP: its
/// `Retry-After` is the only pushback there is, and a server's pushback replaces the computed
/// delay (`surely::docs::retries`, "Within limits"), so the classification must keep it.
#[test]
fn grpc_over_http_503_keeps_retry_after() {
    let req = support::grpc_request(Semantics::NonIdempotent);
    let c = support::classify_head(&req, &support::response(503, &[("retry-after", "2")]));
    assert_eq!(c.pushback(), Some(Pushback::After(Duration::from_secs(2))));
}

proptest! {
    #[test]
    fn retry_after_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64), now_secs in any::<u32>()) {
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            let _ = parse_retry_after(&value, UNIX_EPOCH + Duration::from_secs(now_secs.into()));
        }
    }

    #[test]
    fn grpc_pushback_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            let parsed = parse_grpc_pushback(&value);
            let digits = !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit);
            prop_assert_eq!(matches!(parsed, Pushback::After(_)), digits);
        }
    }

    #[test]
    fn classifying_any_header_values_never_panics(
        status in 100u16..1000,
        retry in prop::collection::vec(any::<u8>(), 0..40),
        push in prop::collection::vec(any::<u8>(), 0..40),
        grpc_status in prop::collection::vec(any::<u8>(), 0..6),
    ) {
        let mut res = http::Response::builder().status(status).body(()).unwrap();
        for (name, bytes) in [("retry-after", &retry), ("grpc-retry-pushback-ms", &push), ("grpc-status", &grpc_status)] {
            if let Ok(v) = HeaderValue::from_bytes(bytes) {
                res.headers_mut().insert(name, v);
            }
        }
        for semantics in SEMANTICS {
            let c = support::classify_head(&support::http_request(semantics), &res);
            prop_assert_eq!(c.phase(), DeliveryPhase::ResponseStarted);
            prop_assert_eq!(c.class() == AttemptClass::Success, status < 400);
            let _ = support::classify_response(&support::grpc_request(semantics), &res).resolve(Some(res.headers()));
        }
    }

    #[test]
    fn delay_seconds_round_trip(secs in any::<u64>()) {
        let value = HeaderValue::from_str(&secs.to_string()).unwrap();
        let expected = Duration::from_secs(secs).min(THIRTY_YEARS);
        prop_assert_eq!(parse_retry_after(&value, now()), Ok(expected));
    }

    #[test]
    fn grpc_millis_round_trip(ms in any::<u64>()) {
        let value = HeaderValue::from_str(&ms.to_string()).unwrap();
        let expected = Duration::from_millis(ms).min(THIRTY_YEARS);
        prop_assert_eq!(parse_grpc_pushback(&value), Pushback::After(expected));
    }

    #[test]
    fn http_date_is_relative_to_now(at in 0u64..=253_402_300_799, now_secs in 0u64..=253_402_300_799) {
        let value = HeaderValue::from_str(&imf_fixdate(at)).unwrap();
        let parsed = parse_retry_after(&value, UNIX_EPOCH + Duration::from_secs(now_secs));
        let expected = Duration::from_secs(at.saturating_sub(now_secs)).min(THIRTY_YEARS);
        prop_assert_eq!(parsed, Ok(expected));
    }
}

proptest! {
    /// Every pushback a classification is given reads back the same, to the nanosecond, up to
    /// about 584 years; a longer one reads back as that longest wait, never as a shorter one
    /// that a retry layer would honour, nor as no pushback or a stop.
    #[test]
    fn a_pushback_reads_back_as_it_was_given(secs in any::<u64>(), nanos in 0u32..1_000_000_000, pick in 0u8..3) {
        let pushback = match pick {
            0 => None,
            1 => Some(Pushback::Stop),
            _ => Some(Pushback::After(Duration::new(secs, nanos))),
        };
        let c = Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted)
            .with_pushback(pushback);
        let longest = Duration::from_nanos(u64::MAX - 2);
        match pushback {
            Some(Pushback::After(d)) if d > longest => {
                prop_assert_eq!(c.pushback(), Some(Pushback::After(longest)));
            }
            given => prop_assert_eq!(c.pushback(), given),
        }
        prop_assert_eq!(c.is_retryable(Semantics::Keyed), pushback != Some(Pushback::Stop));
        prop_assert_eq!(c.class(), AttemptClass::Rejected);
        prop_assert_eq!(c.phase(), DeliveryPhase::ResponseStarted);
    }
}

#[test]
fn a_classification_fits_in_two_registers() {
    // A classifier returns it on every attempt: at 16 bytes it comes back in registers.
    assert_eq!(std::mem::size_of::<Classification>(), 16);
    let c = Classification::new(AttemptClass::Rejected, DeliveryPhase::Sent)
        .with_pushback(Some(Pushback::After(Duration::from_millis(1500))))
        .for_spent_deadline();
    assert_eq!(
        format!("{c:?}"),
        "Classification { class: Rejected, phase: Sent, pushback: Some(After(1.5s)), deadline_refusal: true, overload_refusal: false, cause: None }"
    );
    let c =
        Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted).for_overload();
    assert!(c.is_overload_refusal() && !c.is_deadline_refusal() && !c.is_health_failure());
}

#[test]
fn every_class_phase_and_refusal_reads_back() {
    use AttemptClass::*;
    use DeliveryPhase::*;
    for class in [Success, Final, Conflict, Rejected, MaybeCommitted] {
        for phase in [NotSent, Sent, ResponseStarted] {
            for refusal in [false, true] {
                for pushback in [
                    None,
                    Some(Pushback::Stop),
                    Some(Pushback::After(Duration::MAX)),
                ] {
                    let mut c = Classification::new(class, phase).with_pushback(pushback);
                    if refusal {
                        c = c.for_spent_deadline();
                    }
                    let case = format!("{class:?} {phase:?} {refusal} {pushback:?}");
                    assert_eq!(c.class(), class, "{case}");
                    assert_eq!(c.phase(), phase, "{case}");
                    assert_eq!(c.is_deadline_refusal(), refusal, "{case}");
                    assert_eq!(
                        c.is_health_failure(),
                        class.is_health_failure() && !refusal,
                        "{case}"
                    );
                    assert_eq!(c.pushback().is_some(), pushback.is_some(), "{case}");
                }
            }
        }
    }
}

/// A header value of the shape `digits`, exactly as a number of `unit`s, or `None` past what a
/// `u128` holds.
fn exact(digits: &str, unit: Duration) -> Option<u128> {
    digits.parse::<u128>().ok()?.checked_mul(unit.as_nanos())
}

proptest! {
    /// Decimal numbers of any length, 26 digits and more included: the exact wait up to thirty
    /// years, thirty years past it, never a panic and never a shorter wait.
    #[test]
    fn any_decimal_is_its_wait_up_to_thirty_years(digits in "[0-9]{1,40}") {
        let value = HeaderValue::from_str(&digits).unwrap();
        for (parsed, unit) in [
            (parse_retry_after(&value, now()).unwrap(), Duration::from_secs(1)),
            (
                match parse_grpc_pushback(&value) {
                    Pushback::After(d) => d,
                    other => panic!("{digits}: digits are a wait, not {other:?}"),
                },
                Duration::from_millis(1),
            ),
        ] {
            match exact(&digits, unit) {
                Some(nanos) if nanos <= THIRTY_YEARS.as_nanos() => {
                    prop_assert_eq!(parsed.as_nanos(), nanos, "{}", digits);
                }
                _ => prop_assert_eq!(parsed, THIRTY_YEARS, "{}", digits),
            }
        }
    }
}

/// Which pushback header a generated value goes in.
#[derive(Clone, Copy, Debug)]
enum Carrier {
    RetryAfter,
    Grpc,
}

/// What a server may send as a pushback: any bytes, numbers up to 40 digits, HTTP-dates from
/// 1970 to 9999, negative numbers.
fn pushback_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..32),
        "[0-9]{1,40}".prop_map(String::into_bytes),
        (0u64..=253_402_300_799).prop_map(|at| imf_fixdate(at).into_bytes()),
        (0u64..=315_360_000).prop_map(|ahead| {
            let at = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs()
                + ahead;
            imf_fixdate(at).into_bytes()
        }),
        "-[0-9]{1,30}".prop_map(String::into_bytes),
    ]
}

proptest! {
    /// Any pushback through a real retry layer that obeys up to `MAX_DURATION` and has no
    /// deadline (under paused time): nothing panics, a retry never comes sooner than the server
    /// asked, and a wait past the cap (the thirty years of an absurd value among them) stops
    /// the call instead of being shortened.
    #[test]
    fn a_retry_layer_with_the_longest_cap_never_retries_sooner_than_asked(
        grpc in any::<bool>(),
        bytes in pushback_value(),
    ) {
        use std::sync::{Arc, Mutex};

        use surely::retry::backoff::Backoff;
        use surely::retry::RetryLayer;
        use surely::{OutcomeExt, StopReason};
        use tokio::time::Instant;
        use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

        let Ok(value) = HeaderValue::from_bytes(&bytes) else {
            return Ok(());
        };
        let carrier = if grpc { Carrier::Grpc } else { Carrier::RetryAfter };
        let first = match carrier {
            Carrier::RetryAfter => http::Response::builder()
                .status(503)
                .header(http::header::RETRY_AFTER, value.clone())
                .body(())
                .unwrap(),
            Carrier::Grpc => http::Response::builder()
                .header(http::header::CONTENT_TYPE, "application/grpc")
                .header("grpc-status", "14")
                .header(GRPC_RETRY_PUSHBACK_MS, value.clone())
                .body(())
                .unwrap(),
        };
        let request = match carrier {
            Carrier::RetryAfter => http::Request::get("/stock/sku-42").body(()).unwrap(),
            Carrier::Grpc => http::Request::post("/shop.Stock/Get")
                .header(http::header::CONTENT_TYPE, "application/grpc")
                .body(())
                .unwrap(),
        };
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let seen = attempts.clone();
        let transport = service_fn(move |_req: http::Request<()>| {
            let mut seen = seen.lock().unwrap();
            seen.push(Instant::now());
            let res = if seen.len() == 1 { first.clone() } else { http::Response::new(()) };
            async move { Ok::<_, std::io::Error>(res) }
        });
        let mut client = ServiceBuilder::new()
            .layer(
                RetryLayer::builder()
                    .backoff(Backoff::constant(Duration::from_millis(100)))
                    .max_pushback(surely::MAX_DURATION)
                    .max_attempts(2)
                    .no_budget()
                    .build()
                    .unwrap(),
            )
            .service(transport);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let res = rt.block_on(async { client.ready().await.unwrap().call(request).await.unwrap() });
        let stop = res.call_outcome().map(|o| o.stop_reason());
        // Read after the call: a date's wait is then at most the one the layer read.
        let asked = match carrier {
            Carrier::RetryAfter => parse_retry_after(&value, SystemTime::now()).ok().map(Pushback::After),
            Carrier::Grpc => Some(parse_grpc_pushback(&value)),
        };
        // What the header says, exactly, when it is a number (`None`: past a `u128` of
        // nanoseconds).
        let unit = match carrier {
            Carrier::RetryAfter => Duration::from_secs(1),
            Carrier::Grpc => Duration::from_millis(1),
        };
        let said = value
            .to_str()
            .ok()
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .map(|v| exact(v, unit));
        let attempts = attempts.lock().unwrap().clone();
        match (attempts.as_slice(), asked) {
            ([first, second], Some(Pushback::After(d))) => {
                let waited = *second - *first;
                prop_assert!(waited >= d, "waited {:?}, asked {:?}", waited, d);
                prop_assert!(d <= surely::MAX_DURATION);
                if let Some(said) = said {
                    prop_assert!(said.is_some_and(|n| waited.as_nanos() >= n), "waited {waited:?}, said {value:?}");
                }
            }
            ([_, _], None) => {}
            ([_, _], Some(Pushback::Stop)) => prop_assert!(false, "retried after a stop"),
            ([_], Some(Pushback::After(d))) => {
                // Only a wait past the cap stops it; a date's wait was read a little earlier.
                prop_assert!(d.saturating_add(Duration::from_secs(1)) > surely::MAX_DURATION, "asked {d:?}");
                prop_assert_eq!(stop, Some(StopReason::PushbackStop));
            }
            ([_], Some(Pushback::Stop)) => prop_assert_eq!(stop, Some(StopReason::PushbackStop)),
            (other, asked) => prop_assert!(false, "{} attempts, asked {asked:?}", other.len()),
        }
    }
}
