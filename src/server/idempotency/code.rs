//! The codes of the layer's own error responses.

use std::fmt;
use std::str::FromStr;

/// The code of one of the [`IdempotencyLayer`](super::IdempotencyLayer)'s own error responses:
/// sent in the [`IDEMPOTENCY_ERROR`](super::IDEMPOTENCY_ERROR) header and as the `code` of the
/// answer's [problem details](crate::server::problem). Each code has one status, given below
/// ([`status`](Self::status)), and one [`title`](Self::title).
///
/// [`as_str`](Self::as_str) (and [`Display`](fmt::Display)) gives the code as it is on the
/// wire; [`str::parse`] reads one back, and answers [`UnknownErrorCode`] for any other string
/// (another server's code, or one added after this version: the enum is `#[non_exhaustive]`).
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use surely::server::idempotency::{ErrorCode, IdempotencyLayer};
/// use surely::headers::IDEMPOTENCY_ERROR;
/// use surely::server::store::MemoryStore;
/// use tower::{service_fn, Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = IdempotencyLayer::builder(MemoryStore::new())
///     .require_key_for([http::Method::POST])
///     .build()
///     .unwrap();
/// let svc = layer.layer(service_fn(|_req: http::Request<Full<Bytes>>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
/// }));
///
/// // A POST without a key: refused by the layer, with its code.
/// let req = http::Request::post("/orders").body(Full::new(Bytes::new())).unwrap();
/// let res = svc.oneshot(req).await.unwrap();
/// assert_eq!(res.status(), 400);
/// let code: ErrorCode = res.headers()[IDEMPOTENCY_ERROR].to_str().unwrap().parse().unwrap();
/// assert_eq!(code, ErrorCode::KeyMissing);
/// assert_eq!(code.as_str(), "IDEMPOTENCY_KEY_MISSING");
/// assert_eq!(code.to_string(), "IDEMPOTENCY_KEY_MISSING");
///
/// // Anything else is an error, never a panic.
/// assert!("IDEMPOTENCY_SOMETHING_ELSE".parse::<ErrorCode>().is_err());
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `IDEMPOTENCY_KEY_MISSING`, with `400`: the method requires an `Idempotency-Key` and the
    /// request has none.
    KeyMissing,
    /// `IDEMPOTENCY_KEY_INVALID`, with `400`: the key is empty, longer than 255 bytes, not
    /// visible ASCII, or repeated.
    KeyInvalid,
    /// `IDEMPOTENCY_KEY_IN_FLIGHT`, with `409` and `Retry-After`: the key's first request is
    /// still running.
    KeyInFlight,
    /// `IDEMPOTENCY_KEY_MISMATCH`, with `422`: the key was used before with a different request
    /// body.
    KeyMismatch,
    /// `IDEMPOTENCY_KEY_EXPIRED`, with `410 Gone`: the key's record outlived its retention. The
    /// result is no longer replayed, and the key may not name a new request until the record is
    /// swept: use a new key, after checking by the business key whether the first request took
    /// effect.
    KeyExpired,
    /// `IDEMPOTENCY_BODY_TOO_LARGE`, with `413`: the request body is over the layer's limit; it
    /// was not hashed.
    BodyTooLarge,
    /// `IDEMPOTENCY_TENANT_MISSING`, with `401`: the tenant extractor found no tenant.
    TenantMissing,
    /// `IDEMPOTENCY_STORE_UNAVAILABLE`, with `503` and `Retry-After`: the store could not be
    /// reached; the handler did not run.
    StoreUnavailable,
    /// `IDEMPOTENCY_REQUEST_REJECTED`, with `400`: the store refused a value the request itself
    /// brought; the handler did not run, and the same request would be refused again.
    RequestRejected,
    /// `REQUEST_BODY_FAILED`, with `400`: reading the request body failed (the client's stream
    /// broke off, or its body errored); the handler did not run.
    RequestBodyFailed,
    /// `IDEMPOTENCY_OUTCOME_UNKNOWN`, with `202 Accepted`: the key's record is `UNKNOWN`. An
    /// earlier owner's work may have taken effect (it died after a step it had checkpointed),
    /// and nobody has settled it yet; the handler does not run again until it is settled, after
    /// which the settled result is replayed. surely's client classifies this answer *maybe
    /// committed, do not retry now*: the call ends [`Unknown`](crate::Outcome::Unknown).
    OutcomeUnknown,
    /// `IDEMPOTENCY_REPLAY_FAILED`, with `500`: the key's stored response could not be read
    /// back (its seal did not open, it was stored in a form this server cannot read); the
    /// handler did not run again.
    ReplayFailed,
    /// `IDEMPOTENCY_COMMIT_UNKNOWN`, with `503` and `Retry-After`: with the key claimed
    /// [in the handler's transaction][super::IdempotencyLayerBuilder::in_transaction], the
    /// connection failed while the commit was on its way, so the request may have taken effect.
    /// Send it again with the same key: it is replayed if it committed, and runs if it did not.
    #[cfg_attr(
        not(all(feature = "server", feature = "postgres")),
        doc = crate::docs::links::to_features!(
            "super::IdempotencyLayerBuilder::in_transaction",
        )
    )]
    CommitUnknown,
}

