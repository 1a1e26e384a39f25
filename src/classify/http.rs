use http::{HeaderMap, HeaderValue, StatusCode};

use super::grpc::{self, GrpcEos};
use super::{
    AttemptClass, Classification, Classified, Classify, ClassifyError, DeliveryPhase,
    MakeClassifier, Pushback,
};
use crate::{Envelope, Semantics};

use crate::headers::IDEMPOTENCY_ERROR;
use crate::headers::KEY_IN_FLIGHT;

use crate::headers::NOT_PROCESSED;

/// The built-in classifier for HTTP and gRPC over `http::Request` / `http::Response`.
///
/// HTTP statuses:
///
/// | status | class |
/// | --- | --- |
/// | 202 with [`IDEMPOTENCY_ERROR`]`: IDEMPOTENCY_OUTCOME_UNKNOWN` (a server's record is `UNKNOWN`) | maybe committed, do not retry ([`Pushback::Stop`](crate::pushback::Pushback::Stop)) |
/// | 1xx, 2xx, 3xx | success |
/// | 408, 425, 429; 503 with `Retry-After`; any failure with [`NOT_PROCESSED`] | rejected, not processed |
/// | 409 for a keyed request with `Retry-After` or [`KEY_IN_FLIGHT`] | rejected (the key is in flight) |
/// | 409 otherwise | conflict |
/// | other 4xx | final |
/// | 500, 502, 504, 503 without `Retry-After`, other 5xx | maybe committed |
///
/// A refusal whose [`NOT_PROCESSED`] says `deadline` (the server found the request's deadline
/// spent, or too short, before it started) is rejected too, and
/// [marked](Classification::is_deadline_refusal) so that the circuit breaker does not count the
/// caller's spent budget against the server's health. One that says `overload` (the server's
/// [adaptive limit][crate::server::limit] shed it) is [marked](Classification::is_overload_refusal)
/// the same way: a server shedding load is serving all it can.
///
/// Requests whose `content-type` starts with `application/grpc` are classified by gRPC status
/// (see [`GrpcCode`](super::GrpcCode)): from the headers of a trailers-only response, else at
/// the end of the stream ([`GrpcEos`]). A gRPC response with a non-200 HTTP status comes from a
/// proxy or gateway and is classified by the HTTP table above.
///
/// Errors are classified by [`ClassifyError`].
///
/// A response without an HTTP status ([`Envelope::status`] is `None`: a type of your own, a
/// `u64`, a `String`) is a success: the service answered. A service whose answers can also say
/// "failed" or "try later" needs a classifier of its own ([`from_fn`](super::from_fn)).
///
/// ```
/// use surely::classify::{AttemptClass, Classify, HttpClassifier, MakeClassifier};
///
/// let put = http::Request::put("/orders/o-1").body(()).unwrap();
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let classifier = HttpClassifier::new().make_classifier(&put);
/// let c = Classify::<http::Response<()>, _>::classify_error(
///     classifier,
///     &refused,
///     surely::classify::DeliveryPhase::Sent,
/// );
/// assert_eq!(c.class(), AttemptClass::Rejected);
/// ```
#[cfg_attr(not(feature = "server"), doc = crate::docs::links::to_features!("crate::server::limit"))]
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpClassifier {
    _priv: (),
}

impl HttpClassifier {
    /// The classifier.
    pub fn new() -> Self {
        HttpClassifier { _priv: () }
    }
}

impl<Req: Envelope> MakeClassifier<Req> for HttpClassifier {
    type Classifier = HttpRequestClassifier;

    fn make_classifier(&self, req: &Req) -> HttpRequestClassifier {
        HttpRequestClassifier {
            semantics: req.semantics(),
            grpc: req.is_grpc(),
        }
    }
}

/// The per-request classifier made by [`HttpClassifier`].
#[derive(Clone, Copy, Debug)]
pub struct HttpRequestClassifier {
    semantics: Semantics,
    grpc: bool,
}

impl HttpRequestClassifier {
    /// A classifier for a request with these semantics, over plain HTTP or gRPC.
    ///
    /// ```
    /// use surely::classify::HttpRequestClassifier;
    /// let _ = HttpRequestClassifier::new(surely::Semantics::Keyed, false);
    /// ```
    pub fn new(semantics: Semantics, grpc: bool) -> Self {
        HttpRequestClassifier { semantics, grpc }
    }

