//! The pushback rule (`surely::docs::retries`, "Within limits"), fuzzed: 10 000 generated
//! `Retry-After` and `grpc-retry-pushback-ms` values (delay-seconds small and absurd,
//! HTTP-dates past and future, garbage, negative and huge gRPC values), each answered to a call
//! through a deadline and a retry layer with a cap. Whatever the value: no retry before the
//! delay the server asked for, no wait longer than the cap or past the deadline, and a value
//! that does not parse counts as absent (`Retry-After`) or as "do not retry"
//! (`grpc-retry-pushback-ms`, as gRPC specifies).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::{HeaderValue, Request, Response};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use surely::deadline::SetDeadlineLayer;
use surely::pushback::Pushback;
use surely::pushback::{parse_grpc_pushback, parse_retry_after};
use surely::retry::backoff::Backoff;
use surely::retry::RetryLayer;
use surely::{OutcomeExt, StopReason};
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

/// The backoff when the server asks for nothing.
const BACKOFF: Duration = Duration::from_millis(100);
/// The retry layer's default minimum attempt time, which admission keeps free.
const MIN_ATTEMPT: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Header {
    RetryAfter,
    GrpcPushback,
}

/// One generated value, and which header carries it.
fn generate(rng: &mut StdRng) -> (Header, Vec<u8>) {
    let digits = |n: u128| n.to_string().into_bytes();
    let date = |offset: i64| {
        let now = SystemTime::now();
        let at = if offset >= 0 {
            now + Duration::from_secs(offset as u64)
        } else {
            now - Duration::from_secs(offset.unsigned_abs())
        };
        httpdate::fmt_http_date(at).into_bytes()
    };
    let garbage = |rng: &mut StdRng| {
        const ALPHABET: &[u8] = b"0123456789 -+.,:;abcdefGMTWed\t/xyz\xa0";
        let len = rng.random_range(0..12);
        (0..len)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
            .collect::<Vec<u8>>()
    };
    match rng.random_range(0..11) {
        0 => (Header::RetryAfter, digits(rng.random_range(0..=120))),
        1 => (Header::RetryAfter, digits(rng.random_range(0..=u128::MAX))),
        2 => (Header::RetryAfter, date(rng.random_range(-100..=200))),
        3 => (
            Header::RetryAfter,
            date(rng.random_range(1_000..=3_000_000_000)),
        ),
        4 => (Header::RetryAfter, garbage(rng)),
        5 => (
            Header::RetryAfter,
            format!("-{}", rng.random_range(0..=1000)).into_bytes(),
        ),
        6 => {
            // Digits with whitespace around them, or a fraction: not delay-seconds.
            let n = rng.random_range(0..=120);
            let forms = [format!(" {n}"), format!("{n} "), format!("{n}.5")];
            (
                Header::RetryAfter,
                forms[rng.random_range(0..forms.len())].clone().into_bytes(),
            )
        }
        7 => (Header::GrpcPushback, digits(rng.random_range(0..=120_000))),
        8 => (
            Header::GrpcPushback,
            digits(rng.random_range(0..=u128::MAX)),
        ),
        9 => (
            Header::GrpcPushback,
            format!("-{}", rng.random_range(0..=1000)).into_bytes(),
        ),
        _ => (Header::GrpcPushback, garbage(rng)),
    }
}

fn request(header: Header) -> Request<()> {
    match header {
        // A read: a 503 without a valid Retry-After is still retried, after the backoff.
        Header::RetryAfter => Request::get("/stock/sku-42").body(()).unwrap(),
        Header::GrpcPushback => Request::post("/shop.Stock/Get")
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(())
            .unwrap(),
    }
}

/// The first answer: 503 with `Retry-After`, or a trailers-only gRPC `UNAVAILABLE` with
/// `grpc-retry-pushback-ms`. Every later one succeeds.
fn first_answer(header: Header, value: &HeaderValue) -> Response<()> {
    match header {
        Header::RetryAfter => Response::builder()
            .status(503)
            .header(http::header::RETRY_AFTER, value)
            .body(())
            .unwrap(),
        Header::GrpcPushback => Response::builder()
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header("grpc-status", "14")
            .header("grpc-retry-pushback-ms", value)
            .body(())
            .unwrap(),
    }
}

