//! The client idempotency key layer through the public API: which requests get a key, that
//! every attempt of a call sends the same one, and what happens to a caller's key, good or bad.

use std::collections::HashSet;
use std::future::{ready, Ready};
use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{HeaderValue, Method, Request, Response};
use proptest::prelude::*;
use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
use surely::headers::IDEMPOTENCY_KEY;
use surely::idempotency::InvalidKey;
use surely::idempotency::{IdempotencyKey, SetIdempotencyKeyLayer};
use surely::{Envelope, Error, Semantics};
use tower::{Layer, Service, ServiceExt};

/// What the transport saw of one request.
#[derive(Clone, Debug)]
struct Seen {
    header: Option<HeaderValue>,
    extension: Option<IdempotencyKey>,
    semantics: Semantics,
}

/// A transport that records what it saw, and answers 200.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Recorder {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl<B> Service<Request<B>> for Recorder {
    type Response = Response<()>;
    type Error = io::Error;
    type Future = Ready<Result<Response<()>, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.seen.lock().unwrap().push(Seen {
            header: req.headers().get(IDEMPOTENCY_KEY).cloned(),
            extension: req.extensions().get::<IdempotencyKey>().cloned(),
            semantics: req.semantics(),
        });
        ready(Ok(Response::new(())))
    }
}

/// A stand-in for the retry layer: sends a copy of the request, then the request itself.
#[derive(Clone)]
struct TwoAttempts<S>(S);

impl<S, B> Service<Request<B>> for TwoAttempts<S>
where
    S: Service<Request<B>, Response = Response<()>, Error = io::Error>,
    B: Clone,
{
    type Response = Response<()>;
    type Error = io::Error;
    type Future = Ready<Result<Response<()>, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The recorder's futures are ready at once.
        let first = self.0.call(req.clone());
        drop(first);
        let second = self.0.call(req);
        drop(second);
        ready(Ok(Response::new(())))
    }
}

fn request(method: Method) -> Request<String> {
    Request::builder()
        .method(method)
        .uri("/orders")
        .body("o-1".to_owned())
        .unwrap()
}

async fn send<S, Req>(svc: &mut S, req: Req) -> Result<S::Response, S::Error>
where
    S: Service<Req>,
{
    svc.ready().await?.call(req).await
}

fn is_valid(key: &[u8]) -> bool {
    (1..=255).contains(&key.len()) && key.iter().all(|b| (0x21..=0x7e).contains(b))
}

// ---- the key type -------------------------------------------------------------------------

#[test]
fn generated_keys_are_valid_uuid_v4_shaped_and_unique() {
    let mut keys = HashSet::new();
    for _ in 0..10_000 {
        let key = IdempotencyKey::generate();
        let s = key.as_str();
        assert!(is_valid(s.as_bytes()), "{s}");
        assert_eq!(IdempotencyKey::new(s).unwrap(), key);
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "4", "version nibble: {s}");
        assert!("89ab".contains(&s[19..20]), "variant: {s}");
        assert!(s
            .bytes()
            .enumerate()
            .all(|(i, b)| if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
            }));
        assert_eq!(key.to_header_value(), s);
        keys.insert(key);
    }
    assert_eq!(keys.len(), 10_000);
}

