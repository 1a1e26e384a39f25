//! Every header name the crate reads or writes, in one place.
//!
//! The client layers write some (the budget, the key, the retry owner), the server layers others
//! (the replay mark, the refusal marks), and the classifiers read both. Each constant is also
//! re-exported by the module that uses it most.

use http::{HeaderMap, HeaderName};

/// The header that carries an idempotency key (IETF `Idempotency-Key` draft).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The default HTTP header that carries the remaining budget in milliseconds.
pub const DEFAULT_HEADER: HeaderName = HeaderName::from_static("x-request-timeout-ms");

/// The gRPC deadline header.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The header with which a retry layer tells the next hop that it owns retries for the request.
/// The [`ServerDeadlineLayer`][crate::server::deadline::ServerDeadlineLayer] carries it into the
/// handler's context, and a retry layer inside that handler then retries only attempts that
/// were provably not sent: retries do not multiply with the depth of the chain.
#[cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::deadline::ServerDeadlineLayer",
    )
)]
pub const RETRY_OWNER: HeaderName = HeaderName::from_static("surely-retry-owner");

/// The gRPC header that tells the server how many attempts came before this one.
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// The header with which a server-side idempotency layer marks a 409 as "the key's first request
/// is still running": for a keyed request it means "retry later with the same key".
pub const KEY_IN_FLIGHT: HeaderName = HeaderName::from_static("idempotency-key-in-flight");

/// The header with which a server says it did not process a request (its handler never ran),
/// whatever the status: [`ServerDeadlineLayer`][crate::server::deadline::ServerDeadlineLayer] sets it on
/// its refusals. The built-in classifiers take the server at its word: the attempt is
/// [`Rejected`](crate::classify::AttemptClass::Rejected).
#[cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::deadline::ServerDeadlineLayer",
    )
)]
pub const NOT_PROCESSED: HeaderName = HeaderName::from_static("surely-not-processed");

/// The header in which a request says how critical it is: `sheddable`, `sheddable-plus`,
/// `critical` or `critical-plus` (see [`Criticality`](crate::Criticality)). A server's
/// [adaptive limit][crate::server::limit] sheds the least critical first; from an untrusted
/// caller the header may lower a request's criticality, never raise it.
#[cfg_attr(not(feature = "server"), doc = crate::docs::links::to_features!("crate::server::limit"))]
pub const CRITICALITY: HeaderName = HeaderName::from_static("surely-criticality");

/// The gRPC pushback header, in milliseconds.
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The header that marks a replayed response: `idempotent-replayed: true`.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The header in which the idempotency layer's own error responses carry their code (also the
/// `code` of their problem details): one of the
/// [`ErrorCode`][crate::server::idempotency::ErrorCode]s, such as `IDEMPOTENCY_KEY_MISSING`.
#[cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::idempotency::ErrorCode",
    )
)]
pub const IDEMPOTENCY_ERROR: HeaderName = HeaderName::from_static("idempotency-error");

/// Set to `true` on a replay whose stored response's body was over the layer's stored-size
/// limit and was not kept: the status and headers are the first answer's, the body is empty.
pub const REPLAY_BODY_OMITTED: HeaderName =
    HeaderName::from_static("idempotent-replay-body-omitted");

/// The [`IDEMPOTENCY_ERROR`] code of a server's answer for a key whose outcome is unknown (with
/// `202 Accepted`): the client classifies it maybe committed, not to be retried now.
pub(crate) const OUTCOME_UNKNOWN_CODE: &str = "IDEMPOTENCY_OUTCOME_UNKNOWN";

/// The header in which the client stack hands a gRPC call's outcome to a tonic caller: written
/// on the response the stack returns over the gRPC transport, never sent to a server. tonic
/// builds an error `Status` from the response headers, so the value reaches the caller in
/// `Status::metadata()`; `surely::grpc::StatusExt` (feature `tonic`) reads it back (see
/// [What a tonic caller sees](crate::grpc#what-a-tonic-caller-sees)). The stack removes the
/// header from every response and trailer it receives, so a server cannot forge it.
///
/// The value is `<outcome>; attempts=<n>; stop=<reason>[; replayed][; left-ms=<ms>][; key=<key>]`:
/// the [`Outcome`](crate::Outcome) (`succeeded`, `failed`, `unknown`), the attempts that went
/// out, the [`StopReason`](crate::StopReason) with dashes for spaces (`attempts-exhausted`),
/// `replayed` for a stored replay, the budget left in whole milliseconds, and last the
/// idempotency key, written only when it is 1 to 255 bytes of visible ASCII (it may hold `;`).
/// Any other value reads as no outcome.
///
/// ```
/// assert_eq!(surely::headers::OUTCOME, "surely-outcome");
/// ```
pub const OUTCOME: HeaderName = HeaderName::from_static("surely-outcome");

/// The default response header read as the downstream request id.
pub const DEFAULT_REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// Up to how many distinct names [`may_hold`] compares names instead of looking one up.
const SCAN_UP_TO: usize = 8;

/// Whether `headers` may hold `name`; `false` means it does not. `http` hashes a custom name
/// byte by byte on every look-up (about a hundred instructions for `idempotency-key`), while a
/// request carries few names: comparing those few costs less, and a name of another kind than
/// `name` (a standard one against a custom one) differs at its first word. A map with more
/// names says `true`, and the caller looks the name up as usual.
#[inline]
pub(crate) fn may_hold(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers.keys_len() > SCAN_UP_TO || headers.keys().any(|k| k == name)
}

#[cfg(test)]
mod tests {
    use http::header::{ACCEPT, CONTENT_TYPE};
    use http::HeaderValue;

    use super::*;

    #[test]
    fn may_hold_is_false_only_for_a_name_that_is_not_there() {
        let mut headers = HeaderMap::new();
        assert!(!may_hold(&headers, &IDEMPOTENCY_KEY));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        assert!(!may_hold(&headers, &IDEMPOTENCY_KEY));
        assert!(!may_hold(&headers, &CONTENT_TYPE));
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("k-1"));
        headers.append(IDEMPOTENCY_KEY, HeaderValue::from_static("k-2"));
        assert!(may_hold(&headers, &IDEMPOTENCY_KEY));
        assert!(may_hold(&headers, &ACCEPT));
        // A name is found whatever case it was written in: names are lower case once parsed.
        let parsed: HeaderName = "Idempotency-Key".parse().expect("a valid name");
        assert!(may_hold(&headers, &parsed));
        // Past the scan, the answer is "maybe", and the look-up decides.
        for i in 0..SCAN_UP_TO {
            let name: HeaderName = format!("x-h{i}").parse().expect("a valid name");
            headers.insert(name, HeaderValue::from_static("v"));
        }
        assert!(may_hold(&headers, &RETRY_OWNER));
        assert!(headers.get(RETRY_OWNER).is_none());
    }
}
