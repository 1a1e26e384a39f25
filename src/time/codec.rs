//! Wire codecs that carry a remaining time budget from one hop to the next.
//!
//! Two formats are supported:
//!
//! - **`grpc-timeout`**, as defined by the gRPC over HTTP/2 wire spec: a `TimeoutValue` of one to
//!   eight ASCII digits followed by a one-letter `TimeoutUnit`: `H` hours, `M` minutes, `S`
//!   seconds, `m` milliseconds, `u` microseconds, `n` nanoseconds. For example `250m` or `1000000u`.
//! - **Milliseconds**, for plain HTTP headers: a bare count of whole milliseconds, one to
//!   eighteen ASCII digits, for example `1500`. Eighteen digits (about 31.7 million years) is the
//!   most that always fits a `u64`, so a valid value can never overflow.
//!
//! Both parsers are strict: no sign, no whitespace, no decimal point, nothing but the digits (and
//! the unit). Leading zeros are allowed. A zero value parses to [`Duration::ZERO`]; deciding that
//! such a request has already expired is the caller's job. Errors are typed: a
//! [`ParseTimeoutError`] says what is wrong with its `is_*` predicates.
//!
//! # Bounds
//!
//! The parsers never panic and never overflow: the formats' digit limits bound every value
//! (`99999999H` is about 11,415 years, eighteen digits of milliseconds about 31.7 million), and
//! each parses exactly to a [`Duration`]. Such a budget outlives every caller; a reader that
//! adds one to an instant bounds it where it reads it: the server's deadline layer
//! (`server::deadline::ServerDeadlineLayer`, feature `server`) counts a budget over
//! [`MAX_DURATION`](crate::MAX_DURATION) as ten years, and
//! [`Deadline::after`](crate::deadline::Deadline::after) clamps any budget to about thirty
//! years.
//!
//! # Truncation
//!
//! Encoders always round *down*. A budget that is forwarded must never be larger than the budget
//! the sender actually has left, or the callee would keep working after the caller has given up.
//! Rounding down costs at most one unit of the chosen precision; rounding up would break the
//! guarantee. [`encode_grpc_timeout`] picks the finest unit whose value fits in eight digits, so the
//! loss is as small as the format allows, and a nonzero duration never encodes as zero.
//! Durations too long for the format clamp to its largest value (`99999999H`, or eighteen nines of
//! milliseconds); that budget outlives any real caller.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use surely::deadline::codec::{encode_grpc_timeout, parse_grpc_timeout};
//!
//! // One second is 10 digits of nanoseconds, so the finest unit that fits is microseconds.
//! let value = encode_grpc_timeout(Duration::from_secs(1));
//! assert_eq!(value, "1000000u");
//! assert_eq!(parse_grpc_timeout(value.as_bytes()), Ok(Duration::from_secs(1)));
//!
//! // Precision that does not fit is dropped, never rounded up.
//! let value = encode_grpc_timeout(Duration::new(123, 456_789_123));
//! assert_eq!(value, "123456m");
//!
//! assert!(parse_grpc_timeout(b"-5S").is_err());
//! ```

use std::time::Duration;

use http::HeaderValue;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// `grpc-timeout` units from finest to coarsest, with their length in nanoseconds.
const GRPC_UNITS: [(u8, u128); 6] = [
    (b'n', 1),
    (b'u', 1_000),
    (b'm', 1_000_000),
    (b'S', NANOS_PER_SEC),
    (b'M', 60 * NANOS_PER_SEC),
    (b'H', 3_600 * NANOS_PER_SEC),
];

/// Encodes `timeout` as a `grpc-timeout` header value.
///
/// Uses the finest unit whose value fits in eight digits and truncates anything finer (see the
/// [module docs](self) for why it never rounds up). Zero encodes as `0n`; durations of 100 million
/// hours or more clamp to `99999999H`.
pub fn encode_grpc_timeout(timeout: Duration) -> HeaderValue {
    let nanos = timeout.as_nanos();
    let max = Codec::Grpc.max_value();
    let (count, unit) = GRPC_UNITS
        .iter()
        .find_map(|&(unit, unit_nanos)| {
            let count = u64::try_from(nanos / unit_nanos).ok()?;
            (count <= max).then_some((count, unit))
        })
        .unwrap_or((max, b'H'));
    header_value(count, Some(unit))
}

