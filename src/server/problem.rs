//! The problem details of the server layers' own answers (RFC 9457).
//!
//! An answer a layer writes itself, rather than the handler, has a body a generic client or a
//! gateway can read: `Content-Type: application/problem+json` and a JSON object with
//!
//! * `type`: a URI that documents the problem, made of a base and the problem's name below
//!   (by default this page: `https://docs.rs/surely/latest/surely/server/problem/index.html#`
//!   and the name, so each type leads to its heading here);
//! * `title`: a summary that is the same for every occurrence;
//! * `status`: the status code, as in the response's head;
//! * `detail`: what happened this time, never built from the request: it does not echo a key,
//!   a header or a body;
//! * `code`: the stable code (`IDEMPOTENCY_KEY_MISSING`, `DEADLINE_EXCEEDED`, `OVERLOADED`,
//!   ...); the idempotency layer's is also in the
//!   [`IDEMPOTENCY_ERROR`](crate::headers::IDEMPOTENCY_ERROR) header, which stays so that
//!   clients written against it keep working.
//!
//! The layers that answer this way are the idempotency layer (all its codes, and `202` for an
//! outcome being settled), the deadline layers ([`ServerDeadlineLayer`] and [`RecheckLayer`]:
//! a spent budget, a timeout header that does not parse) and the adaptive limit
//! ([`AdaptiveLimitLayer`]: a refusal). The deadline and limit layers keep the handler's body
//! type and wrap it in [`ResponseBody`](crate::server::ResponseBody), which is either the
//! handler's body or the problem; gRPC refusals stay trailers-only (`grpc-status` and
//! `grpc-message` in the head, no body), as gRPC clients expect.
//!
//! A service that documents its own errors sets its own base
//! ([`IdempotencyLayerBuilder::problem_base`](crate::server::idempotency::IdempotencyLayerBuilder::problem_base),
//! [`ServerDeadlineLayerBuilder::problem_base`], [`RecheckLayer::problem_base`],
//! [`AdaptiveLimitLayerBuilder::problem_base`], or `problem_base` in each layer's section of
//! the server's configuration), and its answers then also carry
//! `Link: <type>; rel="describedby"`, as the `Idempotency-Key` draft suggests. A base that is
//! not an absolute URI (a scheme and an authority: `https://api.example.com/problems/`) is
//! refused when the layer is built.
//!
//! # What a client reads
//!
//! The headers a client of this crate reads stay: `idempotency-error` with the code, and
//! `surely-not-processed` on the refusals that did not run the handler. The problem details
//! are for everyone else: a generic client, a gateway, a person reading a log. When a gateway
//! drops the `idempotency-error` header, the classifier still finds the "outcome unknown" `202`
//! by its problem type in the `Link`. It reads a `Link` only where that makes it more careful:
//! "not processed" is believed from the `surely-not-processed` header alone, never from a
//! problem's name, because a `504` wrongly read as "not processed" would send a write again.
//!
//! [`ServerDeadlineLayerBuilder::problem_base`]: crate::server::deadline::ServerDeadlineLayerBuilder::problem_base
//! [`RecheckLayer::problem_base`]: crate::server::deadline::RecheckLayer::problem_base
//! [`AdaptiveLimitLayerBuilder::problem_base`]: crate::server::limit::AdaptiveLimitLayerBuilder::problem_base
//! [`ServerDeadlineLayer`]: crate::server::deadline::ServerDeadlineLayer
//! [`RecheckLayer`]: crate::server::deadline::RecheckLayer
//! [`AdaptiveLimitLayer`]: crate::server::limit::AdaptiveLimitLayer
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use surely::server::idempotency::IdempotencyLayer;
//! use surely::server::store::MemoryStore;
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let layer = IdempotencyLayer::builder(MemoryStore::new())
//!     .require_key_for([http::Method::POST])
//!     .problem_base("https://api.example.com/problems/")
//!     .build()
//!     .unwrap();
//! let svc = layer.layer(service_fn(|_req: http::Request<Full<Bytes>>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::new())))
//! }));
//! let req = http::Request::post("/orders").body(Full::new(Bytes::new())).unwrap();
//! let res = svc.oneshot(req).await.unwrap();
//! assert_eq!(res.status(), 400);
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! assert_eq!(
//!     res.headers()["link"],
//!     "<https://api.example.com/problems/idempotency-key-missing>; rel=\"describedby\""
//! );
//! let body = res.into_body().collect().await.unwrap().to_bytes();
//! let body = std::str::from_utf8(&body).unwrap();
//! assert!(body.starts_with(
//!     r#"{"type":"https://api.example.com/problems/idempotency-key-missing","title":"Idempotency-Key is missing","status":400,"#
//! ));
//! assert!(body.ends_with(r#","code":"IDEMPOTENCY_KEY_MISSING"}"#));
//! # }
//! ```
//!
//! # The problems
//!
//! Each heading is a problem's name, the end of its `type`.
//!
//! ### idempotency-key-missing
//! `400`: the method requires an `Idempotency-Key` and the request has none. Send one: the
//! same key on every attempt of one intent.
//!
//! ### idempotency-key-invalid
//! `400`: the key is empty, longer than 255 bytes, not visible ASCII, or there are two.
//!
//! ### idempotency-key-in-flight
//! `409`, with `Retry-After`: the key's first request is still running. Send the same request
//! again with the same key later; nothing needs correcting.
//!
//! ### idempotency-key-mismatch
//! `422`: the key was used before with another request. A key stands for one intent: use a new
//! key for a new request.
//!
//! ### idempotency-key-expired
//! `410`: the key's record outlived its retention; its result is no longer replayed. Check by
//! the business key whether the first request took effect before using a new key.
//!
//! ### idempotency-body-too-large
//! `413`: the request body is over the layer's limit, so it could not be checked against the
//! key's first request.
//!
//! ### idempotency-tenant-missing
//! `401`: the request names no tenant, and keys are kept per tenant.
//!
//! ### idempotency-store-unavailable
//! `503`, with `Retry-After`: the store could not be reached; the handler did not run. Send it
//! again with the same key.
//!
//! ### idempotency-request-rejected
//! `400`: the store refused a value the request brought; the same request would be refused
//! again.
//!
//! ### request-body-failed
//! `400`: the request body could not be read; the handler did not run.
//!
//! ### idempotency-outcome-unknown
//! `202`: the key's first request may have taken effect, and is being settled. Do not send it
//! again with a new key: the settled result is replayed to this key.
//!
//! ### idempotency-replay-failed
//! `500`: the stored response could not be read back; the handler did not run again.
//!
//! ### idempotency-commit-unknown
//! `503`, with `Retry-After`: the commit's outcome is unknown. Send it again with the same key:
//! it is replayed if it committed, and runs if it did not.
//!
//! ### deadline-exceeded
//! `504`, with `surely-not-processed: deadline`: the request's deadline (its timeout header,
//! capped by the server's maximum, or what was left when a [`RecheckLayer`] looked) was spent
//! or under the server's minimum before the handler started; the handler did not run. A caller
//! with budget left may send it again.
//!
//! ### deadline-invalid
//! `400`: the request's timeout header does not parse (the `detail` says why, never what it
//! held); the handler did not run.
//!
//! ### overloaded
//! `503`, with `Retry-After` and `surely-not-processed: overload`: the adaptive limit is full
//! and refused the request before processing it. Send it again after the wait, within the
//! retry budget.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;

use crate::ConfigError;

/// The media type of a problem's body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The base of the problems' `type` URIs unless a service sets its own: the headings of this
/// page.
pub const DEFAULT_BASE: &str = "https://docs.rs/surely/latest/surely/server/problem/index.html#";

/// Where a layer's problem types point: this page, or the service's own documentation (then
/// linked from each answer too).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Problems {
    /// The service's own base, checked; `None`: [`DEFAULT_BASE`], and no `Link` header.
    base: Option<Arc<str>>,
}

