//! The client stack configured from TOML, YAML and environment variables (feature `serde`):
//! one complete example in each form, the empty configuration as the defaults, a bad value
//! named by its field, and a configured client at work (paused time).
#![cfg(feature = "serde")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use surely::config::{BudgetKind, ClientConfig};
use surely::retry::backoff::Jitter;
use surely::{Outcome, StopReason};
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceExt};

use crate::support::time::{ms, secs};

/// Every field of the client's configuration, in TOML.
const TOML: &str = r#"
timeout = "2s"
per_try_timeout = "500ms"
internal_headers = false
server_honours_keys = true

[retry]
max_attempts = 4
max_pushback = "10s"
min_attempt_time = "20ms"

[retry.backoff]
base = "50ms"
max = "1m 30s"
multiplier = 3.0
jitter = "equal"

[budget]
kind = "ratio"
ratio = 0.2
ttl = "20s"
min_per_sec = 5.0

[breaker]
name = "payments"
failure_ratio = 0.6
min_throughput = 10
window = { calls = 50 }
slow_call_threshold = "1s"
break_duration = "2s"
break_multiplier = 1.5
max_break = "30s"
jitter = 0.2
half_open_probes = 2
min_timeout_evidence = "50ms"

[hedge]
max_attempts = 3
percentile = 99.0
fallback = "40ms"
min_samples = 50
window = 500
hedge_idempotent = true
min_attempt_time = "5ms"
"#;

/// The same, in YAML.
const YAML: &str = r#"
timeout: 2s
per_try_timeout: 500ms
internal_headers: false
server_honours_keys: true
retry:
  max_attempts: 4
  max_pushback: 10s
  min_attempt_time: 20ms
  backoff:
    base: 50ms
    max: 1m 30s
    multiplier: 3.0
    jitter: equal
budget:
  kind: ratio
  ratio: 0.2
  ttl: 20s
  min_per_sec: 5.0
breaker:
  name: payments
  failure_ratio: 0.6
  min_throughput: 10
  window:
    calls: 50
  slow_call_threshold: 1s
  break_duration: 2s
  break_multiplier: 1.5
  max_break: 30s
  jitter: 0.2
  half_open_probes: 2
  min_timeout_evidence: 50ms
hedge:
  max_attempts: 3
  percentile: 99.0
  fallback: 40ms
  min_samples: 50
  window: 500
  hedge_idempotent: true
  min_attempt_time: 5ms
"#;

/// The same, as environment variables: the prefix, then the path with `__` between keys.
const ENV: &[(&str, &str)] = &[
    ("PAYMENTS_TIMEOUT", "2s"),
    ("PAYMENTS_PER_TRY_TIMEOUT", "500ms"),
    ("PAYMENTS_INTERNAL_HEADERS", "false"),
    ("PAYMENTS_SERVER_HONOURS_KEYS", "true"),
    ("PAYMENTS_RETRY__MAX_ATTEMPTS", "4"),
    ("PAYMENTS_RETRY__MAX_PUSHBACK", "10s"),
    ("PAYMENTS_RETRY__MIN_ATTEMPT_TIME", "20ms"),
    ("PAYMENTS_RETRY__BACKOFF__BASE", "50ms"),
    ("PAYMENTS_RETRY__BACKOFF__MAX", "1m 30s"),
    ("PAYMENTS_RETRY__BACKOFF__MULTIPLIER", "3.0"),
    ("PAYMENTS_RETRY__BACKOFF__JITTER", "equal"),
    ("PAYMENTS_BUDGET__KIND", "ratio"),
    ("PAYMENTS_BUDGET__RATIO", "0.2"),
    ("PAYMENTS_BUDGET__TTL", "20s"),
    ("PAYMENTS_BUDGET__MIN_PER_SEC", "5.0"),
    ("PAYMENTS_BREAKER__NAME", "payments"),
    ("PAYMENTS_BREAKER__FAILURE_RATIO", "0.6"),
    ("PAYMENTS_BREAKER__MIN_THROUGHPUT", "10"),
    ("PAYMENTS_BREAKER__WINDOW__CALLS", "50"),
    ("PAYMENTS_BREAKER__SLOW_CALL_THRESHOLD", "1s"),
    ("PAYMENTS_BREAKER__BREAK_DURATION", "2s"),
    ("PAYMENTS_BREAKER__BREAK_MULTIPLIER", "1.5"),
    ("PAYMENTS_BREAKER__MAX_BREAK", "30s"),
    ("PAYMENTS_BREAKER__JITTER", "0.2"),
    ("PAYMENTS_BREAKER__HALF_OPEN_PROBES", "2"),
    ("PAYMENTS_BREAKER__MIN_TIMEOUT_EVIDENCE", "50ms"),
    ("PAYMENTS_HEDGE__MAX_ATTEMPTS", "3"),
    ("PAYMENTS_HEDGE__PERCENTILE", "99.0"),
    ("PAYMENTS_HEDGE__FALLBACK", "40ms"),
    ("PAYMENTS_HEDGE__MIN_SAMPLES", "50"),
    ("PAYMENTS_HEDGE__WINDOW", "500"),
    ("PAYMENTS_HEDGE__HEDGE_IDEMPOTENT", "true"),
    ("PAYMENTS_HEDGE__MIN_ATTEMPT_TIME", "5ms"),
];