    /// Classifies an HTTP status with the response's headers.
    pub fn classify_status(&self, status: StatusCode, headers: &http::HeaderMap) -> Classification {
        if status == StatusCode::ACCEPTED && is_outcome_unknown(headers) {
            // The server does not know whether the key's work took effect: asking again now
            // gets the same answer, and only settling it (a resolver, the ledger) helps.
            return Classification::new(
                AttemptClass::MaybeCommitted,
                DeliveryPhase::ResponseStarted,
            )
            .with_pushback(Some(Pushback::Stop));
        }
        if status.as_u16() < 400 {
            return Classification::new(AttemptClass::Success, DeliveryPhase::ResponseStarted);
        }
        // A `Retry-After` that does not parse counts as absent.
        let retry_after = crate::pushback::retry_after(headers);
        let pushback = match headers.get(crate::headers::GRPC_RETRY_PUSHBACK_MS) {
            Some(v) => Some(crate::pushback::parse_grpc_pushback(v)),
            None => retry_after.map(Pushback::After),
        };
        let class = match status.as_u16() {
            _ if headers.contains_key(NOT_PROCESSED) => AttemptClass::Rejected,
            408 | 425 | 429 => AttemptClass::Rejected,
            409 if self.semantics == Semantics::Keyed
                && (retry_after.is_some() || headers.contains_key(KEY_IN_FLIGHT)) =>
            {
                AttemptClass::Rejected
            }
            409 => AttemptClass::Conflict,
            400..=499 => AttemptClass::Final,
            503 if retry_after.is_some() => AttemptClass::Rejected,
            _ => AttemptClass::MaybeCommitted,
        };
        let c = Classification::new(class, DeliveryPhase::ResponseStarted).with_pushback(pushback);
        mark_refusal(c, headers)
    }
}

/// Whether `headers` carry the server's "outcome unknown" code: in its header, or (when a
/// gateway kept the problem details' link but not the header) as the problem type a
/// `Link: <...idempotency-outcome-unknown>; rel="describedby"` names.
fn is_outcome_unknown(headers: &http::HeaderMap) -> bool {
    if let Some(v) = headers.get(IDEMPOTENCY_ERROR) {
        return v.as_bytes() == crate::headers::OUTCOME_UNKNOWN_CODE.as_bytes();
    }
    let is_problem = headers
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    is_problem
        && headers.get_all(http::header::LINK).iter().any(|v| {
            let v = v.as_bytes();
            v.windows(OUTCOME_UNKNOWN_TYPE.len())
                .any(|w| w == OUTCOME_UNKNOWN_TYPE)
                && v.windows(DESCRIBED_BY.len()).any(|w| w == DESCRIBED_BY)
        })
}

/// The end of the "outcome unknown" problem's type in a `Link`, and its relation.
const OUTCOME_UNKNOWN_TYPE: &[u8] = b"idempotency-outcome-unknown>";
const DESCRIBED_BY: &[u8] = b"rel=\"describedby\"";

/// The `NOT_PROCESSED` value of a refusal for a spent deadline.
pub(crate) const DEADLINE_REFUSAL: &str = "deadline";

/// The `NOT_PROCESSED` value of a refusal by a server's admission control.
pub(crate) const OVERLOAD_REFUSAL: &str = "overload";

/// `c`, marked as a refusal for a spent deadline or by admission control if the server's
/// `NOT_PROCESSED` says so.
pub(crate) fn mark_refusal(c: Classification, headers: &http::HeaderMap) -> Classification {
    match headers.get(NOT_PROCESSED).map(HeaderValue::as_bytes) {
        Some(v) if v == DEADLINE_REFUSAL.as_bytes() => c.for_spent_deadline(),
        Some(v) if v == OVERLOAD_REFUSAL.as_bytes() => c.for_overload(),
        _ => c,
    }
}

impl<Res: Envelope, E: ClassifyError> Classify<Res, E> for HttpRequestClassifier {
    type ClassifyEos = GrpcEos;

    fn classify_response(self, res: &Res) -> Classified<GrpcEos> {
        let Some(status) = res.status() else {
            // Not an HTTP response: the service answered, in its own terms.
            return Classified::Ready(Classification::success());
        };
        let empty;
        let headers = match res.headers() {
            Some(headers) => headers,
            None => {
                empty = HeaderMap::new();
                &empty
            }
        };
        if self.grpc && status == StatusCode::OK {
            grpc::classify_head(headers)
        } else {
            Classified::Ready(self.classify_status(status, headers))
        }
    }

    fn classify_error(self, error: &E, phase: DeliveryPhase) -> Classification {
        error.classify_error(phase)
    }
}