/// Parses a `grpc-timeout` header value: one to eight ASCII digits and a unit letter.
///
/// # Errors
///
/// Returns a [`ParseTimeoutError`] whose `is_*` predicates say what is wrong.
pub fn parse_grpc_timeout(value: &[u8]) -> Result<Duration, ParseTimeoutError> {
    let codec = Codec::Grpc;
    let (&unit, digits) = value.split_last().ok_or(codec.error(Kind::Empty))?;
    if unit.is_ascii_digit() {
        return Err(codec.error(Kind::MissingUnit));
    }
    let &(_, unit_nanos) = GRPC_UNITS
        .iter()
        .find(|&&(u, _)| u == unit)
        .ok_or(codec.error(Kind::UnknownUnit))?;
    let count = parse_digits(digits, codec)?;
    // Cannot fail within eight digits: the longest value, `99999999H`, is about 11,415 years.
    u128::from(count)
        .checked_mul(unit_nanos)
        .and_then(|nanos| {
            let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
            let subsec = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
            Some(Duration::new(secs, subsec))
        })
        // Cannot fail within the format's digits (18 nines fit a `u64`).
        .ok_or(codec.error(Kind::TooManyDigits))
}

/// Parses a `grpc-timeout` [`HeaderValue`]; see [`parse_grpc_timeout`].
///
/// # Errors
///
/// As [`parse_grpc_timeout`].
pub fn parse_grpc_timeout_header(value: &HeaderValue) -> Result<Duration, ParseTimeoutError> {
    parse_grpc_timeout(value.as_bytes())
}

/// Encodes `timeout` as a count of whole milliseconds, truncating any sub-millisecond part.
///
/// Durations longer than eighteen digits of milliseconds clamp to `999999999999999999`.
pub fn encode_millis(timeout: Duration) -> HeaderValue {
    let max = Codec::Millis.max_value();
    let millis = u64::try_from(timeout.as_millis()).map_or(max, |millis| millis.min(max));
    header_value(millis, None)
}

/// Parses a millisecond header value: one to eighteen ASCII digits and nothing else.
///
/// # Errors
///
/// Returns a [`ParseTimeoutError`] whose `is_*` predicates say what is wrong.
pub fn parse_millis(value: &[u8]) -> Result<Duration, ParseTimeoutError> {
    if value.is_empty() {
        return Err(Codec::Millis.error(Kind::Empty));
    }
    parse_digits(value, Codec::Millis).map(Duration::from_millis)
}

/// Parses a millisecond [`HeaderValue`]; see [`parse_millis`].
///
/// # Errors
///
/// As [`parse_millis`].
pub fn parse_millis_header(value: &HeaderValue) -> Result<Duration, ParseTimeoutError> {
    parse_millis(value.as_bytes())
}

/// The error returned when a timeout header value is malformed.
///
/// Its `is_*` predicates say what is wrong (one of them is true); its `Display` also names the
/// format.
///
/// ```
/// use surely::deadline::codec::{parse_grpc_timeout, parse_millis};
///
/// let err = parse_grpc_timeout(b"5s").unwrap_err();
/// assert!(err.is_unknown_unit());
/// assert_eq!(err.to_string(), "invalid grpc-timeout: unknown unit");
/// assert!(parse_millis(b"1.5").unwrap_err().is_invalid_byte());
/// assert!(parse_millis(&[b'1'; 19]).unwrap_err().is_too_long());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {}: {}", self.codec.name(), self.reason())]
pub struct ParseTimeoutError {
    kind: Kind,
    codec: Codec,
}

impl ParseTimeoutError {
    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.kind == Kind::Empty
    }

    /// Whether a `grpc-timeout` unit has no digits before it.
    pub fn is_missing_digits(&self) -> bool {
        self.kind == Kind::NoDigits
    }

    /// Whether the value has more digits than the format allows (8 for `grpc-timeout`, 18 for
    /// milliseconds).
    pub fn is_too_long(&self) -> bool {
        self.kind == Kind::TooManyDigits
    }

    /// Whether a byte stands where an ASCII digit must be: a sign, whitespace, a decimal
    /// point, non-ASCII...
    pub fn is_invalid_byte(&self) -> bool {
        self.kind == Kind::InvalidByte
    }

    /// Whether a `grpc-timeout` value ends in a digit instead of a unit.
    pub fn is_missing_unit(&self) -> bool {
        self.kind == Kind::MissingUnit
    }

    /// Whether a `grpc-timeout` unit is other than `H`, `M`, `S`, `m`, `u` or `n`.
    pub fn is_unknown_unit(&self) -> bool {
        self.kind == Kind::UnknownUnit
    }

    fn reason(&self) -> &'static str {
        match self.kind {
            Kind::Empty => "empty value",
            Kind::NoDigits => "no digits",
            Kind::TooManyDigits => match self.codec {
                Codec::Grpc => "more than 8 digits",
                Codec::Millis => "more than 18 digits",
            },
            Kind::InvalidByte => "not an ascii digit",
            Kind::MissingUnit => "missing unit",
            Kind::UnknownUnit => "unknown unit",
        }
    }
}