fn from_toml(text: &str) -> Result<ClientConfig, toml::de::Error> {
    toml::from_str(text)
}

fn from_yaml(text: &str) -> Result<ClientConfig, serde_yaml_ng::Error> {
    serde_yaml_ng::from_str(text)
}

/// Reads `vars` as the `config` crate reads the environment, with the prefix `PAYMENTS` and
/// `__` between nested keys. The variables are handed over as a map rather than set on the
/// process, whose environment every test shares.
fn from_env(vars: &[(&str, &str)]) -> Result<ClientConfig, config::ConfigError> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config::Config::builder()
        .add_source(
            config::Environment::with_prefix("PAYMENTS")
                .prefix_separator("_")
                .separator("__")
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

    assert_eq!(toml.timeout, Some(secs(2)));
    assert_eq!(toml.per_try_timeout, Some(ms(500)));
    assert_eq!(toml.internal_headers, Some(false));
    assert_eq!(toml.retry.max_attempts, Some(4));
    assert_eq!(toml.retry.backoff.base, Some(ms(50)));
    assert_eq!(toml.retry.backoff.max, Some(secs(90)));
    assert_eq!(toml.retry.backoff.jitter, Some(Jitter::Equal));
    assert_eq!(toml.budget.kind, Some(BudgetKind::Ratio));
    assert_eq!(toml.budget.ratio, Some(0.2));
    assert_eq!(toml.breaker.name.as_deref(), Some("payments"));
    assert_eq!(toml.breaker.window.as_ref().unwrap().calls, Some(50));
    assert_eq!(toml.hedge.as_ref().unwrap().min_samples, Some(50));

    // It builds: every value passes the builders' checks.
    let layer = toml.apply_hedged(surely::client()).unwrap().into_layer();
    assert!(layer.is_ok());
    // Without a hedge, the retry layer keeps the breaker, and shows it.
    let mut unhedged = toml.clone();
    unhedged.hedge = None;
    let layer = unhedged.builder().unwrap().into_layer().unwrap();
    let shown = format!("{layer:?}");
    assert!(shown.contains("timeout: Some(2s)"), "{shown}");
    assert!(shown.contains("max_attempts: 4"), "{shown}");
    assert!(
        shown.contains("base: 50ms, multiplier: 3.0, cap: 90s, jitter: Equal"),
        "{shown}"
    );
    assert!(
        shown.contains("RatioBudget { ratio: 0.2, ttl: 20s, min_per_sec: 5.0"),
        "{shown}"
    );
    assert!(shown.contains("name: Some(\"payments\")"), "{shown}");
    assert!(
        shown.contains(
            "failure_ratio: 0.6, min_throughput: 10, break_duration: 2s, half_open_probes: 2"
        ),
        "{shown}"
    );
    assert!(shown.contains("per_try: Some(500ms)"), "{shown}");
}

