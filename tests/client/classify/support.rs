//! Shared helpers: requests with each semantics, one-call classification, and an HTTP-date
//! formatter for round-trip properties.

use surely::classify::{
    AttemptClass, Classification, Classified, Classify, DeliveryPhase, GrpcEos, HttpClassifier,
    MakeClassifier, OutcomeTally,
};
use surely::headers::IDEMPOTENCY_KEY;
use surely::Outcome;
use surely::{Envelope, Semantics};

/// The four semantics, in the column order of every table in these tests.
pub(crate) const SEMANTICS: [Semantics; 4] = [
    Semantics::Safe,
    Semantics::Idempotent,
    Semantics::Keyed,
    Semantics::NonIdempotent,
];

/// The error type every layer of a client over an `io::Error` transport returns.
pub(crate) type IoError = surely::Error<std::io::Error>;

/// An HTTP request with these semantics, as the method and headers give them: GET, PUT, POST
/// with an `Idempotency-Key`, POST without one.
pub(crate) fn http_request(semantics: Semantics) -> http::Request<()> {
    let builder = match semantics {
        Semantics::Safe => http::Request::get("/orders/o-1"),
        Semantics::Idempotent => http::Request::put("/orders/o-1"),
        Semantics::Keyed => http::Request::post("/orders").header(IDEMPOTENCY_KEY, "order-o-1"),
        Semantics::NonIdempotent => http::Request::post("/orders"),
    };
    let req = builder.body(()).unwrap();
    assert_eq!(
        req.semantics(),
        semantics,
        "request built for {semantics:?}"
    );
    assert!(!req.is_grpc());
    req
}

/// A gRPC request (always a POST) with these semantics: a `Semantics` extension for the
/// safe and idempotent methods, an `Idempotency-Key` for the keyed one, nothing for the rest.
pub(crate) fn grpc_request(semantics: Semantics) -> http::Request<()> {
    let mut builder = http::Request::post("/shop.Orders/Place")
        .header(http::header::CONTENT_TYPE, "application/grpc+proto");
    match semantics {
        Semantics::Safe | Semantics::Idempotent => {
            builder = builder.extension(semantics);
        }
        Semantics::Keyed => builder = builder.header(IDEMPOTENCY_KEY, "order-o-1"),
        Semantics::NonIdempotent => {}
    }
    let req = builder.body(()).unwrap();
    assert_eq!(
        req.semantics(),
        semantics,
        "gRPC request built for {semantics:?}"
    );
    assert!(req.is_grpc());
    req
}

/// A header map from name/value pairs.
pub(crate) fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
    pairs
        .iter()
        .map(|&(name, value)| {
            (
                http::HeaderName::from_static(name),
                http::HeaderValue::from_static(value),
            )
        })
        .collect()
}

/// A response with this status and these headers.
pub(crate) fn response(status: u16, pairs: &[(&'static str, &'static str)]) -> http::Response<()> {
    let mut res = http::Response::builder().status(status).body(()).unwrap();
    *res.headers_mut() = headers(pairs);
    res
}

/// Classifies `res` for `req` with the built-in HTTP classifier.
pub(crate) fn classify_response(
    req: &http::Request<()>,
    res: &http::Response<()>,
) -> Classified<GrpcEos> {
    let classifier = HttpClassifier::new().make_classifier(req);
    Classify::<http::Response<()>, IoError>::classify_response(classifier, res)
}

/// Classifies `res` for `req`, which must be classified from the head.
pub(crate) fn classify_head(req: &http::Request<()>, res: &http::Response<()>) -> Classification {
    match classify_response(req, res) {
        Classified::Ready(c) => c,
        Classified::RequiresEos(_) => panic!("expected a classification from the head"),
    }
}

/// Classifies `error` for `req` with the built-in HTTP classifier, as a layer that believes
/// the request reached `phase`.
pub(crate) fn classify_error<E>(
    req: &http::Request<()>,
    error: &E,
    phase: DeliveryPhase,
) -> Classification
where
    E: surely::classify::ClassifyError,
{
    let classifier = HttpClassifier::new().make_classifier(req);
    Classify::<http::Response<()>, E>::classify_error(classifier, error, phase)
}

/// The outcome of a call whose only attempts had these classes.
pub(crate) fn outcome_of(semantics: Semantics, classes: &[AttemptClass]) -> Option<Outcome> {
    let mut tally = OutcomeTally::new(semantics);
    for &class in classes {
        tally.observe(class);
    }
    assert_eq!(tally.semantics(), semantics);
    tally.outcome()
}

const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Formats seconds since the Unix epoch as an IMF-fixdate (RFC 9110 §5.6.7), using Howard
/// Hinnant's `civil_from_days`.
pub(crate) fn imf_fixdate(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (hour, min, sec) = (rem / 3600, rem / 60 % 60, rem % 60);
    let weekday = WEEKDAYS[(days % 7) as usize];

    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month = MONTHS[(month - 1) as usize];
    format!("{weekday}, {day:02} {month} {year} {hour:02}:{min:02}:{sec:02} GMT")
}

#[test]
fn imf_fixdate_formats_known_dates() {
    assert_eq!(imf_fixdate(0), "Thu, 01 Jan 1970 00:00:00 GMT");
    assert_eq!(imf_fixdate(1_445_412_540), "Wed, 21 Oct 2015 07:29:00 GMT");
    assert_eq!(imf_fixdate(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
    assert_eq!(
        imf_fixdate(253_402_300_799),
        "Fri, 31 Dec 9999 23:59:59 GMT"
    );
}