/// The ways a timeout header value can be malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The value is empty.
    Empty,
    /// A `grpc-timeout` unit with no digits before it.
    NoDigits,
    /// More digits than the format allows (8 for `grpc-timeout`, 18 for milliseconds): within
    /// them, no value overflows a `u64` or a [`Duration`].
    TooManyDigits,
    /// A byte where an ASCII digit must be: a sign, whitespace, a decimal point, non-ASCII...
    InvalidByte,
    /// A `grpc-timeout` value that ends in a digit instead of a unit.
    MissingUnit,
    /// A `grpc-timeout` unit other than `H`, `M`, `S`, `m`, `u` or `n`.
    UnknownUnit,
}

/// Which format an error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    Grpc,
    Millis,
}

impl Codec {
    const fn name(self) -> &'static str {
        match self {
            Self::Grpc => "grpc-timeout",
            Self::Millis => "millisecond timeout",
        }
    }

    const fn max_digits(self) -> u32 {
        match self {
            Self::Grpc => 8,
            Self::Millis => 18,
        }
    }

    const fn max_value(self) -> u64 {
        10u64.pow(self.max_digits()) - 1
    }

    const fn error(self, kind: Kind) -> ParseTimeoutError {
        ParseTimeoutError { kind, codec: self }
    }
}

/// Parses a run of ASCII digits, at most `codec.max_digits()` of them.
fn parse_digits(digits: &[u8], codec: Codec) -> Result<u64, ParseTimeoutError> {
    if digits.is_empty() {
        return Err(codec.error(Kind::NoDigits));
    }
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(codec.error(Kind::InvalidByte));
    }
    if digits.len() > codec.max_digits() as usize {
        return Err(codec.error(Kind::TooManyDigits));
    }
    digits
        .iter()
        .try_fold(0u64, |acc, &digit| {
            acc.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
        })
        .ok_or(codec.error(Kind::TooManyDigits))
}