#[tokio::test(start_paused = true)]
async fn an_empty_configuration_builds_the_default_stack() {
    for empty in [
        from_toml("").unwrap(),
        from_yaml("{}").unwrap(),
        from_env(&[]).unwrap(),
        from_toml("[retry]\n[retry.backoff]\n[breaker]\n").unwrap(),
    ] {
        assert_eq!(empty, ClientConfig::default());
        // The layers, as they show themselves: deadline, retry (attempts, backoff, budget,
        // pushback, breaker), attempt timeout.
        let configured = format!("{:?}", empty.builder().unwrap().into_layer().unwrap());
        let default = format!("{:?}", surely::client().into_layer().unwrap());
        assert_eq!(configured, default);
        // The presets keep what makes them presets.
        let http = empty.apply(surely::client::http()).unwrap().into_layer();
        assert_eq!(
            format!("{:?}", http.unwrap()),
            format!("{:?}", surely::client::http().into_layer().unwrap())
        );
        let grpc = empty.apply(surely::client::grpc()).unwrap().into_layer();
        assert_eq!(
            format!("{:?}", grpc.unwrap()),
            format!("{:?}", surely::client::grpc().into_layer().unwrap())
        );
    }
}

/// A transport whose connection is refused every time (nothing sent: a POST may go again),
/// and the number of attempts it saw.
fn refusing() -> (
    impl Service<
            http::Request<String>,
            Response = http::Response<String>,
            Error = std::io::Error,
            Future = impl Send,
        > + Clone,
    Arc<AtomicU32>,
) {
    let attempts = Arc::new(AtomicU32::new(0));
    let seen = attempts.clone();
    let transport = service_fn(move |_req: http::Request<String>| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)) }
    });
    (transport, attempts)
}

#[tokio::test(start_paused = true)]
async fn a_configured_client_retries_as_configured() {
    let config = from_toml(
        r#"
        timeout = "5s"
        [retry]
        max_attempts = 4
        [retry.backoff]
        base = "100ms"
        multiplier = 2.0
        jitter = "none"
        "#,
    )
    .unwrap();
    let (transport, attempts) = refusing();
    let mut client = config.builder().unwrap().build(transport).unwrap();

    let start = Instant::now();
    let order = http::Request::post("/orders")
        .body("o-1".to_owned())
        .unwrap();
    let err = client.ready().await.unwrap().call(order).await.unwrap_err();
    assert_eq!(attempts.load(Ordering::SeqCst), 4);
    assert_eq!(err.attempts(), 4);
    assert_eq!(err.stop_reason(), Some(StopReason::AttemptsExhausted));
    assert_eq!(err.outcome(), Outcome::Failed);
    // Waits of 100, 200 and 400 ms between the four attempts, without jitter.
    assert_eq!(start.elapsed(), ms(700));
}

#[tokio::test(start_paused = true)]
async fn a_configured_timeout_bounds_the_call() {
    let config =
        from_yaml("timeout: 300ms\nretry:\n  backoff:\n    base: 1s\n    jitter: none\n").unwrap();
    let (transport, attempts) = refusing();
    let mut client = config.builder().unwrap().build(transport).unwrap();
    let start = Instant::now();
    let order = http::Request::post("/orders")
        .body("o-1".to_owned())
        .unwrap();
    let err = client.ready().await.unwrap().call(order).await.unwrap_err();
    // The first retry would wait 1 s, past the 300 ms budget: the call stops at once.
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    assert_eq!(err.stop_reason(), Some(StopReason::Deadline));
    assert!(start.elapsed() < Duration::from_millis(300));
}

