//! The review of a call chain (`surely::review`, feature `review`): every finding with a chain
//! that has it and one that does not, the worked example's two files, the file's errors with
//! their places, the command's exit codes and JSON, a fuzzed file that never panics, and the
//! amplification figure against the amplification simulator's.

use std::time::Duration;

use proptest::prelude::*;
use surely::review::{Chain, FindingId, Operation, Review, ReviewErrorKind, Service, Severity};

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/amplification/sim.rs"]
mod sim;

const BROKEN: &str = include_str!("../../examples/review/orders.toml");
const FIXED: &str = include_str!("../../examples/review/orders-fixed.toml");

fn review(text: &str) -> Review {
    Chain::from_toml(text)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .review()
        .unwrap()
}

fn ids(review: &Review) -> Vec<FindingId> {
    review.findings().iter().map(|f| f.id).collect()
}

/// A chain of two services: `a.op` calls `b.op` through `a`'s client for `b`, with `client`
/// as that client's settings section, `b_kind` and `b_extra` as `b.op`'s kind and other keys,
/// `b_server` as `b`'s server section and `a_extra` appended to the file.
fn pair(client: &str, b_kind: &str, b_extra: &str, b_server: &str, a_extra: &str) -> String {
    format!(
        r#"
[services.a.operations.op]
kind = "read"
calls = ["b.op"]

[services.a.clients.b]
preset = "http"
[services.a.clients.b.settings]
{client}

[services.a.ledger]
manual_queue = true

[services.b.operations.op]
kind = "{b_kind}"
{b_extra}

{b_server}

{a_extra}
"#
    )
}