impl Problems {
    /// Problems under `base`, which must be an absolute URI (a scheme and an authority) of
    /// visible ASCII that a `Link` header can carry.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] of `setting` otherwise.
    pub(crate) fn at(base: &str, setting: &'static str) -> Result<Self, ConfigError> {
        let refuse = |why: &str| ConfigError::new(setting, why.to_owned());
        if base.is_empty() {
            return Err(refuse("must be an absolute URI, not empty"));
        }
        if base.len() > 1024 {
            return Err(refuse("must be at most 1024 bytes"));
        }
        if !base
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'<' | b'>' | b'"' | b'\\'))
        {
            return Err(refuse(
                "must be visible ASCII without spaces, quotes, backslashes or angle brackets",
            ));
        }
        let uri: http::Uri = base.parse().map_err(|_| {
            refuse("must be an absolute URI, such as https://api.example.com/problems/")
        })?;
        if uri.scheme().is_none() || uri.authority().is_none() {
            return Err(refuse(
                "must be an absolute URI with a scheme and a host, such as https://api.example.com/problems/",
            ));
        }
        Ok(Self {
            base: Some(Arc::from(base)),
        })
    }

    /// The `type` of the problem named `name`.
    pub(crate) fn type_uri(&self, name: &str) -> String {
        let base = self.base.as_deref().unwrap_or(DEFAULT_BASE);
        let mut uri = String::with_capacity(base.len() + name.len());
        uri.push_str(base);
        uri.push_str(name);
        uri
    }

    /// An answer of the layer's own: `status`, the problem details of `code` (named by its
    /// lower-case, dashed form) with `title` and `detail`, the media type, and the `Link` when
    /// the service set a base.
    pub(crate) fn respond(
        &self,
        status: StatusCode,
        code: &str,
        title: &str,
        detail: &str,
    ) -> Response<Full<Bytes>> {
        self.answer(status, code, title, detail).map(Full::new)
    }

    /// [`respond`](Self::respond)'s answer with its body as bytes, for a layer whose body type
    /// is its own.
    pub(crate) fn answer(
        &self,
        status: StatusCode,
        code: &str,
        title: &str,
        detail: &str,
    ) -> Response<Bytes> {
        let type_uri = self.type_uri(&name_of(code));
        let mut body = String::with_capacity(96 + type_uri.len() + title.len() + detail.len());
        body.push_str("{\"type\":");
        json_string(&mut body, &type_uri);
        body.push_str(",\"title\":");
        json_string(&mut body, title);
        let _ = write!(body, ",\"status\":{}", status.as_u16());
        body.push_str(",\"detail\":");
        json_string(&mut body, detail);
        body.push_str(",\"code\":");
        json_string(&mut body, code);
        body.push('}');
        let mut res = Response::new(Bytes::from(body));
        *res.status_mut() = status;
        let headers = res.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if self.base.is_some() {
            // Checked visible ASCII without angle brackets or quotes: always a valid value.
            if let Ok(link) = HeaderValue::try_from(format!("<{type_uri}>; rel=\"describedby\"")) {
                headers.insert(header::LINK, link);
            }
        }
        res
    }
}