#[test]
fn generated_keys_differ_across_threads() {
    let handles: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(|| {
                (0..100)
                    .map(|_| IdempotencyKey::generate())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all: HashSet<_> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(all.len(), 800);
}

#[test]
fn invalid_keys_say_what_is_wrong() {
    let empty = IdempotencyKey::new("").unwrap_err();
    assert!(empty.is_empty());
    assert_eq!(empty.to_string(), "invalid idempotency key: empty");

    let long = IdempotencyKey::new("k".repeat(256)).unwrap_err();
    assert_eq!(long.len_over_limit(), Some(256));
    assert_eq!(
        long.to_string(),
        "invalid idempotency key: 256 bytes long, at most 255 allowed"
    );
    assert!(IdempotencyKey::new("k".repeat(255)).is_ok());

    let space = IdempotencyKey::new("a b").unwrap_err();
    assert_eq!(space.invalid_byte(), Some((1, b' ')));
    let control = IdempotencyKey::new("ab\tc").unwrap_err();
    assert_eq!(control.invalid_byte(), Some((2, b'\t')));
    assert_eq!(
        control.to_string(),
        "invalid idempotency key: byte 0x09 at position 2 is not visible ascii (0x21..=0x7e)"
    );
    let del = IdempotencyKey::new("a\x7f").unwrap_err();
    assert_eq!(del.invalid_byte(), Some((1, 0x7f)));
    let accent = IdempotencyKey::new("caf\u{e9}").unwrap_err();
    assert_eq!(accent.invalid_byte(), Some((3, 0xc3)));

    // The edges of the range, and a quoted structured-field string, are fine.
    assert_eq!(IdempotencyKey::new("!~\"q\"").unwrap().as_str(), "!~\"q\"");
}

#[test]
fn an_invalid_key_error_is_final_and_not_sent() {
    let err: Error<io::Error> = IdempotencyKey::new("").unwrap_err().into();
    assert!(err.invalid_key().unwrap().is_empty());
    assert_eq!(err.local_phase(), Some(DeliveryPhase::NotSent));
    let c = err.classify_error(DeliveryPhase::Sent);
    assert_eq!(c.class(), AttemptClass::Final);
    assert_eq!(c.phase(), DeliveryPhase::NotSent);
    assert_eq!(err.to_string(), "invalid idempotency key: empty");

    // Boxed, as tower layers box errors, and bare.
    let boxed: surely::classify::BoxError = Box::new(err);
    assert_eq!(
        boxed.classify_error(DeliveryPhase::Sent).class(),
        AttemptClass::Final
    );
    let bare: surely::classify::BoxError = Box::new(IdempotencyKey::new("").unwrap_err());
    let c = bare.classify_error(DeliveryPhase::Sent);
    assert_eq!(
        (c.class(), c.phase()),
        (AttemptClass::Final, DeliveryPhase::NotSent)
    );
}

proptest! {
    #[test]
    fn new_accepts_exactly_the_valid_keys(s in any::<String>()) {
        let valid = is_valid(s.as_bytes());
        match IdempotencyKey::new(s.clone()) {
            Ok(key) => {
                prop_assert!(valid);
                prop_assert_eq!(key.as_str(), s.as_str());
            }
            Err(e) => {
                prop_assert!(!valid);
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    #[test]
    fn new_accepts_exactly_the_valid_ascii_keys(s in "[\\x00-\\x7f]{0,300}") {
        prop_assert_eq!(IdempotencyKey::new(s.clone()).is_ok(), is_valid(s.as_bytes()));
    }

    #[test]
    fn header_values_are_validated_like_strings(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            prop_assert_eq!(IdempotencyKey::from_header_value(&value).is_ok(), is_valid(&bytes));
        }
    }
}

// ---- which requests get a key ------------------------------------------------------------

#[tokio::test]
async fn non_idempotent_methods_get_a_key_by_default() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::new().layer(transport.clone());
    for method in [
        Method::POST,
        Method::PATCH,
        Method::from_bytes(b"CHARGE").unwrap(),
    ] {
        send(&mut svc, request(method)).await.unwrap();
    }
    for seen in transport.seen() {
        let header = seen.header.expect("a key header");
        let ext = seen.extension.expect("a key extension");
        assert_eq!(ext.to_header_value(), header);
        // Nobody said the server honours keys: the generated key is sent, and promises nothing.
        assert_eq!(seen.semantics, Semantics::NonIdempotent);
    }
}

#[tokio::test]
async fn a_generated_key_makes_the_request_keyed_only_for_a_server_that_honours_keys() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::new()
        .server_honours_keys()
        .layer(transport.clone());
    send(&mut svc, request(Method::POST)).await.unwrap();
    let seen = transport.seen();
    assert!(seen[0].header.is_some());
    assert_eq!(seen[0].semantics, Semantics::Keyed);
}

#[tokio::test]
async fn a_caller_key_makes_the_request_keyed_without_the_declaration() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::new().layer(transport.clone());
    let mut by_header = request(Method::POST);
    by_header
        .headers_mut()
        .insert(IDEMPOTENCY_KEY, HeaderValue::from_static("order-o-1"));
    send(&mut svc, by_header).await.unwrap();
    let mut by_extension = request(Method::POST);
    by_extension
        .extensions_mut()
        .insert(IdempotencyKey::new("order-o-2").unwrap());
    send(&mut svc, by_extension).await.unwrap();
    for seen in transport.seen() {
        assert_eq!(seen.semantics, Semantics::Keyed);
    }
}

#[tokio::test]
async fn an_explicit_semantics_wins_over_any_key() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::new()
        .server_honours_keys()
        .layer(transport.clone());
    // The caller says this POST must never be repeated: the key still goes out (it helps a
    // server that deduplicates the retries of refused attempts), the semantics stay.
    let mut once = request(Method::POST);
    once.extensions_mut().insert(Semantics::NonIdempotent);
    send(&mut svc, once).await.unwrap();
    // And a read stays a read under a policy that keys everything.
    let mut always = SetIdempotencyKeyLayer::always().layer(transport.clone());
    send(&mut always, request(Method::GET)).await.unwrap();
    let seen = transport.seen();
    assert!(seen[0].header.is_some());
    assert_eq!(seen[0].semantics, Semantics::NonIdempotent);
    assert!(seen[1].header.is_some());
    assert_eq!(seen[1].semantics, Semantics::Safe);
}

