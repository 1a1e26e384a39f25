//! Reading a server's pushback: `Retry-After` and `grpc-retry-pushback-ms`.
//!
//! A server that says when to come back knows more than any backoff formula. These parsers turn
//! the headers into a [`Pushback`]; the classifiers attach it to the attempt's
//! [`Classification`](crate::classify::Classification). They never panic: a malformed
//! `Retry-After` is an error the caller may ignore, and a malformed or negative
//! `grpc-retry-pushback-ms` means "do not retry", as the gRPC retry design specifies.
//!
//! # The longest wait
//!
//! A peer may ask for any wait: 26 digits of seconds, a date in the year 9999. The parsers read
//! a wait longer than **thirty years** as thirty years, three times
//! [`MAX_DURATION`](crate::MAX_DURATION). That is still longer than any client of this crate
//! may be told to wait (a retry layer's
//! [`max_pushback`](crate::retry::RetryLayerBuilder::max_pushback) is at most `MAX_DURATION`),
//! so a call asked to wait that long stops, as one asked for more than its cap does: the clamp
//! never makes a client come back sooner than the server asked. What it spares is every sum
//! of a wait and an instant further on, which a wait of 10^25 seconds would overflow.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};

use crate::time::FAR_FUTURE;

/// The longest wait a pushback header reads as (see [the longest wait](self#the-longest-wait)).
const LONGEST: Duration = FAR_FUTURE;

/// Why a `Retry-After` value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid retry-after: expected delay-seconds or an HTTP-date")]
pub struct InvalidRetryAfter(());

/// Parses `Retry-After` (RFC 9110 §10.2.3): `delay-seconds` or an HTTP-date, relative to `now`.
/// A date in the past is a delay of zero; a delay over thirty years (a 20-digit number, a date
/// in the year 9999) is thirty years, longer than any client waits (see
/// [the longest wait](self#the-longest-wait)).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use surely::pushback::parse_retry_after;
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
/// let v = http::HeaderValue::from_static("120");
/// assert_eq!(parse_retry_after(&v, now), Ok(Duration::from_secs(120)));
///
/// let date = http::HeaderValue::from_static("Wed, 21 Oct 2015 07:29:00 GMT");
/// assert_eq!(parse_retry_after(&date, now), Ok(Duration::from_secs(60)));
///
/// assert!(parse_retry_after(&http::HeaderValue::from_static("-1"), now).is_err());
///
/// let absurd = http::HeaderValue::from_static("99999999999999999999999999");
/// let thirty_years = Duration::from_secs(30 * 365 * 86_400);
/// assert_eq!(parse_retry_after(&absurd, now), Ok(thirty_years));
/// assert!(thirty_years > surely::MAX_DURATION);
/// ```
pub fn parse_retry_after(
    value: &HeaderValue,
    now: SystemTime,
) -> Result<Duration, InvalidRetryAfter> {
    if let Some(secs) = decimal(value.as_bytes()) {
        return Ok(Duration::from_secs(secs).min(LONGEST));
    }
    let text = value.to_str().map_err(|_| InvalidRetryAfter(()))?;
    // A date the parser takes is in the years 1970 to 9999: at most some 8,000 years ahead.
    let at = httpdate::parse_http_date(text).map_err(|_| InvalidRetryAfter(()))?;
    Ok(at
        .duration_since(now)
        .unwrap_or(Duration::ZERO)
        .min(LONGEST))
}

/// Parses `grpc-retry-pushback-ms`: a non-negative integer is a delay; anything else (negative,
/// empty, not a number) means [`Pushback::Stop`]. A delay over thirty years is thirty years,
/// longer than any client waits (see [the longest wait](self#the-longest-wait)).
///
/// ```
/// use std::time::Duration;
/// use surely::pushback::Pushback;
/// use surely::pushback::parse_grpc_pushback;
///
/// let v = http::HeaderValue::from_static("250");
/// assert_eq!(parse_grpc_pushback(&v), Pushback::After(Duration::from_millis(250)));
/// assert_eq!(parse_grpc_pushback(&http::HeaderValue::from_static("-1")), Pushback::Stop);
/// ```
pub fn parse_grpc_pushback(value: &HeaderValue) -> Pushback {
    match decimal(value.as_bytes()) {
        Some(ms) => Pushback::After(Duration::from_millis(ms).min(LONGEST)),
        None => Pushback::Stop,
    }
}

/// A run of ASCII digits as a number, `u64::MAX` past it (then longer than [`LONGEST`] in any
/// unit the headers use); `None` when there are no digits or a byte is not one.
fn decimal(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| {
        let digit = char::from(b).to_digit(10)?;
        Some(n.saturating_mul(10).saturating_add(u64::from(digit)))
    })
}

/// The delay a valid `Retry-After` asks for (relative to the system clock); `None` when the
/// header is absent or does not parse, which is the same thing.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(http::header::RETRY_AFTER)?;
    parse_retry_after(v, SystemTime::now()).ok()
}

/// What the server asked about retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Pushback {
    /// Retry no earlier than this (`Retry-After`, `grpc-retry-pushback-ms`).
    After(Duration),
    /// Do not retry (a negative or malformed `grpc-retry-pushback-ms`).
    Stop,
}