impl ErrorCode {
    /// Every code, in the order of the variants.
    const ALL: [ErrorCode; 13] = [
        ErrorCode::KeyMissing,
        ErrorCode::KeyInvalid,
        ErrorCode::KeyInFlight,
        ErrorCode::KeyMismatch,
        ErrorCode::KeyExpired,
        ErrorCode::BodyTooLarge,
        ErrorCode::TenantMissing,
        ErrorCode::StoreUnavailable,
        ErrorCode::RequestRejected,
        ErrorCode::RequestBodyFailed,
        ErrorCode::OutcomeUnknown,
        ErrorCode::ReplayFailed,
        ErrorCode::CommitUnknown,
    ];

    /// The code as it is on the wire, such as `IDEMPOTENCY_KEY_MISSING`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorCode::KeyMissing => "IDEMPOTENCY_KEY_MISSING",
            ErrorCode::KeyInvalid => "IDEMPOTENCY_KEY_INVALID",
            ErrorCode::KeyInFlight => "IDEMPOTENCY_KEY_IN_FLIGHT",
            ErrorCode::KeyMismatch => "IDEMPOTENCY_KEY_MISMATCH",
            ErrorCode::KeyExpired => "IDEMPOTENCY_KEY_EXPIRED",
            ErrorCode::BodyTooLarge => "IDEMPOTENCY_BODY_TOO_LARGE",
            ErrorCode::TenantMissing => "IDEMPOTENCY_TENANT_MISSING",
            ErrorCode::StoreUnavailable => "IDEMPOTENCY_STORE_UNAVAILABLE",
            ErrorCode::RequestRejected => "IDEMPOTENCY_REQUEST_REJECTED",
            ErrorCode::RequestBodyFailed => "REQUEST_BODY_FAILED",
            ErrorCode::OutcomeUnknown => crate::headers::OUTCOME_UNKNOWN_CODE,
            ErrorCode::ReplayFailed => "IDEMPOTENCY_REPLAY_FAILED",
            ErrorCode::CommitUnknown => "IDEMPOTENCY_COMMIT_UNKNOWN",
        }
    }
}