/// Writes `value` in decimal, then `unit`, into a stack buffer, and copies it into a
/// [`HeaderValue`]: the only allocation.
fn header_value(mut value: u64, unit: Option<u8>) -> HeaderValue {
    // `u64::MAX` has 20 digits, plus one byte for the unit: no index below can go out of bounds.
    let mut buf = [0u8; 21];
    let mut start = buf.len();
    if let Some(unit) = unit {
        start -= 1;
        buf[start] = unit;
    }
    loop {
        start -= 1;
        buf[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    HeaderValue::from_bytes(&buf[start..])
        .expect("ascii digits and a unit letter are a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;
    use Kind::*;

    const HOUR: u64 = 3_600;

    /// The kind as a caller reads it, through the predicates: exactly one of them holds, and
    /// it is the error's.
    fn by_predicates(err: &ParseTimeoutError) -> Kind {
        let holds: Vec<Kind> = [
            (err.is_empty(), Empty),
            (err.is_missing_digits(), NoDigits),
            (err.is_too_long(), TooManyDigits),
            (err.is_invalid_byte(), InvalidByte),
            (err.is_missing_unit(), MissingUnit),
            (err.is_unknown_unit(), UnknownUnit),
        ]
        .into_iter()
        .filter_map(|(holds, kind)| holds.then_some(kind))
        .collect();
        assert_eq!(holds, [err.kind], "{err:?}");
        err.kind
    }

    fn grpc_kind(value: &[u8]) -> Kind {
        by_predicates(&parse_grpc_timeout(value).unwrap_err())
    }

    fn millis_kind(value: &[u8]) -> Kind {
        by_predicates(&parse_millis(value).unwrap_err())
    }

    #[test]
    fn encode_grpc_picks_finest_unit_that_fits() {
        let cases = [
            (Duration::ZERO, "0n"),
            (Duration::from_nanos(1), "1n"),
            (Duration::from_nanos(99_999_999), "99999999n"),
            (Duration::from_nanos(100_000_000), "100000u"),
            (Duration::from_secs(1), "1000000u"),
            (Duration::from_millis(99_999_999), "99999999m"),
            (Duration::from_secs(99_999_999), "99999999S"),
            (Duration::from_secs(100_000_000), "1666666M"),
            (Duration::from_secs(99_999_999 * 60), "99999999M"),
            (Duration::from_secs(99_999_999 * HOUR), "99999999H"),
        ];
        for (duration, expected) in cases {
            assert_eq!(encode_grpc_timeout(duration), expected, "{duration:?}");
        }
    }

    #[test]
    fn encode_grpc_truncates() {
        assert_eq!(
            encode_grpc_timeout(Duration::new(123, 456_789_123)),
            "123456m"
        );
        assert_eq!(
            encode_grpc_timeout(Duration::from_nanos(100_000_999)),
            "100000u"
        );
    }

    #[test]
    fn encode_grpc_clamps() {
        assert_eq!(
            encode_grpc_timeout(Duration::from_secs(100_000_000 * HOUR)),
            "99999999H"
        );
        assert_eq!(encode_grpc_timeout(Duration::MAX), "99999999H");
    }

    #[test]
    fn parse_grpc_every_unit() {
        let cases: [(&[u8], Duration); 8] = [
            (b"2H", Duration::from_secs(2 * HOUR)),
            (b"3M", Duration::from_secs(180)),
            (b"4S", Duration::from_secs(4)),
            (b"5m", Duration::from_millis(5)),
            (b"6u", Duration::from_micros(6)),
            (b"7n", Duration::from_nanos(7)),
            (b"00001S", Duration::from_secs(1)),
            (b"0m", Duration::ZERO),
        ];
        for (value, expected) in cases {
            assert_eq!(parse_grpc_timeout(value), Ok(expected));
        }
        assert_eq!(
            parse_grpc_timeout(b"99999999H"),
            Ok(Duration::from_secs(99_999_999 * HOUR))
        );
    }

    #[test]
    fn parse_grpc_rejects() {
        let cases: [(&[u8], Kind); 14] = [
            (b"", Empty),
            (b"S", NoDigits),
            (b"5", MissingUnit),
            (b"123456789", MissingUnit),
            (b"5s", UnknownUnit),
            (b"5h", UnknownUnit),
            (b"5 ", UnknownUnit),
            (b"123456789S", TooManyDigits),
            (b"000000001S", TooManyDigits),
            (b"-5S", InvalidByte),
            (b"+5S", InvalidByte),
            (b" 5S", InvalidByte),
            (b"1.5S", InvalidByte),
            ("５S".as_bytes(), InvalidByte),
        ];
        for (value, kind) in cases {
            assert_eq!(
                grpc_kind(value),
                kind,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn millis_round_trip_and_truncation() {
        assert_eq!(encode_millis(Duration::ZERO), "0");
        assert_eq!(encode_millis(Duration::from_micros(1_999)), "1");
        assert_eq!(encode_millis(Duration::from_millis(1_500)), "1500");
        assert_eq!(encode_millis(Duration::MAX), "999999999999999999");
        assert_eq!(parse_millis(b"0"), Ok(Duration::ZERO));
        assert_eq!(parse_millis(b"0001500"), Ok(Duration::from_millis(1_500)));
        assert_eq!(
            parse_millis(b"999999999999999999"),
            Ok(Duration::from_millis(999_999_999_999_999_999))
        );
    }

    #[test]
    fn parse_millis_rejects() {
        let cases: [(&[u8], Kind); 8] = [
            (b"", Empty),
            (b"1000000000000000000", TooManyDigits),
            (b"-1", InvalidByte),
            (b"+1", InvalidByte),
            (b" 1", InvalidByte),
            (b"1 ", InvalidByte),
            (b"1.5", InvalidByte),
            (b"1ms", InvalidByte),
        ];
        for (value, kind) in cases {
            assert_eq!(
                millis_kind(value),
                kind,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn header_wrappers() {
        let value = HeaderValue::from_static("250m");
        assert_eq!(
            parse_grpc_timeout_header(&value),
            Ok(Duration::from_millis(250))
        );
        let value = HeaderValue::from_static("250");
        assert_eq!(parse_millis_header(&value), Ok(Duration::from_millis(250)));
    }

    #[test]
    fn display_names_the_format() {
        let err = parse_grpc_timeout(b"123456789S").unwrap_err();
        assert_eq!(err.to_string(), "invalid grpc-timeout: more than 8 digits");
        let err = parse_millis(b"1.5").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid millisecond timeout: not an ascii digit"
        );
        let err = parse_millis(&[b'1'; 19]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid millisecond timeout: more than 18 digits"
        );
    }
}