#[test]
fn an_unknown_field_is_refused_by_name() {
    let err = from_toml("[retry]\nmax_attempt = 4\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `max_attempt`"), "{err}");
    assert!(
        err.contains("max_attempts"),
        "the known fields are listed: {err}"
    );

    let err = from_yaml("retry:\n  backoff:\n    bsae: 50ms\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("retry.backoff"), "{err}");
    assert!(err.contains("unknown field `bsae`"), "{err}");

    let err = from_env(&[("PAYMENTS_BREAKER__FAILURE_RATE", "0.5")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `failure_rate`"), "{err}");

    let err = from_toml("tiemout = \"2s\"\n").unwrap_err().to_string();
    assert!(err.contains("unknown field `tiemout`"), "{err}");
}

#[test]
fn a_bad_duration_is_refused_with_its_field_and_why() {
    let err = from_toml("[retry.backoff]\nbase = \"3 parsecs\"\n").unwrap_err();
    let text = err.to_string();
    // toml shows the line, which names the field.
    assert!(text.contains("base = \"3 parsecs\""), "{text}");
    assert!(text.contains("invalid duration \"3 parsecs\""), "{text}");
    assert!(text.contains("unknown time unit"), "{text}");

    let text = from_yaml("retry:\n  backoff:\n    base: 3 parsecs\n")
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with("retry.backoff.base: invalid duration"),
        "{text}"
    );

    let text = from_env(&[("PAYMENTS_PER_TRY_TIMEOUT", "soon")])
        .unwrap_err()
        .to_string();
    assert!(text.contains("invalid duration \"soon\""), "{text}");
    assert!(text.contains("per_try_timeout"), "{text}");

    // A number is not a duration: which unit would it be?
    let text = from_toml("timeout = 5\n").unwrap_err().to_string();
    assert!(text.contains("timeout = 5"), "{text}");
    assert!(
        text.contains("expected a duration written as a string"),
        "{text}"
    );
}

#[test]
fn a_value_out_of_range_is_refused_by_the_builder_under_its_field_path() {
    let cases = [
        (
            "[budget]\nkind = \"ratio\"\nratio = 5000.0\n",
            "budget.ratio",
            "must be between 0 and 1000",
        ),
        (
            "[budget]\nkind = \"ratio\"\nttl = \"2m\"\n",
            "budget.ttl",
            "must be between 1 and 60 seconds",
        ),
        (
            "[budget]\nkind = \"ratio\"\nmin_per_sec = -1.0\n",
            "budget.min_per_sec",
            "must not be negative",
        ),
        (
            "[budget]\nkind = \"token_bucket\"\nmax_tokens = 0\ntoken_ratio = 0.1\n",
            "budget.max_tokens",
            "must be between 1 and 1000",
        ),
        (
            "[breaker]\nfailure_ratio = 1.5\n",
            "breaker.failure_ratio",
            "must be greater than 0 and at most 1",
        ),
        (
            "[breaker]\nwindow = { calls = 10 }\n",
            "breaker.min_throughput",
            "must not exceed the count window, or the breaker could never open",
        ),
        (
            "[breaker]\nbreak_duration = \"2m\"\n",
            "breaker.max_break",
            "must be at least the break duration",
        ),
        (
            "[breaker]\nwindow = { calls = 50, length = \"10s\" }\n",
            "breaker.window",
            "takes `calls` (a count window) or `length` (a time window), not both",
        ),
        (
            "[retry]\nmax_attempts = 0\n",
            "retry.max_attempts",
            "must be at least 1 (the first attempt)",
        ),
        (
            "[retry.backoff]\nbase = \"0s\"\n",
            "retry.backoff.base",
            "must be greater than zero",
        ),
        (
            "[retry.backoff]\nbase = \"5s\"\nmax = \"1s\"\n",
            "retry.backoff.max",
            "must not be less than the base delay",
        ),
        (
            "[retry.backoff]\nmultiplier = 0.5\n",
            "retry.backoff.multiplier",
            "must be at least 1.0",
        ),
        ("timeout = \"0s\"\n", "timeout", "must be greater than zero"),
        (
            "per_try_timeout = \"0ms\"\n",
            "per_try_timeout",
            "must be greater than zero",
        ),
    ];
    for (text, field, why) in cases {
        let err = from_toml(text).unwrap().builder().unwrap_err();
        assert_eq!(err.setting(), field, "{text}");
        assert_eq!(err.to_string(), format!("invalid {field}: {why}"), "{text}");
    }

    // The same rule, from the environment.
    let err = from_env(&[
        ("PAYMENTS_BUDGET__KIND", "ratio"),
        ("PAYMENTS_BUDGET__RATIO", "-0.5"),
    ])
    .unwrap()
    .builder()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid budget.ratio: must be between 0 and 1000"
    );
}

#[test]
fn a_value_of_the_wrong_type_is_refused_with_its_field() {
    let text = from_yaml("budget:\n  kind: ratio\n  ratio: lots\n")
        .unwrap_err()
        .to_string();
    assert!(text.starts_with("budget.ratio: invalid type"), "{text}");
    let text = from_env(&[("PAYMENTS_RETRY__MAX_ATTEMPTS", "four")])
        .unwrap_err()
        .to_string();
    assert!(text.contains("retry.max_attempts"), "{text}");
    let text = from_toml("[budget]\nkind = \"bottomless\"\n")
        .unwrap_err()
        .to_string();
    assert!(text.contains("unknown variant `bottomless`"), "{text}");
}