impl ErrorCode {
    /// The problem's `title` in its [problem details](crate::server::problem): a short,
    /// human-readable summary that does not change from one occurrence to the next.
    pub fn title(&self) -> &'static str {
        match self {
            ErrorCode::KeyMissing => "Idempotency-Key is missing",
            ErrorCode::KeyInvalid => "Idempotency-Key is invalid",
            ErrorCode::KeyInFlight => "A request is outstanding for this Idempotency-Key",
            ErrorCode::KeyMismatch => "Idempotency-Key is already used with another request",
            ErrorCode::KeyExpired => "Idempotency-Key has expired",
            ErrorCode::BodyTooLarge => "Request body too large to check",
            ErrorCode::TenantMissing => "No tenant for the Idempotency-Key",
            ErrorCode::StoreUnavailable => "Idempotency store unavailable",
            ErrorCode::RequestRejected => "Request refused by the idempotency store",
            ErrorCode::RequestBodyFailed => "Request body could not be read",
            ErrorCode::OutcomeUnknown => "Outcome unknown",
            ErrorCode::ReplayFailed => "Stored response could not be replayed",
            ErrorCode::CommitUnknown => "Outcome of the commit unknown",
        }
    }

    /// The status the layer answers this code with.
    pub fn status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            ErrorCode::KeyMissing
            | ErrorCode::KeyInvalid
            | ErrorCode::RequestRejected
            | ErrorCode::RequestBodyFailed => S::BAD_REQUEST,
            ErrorCode::KeyInFlight => S::CONFLICT,
            ErrorCode::KeyMismatch => S::UNPROCESSABLE_ENTITY,
            ErrorCode::KeyExpired => S::GONE,
            ErrorCode::BodyTooLarge => S::PAYLOAD_TOO_LARGE,
            ErrorCode::TenantMissing => S::UNAUTHORIZED,
            ErrorCode::StoreUnavailable | ErrorCode::CommitUnknown => S::SERVICE_UNAVAILABLE,
            ErrorCode::OutcomeUnknown => S::ACCEPTED,
            ErrorCode::ReplayFailed => S::INTERNAL_SERVER_ERROR,
        }
    }

    /// Every code, in the order of the variants.
    pub fn all() -> impl Iterator<Item = ErrorCode> {
        ErrorCode::ALL.into_iter()
    }
}

impl fmt::Display for ErrorCode {
    /// The code as it is on the wire ([`as_str`](ErrorCode::as_str)).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ErrorCode {
    type Err = UnknownErrorCode;

    /// The code whose wire form is `s`, exactly (case included).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorCode::ALL
            .into_iter()
            .find(|code| code.as_str() == s)
            .ok_or(UnknownErrorCode { _private: () })
    }
}

/// A string that is not one of the [`ErrorCode`]s, from [`str::parse`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an idempotency error code")]
pub struct UnknownErrorCode {
    _private: (),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_and_the_wire_forms_stay() {
        let wire: Vec<&str> = ErrorCode::ALL.iter().map(ErrorCode::as_str).collect();
        assert_eq!(
            wire,
            [
                "IDEMPOTENCY_KEY_MISSING",
                "IDEMPOTENCY_KEY_INVALID",
                "IDEMPOTENCY_KEY_IN_FLIGHT",
                "IDEMPOTENCY_KEY_MISMATCH",
                "IDEMPOTENCY_KEY_EXPIRED",
                "IDEMPOTENCY_BODY_TOO_LARGE",
                "IDEMPOTENCY_TENANT_MISSING",
                "IDEMPOTENCY_STORE_UNAVAILABLE",
                "IDEMPOTENCY_REQUEST_REJECTED",
                "REQUEST_BODY_FAILED",
                "IDEMPOTENCY_OUTCOME_UNKNOWN",
                "IDEMPOTENCY_REPLAY_FAILED",
                "IDEMPOTENCY_COMMIT_UNKNOWN",
            ]
        );
        for code in ErrorCode::ALL {
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            assert_eq!(code.to_string(), code.as_str());
        }
    }

    #[test]
    fn anything_else_is_unknown() {
        for s in [
            "",
            "idempotency_key_missing",
            "IDEMPOTENCY_KEY_MISSING ",
            "IDEMPOTENCY_",
            "REQUEST_BODY_FAILED ",
            "\u{0}",
            "é",
        ] {
            let err = s.parse::<ErrorCode>().unwrap_err();
            assert_eq!(err.to_string(), "not an idempotency error code");
        }
    }
}
