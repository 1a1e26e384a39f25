//! Request semantics as the classifiers see them.

use surely::headers::IDEMPOTENCY_KEY;
use surely::{Envelope, Semantics};

fn semantics(method: http::Method, key: bool) -> Semantics {
    let mut builder = http::Request::builder().method(method);
    if key {
        builder = builder.header(IDEMPOTENCY_KEY, "k-1");
    }
    builder.body(()).unwrap().semantics()
}

#[test]
fn from_method_and_key() {
    use http::Method;
    #[rustfmt::skip]
    let table = [
        // method           no key                     with key
        (Method::GET,     Semantics::Safe,          Semantics::Safe),
        (Method::HEAD,    Semantics::Safe,          Semantics::Safe),
        (Method::OPTIONS, Semantics::Safe,          Semantics::Safe),
        (Method::TRACE,   Semantics::Safe,          Semantics::Safe),
        (Method::PUT,     Semantics::Idempotent,    Semantics::Idempotent),
        (Method::DELETE,  Semantics::Idempotent,    Semantics::Idempotent),
        (Method::POST,    Semantics::NonIdempotent, Semantics::Keyed),
        (Method::PATCH,   Semantics::NonIdempotent, Semantics::Keyed),
        (Method::CONNECT, Semantics::NonIdempotent, Semantics::Keyed),
    ];
    for (method, plain, keyed) in table {
        assert_eq!(semantics(method.clone(), false), plain, "{method}");
        assert_eq!(semantics(method.clone(), true), keyed, "{method}");
        assert_eq!(Semantics::from_method(&method), plain, "{method}");
    }
    let custom = http::Method::from_bytes(b"PURGE").unwrap();
    assert_eq!(semantics(custom, false), Semantics::NonIdempotent);
}

#[test]
fn an_extension_overrides_method_and_key() {
    let mut req = http::Request::post("/search")
        .header(IDEMPOTENCY_KEY, "k")
        .body(())
        .unwrap();
    req.extensions_mut().insert(Semantics::Safe);
    assert_eq!(req.semantics(), Semantics::Safe);
    let mut req = http::Request::get("/reset").body(()).unwrap();
    req.extensions_mut().insert(Semantics::NonIdempotent);
    assert_eq!(req.semantics(), Semantics::NonIdempotent);
}

#[test]
fn a_custom_request_defaults_to_non_idempotent() {
    struct Custom;
    impl Envelope for Custom {}
    assert_eq!(Custom.semantics(), Semantics::NonIdempotent);
    assert!(!Custom.is_grpc());
}

#[test]
fn is_grpc_by_content_type() {
    for (ct, grpc) in [
        ("application/grpc", true),
        ("application/grpc+proto", true),
        ("application/json", false),
    ] {
        let req = http::Request::post("/x")
            .header(http::header::CONTENT_TYPE, ct)
            .body(())
            .unwrap();
        assert_eq!(req.is_grpc(), grpc, "{ct}");
    }
}