#[test]
fn the_hedge_is_for_a_client_built_with_one() {
    let config = from_toml("[hedge]\ndelay = \"20ms\"\n").unwrap();
    let err = config.builder().unwrap_err();
    assert_eq!(err.setting(), "hedge");
    let layer = config.apply_hedged(surely::client()).unwrap().into_layer();
    assert!(layer.is_ok());

    // Without a section, the hedge's defaults.
    assert!(from_toml("")
        .unwrap()
        .apply_hedged(surely::client())
        .is_ok());

    let cases = [
        ("[hedge]\nmax_attempts = 0\n", "hedge.max_attempts"),
        ("[hedge]\npercentile = 120.0\n", "hedge.percentile"),
        ("[hedge]\nmin_samples = 2000\n", "hedge.min_samples"),
        (
            "[hedge]\ndelay = \"20ms\"\npercentile = 99.0\n",
            "hedge.delay",
        ),
    ];
    for (text, field) in cases {
        let err = from_toml(text)
            .unwrap()
            .apply_hedged(surely::client())
            .unwrap_err();
        assert_eq!(err.setting(), field, "{text}: {err}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_body_idle_timeout_is_for_a_client_built_with_one() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full, StreamBody};
    use surely::retry::ReplayBody;
    use surely::timeout::BodyIdle;

    let config = from_toml("body_idle_timeout = \"2s\"\n").unwrap();
    assert_eq!(config.body_idle_timeout, Some(secs(2)));
    for err in [
        config.apply(surely::client::http()).unwrap_err(),
        config.apply(surely::client()).unwrap_err(),
    ] {
        assert_eq!(err.setting(), "body_idle_timeout", "{err}");
    }
    let zero = from_toml("body_idle_timeout = \"0s\"\n")
        .unwrap()
        .apply(surely::client::http().body_idle_timeout(secs(30)))
        .unwrap_err();
    assert_eq!(zero.setting(), "body_idle_timeout", "{zero}");

    // The configured duration replaces the code's.
    let transport = service_fn(|_req: http::Request<ReplayBody<Full<Bytes>>>| async {
        let first = Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(b"[")));
        let frames =
            tokio_stream::StreamExt::chain(tokio_stream::iter([first]), tokio_stream::pending());
        Ok::<_, std::io::Error>(http::Response::new(StreamBody::new(frames)))
    });
    let mut client = config
        .apply(surely::client::http().body_idle_timeout(secs(30)))
        .unwrap()
        .build(transport)
        .unwrap();
    let get = http::Request::get("/orders").body(Full::default()).unwrap();
    let res = client.ready().await.unwrap().call(get).await.unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    let waited = Instant::now();
    let err = body.frame().await.unwrap().unwrap_err();
    assert_eq!(
        err.downcast_ref::<BodyIdle>(),
        Some(&BodyIdle::new(secs(2)))
    );
    assert_eq!(Instant::now() - waited, secs(2));
}

#[tokio::test(start_paused = true)]
async fn a_budget_of_kind_none_removes_the_budget() {
    let config = from_toml("[budget]\nkind = \"none\"\n").unwrap();
    let shown = format!("{:?}", config.builder().unwrap().into_layer().unwrap());
    assert!(shown.contains("budget: None"), "{shown}");

    let bucket =
        from_toml("[budget]\nkind = \"token_bucket\"\nmax_tokens = 20\ntoken_ratio = 0.5\n");
    let shown = format!(
        "{:?}",
        bucket.unwrap().builder().unwrap().into_layer().unwrap()
    );
    assert!(shown.contains("TokenBucket"), "{shown}");

    // A ratio budget unless said otherwise.
    let ratio = from_toml("[budget]\nratio = 0.3\n").unwrap();
    let shown = format!("{:?}", ratio.builder().unwrap().into_layer().unwrap());
    assert!(shown.contains("RatioBudget { ratio: 0.3"), "{shown}");

    // A token bucket says both of its numbers, and a field of another kind is refused.
    let cases = [
        (
            "kind = \"token_bucket\"\nmax_tokens = 20\n",
            "invalid budget.token_ratio: is needed for a token bucket",
        ),
        (
            "kind = \"token_bucket\"\nmax_tokens = 20\ntoken_ratio = 0.5\nttl = \"5s\"\n",
            "invalid budget.ttl: is for a budget of kind \"ratio\"",
        ),
        (
            "ratio = 0.2\nmax_tokens = 20\n",
            "invalid budget.max_tokens: is for a budget of kind \"token_bucket\"",
        ),
        (
            "kind = \"none\"\nratio = 0.2\n",
            "invalid budget.ratio: is for a budget of kind \"ratio\"",
        ),
    ];
    for (text, message) in cases {
        let config = from_toml(&format!("[budget]\n{text}")).unwrap();
        assert_eq!(config.builder().unwrap_err().to_string(), message, "{text}");
    }
}

