//! Idempotency keys, client side: one key per logical call, the same on every attempt.
//!
//! A POST whose reply was lost cannot be sent again: the server may have created the order,
//! and a second POST creates a second one. With an `Idempotency-Key` header (IETF draft
//! `draft-ietf-httpapi-idempotency-key-header`), a server that honours it remembers the key with
//! the first request's result, and answers a repeat with that result instead of doing the work
//! twice. The request becomes [`Semantics::Keyed`]: the retry layer may repeat it after a timeout
//! or a 502, and a lost reply no longer leaves the outcome unknown for good.
//!
//! [`SetIdempotencyKeyLayer`] gives each call its key: the caller's, if the request carries one (an
//! `Idempotency-Key` header, or an [`IdempotencyKey`] in its extensions), otherwise a fresh random
//! one ([`IdempotencyKey::generate`]), but only for requests that need it: by default those whose
//! semantics are neither safe nor idempotent (POST, PATCH, any method not in RFC 9110's lists; a
//! [`Semantics`] extension overrides the method, as everywhere in the crate). [`always`] and
//! [`for_methods`](SetIdempotencyKeyLayer::for_methods) choose differently, and
//! [`when`](SetIdempotencyKeyLayer::when) takes any predicate.
//!
//! # A key promises only what the server does with it
//!
//! A key the caller set makes the request [`Keyed`](crate::Semantics::Keyed): the caller knows its
//! server. A key the layer generates does so only when the layer was told that the server honours
//! keys ([`server_honours_keys`](SetIdempotencyKeyLayer::server_honours_keys)); otherwise it is sent
//! all the same, but the request keeps the semantics of its method, and a POST whose reply was lost
//! is not sent again to a server that might run it twice. A [`Semantics`] extension set by the
//! caller always wins.
//!
//! # One key per intent, not per attempt
//!
//! The key names *what the caller wants done*, once. If each attempt had its own key, the server
//! would see two different requests and do the work twice: exactly what the key is for
//! preventing. So the key is made **outside** the retry layer, written into the request, and
//! every attempt sends a copy of that request, with the same key. That is also why the layer sits
//! *inside* the deadline layer: the deadline bounds the whole call, the key names it, and the
//! retries happen within both (see the crate's layer order):
//!
//! ```text
//! record::RecordCallLayer
//!   deadline::SetDeadlineLayer
//!     idempotency::SetIdempotencyKeyLayer     one key per call
//!       retry                              every attempt sends the same key
//!         ... attempt timeout, transport
//! ```
//!
//! # What the server does with it
//!
//! A server that honours keys (this crate's [server layer][crate::server::idempotency], or most payment APIs)
//! answers:
//!
//! * **a repeat of a finished request**: the stored response of the first one, without doing the
//!   work again;
//! * **a repeat while the first is still running**: `409 Conflict`, with `Retry-After` or the
//!   [`idempotency-key-in-flight`](crate::headers::KEY_IN_FLIGHT) header. The
//!   [`HttpClassifier`](crate::classify::HttpClassifier) classifies that as *rejected* for a keyed
//!   request: retry later, **with the same key**. A 409 without either marker is a business
//!   conflict, and is not retried;
//! * **the same key with a different payload**: `422 Unprocessable Content`, which is *final*: the
//!   caller reused a key for another intent.
//!
//! # Invalid keys
//!
//! A caller's key must be 1 to 255 bytes of visible ASCII (see [`IdempotencyKey`]) and the
//! header must appear once. Otherwise the call fails with [`InvalidKey`]
//! ([`Error::invalid_key`]), without calling the inner service; the error is classified *final*
//! and *not sent*.
//!
//! # Requests without headers
//!
//! The layer works on any [`Envelope`]: [`http::Request`] (so hyper, tonic, and any HTTP
//! transport), and request types of your own. A type whose [`Envelope::headers_mut`] returns
//! `None`, the default, has nowhere to put a key: the layer passes it through unchanged.
//!
//! # Allocations
//!
//! A generated key costs one allocation for its bytes, which the header and the extension share,
//! plus the extension insert (the request's extension map, if it had none yet, and the boxed
//! key), and, for a server not declared to honour keys, one more boxed extension that keeps the
//! request's semantics. A caller's key given as a header costs none: it is validated in place, kept as it is,
//! and not copied into the extensions. A caller's key given as an extension costs none either
//! (the header shares its bytes). A request that needs no key costs one look at its headers.
//!
//! # Example
//!
//! ```
//! use surely::idempotency::{IdempotencyKey, SetIdempotencyKeyLayer};
//! use surely::{Envelope, Semantics};
//! use surely::headers::IDEMPOTENCY_KEY;
//! use tower::{service_fn, Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let server = service_fn(|req: http::Request<&'static str>| async move {
//!     // The transport sees a keyed request: this client was told its server honours keys.
//!     assert_eq!(req.semantics(), Semantics::Keyed);
//!     let key = req.headers()[IDEMPOTENCY_KEY].clone();
//!     // Layers in between find the same key in the extensions.
//!     assert_eq!(req.extensions().get::<IdempotencyKey>().unwrap().to_header_value(), key);
//!     Ok::<_, std::io::Error>(http::Response::new(()))
//! });
//! let mut client = SetIdempotencyKeyLayer::new().server_honours_keys().layer(server);
//!
//! let order = http::Request::post("/orders").body("o-1").unwrap();
//! client.ready().await.unwrap().call(order).await.unwrap();
//!
//! // A bad caller key never leaves the process.
//! let bad = http::Request::post("/orders").header(IDEMPOTENCY_KEY, "two words").body("o-2").unwrap();
//! let err = client.ready().await.unwrap().call(bad).await.unwrap_err();
//! assert_eq!(err.invalid_key().unwrap().invalid_byte(), Some((3, b' ')));
//! # }
//! ```
//!
//! # How this differs from a hand-written header
//!
//! tower has no such layer; a `SetRequestHeader` from tower-http with a random value would make a
//! key per *attempt* if placed under the retry layer, and would not validate a caller's key. This
//! layer makes one per call, keeps the caller's, refuses bad ones before they are sent, and
//! leaves requests that need no key alone.
//!
//! [`always`]: SetIdempotencyKeyLayer::always
//! [`Semantics`]: crate::Semantics
//! [`Semantics::Keyed`]: crate::Semantics::Keyed
//! [`Error::invalid_key`]: crate::Error::invalid_key
//! [`Envelope::headers_mut`]: crate::Envelope::headers_mut
//! [`Envelope`]: crate::Envelope
#![cfg_attr(
    not(feature = "server"),
    doc = crate::docs::links::to_features!(
        "crate::server::idempotency",
    )
)]

pub mod future;
mod layer;
mod policy;
mod service;

pub use self::layer::SetIdempotencyKeyLayer;
pub use self::policy::{Always, KeyPolicy, Methods, NonIdempotent};
pub use self::service::SetIdempotencyKey;
pub use crate::ids::{IdempotencyKey, InvalidKey};