#[test]
fn no_retry_comes_sooner_than_asked_or_later_than_the_cap_or_the_deadline() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let mut rng = StdRng::seed_from_u64(0x5eed_0012);
    let caps = [Duration::from_secs(1), Duration::from_secs(30)];
    let deadlines = [Duration::from_secs(2), Duration::from_secs(60)];
    let (mut retried, mut stopped, mut absent) = (0, 0, 0);
    rt.block_on(async {
        for case in 0..10_000 {
            let (header, bytes) = generate(&mut rng);
            let Ok(value) = HeaderValue::from_bytes(&bytes) else {
                unreachable!("the alphabet is made of header bytes");
            };
            let cap = caps[case % caps.len()];
            let deadline = deadlines[(case / 2) % deadlines.len()];
            let attempts = Arc::new(Mutex::new(Vec::new()));
            let seen = attempts.clone();
            let answer = first_answer(header, &value);
            let transport = service_fn(move |_req: Request<()>| {
                let mut seen = seen.lock().unwrap();
                seen.push(Instant::now());
                let res = if seen.len() == 1 {
                    answer.clone()
                } else {
                    Response::new(())
                };
                async move { Ok::<_, std::io::Error>(res) }
            });
            let mut client = ServiceBuilder::new()
                .layer(SetDeadlineLayer::new(deadline))
                .layer(
                    RetryLayer::builder()
                        .backoff(Backoff::constant(BACKOFF))
                        .max_pushback(cap)
                        .max_attempts(2)
                        .no_budget()
                        .build()
                        .unwrap(),
                )
                .service(transport);
            let res = client
                .ready()
                .await
                .unwrap()
                .call(request(header))
                .await
                .unwrap();
            let attempts = attempts.lock().unwrap().clone();
            // Read after the call: for an HTTP-date, the delay left now is at most the one
            // the layer read, so "waited at least this" is a sound bound.
            let asked = match header {
                Header::RetryAfter => parse_retry_after(&value, SystemTime::now())
                    .ok()
                    .map(Pushback::After),
                Header::GrpcPushback => Some(parse_grpc_pushback(&value)),
            };
            let what =
                format!("case {case}: {header:?} {value:?}, cap {cap:?}, deadline {deadline:?}");
            let stop = res.call_outcome().map(|o| o.stop_reason());
            match attempts.as_slice() {
                [first, second] => {
                    retried += 1;
                    let waited = *second - *first;
                    assert!(waited <= cap.max(BACKOFF), "{what}: waited {waited:?}");
                    assert!(
                        waited + MIN_ATTEMPT <= deadline,
                        "{what}: waited {waited:?}"
                    );
                    match asked {
                        Some(Pushback::After(d)) => {
                            assert!(waited >= d, "{what}: waited {waited:?}, asked {d:?}")
                        }
                        Some(Pushback::Stop) => panic!("{what}: retried after a stop"),
                        None => {
                            absent += 1;
                            assert_eq!(waited, BACKOFF, "{what}: not read as absent");
                        }
                        Some(other) => {
                            panic!("{what}: a pushback this test does not know: {other:?}")
                        }
                    }
                    assert_eq!(stop, Some(StopReason::Success), "{what}");
                }
                [_] => {
                    stopped += 1;
                    match asked {
                        Some(Pushback::Stop) => {}
                        Some(Pushback::After(d)) => {
                            // Only a delay past the cap or the deadline may stop the call. A
                            // date's delay was read a little earlier, so a little longer.
                            let slack = if header == Header::RetryAfter {
                                Duration::from_secs(1)
                            } else {
                                Duration::ZERO
                            };
                            let d = d.saturating_add(slack);
                            assert!(
                                d > cap || d.saturating_add(MIN_ATTEMPT) > deadline,
                                "{what}: not retried, asked {d:?}"
                            );
                        }
                        None => panic!("{what}: an absent pushback stopped a retryable read"),
                        Some(other) => {
                            panic!("{what}: a pushback this test does not know: {other:?}")
                        }
                    }
                    assert_eq!(stop, Some(StopReason::PushbackStop), "{what}");
                }
                other => panic!("{what}: {} attempts", other.len()),
            }
        }
    });
    // The generator reached every branch of the rule.
    assert!(
        retried > 1_000 && stopped > 1_000 && absent > 500,
        "{retried} {stopped} {absent}"
    );
}