#[test]
fn a_timeout_too_short_for_the_reserve_is_blamed_on_the_timeout() {
    // The file has no reserve: its error names the key the file has.
    for short in ["1ns", "1ms"] {
        let config = from_toml(&format!("timeout = \"{short}\"\n")).unwrap();
        let err = config.builder().unwrap_err();
        assert_eq!(err.setting(), "timeout", "{short}: {err}");
        assert!(err.reason().starts_with("must be at least 2 ms"), "{err}");
    }
    assert!(from_toml("timeout = \"2ms\"\n").unwrap().builder().is_ok());
}

#[tokio::test(start_paused = true)]
async fn extreme_values_are_refused_or_work_never_a_panic() {
    // Too long for a duration at all: refused by the reader.
    let text = from_toml("timeout = \"100000000000000 years\"\n")
        .unwrap_err()
        .to_string();
    assert!(text.contains("invalid duration"), "{text}");

    // Absurd but valid (every duration within `MAX_DURATION`, ten years): the stack builds,
    // and calls end.
    let config = from_toml(
        r#"
        timeout = "9 years"
        per_try_timeout = "8 years"
        [retry]
        max_attempts = 4294967295
        max_pushback = "9 years"
        min_attempt_time = "8 years"
        [retry.backoff]
        base = "8 years"
        max = "9 years"
        multiplier = 1e300
        [budget]
        ratio = 1000.0
        ttl = "60s"
        min_per_sec = 1e300
        [breaker]
        min_throughput = 4294967295
        window = { length = "9 years", buckets = 1000 }
        break_duration = "8 years"
        max_break = "9 years"
        min_timeout_evidence = "9 years"
        "#,
    )
    .unwrap();
    let ok = service_fn(|_req: http::Request<String>| async {
        Ok::<_, std::io::Error>(http::Response::new(String::from("ok")))
    });
    let mut client = config.builder().unwrap().build(ok).unwrap();
    let read = http::Request::get("/orders/o-1")
        .body(String::new())
        .unwrap();
    let res = client.ready().await.unwrap().call(read).await.unwrap();
    assert_eq!(res.body(), "ok");

    let (transport, attempts) = refusing();
    let mut client = config.builder().unwrap().build(transport).unwrap();
    let read = http::Request::get("/orders/o-1")
        .body(String::new())
        .unwrap();
    let err = client.ready().await.unwrap().call(read).await.unwrap_err();
    assert_eq!(err.outcome(), Outcome::Failed);
    assert!(attempts.load(Ordering::SeqCst) >= 1);
}

#[tokio::test(start_paused = true)]
async fn a_server_that_honours_keys_gets_a_lost_post_again() {
    // The first reply is lost after the order was sent.
    let lossy = || {
        let attempts = Arc::new(AtomicU32::new(0));
        let seen = attempts.clone();
        let transport = service_fn(move |_req: http::Request<String>| {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
                }
                Ok(http::Response::new(String::from("created")))
            }
        });
        (transport, attempts)
    };
    let order = || {
        http::Request::post("/orders")
            .body("o-1".to_owned())
            .unwrap()
    };

    // By default the client cannot know, and does not send the POST again.
    let (transport, attempts) = lossy();
    let mut client = from_toml("")
        .unwrap()
        .builder()
        .unwrap()
        .build(transport)
        .unwrap();
    let err = client
        .ready()
        .await
        .unwrap()
        .call(order())
        .await
        .unwrap_err();
    assert_eq!(err.outcome(), Outcome::Unknown);
    assert_eq!(attempts.load(Ordering::SeqCst), 1);

    // Configured as honoured, the keyed POST goes again, with its key.
    let config = from_toml("server_honours_keys = true\n").unwrap();
    let (transport, attempts) = lossy();
    let mut client = config.builder().unwrap().build(transport).unwrap();
    let res = client.ready().await.unwrap().call(order()).await.unwrap();
    assert_eq!(res.body(), "created");
    assert_eq!(attempts.load(Ordering::SeqCst), 2);

    // The gRPC preset sends no keys: the setting cannot hold there.
    let err = config.apply(surely::client::grpc()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid server_honours_keys: is set, but this client sends no idempotency keys"
    );
}