impl Problems {
    /// The deadline layers' refusal of a request whose budget was spent (or under the
    /// server's minimum) before its handler started.
    pub(crate) fn deadline_exceeded(&self) -> Response<Bytes> {
        self.answer(
            StatusCode::GATEWAY_TIMEOUT,
            DEADLINE_EXCEEDED,
            "Deadline exceeded before processing",
            "The request's deadline left too little time to start it; the handler did not run.",
        )
    }

    /// The deadline layer's refusal of a timeout header it cannot read; `why` is the parser's
    /// message, which names the fault, never the value.
    pub(crate) fn deadline_invalid(&self, why: &str) -> Response<Bytes> {
        self.answer(
            StatusCode::BAD_REQUEST,
            DEADLINE_INVALID,
            "Deadline header is invalid",
            why,
        )
    }

    /// The adaptive limit's refusal.
    pub(crate) fn overloaded(&self) -> Response<Bytes> {
        self.answer(
            StatusCode::SERVICE_UNAVAILABLE,
            OVERLOADED,
            "Overloaded",
            "The service is at its concurrency limit and refused the request before processing it.",
        )
    }
}

/// The code of the deadline layers' refusal (`504`).
pub(crate) const DEADLINE_EXCEEDED: &str = "DEADLINE_EXCEEDED";
/// The code of a timeout header that does not parse (`400`).
pub(crate) const DEADLINE_INVALID: &str = "DEADLINE_INVALID";
/// The code of the adaptive limit's refusal (`503`).
pub(crate) const OVERLOADED: &str = "OVERLOADED";

/// A code's problem name: `IDEMPOTENCY_KEY_MISSING` is `idempotency-key-missing`.
pub(crate) fn name_of(code: &str) -> String {
    code.chars()
        .map(|c| match c {
            '_' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// `s` as a JSON string, escaped, appended to `out`.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_is_an_absolute_uri_or_refused() {
        for good in [
            "https://api.example.com/problems/",
            "http://localhost:8080/errors#",
            "https://example.com",
        ] {
            assert!(Problems::at(good, "problem base").is_ok(), "{good}");
        }
        for bad in [
            "",
            "/problems/",
            "problems",
            "https://exa mple.com/",
            "https://example.com/<x>",
            "https://example.com/\"",
            "https://example.com/é",
            "mailto:someone",
        ] {
            let e = Problems::at(bad, "problem base").unwrap_err();
            assert_eq!(e.setting(), "problem base", "{bad}");
        }
        assert!(Problems::at(&format!("https://e.com/{}", "a".repeat(2000)), "b").is_err());
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut out = String::new();
        json_string(&mut out, "a\"b\\c\nd\u{1}e\u{2028}");
        assert_eq!(out, r#""a\"b\\c\nd\u0001e\u2028""#);
    }

    #[test]
    fn names_are_lower_case_and_dashed() {
        assert_eq!(
            name_of("IDEMPOTENCY_KEY_MISSING"),
            "idempotency-key-missing"
        );
    }
}
