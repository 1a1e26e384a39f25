//! Property tests for the deadline header codecs.

use std::time::Duration;

use proptest::prelude::*;
use surely::deadline::codec::{
    encode_grpc_timeout, encode_millis, parse_grpc_timeout, parse_millis,
};

/// `grpc-timeout` units from finest to coarsest, with their length in nanoseconds.
const UNITS: [(u8, u128); 6] = [
    (b'n', 1),
    (b'u', 1_000),
    (b'm', 1_000_000),
    (b'S', 1_000_000_000),
    (b'M', 60_000_000_000),
    (b'H', 3_600_000_000_000),
];
const GRPC_MAX: u128 = 99_999_999;

/// Durations spread over every unit: nanoseconds up to ~584 years, plus anything at all.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0..=u64::MAX >> 20).prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_nanos),
        (any::<u64>(), 0..1_000_000_000u32).prop_map(|(secs, nanos)| Duration::new(secs, nanos)),
    ]
}

proptest! {
    #[test]
    fn grpc_round_trip_truncates_by_less_than_one_unit(d in duration()) {
        let encoded = encode_grpc_timeout(d);
        let (&unit, digits) = encoded.as_bytes().split_last().unwrap();
        prop_assert!((1..=8).contains(&digits.len()), "{encoded:?}");
        prop_assert!(digits.iter().all(u8::is_ascii_digit), "{encoded:?}");
        let position = UNITS.iter().position(|&(u, _)| u == unit).unwrap();
        let unit_nanos = UNITS[position].1;

        let decoded = parse_grpc_timeout(encoded.as_bytes()).unwrap();
        prop_assert!(decoded <= d);
        if d.as_nanos() / unit_nanos > GRPC_MAX {
            // Clamped: only possible in the coarsest unit.
            prop_assert_eq!(&encoded, "99999999H");
        } else {
            prop_assert!((d - decoded).as_nanos() < unit_nanos, "{d:?} -> {encoded:?}");
        }
        // The finest unit that fits: the next finer one would not.
        if let Some(&(_, finer_nanos)) = position.checked_sub(1).and_then(|i| UNITS.get(i)) {
            prop_assert!(d.as_nanos() / finer_nanos > GRPC_MAX, "{d:?} -> {encoded:?}");
        }
    }

    #[test]
    fn millis_round_trip_is_exact_for_whole_millis(
        millis in 0..1_000_000_000_000_000_000u64,
        sub_milli_nanos in 0..1_000_000u32,
    ) {
        let whole = Duration::from_millis(millis);
        prop_assert_eq!(parse_millis(encode_millis(whole).as_bytes()), Ok(whole));
        let truncated = whole + Duration::from_nanos(sub_milli_nanos.into());
        prop_assert_eq!(parse_millis(encode_millis(truncated).as_bytes()), Ok(whole));
    }

    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..20)) {
        let _ = parse_grpc_timeout(&bytes);
        let _ = parse_millis(&bytes);
    }

    #[test]
    fn any_valid_grpc_timeout_parses(value in "[0-9]{1,8}[HMSmun]") {
        let (digits, unit) = value.split_at(value.len() - 1);
        let unit_nanos = UNITS.iter().find(|&&(u, _)| u == unit.as_bytes()[0]).unwrap().1;
        let expected = digits.parse::<u128>().unwrap() * unit_nanos;
        prop_assert_eq!(parse_grpc_timeout(value.as_bytes()).unwrap().as_nanos(), expected);
    }

    #[test]
    fn any_valid_millis_parses(value in "[0-9]{1,18}") {
        let expected = Duration::from_millis(value.parse().unwrap());
        prop_assert_eq!(parse_millis(value.as_bytes()), Ok(expected));
    }
}

proptest! {
    /// Decimal numbers of any length, 26 digits and more included: within the format's digits,
    /// the exact budget; past them, an error that says so. Never a panic.
    #[test]
    fn any_decimal_is_its_budget_or_too_long(digits in "[0-9]{1,40}", unit in "[HMSmun]") {
        match parse_millis(digits.as_bytes()) {
            Ok(d) => {
                prop_assert!(digits.len() <= 18);
                prop_assert_eq!(d.as_millis(), digits.parse::<u128>().unwrap());
            }
            Err(e) => prop_assert!(digits.len() > 18 && e.is_too_long(), "{digits}: {e}"),
        }
        let value = format!("{digits}{unit}");
        let unit_nanos = UNITS.iter().find(|&&(u, _)| u == unit.as_bytes()[0]).unwrap().1;
        match parse_grpc_timeout(value.as_bytes()) {
            Ok(d) => {
                prop_assert!(digits.len() <= 8);
                prop_assert_eq!(d.as_nanos(), digits.parse::<u128>().unwrap() * unit_nanos);
            }
            Err(e) => prop_assert!(digits.len() > 8 && e.is_too_long(), "{value}: {e}"),
        }
    }

    /// Any deadline header (any bytes, numbers of any length, `grpc-timeout`s) on a request that
    /// a real retry layer retries, with the longest pushback cap and no deadline: the layer reads
    /// it again for the retry, never panics, and with no deadline of its own leaves it as sent.
    #[test]
    fn a_retry_layer_reads_any_deadline_header(
        grpc in any::<bool>(),
        bytes in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..32),
            "[0-9]{1,40}".prop_map(String::into_bytes),
            ("[0-9]{1,40}", "[HMSmun]").prop_map(|(d, u)| format!("{d}{u}").into_bytes()),
        ],
    ) {
        use std::sync::{Arc, Mutex};

        use http::{HeaderValue, Request, Response};
        use surely::retry::backoff::Backoff;
        use surely::retry::RetryLayer;
        use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

        let Ok(value) = HeaderValue::from_bytes(&bytes) else {
            return Ok(());
        };
        let name = if grpc { "grpc-timeout" } else { "x-request-timeout-ms" };
        let mut request = Request::post("/orders").body(()).unwrap();
        if grpc {
            request.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
        }
        request.headers_mut().insert(name, value.clone());
        // Refused before processing the first time (retried whatever the method), then served.
        let first = if grpc {
            Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "14")
                .header("grpc-retry-pushback-ms", "5")
                .body(())
                .unwrap()
        } else {
            Response::builder()
                .status(503)
                .header("surely-not-processed", "overload")
                .header("retry-after", "1")
                .body(())
                .unwrap()
        };
        let sent = Arc::new(Mutex::new(Vec::new()));
        let seen = sent.clone();
        let transport = service_fn(move |req: Request<()>| {
            let mut seen = seen.lock().unwrap();
            seen.push(req.headers().get(name).cloned());
            let res = if seen.len() == 1 { first.clone() } else { Response::new(()) };
            async move { Ok::<_, std::io::Error>(res) }
        });
        let mut client = ServiceBuilder::new()
            .layer(
                RetryLayer::builder()
                    .backoff(Backoff::none())
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
        rt.block_on(async { client.ready().await.unwrap().call(request).await.unwrap() });
        let sent = sent.lock().unwrap().clone();
        prop_assert_eq!(sent, vec![Some(value.clone()), Some(value)]);
    }
}