#[tokio::test]
async fn safe_and_idempotent_methods_get_no_key_by_default() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::new().layer(transport.clone());
    for method in [Method::GET, Method::HEAD, Method::PUT, Method::DELETE] {
        send(&mut svc, request(method)).await.unwrap();
    }
    let seen = transport.seen();
    assert_eq!(seen.len(), 4);
    assert!(seen
        .iter()
        .all(|s| s.header.is_none() && s.extension.is_none()));
}

#[tokio::test]
async fn a_semantics_extension_overrides_the_method() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::new().layer(transport.clone());
    let mut search = request(Method::POST);
    search.extensions_mut().insert(Semantics::Safe);
    send(&mut svc, search).await.unwrap();
    assert!(transport.seen()[0].header.is_none());
}

#[tokio::test]
async fn always_keys_reads_too() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::always().layer(transport.clone());
    send(&mut svc, request(Method::GET)).await.unwrap();
    let seen = &transport.seen()[0];
    assert!(seen.header.is_some());
    assert!(seen.extension.is_some());
    // A keyed GET is still safe.
    assert_eq!(seen.semantics, Semantics::Safe);
}

#[tokio::test]
async fn for_methods_keys_the_listed_methods_only() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::for_methods([Method::PUT]).layer(transport.clone());
    send(&mut svc, request(Method::PUT)).await.unwrap();
    send(&mut svc, request(Method::POST)).await.unwrap();
    let seen = transport.seen();
    assert!(seen[0].header.is_some());
    assert!(seen[1].header.is_none());
}

#[tokio::test]
async fn a_predicate_decides() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::when(|req: &dyn Envelope| {
        req.headers().is_some_and(|h| h.contains_key("x-pay"))
    })
    .layer(transport.clone());
    let mut pay = request(Method::GET);
    pay.headers_mut()
        .insert("x-pay", HeaderValue::from_static("1"));
    send(&mut svc, pay).await.unwrap();
    send(&mut svc, request(Method::POST)).await.unwrap();
    let seen = transport.seen();
    assert!(seen[0].header.is_some());
    assert!(seen[1].header.is_none());
}

// ---- one key per call -----------------------------------------------------------------------

#[tokio::test]
async fn every_attempt_of_a_call_sends_the_same_key() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::new()
        .server_honours_keys()
        .layer(TwoAttempts(transport.clone()));
    send(&mut svc, request(Method::POST)).await.unwrap();
    send(&mut svc, request(Method::POST)).await.unwrap();

    let seen = transport.seen();
    assert_eq!(seen.len(), 4);
    let keys: Vec<_> = seen.iter().map(|s| s.header.clone().unwrap()).collect();
    // Attempts of one call share the key; calls do not.
    assert_eq!(keys[0], keys[1]);
    assert_eq!(keys[2], keys[3]);
    assert_ne!(keys[0], keys[2]);
    assert_eq!(seen[0].extension, seen[1].extension);
    assert!(seen.iter().all(|s| s.semantics == Semantics::Keyed));
}

// ---- the caller's key -----------------------------------------------------------------------

