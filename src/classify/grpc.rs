use http::{HeaderMap, HeaderName, StatusCode};

use super::{AttemptClass, Classification, Classified, ClassifyEos, DeliveryPhase};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// A gRPC status code (the `grpc-status` header), as a number and its class.
///
/// | code | class |
/// | --- | --- |
/// | `OK` (0) | success |
/// | `INVALID_ARGUMENT`, `NOT_FOUND`, `ALREADY_EXISTS`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, `OUT_OF_RANGE`, `UNIMPLEMENTED`, `UNAUTHENTICATED` | final |
/// | `ABORTED` | conflict |
/// | `RESOURCE_EXHAUSTED`; `UNAVAILABLE` in a trailers-only response with `grpc-retry-pushback-ms` | rejected, not processed |
/// | `CANCELLED`, `UNKNOWN`, `DEADLINE_EXCEEDED`, `INTERNAL`, `DATA_LOSS`; any other `UNAVAILABLE` | maybe committed |
///
/// Any status with the crate's [`NOT_PROCESSED`](crate::headers::NOT_PROCESSED) marker is rejected.
///
/// `UNAVAILABLE` is "not processed" only when the server says so, as HTTP's 503 is only with
/// `Retry-After` ([`docs::outcomes`](crate::docs::outcomes)): servers such as tonic send every
/// unary error trailers-only, including an `UNAVAILABLE` returned by a handler that had already
/// done its work, and gRPC's status documentation warns that retrying `UNAVAILABLE` is not
/// always safe for non-idempotent operations. Read as "not processed" whenever it came
/// trailers-only, a gRPC write without a key would be sent twice.
///
/// ```
/// use surely::classify::{AttemptClass, GrpcCode};
/// assert_eq!(GrpcCode::from_header(b"10").map(GrpcCode::class_after_headers), Some(AttemptClass::Conflict));
/// assert_eq!(GrpcCode::from_header(b"x"), None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrpcCode(u16);

impl GrpcCode {
    /// `OK`.
    pub const OK: GrpcCode = GrpcCode(0);
    /// `INVALID_ARGUMENT`.
    pub const INVALID_ARGUMENT: GrpcCode = GrpcCode(3);
    /// `DEADLINE_EXCEEDED`.
    pub const DEADLINE_EXCEEDED: GrpcCode = GrpcCode(4);
    /// `RESOURCE_EXHAUSTED`.
    pub const RESOURCE_EXHAUSTED: GrpcCode = GrpcCode(8);
    /// `ABORTED`.
    pub const ABORTED: GrpcCode = GrpcCode(10);
    /// `INTERNAL`.
    pub const INTERNAL: GrpcCode = GrpcCode(13);
    /// `UNAVAILABLE`.
    pub const UNAVAILABLE: GrpcCode = GrpcCode(14);
    /// `UNKNOWN`.
    pub const UNKNOWN: GrpcCode = GrpcCode(2);

    /// Parses a `grpc-status` value (1 to 3 ASCII digits); `None` if malformed.
    pub fn from_header(value: &[u8]) -> Option<GrpcCode> {
        if value.is_empty() || value.len() > 3 || !value.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let n = value
            .iter()
            .fold(0u16, |acc, b| acc * 10 + u16::from(b - b'0'));
        Some(GrpcCode(n))
    }

    /// The numeric code.
    pub fn code(self) -> u16 {
        self.0
    }

    /// The code's class in a trailers-only response, sent before any response headers, whose
    /// server may (`pushback`) or may not have asked for a retry with `grpc-retry-pushback-ms`.
    pub fn class_trailers_only(self, pushback: bool) -> AttemptClass {
        match self {
            GrpcCode::UNAVAILABLE if pushback => AttemptClass::Rejected,
            other => other.class_after_headers(),
        }
    }

    /// The code's class when it arrived in trailers after the response headers.
    pub fn class_after_headers(self) -> AttemptClass {
        match self.0 {
            0 => AttemptClass::Success,
            3 | 5 | 6 | 7 | 9 | 11 | 12 | 16 => AttemptClass::Final,
            10 => AttemptClass::Conflict,
            8 => AttemptClass::Rejected,
            _ => AttemptClass::MaybeCommitted,
        }
    }

    /// The gRPC code a gRPC library reports for a non-200 HTTP status (gRPC's
    /// `http-grpc-status-mapping`). The classifiers do not use it: such a status comes from a
    /// proxy or gateway, and the HTTP table says more (a 504 after forwarding may have committed,
    /// which `UNAVAILABLE` would hide).
    pub fn from_http_status(status: StatusCode) -> GrpcCode {
        GrpcCode(match status.as_u16() {
            400 => 13,
            401 => 16,
            403 => 7,
            404 => 12,
            429 | 502 | 503 | 504 => 14,
            _ => 2,
        })
    }
}

/// End-of-stream classification of a gRPC response: reads `grpc-status` and
/// `grpc-retry-pushback-ms` from the trailers. A stream that ends without a valid `grpc-status`
/// is [`MaybeCommitted`](AttemptClass::MaybeCommitted).
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcEos {
    _priv: (),
}

impl ClassifyEos for GrpcEos {
    fn classify_eos(self, trailers: Option<&HeaderMap>) -> Classification {
        let Some(trailers) = trailers else {
            return Classification::failure_at(DeliveryPhase::ResponseStarted);
        };
        classify_status_headers(trailers, false)
            .unwrap_or_else(|| Classification::failure_at(DeliveryPhase::ResponseStarted))
    }
}

fn classify_status_headers(headers: &HeaderMap, trailers_only: bool) -> Option<Classification> {
    let code =
        GrpcCode::from_header(headers.get(GRPC_STATUS)?.as_bytes()).unwrap_or(GrpcCode::UNKNOWN);
    let class = if code != GrpcCode::OK && headers.contains_key(crate::headers::NOT_PROCESSED) {
        AttemptClass::Rejected
    } else if trailers_only {
        code.class_trailers_only(headers.contains_key(crate::headers::GRPC_RETRY_PUSHBACK_MS))
    } else {
        code.class_after_headers()
    };
    let pushback = match class {
        AttemptClass::Success => None,
        _ => headers
            .get(crate::headers::GRPC_RETRY_PUSHBACK_MS)
            .map(crate::pushback::parse_grpc_pushback),
    };
    let c = Classification::new(class, DeliveryPhase::ResponseStarted).with_pushback(pushback);
    if code != GrpcCode::OK {
        Some(super::http::mark_refusal(c, headers))
    } else {
        Some(c)
    }
}

/// Classifies the head of a gRPC response whose HTTP status is 200: from `grpc-status` in the
/// headers of a trailers-only response, else at the end of the stream.
pub(super) fn classify_head(headers: &HeaderMap) -> Classified<GrpcEos> {
    match classify_status_headers(headers, true) {
        Some(c) => Classified::Ready(c),
        None => Classified::RequiresEos(GrpcEos::default()),
    }
}
