//! The server layers configured from TOML, YAML and environment variables (feature `serde`):
//! one complete example in each form, the empty configuration as the defaults, a bad value
//! named by its field, and configured layers at work.
#![cfg(feature = "serde")]

use std::collections::HashMap;
use std::convert::Infallible;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use surely::server::config::ServerConfig;
use surely::server::deadline::{Malformed, ServerDeadlineLayer};
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::MemoryStore;
use tower::{service_fn, Layer, ServiceExt};

use crate::support::time::{ms, secs};

const TOML: &str = r#"
[deadline]
max = "5s"
min = "20ms"
http_header = "x-budget-ms"
malformed = "ignore"

[idempotency]
lease = "10s"
renew_for = "10m"
in_flight_retry_after = "2s"
retention = "7days"
max_body_bytes = 65536
max_stored_bytes = 262144
store_server_errors = false
require_key_for = ["POST", "PATCH"]
cancel_with_caller = true
"#;

const YAML: &str = r#"
deadline:
  max: 5s
  min: 20ms
  http_header: x-budget-ms
  malformed: ignore
idempotency:
  lease: 10s
  renew_for: 10m
  in_flight_retry_after: 2s
  retention: 7days
  max_body_bytes: 65536
  max_stored_bytes: 262144
  store_server_errors: false
  require_key_for: [POST, PATCH]
  cancel_with_caller: true
"#;

const ENV: &[(&str, &str)] = &[
    ("ORDERS_DEADLINE__MAX", "5s"),
    ("ORDERS_DEADLINE__MIN", "20ms"),
    ("ORDERS_DEADLINE__HTTP_HEADER", "x-budget-ms"),
    ("ORDERS_DEADLINE__MALFORMED", "ignore"),
    ("ORDERS_IDEMPOTENCY__LEASE", "10s"),
    ("ORDERS_IDEMPOTENCY__RENEW_FOR", "10m"),
    ("ORDERS_IDEMPOTENCY__IN_FLIGHT_RETRY_AFTER", "2s"),
    ("ORDERS_IDEMPOTENCY__RETENTION", "7days"),
    ("ORDERS_IDEMPOTENCY__MAX_BODY_BYTES", "65536"),
    ("ORDERS_IDEMPOTENCY__MAX_STORED_BYTES", "262144"),
    ("ORDERS_IDEMPOTENCY__STORE_SERVER_ERRORS", "false"),
    ("ORDERS_IDEMPOTENCY__REQUIRE_KEY_FOR", "POST,PATCH"),
    ("ORDERS_IDEMPOTENCY__CANCEL_WITH_CALLER", "true"),
];

fn from_toml(text: &str) -> Result<ServerConfig, toml::de::Error> {
    toml::from_str(text)
}

fn from_yaml(text: &str) -> Result<ServerConfig, serde_yaml_ng::Error> {
    serde_yaml_ng::from_str(text)
}

/// Reads `vars` as the `config` crate reads the environment: prefix `ORDERS`, `__` between
/// nested keys, lists separated by commas. Handed over as a map, not set on the process.
fn from_env(vars: &[(&str, &str)]) -> Result<ServerConfig, config::ConfigError> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config::Config::builder()
        .add_source(
            config::Environment::with_prefix("ORDERS")
                .prefix_separator("_")
                .separator("__")
                .list_separator(",")
                .with_list_parse_key("idempotency.require_key_for")
                .try_parsing(true)
                .source(Some(vars)),
        )
        .build()?
        .try_deserialize()
}

#[test]
fn a_complete_configuration_reads_the_same_from_toml_yaml_and_the_environment() {
    let toml = from_toml(TOML).unwrap();
    assert_eq!(from_yaml(YAML).unwrap(), toml);
    assert_eq!(from_env(ENV).unwrap(), toml);

    assert_eq!(toml.deadline.max, Some(secs(5)));
    assert_eq!(toml.deadline.min, Some(ms(20)));
    assert_eq!(toml.deadline.malformed, Some(Malformed::Ignore));
    assert_eq!(toml.idempotency.retention, Some(secs(7 * 86_400)));
    assert_eq!(
        toml.idempotency.require_key_for,
        Some(vec!["POST".to_owned(), "PATCH".to_owned()])
    );

    let deadline = format!("{:?}", toml.deadline.layer().unwrap());
    assert!(
        deadline.contains("header: \"x-budget-ms\", max: Some(5s), min: 20ms, malformed: Ignore"),
        "{deadline}"
    );
    let idempotency = format!("{:?}", toml.idempotency.layer(MemoryStore::new()).unwrap());
    for part in [
        "lease: 10s",
        "renew_for: Some(600s)",
        "retry_after: 2s",
        "retention: 604800s",
        "max_body: 65536",
        "required: [POST, PATCH]",
        "store_server_errors: false",
        "detach: false",
        "max_stored: 262144",
    ] {
        assert!(idempotency.contains(part), "{part} in {idempotency}");
    }
}