/// Each finding: a chain that has it (at the severity given) and the same chain fixed, which
/// has none.
fn cases() -> Vec<(FindingId, Severity, String, String)> {
    let three = |a: &str, b: &str| {
        format!(
            r#"
[review]
max_amplification = 5
[services.top.operations.op]
kind = "read"
calls = ["mid.op"]
[services.top.clients.mid]
settings = {{ timeout = "5s" }}
[services.mid.operations.op]
kind = "read"
calls = ["low.op"]
[services.mid.server]
{a}
[services.mid.server.deadline]
max = "10s"
[services.mid.clients.low]
settings = {{ timeout = "1s" {b} }}
[services.low.operations.op]
kind = "read"
"#
        )
    };
    vec![
        (
            FindingId::Amplification,
            Severity::Error,
            three("", r#", budget = { kind = "none" }"#).replace(
                r#"settings = { timeout = "5s" }"#,
                r#"settings = { timeout = "5s", budget = { kind = "none" } }"#,
            ),
            three("trust_retry_signals = true", r#", budget = { kind = "none" }"#),
        ),
        (
            FindingId::Amplification,
            Severity::Warning,
            three("", ""),
            three("trust_retry_signals = true", ""),
        ),
        (
            FindingId::RetryOwners,
            Severity::Error,
            three("", ""),
            three("trust_retry_signals = true", ""),
        ),
        (
            FindingId::DeadlineOutlivesParent,
            Severity::Warning,
            three("trust_retry_signals = true", "").replace(
                r#"settings = { timeout = "1s"  }"#,
                r#"settings = { timeout = "6s" }"#,
            ),
            three("trust_retry_signals = true", ""),
        ),
        (
            FindingId::DeadlineOutlivesParent,
            Severity::Error,
            three("trust_retry_signals = true", "")
                .replace(
                    r#"settings = { timeout = "1s"  }"#,
                    r#"settings = { timeout = "6s" }"#,
                )
                .replace(
                    r#"settings = { timeout = "5s" }"#,
                    r#"settings = { timeout = "5s", internal_headers = false }"#,
                ),
            three("trust_retry_signals = true", "").replace(
                r#"settings = { timeout = "5s" }"#,
                r#"settings = { timeout = "5s", internal_headers = false }"#,
            ),
        ),
        (
            FindingId::WriteRetriedWithoutKey,
            Severity::Error,
            pair("", "write", "method = \"PUT\"", "", ""),
            pair("", "write", "method = \"POST\"", "", ""),
        ),
        (
            FindingId::KeyNotHonoured,
            Severity::Error,
            pair("server_honours_keys = true", "write", "", "", ""),
            pair(
                "server_honours_keys = true",
                "write",
                "",
                "[services.b.server.idempotency]",
                "",
            ),
        ),
        (
            FindingId::KeyNotHonoured,
            Severity::Error,
            pair("server_honours_keys = true", "write", "", "", "")
                .replace("[services.b.operations.op]", "[services.b]\nexternal = true\naccepts_key = false\n[services.b.operations.op]"),
            pair("server_honours_keys = true", "write", "", "", "")
                .replace("[services.b.operations.op]", "[services.b]\nexternal = true\naccepts_key = true\n[services.b.operations.op]"),
        ),
        (
            FindingId::HedgeNotSafe,
            Severity::Error,
            pair("hedge = { delay = \"10ms\" }", "write", "method = \"GET\"", "", "")
                .replace("[services.a.ledger]", "[services.a.ledger]\nresolver = true"),
            pair("hedge = { delay = \"10ms\" }", "read", "", "", ""),
        ),
        (
            FindingId::HedgeNotSafe,
            Severity::Warning,
            pair(
                "hedge = { delay = \"10ms\", hedge_idempotent = true }",
                "idempotent",
                "",
                "",
                "",
            ),
            pair("hedge = { delay = \"10ms\" }", "idempotent", "", "", ""),
        ),
        (
            FindingId::AttemptsExceedBudget,
            Severity::Warning,
            pair("timeout = \"1s\"\nper_try_timeout = \"400ms\"", "read", "", "", ""),
            pair("timeout = \"1s\"\nper_try_timeout = \"300ms\"", "read", "", "", ""),
        ),
        (
            FindingId::UnknownUnowned,
            Severity::Error,
            pair("", "write", "", "", "").replace("[services.a.ledger]\nmanual_queue = true", ""),
            pair("", "write", "", "", "")
                .replace("[services.a.ledger]\nmanual_queue = true", "")
                .replace(
                    "preset = \"http\"",
                    "preset = \"http\"\nresolver = true",
                ),
        ),
        (
            FindingId::RecordOutsideTransaction,
            Severity::Error,
            pair(
                "",
                "write",
                "money = true",
                "[services.b.server.idempotency]\nstore = \"postgres\"",
                "",
            ),
            pair(
                "",
                "write",
                "money = true",
                "[services.b.server.idempotency]\nstore = \"postgres\"\nboundary = \"in_transaction\"",
                "",
            ),
        ),
        (
            FindingId::RecordOutsideTransaction,
            Severity::Error,
            pair("", "write", "money = true", "", ""),
            pair(
                "",
                "write",
                "money = true",
                "[services.b.server.idempotency]\nstore = \"postgres\"\nboundary = \"complete_in\"",
                "",
            ),
        ),
        (
            FindingId::InboxWithoutVersions,
            Severity::Error,
            pair("", "read", "", "[services.b.inbox]\nchange_events = true", ""),
            pair(
                "",
                "read",
                "",
                "[services.b.inbox]\nchange_events = true\nversions = \"in_order\"",
                "",
            ),
        ),
        (
            FindingId::InboxWithoutVersions,
            Severity::Warning,
            pair("", "read", "", "[services.b.inbox]", ""),
            pair("", "read", "", "[services.b.inbox]\nchange_events = false", ""),
        ),
    ]
}

#[test]
fn every_finding_has_a_failing_and_a_passing_case() {
    let cases = cases();
    for id in FindingId::ALL {
        assert!(cases.iter().any(|c| c.0 == id), "no case for finding {id}");
    }
    for (id, severity, bad, good) in cases {
        let found = review(&bad);
        let hit = found
            .findings_of(id)
            .next()
            .unwrap_or_else(|| panic!("{id} not found in\n{bad}\n{found}"));
        assert_eq!(hit.severity, severity, "{id}: {hit:?}");
        assert!(!hit.path.is_empty() && !hit.fix.is_empty(), "{hit:?}");
        let clean = review(&good);
        assert!(
            clean.findings_of(id).next().is_none(),
            "{id} still found in\n{good}\n{clean}"
        );
    }
}

#[test]
fn finding_ids_are_stable() {
    let names: Vec<&str> = FindingId::ALL.iter().map(|id| id.as_str()).collect();
    assert_eq!(
        names,
        [
            "amplification",
            "deadline-outlives-parent",
            "retry-owners",
            "write-retried-without-key",
            "key-not-honoured",
            "hedge-not-safe",
            "attempts-exceed-budget",
            "unknown-unowned",
            "record-outside-transaction",
            "inbox-without-versions",
        ]
    );
    let docs = include_str!("../../src/docs/review.md");
    for name in names {
        assert!(
            docs.contains(&format!("`{name}`")),
            "docs::review does not list the finding `{name}`"
        );
    }
}

#[test]
fn the_worked_example_finds_every_mistake_and_its_fix_passes_clean() {
    let broken = review(BROKEN);
    let found = ids(&broken);
    for id in FindingId::ALL {
        assert!(found.contains(&id), "orders.toml: {id} not found\n{broken}");
    }
    // Every kind of mistake is marked in the file, and every marked one is found.
    let mut marked = std::collections::BTreeSet::new();
    for line in BROKEN.lines().filter(|l| l.contains("MISTAKE (")) {
        let ids = line
            .split("MISTAKE (")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap();
        for id in ids.split(", ") {
            assert!(
                found.iter().any(|f| f.as_str() == id),
                "marked {id}, not found"
            );
            marked.insert(id);
        }
    }
    assert_eq!(marked.len(), FindingId::ALL.len(), "{marked:?}");
    assert!(broken.fails(Severity::Error));
    // The figure the docs quote is the one printed.
    let figure =
        "gateway.show -> orders.get -> inventory.stock -> warehouse.count: 54x worst, 3.63x";
    assert!(broken.to_string().contains(figure), "{broken}");
    let docs = include_str!("../../src/docs/review.md").replace("\n", " ");
    assert!(docs.contains(figure), "docs::review quotes another figure");

    let fixed = review(FIXED);
    assert!(fixed.findings().is_empty(), "{fixed}");
    assert!(!fixed.fails(Severity::Info));
    // The seven answers of every operation, each answered or handed to the reviewer.
    for op in fixed.operations() {
        assert_eq!(op.answers.len(), 7, "{op:?}");
        for a in &op.answers {
            assert!(!a.given.is_empty() || a.open.is_some(), "{op:?}");
        }
    }
    let text = fixed.to_string();
    assert!(text.contains("7. How long may an UNKNOWN wait"), "{text}");
    assert!(text.contains("the settings do not say"), "{text}");
    assert!(
        text.contains("findings: 0 error(s), 0 warning(s), 0 info"),
        "{text}"
    );
}

#[test]
fn a_chain_built_in_code_is_reviewed_like_its_file() {
    let orders = surely::client::http()
        .timeout(Duration::from_secs(2))
        .retry(|r| r.max_attempts(3));
    let payments = surely::client::http().timeout(Duration::from_secs(5));
    let chain = Chain::new()
        .service(
            Service::new("gateway")
                .client("orders", orders.describe())
                .operation(Operation::write("checkout").calls("orders", "place")),
        )
        .service(
            Service::new("orders")
                .client("payments", payments.describe())
                .operation(
                    Operation::write("place")
                        .money()
                        .calls("payments", "charge"),
                ),
        )
        .service(Service::external("payments", false).operation(Operation::write("charge")));
    let from_code = chain.review().unwrap();
    let from_file = review(
        r#"
[services.gateway.clients.orders]
preset = "http"
settings = { timeout = "2s", retry = { max_attempts = 3 } }
[services.gateway.operations.checkout]
kind = "write"
calls = ["orders.place"]
[services.orders.clients.payments]
preset = "http"
settings = { timeout = "5s" }
[services.orders.operations.place]
kind = "write"
money = true
calls = ["payments.charge"]
[services.payments]
external = true
accepts_key = false
[services.payments.operations.charge]
kind = "write"
"#,
    );
    assert_eq!(ids(&from_code), ids(&from_file));
    assert_eq!(from_code.paths(), from_file.paths());
    assert!(ids(&from_code).contains(&FindingId::DeadlineOutlivesParent));
}

#[test]
fn the_server_and_durable_parts_describe_themselves() {
    use surely::review::{Boundary, ServerSettings, VersionPolicy};
    use surely::server::deadline::ServerDeadlineLayer;
    use surely::server::idempotency::IdempotencyLayer;
    use surely::server::store::MemoryStore;

    let deadline = ServerDeadlineLayer::builder()
        .max(Duration::from_secs(3))
        .trust_retry_signals(|_| true);
    let d = deadline.describe();
    assert_eq!(d.max, Some(Duration::from_secs(3)));
    assert!(d.trusts_retry_signals);
    let idem = IdempotencyLayer::builder(MemoryStore::new())
        .build()
        .unwrap();
    let i = idem.describe();
    assert_eq!(
        (i.store.as_str(), i.boundary),
        ("memory", Boundary::Separate)
    );
    let mut server = ServerSettings::default();
    server.deadline = Some(d);
    server.idempotency = Some(i);

    let consumer = surely::inbox::Consumer::builder("shipping")
        .versions(surely::inbox::Versions::Latest)
        .build()
        .unwrap();
    let mut inbox = consumer.describe();
    assert_eq!(inbox.versions, VersionPolicy::Latest);
    inbox.change_events = Some(true);

    let relay = surely::outbox::Relay::builder(surely::outbox::MemoryOutbox::new(), ())
        .build()
        .unwrap();
    assert_eq!(relay.describe().relay, surely::review::RelayKind::Polling);

    let budget = surely::budget::TokenBucket::builder()
        .max_tokens(20)
        .build()
        .unwrap();
    let client = surely::client()
        .budget(std::sync::Arc::new(budget))
        .describe();
    assert!(matches!(
        client.retry.budget,
        surely::review::BudgetSettings::TokenBucket { max_tokens: 20, .. }
    ));

    let chain = Chain::new()
        .service(
            Service::new("a")
                .client("b", client)
                .operation(Operation::read("op").calls("b", "op")),
        )
        .service(
            Service::new("b")
                .server(server)
                .inbox(inbox)
                .operation(Operation::read("op")),
        );
    let review = chain.review().unwrap();
    assert!(review.findings().is_empty(), "{review}");
}

// ---- the file's errors ------------------------------------------------------------------

fn error(text: &str) -> surely::review::ReviewError {
    match Chain::from_toml(text) {
        Ok(chain) => panic!("accepted: {chain:?}"),
        Err(e) => e,
    }
}

#[test]
fn a_file_that_does_not_parse_says_where() {
    let e = error("[services.a\nkind = 1\n");
    assert_eq!(e.kind(), ReviewErrorKind::Parse);
    assert_eq!(e.line(), Some(1), "{e}");
    assert!(e.to_string().starts_with("line 1, column "), "{e}");
}

#[test]
fn an_unknown_setting_is_an_error_at_its_place() {
    let e = error(
        "[services.a.clients.b]\npreset = \"http\"\n[services.a.clients.b.settings]\nretries = 3\n",
    );
    assert_eq!(e.kind(), ReviewErrorKind::Parse);
    assert_eq!(e.line(), Some(4), "{e}");
    assert!(e.message().contains("retries"), "{e}");
    let e = error("[services.a]\nexternall = true\n");
    assert_eq!((e.line(), e.column()), (Some(2), Some(1)), "{e}");
    let e = error("[review]\nlimit = 3\n");
    assert_eq!(e.line(), Some(2), "{e}");
    let e = error("[services.a.operations.op]\nkind = \"delete\"\n");
    assert_eq!(e.line(), Some(2), "{e}");
}

#[test]
fn a_value_a_builder_refuses_is_an_error_of_its_section() {
    let e = error(
        "[services.a.clients.b]\n[services.a.clients.b.settings]\nretry = { backoff = { base = \"5s\", max = \"1s\" } }\n",
    );
    assert_eq!(e.kind(), ReviewErrorKind::Parse);
    assert!(e.message().contains("retry.backoff.max"), "{e}");
    assert_eq!(e.line(), Some(1), "{e}");
    let e = error("[review]\nmax_amplification = 0.5\n");
    assert_eq!(
        (e.kind(), e.line()),
        (ReviewErrorKind::Invalid, Some(2)),
        "{e}"
    );
    let e = error("[review]\nrate = -1.0\n");
    assert_eq!(
        (e.kind(), e.line()),
        (ReviewErrorKind::Invalid, Some(2)),
        "{e}"
    );
    let e = error("[services.a.server]\ntrust_retry_signals = true\n");
    assert!(e.message().contains("trust_retry_signals"), "{e}");
}

#[test]
fn unknown_names_are_errors_at_the_call() {
    let base = "[services.a.clients.b]\n[services.a.operations.op]\nkind = \"read\"\ncalls = [\"x\", \"b.op\", ";
    let e = error(&format!(
        "{base}\"nope.op\"]\n[services.b.operations.op]\nkind = \"read\"\n"
    ));
    assert!(e.message().contains("`service.operation`"), "{e}");
    assert_eq!((e.line(), e.column()), (Some(4), Some(10)), "{e}");

    let e = error(
        "[services.a.clients.b]\n[services.a.operations.op]\nkind = \"read\"\ncalls = [\"b.op\", \"c.op\"]\n[services.b.operations.op]\nkind = \"read\"\n",
    );
    assert_eq!(e.kind(), ReviewErrorKind::UnknownService, "{e}");
    assert_eq!((e.line(), e.column()), (Some(4), Some(18)), "{e}");

    let e = error(
        "[services.a.clients.b]\n[services.a.operations.op]\nkind = \"read\"\ncalls = [\"b.nope\"]\n[services.b.operations.op]\nkind = \"read\"\n",
    );
    assert_eq!(e.kind(), ReviewErrorKind::UnknownOperation, "{e}");
    assert_eq!(e.line(), Some(4), "{e}");

    let e = error(
        "[services.a.operations.op]\nkind = \"read\"\ncalls = [\"b.op\"]\n[services.b.operations.op]\nkind = \"read\"\n",
    );
    assert_eq!(e.kind(), ReviewErrorKind::NoClient, "{e}");
    assert_eq!(e.line(), Some(3), "{e}");
}

#[test]
fn a_cycle_is_an_error_that_names_it() {
    let e = error(
        r#"[services.a.clients.b]
[services.a.operations.op]
kind = "read"
calls = ["b.op"]
[services.b.clients.c]
[services.b.operations.op]
kind = "read"
calls = ["c.op"]
[services.c.clients.a]
[services.c.operations.op]
kind = "read"
calls = ["a.op"]
"#,
    );
    assert_eq!(e.kind(), ReviewErrorKind::Cycle, "{e}");
    assert!(e.line().is_some_and(|l| [4, 8, 12].contains(&l)), "{e}");
    for op in ["a.op", "b.op", "c.op"] {
        assert!(e.message().contains(op), "{e}");
    }
    // An operation that calls itself.
    let e = error(
        "[services.a.clients.a]\n[services.a.operations.op]\nkind = \"read\"\ncalls = [\"a.op\"]\n",
    );
    assert_eq!(
        (e.kind(), e.line()),
        (ReviewErrorKind::Cycle, Some(4)),
        "{e}"
    );
    // In code, without a place.
    let e = Chain::new()
        .service(
            Service::new("a")
                .client("a", surely::client().describe())
                .operation(Operation::read("op").calls("a", "op")),
        )
        .review()
        .unwrap_err();
    assert_eq!((e.kind(), e.line()), (ReviewErrorKind::Cycle, None));
}

#[test]
fn a_huge_or_deep_file_is_an_error_not_a_crash() {
    let deep = format!("a = {}{}", "[".repeat(100_000), "]".repeat(100_000));
    let e = error(&deep);
    assert_eq!(e.kind(), ReviewErrorKind::Parse);
    assert!(e.message().contains("nested deeper"), "{e}");
    let inline = format!("a = {}", "{ b = ".repeat(10_000));
    assert_eq!(error(&inline).kind(), ReviewErrorKind::Parse);
    let huge = "# ".repeat(3 << 20);
    assert!(error(&huge).message().contains("over the limit"));
    // A long chain, walked without recursion.
    let mut long = String::new();
    for i in 0..3000 {
        long.push_str(&format!(
            "[services.s{i}.clients.s{next}]\nsettings = {{ retry = {{ max_attempts = 1 }} }}\n[services.s{i}.operations.op]\nkind = \"read\"\ncalls = [\"s{next}.op\"]\n",
            next = i + 1
        ));
    }
    long.push_str("[services.s3000.operations.op]\nkind = \"read\"\n");
    let r = review(&long);
    assert_eq!(r.paths().len(), 1);
    assert_eq!(r.paths()[0].path.len(), 3001);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any text is a chain or a typed error.
    #[test]
    fn any_text_is_read_or_refused(text in "\\PC{0,400}") {
        if let Ok(chain) = Chain::from_toml(&text) {
            chain.review().unwrap();
        }
    }

    /// Any mix of the format's own lines is a chain or a typed error with a place.
    #[test]
    fn any_mix_of_chain_lines_is_read_or_refused(
        lines in proptest::collection::vec(prop_oneof![
            Just("[services.a.clients.b]".to_owned()),
            Just("[services.b.clients.a]".to_owned()),
            Just("[services.a.operations.op]".to_owned()),
            Just("[services.b.operations.op]".to_owned()),
            Just("[services.b.server.deadline]".to_owned()),
            Just("[services.b.server.idempotency]".to_owned()),
            Just("[services.a.ledger]".to_owned()),
            Just("[review]".to_owned()),
            Just("kind = \"write\"".to_owned()),
            Just("kind = \"read\"".to_owned()),
            Just("calls = [\"b.op\"]".to_owned()),
            Just("calls = [\"a.op\"]".to_owned()),
            Just("method = \"PUT\"".to_owned()),
            Just("money = true".to_owned()),
            Just("settings = { timeout = \"1s\", per_try_timeout = \"600ms\" }".to_owned()),
            Just("settings = { hedge = {} }".to_owned()),
            Just("trust_retry_signals = true".to_owned()),
            Just("max = \"2s\"".to_owned()),
            (0u32..20).prop_map(|n| format!("settings = {{ retry = {{ max_attempts = {n} }} }}")),
            any::<f64>().prop_map(|x| format!("max_amplification = {x:?}")),
            any::<f64>().prop_map(|x| format!("rate = {x:?}")),
            "[a-z_]{1,8} = [0-9a-z\"]{0,6}",
        ], 0..24),
    ) {
        let text = lines.join("\n");
        match Chain::from_toml(&text) {
            Ok(chain) => {
                let review = chain.review().unwrap();
                let _ = review.to_string();
            }
            Err(e) => {
                if e.kind() == ReviewErrorKind::Parse {
                    prop_assert!(e.line().is_some(), "{e}: {text}");
                }
            }
        }
    }
}

// ---- the amplification figure against the simulator's -----------------------------------

/// The chain the simulator runs: `layers` hops over a failing bottom, each hop's client as
/// `settings`, each server trusting its caller's retry signals if `trusted`.
fn simulated_chain(layers: usize, settings: &str, trusted: bool) -> String {
    let mut text = String::from("[review]\nrate = 400\nmax_amplification = 1000\n");
    for i in 0..layers {
        text.push_str(&format!(
            "[services.s{i}.clients.s{n}]\nsettings = {{ {settings} }}\n[services.s{i}.operations.op]\nkind = \"read\"\ncalls = [\"s{n}.op\"]\n",
            n = i + 1
        ));
        if i > 0 && trusted {
            text.push_str(&format!(
                "[services.s{i}.server]\ntrust_retry_signals = true\n[services.s{i}.server.deadline]\n"
            ));
        }
    }
    text.push_str(&format!(
        "[services.s{layers}.operations.op]\nkind = \"read\"\n"
    ));
    text
}

#[test]
fn the_amplification_figure_agrees_with_the_simulator() {
    let params = sim::Params {
        calls: 2000,
        ..sim::Params::default()
    };
    let simulate = |strategy, layers| {
        sim::run_cell(strategy, layers, sim::Failure::Always, &params)
            .unwrap()
            .amplification()
    };
    // The budget-bounded figure holds the simulated one, and is close to it.
    let close = |what: &str, layers: usize, simulated: f64, bounded: f64| {
        eprintln!("{what}, {layers} layer(s): simulated {simulated:.3}, reviewed {bounded:.3}");
        assert!(
            simulated <= bounded * 1.02 && simulated >= bounded * 0.95,
            "{what}, {layers} layer(s): simulated {simulated}, reviewed {bounded}"
        );
    };
    for layers in [1, 2, 3] {
        // No budget, no marker: the worst case is the product of the attempts, and the
        // simulator counts exactly that.
        let naive = review(&simulated_chain(
            layers,
            "budget = { kind = \"none\" }",
            false,
        ));
        let worst = naive.paths()[0].worst;
        assert_eq!(worst, 3f64.powi(layers as i32));
        let simulated = simulate(sim::Strategy::Naive, layers);
        assert!(
            (simulated - worst).abs() < 1e-9,
            "naive, {layers} layers: simulated {simulated}, reviewed {worst}"
        );
        // A ratio budget at every hop, no marker.
        let ratio = review(&simulated_chain(layers, "", false));
        let simulated = simulate(sim::Strategy::SurelyRatio, layers);
        close("ratio", layers, simulated, ratio.paths()[0].bounded);
        // The defaults with the marker trusted: one hop retries.
        let owned = review(&simulated_chain(layers, "", true));
        assert_eq!(owned.paths()[0].retry_owners, 1);
        assert_eq!(owned.paths()[0].worst, 3.0);
        let simulated = simulate(sim::Strategy::SurelyDefault, layers);
        close("default", layers, simulated, owned.paths()[0].bounded);
    }
}

// ---- the command --------------------------------------------------------------------------

#[cfg(feature = "cli")]
mod command {
    use std::process::{Command, Output};

    fn surely(args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_surely"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("SURELY_DATABASE_URL")
            .args(args)
            .output()
            .unwrap()
    }

    #[test]
    fn exit_codes_say_clean_findings_or_a_bad_file() {
        let clean = surely(&["review", "examples/review/orders-fixed.toml"]);
        assert_eq!(clean.status.code(), Some(0), "{clean:?}");
        let text = String::from_utf8(clean.stdout).unwrap();
        assert!(text.contains("orders.place (write, POST)"), "{text}");

        let broken = surely(&["review", "examples/review/orders.toml"]);
        assert_eq!(broken.status.code(), Some(1), "{broken:?}");
        let text = String::from_utf8(broken.stdout).unwrap();
        assert!(text.contains("error   retry-owners"), "{text}");

        // Only warnings: clean at the default `--fail-on error`, not at `warning`.
        let dir = tempfile_dir();
        let warn = dir.join("warn.toml");
        std::fs::write(
            &warn,
            "[services.a.clients.b]\nsettings = { timeout = \"1s\", per_try_timeout = \"400ms\" }\n[services.a.operations.op]\nkind = \"read\"\ncalls = [\"b.op\"]\n[services.b.operations.op]\nkind = \"read\"\n",
        )
        .unwrap();
        let warn = warn.to_str().unwrap();
        assert_eq!(surely(&["review", warn]).status.code(), Some(0));
        assert_eq!(
            surely(&["review", warn, "--fail-on", "warning"])
                .status
                .code(),
            Some(1)
        );

        let bad = dir.join("bad.toml");
        std::fs::write(
            &bad,
            "[services.a.operations.op]\nkind = \"read\"\ncalls = [\"b.op\"]\n",
        )
        .unwrap();
        let out = surely(&["review", bad.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains("line 3, column 10"), "{err}");
        let out = surely(&["review", "no/such/file.toml"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let out = surely(&["review", warn, "--fail-on", "loud"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
    }

    #[test]
    fn json_carries_the_answers_the_paths_and_the_findings() {
        let out = surely(&["--json", "review", "examples/review/orders.toml"]);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let ids: Vec<&str> = v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["id"].as_str().unwrap())
            .collect();
        for id in surely::review::FindingId::ALL {
            assert!(ids.contains(&id.as_str()), "{id}: {ids:?}");
        }
        let first = &v["findings"][0];
        assert!(
            first["severity"] == "error" && first["path"].is_array() && first["fix"].is_string()
        );
        let op = &v["operations"][0];
        assert_eq!(op["answers"].as_array().unwrap().len(), 7);
        assert_eq!(op["answers"][0]["question"], "timeout_states");
        assert!(v["paths"][0]["worst"].is_number());
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("surely-review-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

// ---- the admin's page ---------------------------------------------------------------------

#[tokio::test]
async fn the_admin_shows_the_running_services_review() {
    use crate::http::{send, serve};
    use surely::admin::{Admin, Authorize};

    let chain = Chain::from_toml(BROKEN).unwrap();
    let admin = Admin::builder()
        .authorize(Authorize::dev_allow_all_from_loopback())
        .review(&chain)
        .build();
    let addr = serve(admin.router()).await;
    let page = send(addr, http::Method::GET, "/review", &[], bytes::Bytes::new()).await;
    assert_eq!(page.status, http::StatusCode::OK, "{}", page.body);
    for id in FindingId::ALL {
        assert!(page.body.contains(id.as_str()), "{id}");
    }
    assert!(page.body.contains("How long may an UNKNOWN wait"));
    assert!(page.body.contains("orders.place → payments.charge"));
    let api = send(
        addr,
        http::Method::GET,
        "/api/review",
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(api.status, http::StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(
        v["findings"].as_array().unwrap().len(),
        review(BROKEN).findings().len()
    );

    // A chain that cannot be reviewed says why; no chain is no page.
    let cycle = Chain::new().service(
        Service::new("a")
            .client("a", surely::client().describe())
            .operation(Operation::read("op").calls("a", "op")),
    );
    let admin = Admin::builder()
        .authorize(Authorize::dev_allow_all_from_loopback())
        .review(&cycle)
        .build();
    let addr = serve(admin.router()).await;
    let page = send(addr, http::Method::GET, "/review", &[], bytes::Bytes::new()).await;
    assert_eq!(page.status, http::StatusCode::INTERNAL_SERVER_ERROR);
    assert!(page.body.contains("cycle"), "{}", page.body);
    let admin = Admin::builder()
        .authorize(Authorize::dev_allow_all_from_loopback())
        .build();
    let addr = serve(admin.router()).await;
    let page = send(
        addr,
        http::Method::GET,
        "/api/review",
        &[],
        bytes::Bytes::new(),
    )
    .await;
    assert_eq!(page.status, http::StatusCode::NOT_FOUND);
}
