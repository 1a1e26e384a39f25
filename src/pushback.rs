//! Reading a server's pushback: `Retry-After` and `grpc-retry-pushback-ms`.
//!
//! A server that says when to come back knows more than any backoff formula. These parsers turn
//! the headers into a [`Pushback`]; the classifiers attach it to the attempt's
//! [`Classification`](crate::classify::Classification). They never panic: a malformed
//! `Retry-After` is an error the caller may ignore, and a malformed or negative
//! `grpc-retry-pushback-ms` means "do not retry", as the gRPC retry design specifies.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};

/// Why a `Retry-After` value could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid retry-after: expected delay-seconds or an HTTP-date")]
pub struct InvalidRetryAfter(());

/// Parses `Retry-After` (RFC 9110 §10.2.3): `delay-seconds` or an HTTP-date, relative to `now`.
/// A date in the past is a delay of zero.
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
/// ```
pub fn parse_retry_after(
    value: &HeaderValue,
    now: SystemTime,
) -> Result<Duration, InvalidRetryAfter> {
    let bytes = value.as_bytes();
    if !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit) {
        // Saturate absurdly long delays rather than fail: the caller caps them anyway.
        let secs = bytes.iter().try_fold(0u64, |acc, b| {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        });
        return Ok(Duration::from_secs(secs.unwrap_or(u64::MAX)));
    }
    let text = value.to_str().map_err(|_| InvalidRetryAfter(()))?;
    let at = httpdate::parse_http_date(text).map_err(|_| InvalidRetryAfter(()))?;
    Ok(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses `grpc-retry-pushback-ms`: a non-negative integer is a delay; anything else (negative,
/// empty, not a number) means [`Pushback::Stop`].
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
    let bytes = value.as_bytes();
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return Pushback::Stop;
    }
    let ms = bytes.iter().try_fold(0u64, |acc, b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    });
    Pushback::After(Duration::from_millis(ms.unwrap_or(u64::MAX)))
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