#[test]
fn an_empty_configuration_builds_the_default_layers() {
    for empty in [
        from_toml("").unwrap(),
        from_yaml("{}").unwrap(),
        from_env(&[]).unwrap(),
    ] {
        assert_eq!(empty, ServerConfig::default());
        assert_eq!(
            format!("{:?}", empty.deadline.layer().unwrap()),
            format!("{:?}", ServerDeadlineLayer::new())
        );
        assert_eq!(
            format!("{:?}", empty.idempotency.layer(MemoryStore::new()).unwrap()),
            format!("{:?}", IdempotencyLayer::new(MemoryStore::new()))
        );
    }
}

#[test]
fn bad_values_are_refused_with_their_field_and_why() {
    // Refused by the builders, under the field's path.
    let cases = [
        (
            "[deadline]\nmax = \"0s\"\n",
            "deadline.max",
            "must be greater than zero",
        ),
        (
            "[deadline]\nmax = \"1s\"\nmin = \"1s\"\n",
            "deadline.min",
            "must be less than the maximum, or every request would be refused",
        ),
        (
            "[deadline]\nhttp_header = \"budget in ms\"\n",
            "deadline.http_header",
            "must be a valid HTTP header name",
        ),
        (
            "[idempotency]\nlease = \"0s\"\n",
            "idempotency.lease",
            "must be greater than zero",
        ),
        (
            "[idempotency]\nrenew_for = \"11 years\"\n",
            "idempotency.renew_for",
            "must be at most ten years",
        ),
        (
            "[idempotency]\nretention = \"0s\"\n",
            "idempotency.retention",
            "must be greater than zero",
        ),
        (
            "[idempotency]\nmax_body_bytes = 0\n",
            "idempotency.max_body_bytes",
            "must be greater than zero",
        ),
        (
            "[idempotency]\nrequire_key_for = [\"P OST\"]\n",
            "idempotency.require_key_for",
            "must list HTTP methods, such as \"POST\"",
        ),
    ];
    for (text, field, why) in cases {
        let config = from_toml(text).unwrap();
        let err = match config.deadline.layer() {
            Err(e) => e,
            Ok(_) => config.idempotency.layer(MemoryStore::new()).unwrap_err(),
        };
        assert_eq!(err.setting(), field, "{text}");
        assert_eq!(err.to_string(), format!("invalid {field}: {why}"), "{text}");
    }

    // Refused by the reader: an unknown field, a bad duration, a value of another type.
    let text = from_toml("[deadline]\nmaximum = \"5s\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("unknown field `maximum`, expected one of `max`"),
        "{text}"
    );
    let text = from_yaml("idempotency:\n  lease: a while\n")
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with("idempotency.lease: invalid duration \"a while\""),
        "{text}"
    );
    let text = from_env(&[("ORDERS_DEADLINE__MALFORMED", "shrug")])
        .unwrap_err()
        .to_string();
    assert!(text.contains("shrug"), "{text}");
    assert!(text.contains("deadline.malformed"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn configured_layers_do_their_work() {
    let config = from_toml(TOML).unwrap();
    let handler = service_fn(|_req: http::Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
            b"created",
        ))))
    });
    let svc = config.deadline.layer().unwrap().layer(
        config
            .idempotency
            .layer(MemoryStore::new())
            .unwrap()
            .layer(handler),
    );

    // The configured header, under the configured minimum: refused before the handler.
    let hurried = http::Request::post("/orders")
        .header("x-budget-ms", "10")
        .header("idempotency-key", "k-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = svc.clone().oneshot(hurried).await.unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);

    // A malformed header is ignored, as configured.
    let garbled = http::Request::post("/orders")
        .header("x-budget-ms", "soon")
        .header("idempotency-key", "k-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = svc.clone().oneshot(garbled).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    // A POST must carry a key, as configured.
    let unkeyed = http::Request::post("/orders")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let res = svc.clone().oneshot(unkeyed).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
}

/// The adaptive limit from TOML, YAML and the environment; the gradient's and AIMD's settings
/// each refused with the other algorithm; bad values by their field.
#[test]
fn the_adaptive_limit_is_configured_too() {
    use surely::server::config::LimitAlgorithm;

    let toml = from_toml(
        "[limit]\nalgorithm = \"aimd\"\ninitial = 40\nmin = 4\nmax = 400\nretry_after = \"2s\"\n\
         backoff = 0.8\nlatency_target = \"250ms\"\n[limit.criticality]\nsheddable = 0.5\n",
    )
    .unwrap();
    let yaml = from_yaml(
        "limit:\n  algorithm: aimd\n  initial: 40\n  min: 4\n  max: 400\n  retry_after: 2s\n  \
         backoff: 0.8\n  latency_target: 250ms\n  criticality:\n    sheddable: 0.5\n",
    )
    .unwrap();
    let env = from_env(&[
        ("ORDERS_LIMIT__ALGORITHM", "aimd"),
        ("ORDERS_LIMIT__INITIAL", "40"),
        ("ORDERS_LIMIT__MIN", "4"),
        ("ORDERS_LIMIT__MAX", "400"),
        ("ORDERS_LIMIT__RETRY_AFTER", "2s"),
        ("ORDERS_LIMIT__BACKOFF", "0.8"),
        ("ORDERS_LIMIT__LATENCY_TARGET", "250ms"),
        ("ORDERS_LIMIT__CRITICALITY__SHEDDABLE", "0.5"),
    ])
    .unwrap();
    assert_eq!(yaml, toml);
    assert_eq!(env, toml);
    assert_eq!(toml.limit.algorithm, Some(LimitAlgorithm::Aimd));
    let layer = toml.limit.layer().unwrap();
    assert_eq!(layer.limit(), 40);
    assert!(format!("{layer:?}").contains("backoff: 0.8"), "{layer:?}");
    // The empty section: the default limit.
    let empty = from_toml("").unwrap().limit.layer().unwrap();
    assert_eq!(
        format!("{empty:?}"),
        format!("{:?}", surely::server::limit::AdaptiveLimitLayer::new())
    );

    let cases = [
        ("[limit]\nmin = 0\n", "limit.min", "must be at least 1"),
        (
            "[limit]\nmin = 10\nmax = 5\ninitial = 7\n",
            "limit.max",
            "must not be less than the minimum",
        ),
        (
            "[limit]\ninitial = 5000\n",
            "limit.initial",
            "must be between the minimum and the maximum",
        ),
        (
            "[limit]\ntolerance = 0.5\n",
            "limit.tolerance",
            "must be a finite number of at least 1",
        ),
        (
            "[limit]\nalgorithm = \"aimd\"\nwindow = 10\n",
            "limit.tolerance",
            "tolerance, smoothing, window, long_window and sample_every apply to algorithm = \"gradient\" only",
        ),
        (
            "[limit]\nbackoff = 0.5\n",
            "limit.backoff",
            "backoff and latency_target apply to algorithm = \"aimd\" only",
        ),
        (
            "[limit.criticality]\nsheddable = 1.5\n",
            "limit.criticality",
            "must not fall as criticality rises, and `critical` must fill the whole limit (1.0)",
        ),
        (
            "[limit]\nretry_after = \"2h\"\n",
            "limit.retry_after",
            "must be greater than zero and at most an hour",
        ),
    ];
    for (text, field, why) in cases {
        let err = from_toml(text).unwrap().limit.layer().unwrap_err();
        assert_eq!(err.setting(), field, "{text}");
        assert_eq!(err.to_string(), format!("invalid {field}: {why}"), "{text}");
    }
    let text = from_toml("[limit]\nalgorithm = \"vegas\"\n")
        .unwrap_err()
        .to_string();
    assert!(text.contains("unknown variant `vegas`"), "{text}");
}