#[tokio::test]
async fn a_caller_header_is_kept_as_it_is() {
    let transport = Recorder::default();
    let mut svc = SetIdempotencyKeyLayer::always().layer(transport.clone());
    let mut req = request(Method::POST);
    req.headers_mut()
        .insert(IDEMPOTENCY_KEY, HeaderValue::from_static("\"order-o-1\""));
    send(&mut svc, req).await.unwrap();
    let seen = &transport.seen()[0];
    assert_eq!(seen.header.as_ref().unwrap(), "\"order-o-1\"");
    // Not copied into the extensions: a caller's header costs nothing.
    assert!(seen.extension.is_none());
}

#[tokio::test]
async fn a_caller_extension_key_is_used() {
    let transport = Recorder::default();
    // Even for a method the policy would not key.
    let mut svc = SetIdempotencyKeyLayer::new().layer(transport.clone());
    let mut req = request(Method::GET);
    req.extensions_mut()
        .insert(IdempotencyKey::new("order-o-1").unwrap());
    send(&mut svc, req).await.unwrap();
    let seen = &transport.seen()[0];
    assert_eq!(seen.header.as_ref().unwrap(), "order-o-1");
    assert_eq!(seen.extension.as_ref().unwrap(), "order-o-1");
}

#[tokio::test]
async fn invalid_caller_keys_fail_the_call_without_sending_it() {
    type Case = (Vec<&'static [u8]>, fn(&InvalidKey) -> bool);
    let cases: Vec<Case> = vec![
        (vec![b""], |e| e.is_empty()),
        (vec![&[b'k'; 256]], |e| e.len_over_limit() == Some(256)),
        (vec![b"a b"], |e| e.invalid_byte() == Some((1, b' '))),
        (vec![b"a\tb"], |e| e.invalid_byte() == Some((1, b'\t'))),
        (vec![b"ab\xc3\xa9"], |e| e.invalid_byte() == Some((2, 0xc3))),
        (vec![b"a", b"b"], |e| e.is_repeated()),
    ];
    for (values, expected) in cases {
        let transport = Recorder::default();
        let mut svc = SetIdempotencyKeyLayer::new().layer(transport.clone());
        let mut req = request(Method::POST);
        for v in &values {
            req.headers_mut()
                .append(IDEMPOTENCY_KEY, HeaderValue::from_bytes(v).unwrap());
        }
        let err = send(&mut svc, req).await.unwrap_err();
        let invalid = err.invalid_key().expect("an invalid key error");
        assert!(expected(invalid), "{values:?}: {invalid}");
        assert!(transport.seen().is_empty(), "{values:?} was sent");
        let c = err.classify_error(DeliveryPhase::Sent);
        assert_eq!(c.class(), AttemptClass::Final);
        assert_eq!(c.phase(), DeliveryPhase::NotSent);
        assert!(!err.is_transport());
    }
}

// ---- requests without headers -------------------------------------------------------------

#[derive(Debug, PartialEq)]
struct CreateUser(&'static str);

impl Envelope for CreateUser {}

#[tokio::test]
async fn a_request_without_headers_passes_through() {
    let mut svc =
        SetIdempotencyKeyLayer::always().layer(tower::service_fn(|req: CreateUser| async move {
            Ok::<_, io::Error>(req)
        }));
    let back = send(&mut svc, CreateUser("ann")).await.unwrap();
    assert_eq!(back, CreateUser("ann"));
}

// ---- composition ----------------------------------------------------------------------------

#[tokio::test]
async fn layers_stack_without_nesting_errors() {
    let transport = tower::service_fn(|_: Request<String>| async {
        Err::<Response<()>, _>(io::Error::from(io::ErrorKind::ConnectionReset))
    });
    let mut svc = tower::ServiceBuilder::new()
        .layer(SetIdempotencyKeyLayer::new())
        .layer(surely::timeout::AttemptTimeoutLayer::deadline_only())
        .service(transport);
    let err: Error<io::Error> = send(&mut svc, request(Method::POST)).await.unwrap_err();
    assert!(err.is_transport());
    // Keyed, so a reset after send may be retried.
    assert!(err
        .classify_error(DeliveryPhase::Sent)
        .is_retryable(Semantics::Keyed));
}
