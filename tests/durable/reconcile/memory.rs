//! Reconciliation on the memory store, in paused time.

use std::future::{ready, Future};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use surely::reconcile::{
    Difference, DifferenceStore, Fact, ItemState, Marked, MemoryDifferences, MemorySource,
    PageRequest, Reconciler, RepairAnswer, RepairId, RepairRequest, Repairer, Rule, RuleError,
    Seen, SeenFact, Source, Want,
};
use surely::record::InMemoryRecorder;
use surely::retry::backoff::Backoff;

use super::{ago, now, reconciler, secs, Systems, Target, GRACE};

/// The seed's cases, and one in flight: three differences, each recorded once with its
/// repair; the in-flight key is not flagged; a second pass records nothing new.
#[tokio::test(start_paused = true)]
async fn differences_are_found_once_and_in_flight_work_is_left_alone() {
    let s = Systems::default();
    // A charge while the order still waits for payment.
    s.orders.put("o-1", "awaiting_payment", 2, ago(3600));
    s.payments.put("o-1", "charged", 1, ago(3500));
    // Consistent: paid and charged, stock reserved.
    s.orders.put("o-2", "paid", 3, ago(3600));
    s.payments.put("o-2", "charged", 1, ago(3600));
    s.inventory.put("o-2", "reserved", 1, ago(3600));
    // Stock released while the order is still cancelling.
    s.orders.put("o-3", "cancelling", 4, ago(4000));
    s.inventory.put("o-3", "released", 2, ago(3900));
    // A refund owed: a charge without an order.
    s.payments.put("o-4", "charged", 1, ago(7200));
    // In flight: charged a minute ago, the order not yet marked paid.
    s.orders.put("o-5", "awaiting_payment", 1, ago(600));
    s.payments.put("o-5", "charged", 1, ago(60));

    let store = MemoryDifferences::new();
    let mut r = reconciler(&s, store.clone());
    let pass = r.run_once(now()).await.unwrap();
    assert_eq!(pass.keys, 5);
    assert_eq!(pass.differences, 3, "{pass:?}");
    assert_eq!((pass.new, pass.known), (3, 0));
    assert_eq!(pass.in_flight, 1, "{pass:?}");

    let items = store.list(None, 100).await.unwrap();
    let found: Vec<(&str, &[u8], Option<&str>)> = items
        .iter()
        .map(|i| {
            let d = &i.difference;
            (d.rule.as_str(), d.key.as_ref(), d.action.as_deref())
        })
        .collect();
    assert_eq!(
        found,
        [
            ("payment-order", &b"o-1"[..], Some("mark-paid")),
            ("order-inventory", &b"o-3"[..], Some("finish-cancel")),
            ("payment-order", &b"o-4"[..], Some("refund")),
        ]
    );
    assert!(items.iter().all(|i| i.state == ItemState::Open));

    let again = r.run_once(now()).await.unwrap();
    assert_eq!((again.differences, again.new, again.known), (3, 0, 3));
    assert_eq!(store.list(None, 100).await.unwrap().len(), 3);

    // Once the grace window has passed, the in-flight key is a difference too.
    let later = r.run_once(now() + GRACE).await.unwrap();
    assert_eq!((later.new, later.in_flight), (1, 0), "{later:?}");
}

/// The repair id is a digest of the rule, the key and the facts' versions: the same facts give
/// the same id; another version, key or rule another one.
#[test]
fn the_repair_id_is_deterministic() {
    let seen = |v| {
        vec![
            Seen::new(
                "orders",
                Some(SeenFact::new("awaiting_payment", v, ago(10))),
            ),
            Seen::new("payments", None),
        ]
    };
    let id = RepairId::of("r", b"k", &seen(1));
    assert_eq!(id, RepairId::of("r", b"k", &seen(1)));
    // The values and times are not part of it: the versions say which facts they were.
    let other_time = vec![
        Seen::new("orders", Some(SeenFact::new("x", 1, ago(99)))),
        Seen::new("payments", None),
    ];
    assert_eq!(id, RepairId::of("r", b"k", &other_time));
    assert_ne!(id, RepairId::of("r", b"k", &seen(2)));
    assert_ne!(id, RepairId::of("r", b"k2", &seen(1)));
    assert_ne!(id, RepairId::of("r2", b"k", &seen(1)));
    // No two inputs share an encoding: moving a byte from the rule to the key changes it.
    assert_ne!(RepairId::of("ab", b"c", &[]), RepairId::of("a", b"bc", &[]));
    assert!(id.as_str().starts_with("rep-") && id.as_str().len() == 36);
    // `docs::reconciliation`: the first 16 bytes of the SHA-256 of the length-prefixed fields
    // (a version, a missing fact), in hex.
    assert_eq!(id.as_str(), "rep-95d651cedc4a111d8b76a802b3fdc44a");
    assert_eq!(RepairId::parse(id.as_str()).unwrap(), id);
    assert!(RepairId::parse("rep-xyz").unwrap_err().is_invalid());
    let d = Difference::new("r", Bytes::from_static(b"k"), seen(1), None);
    assert_eq!(d.id, id);
}

/// Each difference is repaired once, through the service, which receives the repair id; a
/// second comparison over the repaired facts finds them consistent and applies nothing.
#[tokio::test(start_paused = true)]
async fn repairs_are_applied_once_and_a_rerun_applies_nothing() {
    let s = Systems::default();
    s.orders.put("o-1", "awaiting_payment", 2, ago(3600));
    s.payments.put("o-1", "charged", 1, ago(3500));
    s.inventory.put("o-1", "reserved", 1, ago(3500));
    s.orders.put("o-3", "cancelling", 4, ago(4000));
    s.inventory.put("o-3", "released", 2, ago(3900));
    let store = MemoryDifferences::new();
    let mut r = reconciler(&s, store.clone());
    r.run_once(now()).await.unwrap();

    // The target applies the repair to the orders system, at a new version.
    let target = Target::default();
    let orders = s.orders.clone();
    let t = target.clone();
    let service = tower::service_fn(move |req: RepairRequest| {
        let (orders, t) = (orders.clone(), t.clone());
        async move {
            let answer = t.apply(&req);
            let old = orders.get(&req.key).unwrap();
            let value = match req.action.as_str() {
                "mark-paid" => "paid",
                "finish-cancel" => "cancelled",
                other => panic!("no action {other}"),
            };
            orders.put(req.key.clone(), value, old.version + 1, ago(3000));
            Ok::<_, std::io::Error>(answer)
        }
    });
    let mut repairer = Repairer::builder(store.clone(), service).build().unwrap();
    let round = repairer.run_once().await.unwrap();
    assert_eq!((round.claimed, round.repaired), (2, 2), "{round:?}");
    assert!(target.applied().values().all(|&n| n == 1));
    assert_eq!(target.applied().len(), 2);

    let again = r.run_once(now()).await.unwrap();
    assert_eq!(again.differences, 0, "{again:?}");
    assert_eq!(repairer.run_once().await.unwrap().claimed, 0);
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.open(), stats.repaired), (0, 2));
}

/// A repairer applies a repair and dies before it marks it. Its lease passes, another
/// repairer takes the difference and sends the same repair id: the target applies it once.
/// The dead repairer's claim can no longer mark.
#[tokio::test(start_paused = true)]
async fn a_crash_between_the_repair_and_its_mark_applies_it_once() {
    let s = Systems::default();
    s.orders.put("o-1", "awaiting_payment", 2, ago(3600));
    s.payments.put("o-1", "charged", 1, ago(3500));
    let store = MemoryDifferences::new();
    reconciler(&s, store.clone()).run_once(now()).await.unwrap();

    let target = Target::default();
    // The first repairer's target applies, then never answers: the process dies there.
    let t = target.clone();
    let dying = tower::service_fn(move |req: RepairRequest| {
        let t = t.clone();
        async move {
            t.apply(&req);
            std::future::pending::<()>().await;
            Ok::<_, std::io::Error>(RepairAnswer::Applied)
        }
    });
    let mut first = Repairer::builder(store.clone(), dying)
        .lease(secs(60))
        .timeout(secs(30))
        .build()
        .unwrap();
    tokio::select! {
        _ = first.run_once() => panic!("the first repairer must not finish"),
        _ = tokio::time::sleep(secs(5)) => {}
    }
    drop(first);
    let id = store.list(None, 1).await.unwrap()[0].difference.id.clone();
    assert_eq!(target.calls(&id), 1);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().state,
        ItemState::Claimed
    );

    // Within the lease, nobody takes it.
    let mut second = Repairer::builder(store.clone(), target.service())
        .lease(secs(60))
        .timeout(secs(30))
        .build()
        .unwrap();
    assert_eq!(second.run_once().await.unwrap().claimed, 0);
    tokio::time::advance(secs(60)).await;
    let round = second.run_once().await.unwrap();
    assert_eq!((round.claimed, round.repaired), (1, 1), "{round:?}");
    assert_eq!(target.calls(&id), 2, "the same repair id was sent again");
    assert_eq!(target.applied()[&id], 1, "and applied once");
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().state,
        ItemState::Repaired
    );
}

/// A claim whose lease passed cannot mark: the store refuses it as stale.
#[tokio::test(start_paused = true)]
async fn a_stale_claim_cannot_mark() {
    let store = MemoryDifferences::new();
    let d = Difference::new("r", "k", vec![], Some("fix".to_owned()));
    assert!(store.record(&d).await.unwrap());
    assert!(!store.record(&d).await.unwrap(), "recording is idempotent");
    let old = store.claim(10, secs(10)).await.unwrap().remove(0);
    tokio::time::advance(secs(11)).await;
    let new = store.claim(10, secs(10)).await.unwrap().remove(0);
    assert!(new.fence() > old.fence());
    assert!(store
        .mark_repaired(&old, "late")
        .await
        .unwrap_err()
        .is_stale());
    assert!(store
        .to_manual(&old, "me", "late")
        .await
        .unwrap_err()
        .is_stale());
    assert_eq!(
        store.mark_repaired(&new, "done").await.unwrap(),
        Marked::Now
    );
    // Marking again, with any claim, changes nothing.
    assert_eq!(
        store.mark_repaired(&old, "again").await.unwrap(),
        Marked::Already
    );
}

/// Four repairers at once over one store: every difference is sent to the target once.
#[tokio::test(start_paused = true)]
async fn four_repairers_at_once_repair_each_difference_once() {
    let s = Systems::default();
    for n in 0..200 {
        let key = format!("o-{n:04}");
        s.orders.put(key.clone(), "awaiting_payment", 1, ago(3600));
        s.payments.put(key, "charged", 1, ago(3600));
    }
    let store = MemoryDifferences::new();
    let pass = reconciler(&s, store.clone()).run_once(now()).await.unwrap();
    assert_eq!(pass.new, 200);

    let target = Target::default();
    let mut tasks = Vec::new();
    for n in 0..4 {
        let t = target.clone();
        // Each repair takes a while, so the repairers' rounds interleave.
        let service = tower::service_fn(move |req: RepairRequest| {
            let t = t.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok::<_, std::io::Error>(t.apply(&req))
            }
        });
        let mut repairer = Repairer::builder(store.clone(), service)
            .name(format!("repairer-{n}"))
            .batch(7)
            .build()
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let mut repaired = 0;
            loop {
                let round = repairer.run_once().await.unwrap();
                assert_eq!(round.stale, 0);
                repaired += round.repaired;
                if round.claimed == 0 {
                    return repaired;
                }
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 200);
    let ids: Vec<RepairId> = store
        .list(None, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.difference.id)
        .collect();
    assert_eq!(ids.len(), 200);
    for id in &ids {
        assert_eq!(target.calls(id), 1, "{id} sent more than once");
    }
    assert_eq!(store.stats().await.unwrap().repaired, 200);
}

/// A repair that fails is tried again after its backoff, and goes to the manual queue after
/// its tries, with the repairer's name and the last error; one the target refuses goes there
/// at once; one without a declared repair is there from the start.
#[tokio::test(start_paused = true)]
async fn failures_are_retried_then_go_to_the_manual_queue_with_who_and_why() {
    let store = MemoryDifferences::new();
    let failing = Difference::new("r", "k-fail", vec![], Some("fix".to_owned()));
    let refused = Difference::new("r", "k-refuse", vec![], Some("fix".to_owned()));
    let unknown = Difference::new("r", "k-none", vec![], None);
    for d in [&failing, &refused, &unknown] {
        store.record(d).await.unwrap();
    }
    assert_eq!(
        store.get(&unknown.id).await.unwrap().unwrap().state,
        ItemState::Manual
    );
    let tries = Arc::new(AtomicU32::new(0));
    let t = tries.clone();
    let service = tower::service_fn(move |req: RepairRequest| {
        let t = t.clone();
        async move {
            if req.key.as_ref() == b"k-refuse" {
                return Ok(RepairAnswer::Refused("the order moved on".to_owned()));
            }
            assert_eq!(req.attempt, t.fetch_add(1, Ordering::SeqCst) + 1);
            Err(std::io::Error::other("the order service is down"))
        }
    });
    let mut repairer = Repairer::builder(store.clone(), service)
        .name("host-7")
        .max_tries(3)
        .backoff(Backoff::constant(secs(10)))
        .build()
        .unwrap();
    let round = repairer.run_once().await.unwrap();
    assert_eq!(
        (round.claimed, round.retried, round.to_manual),
        (2, 1, 1),
        "{round:?}"
    );
    // Not before its backoff.
    assert_eq!(repairer.run_once().await.unwrap().claimed, 0);
    tokio::time::advance(secs(10)).await;
    assert_eq!(repairer.run_once().await.unwrap().retried, 1);
    tokio::time::advance(secs(10)).await;
    assert_eq!(repairer.run_once().await.unwrap().to_manual, 1);
    assert_eq!(tries.load(Ordering::SeqCst), 3);

    let item = store.get(&failing.id).await.unwrap().unwrap();
    assert_eq!(item.state, ItemState::Manual);
    assert_eq!(item.who.as_deref(), Some("host-7"));
    let note = item.note.unwrap();
    assert!(
        note.contains("3 tries failed") && note.contains("down"),
        "{note}"
    );
    let item = store.get(&refused.id).await.unwrap().unwrap();
    assert_eq!(item.who.as_deref(), Some("host-7"));
    assert!(item.note.unwrap().contains("the order moved on"));
    let item = store.get(&unknown.id).await.unwrap().unwrap();
    assert!(item.note.unwrap().contains("no repair is declared"));

    // A person resolves it: who and why are checked and kept.
    assert!(store
        .resolve_manually(&failing.id, "", "done")
        .await
        .unwrap_err()
        .is_invalid());
    assert!(store
        .resolve_manually(&failing.id, "ana\u{0}", "done")
        .await
        .unwrap_err()
        .is_invalid());
    let m = store
        .resolve_manually(&failing.id, "ana", "refunded by hand")
        .await
        .unwrap();
    assert_eq!(m, Marked::Now);
    let item = store.get(&failing.id).await.unwrap().unwrap();
    assert_eq!(
        (item.state, item.who.as_deref()),
        (ItemState::Resolved, Some("ana"))
    );
    let missing = RepairId::of("nope", b"", &[]);
    assert!(store
        .resolve_manually(&missing, "ana", "x")
        .await
        .unwrap_err()
        .is_not_found());
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.open(), stats.manual, stats.resolved), (2, 2, 1));
}

/// Bad configuration is a typed error, never a panic.
#[test]
fn bad_rules_are_typed_errors() {
    let build = |sources: &[&str], rules: Vec<Rule>| {
        let mut b = Reconciler::builder(MemoryDifferences::new());
        for s in sources {
            b = b.source(*s, MemorySource::new());
        }
        for r in rules {
            b = b.rule(r);
        }
        b.build().map(|_| ()).unwrap_err()
    };
    let ok = || Rule::new("r", ["a", "b"]).consistent([Want::Any, Want::Any]);
    assert_eq!(build(&[], vec![ok()]), RuleError::NoSources);
    assert_eq!(build(&["a", "b"], vec![]), RuleError::NoRules);
    assert!(matches!(
        build(&["a", "a"], vec![ok()]),
        RuleError::DuplicateSource(_)
    ));
    assert!(matches!(
        build(&["a", "b"], vec![ok(), ok()]),
        RuleError::DuplicateRule(n) if n == "\"r\""
    ));
    assert!(matches!(
        build(&["a", "b"], vec![Rule::new("r", ["a", "c"]).consistent([Want::Any, Want::Any])]),
        RuleError::UnknownSource { source_name, .. } if source_name == "\"c\""
    ));
    assert!(matches!(
        build(
            &["a", "b"],
            vec![Rule::new("r", ["a"]).consistent([Want::Any])]
        ),
        RuleError::TooFewSources { got: 1, .. }
    ));
    assert!(matches!(
        build(
            &["a", "b"],
            vec![Rule::new("r", ["a", "a"]).consistent([Want::Any, Want::Any])]
        ),
        RuleError::SourceTwice { .. }
    ));
    assert!(matches!(
        build(&["a", "b"], vec![Rule::new("r", ["a", "b"])]),
        RuleError::NoCombinations(_)
    ));
    assert!(matches!(
        build(
            &["a", "b"],
            vec![Rule::new("r", ["a", "b"]).consistent([Want::Any])]
        ),
        RuleError::Arity {
            expected: 2,
            got: 1,
            index: 0,
            ..
        }
    ));
    assert!(matches!(
        build(
            &["a", "b"],
            vec![Rule::new("r", ["a", "b"]).repair([Want::Missing, Want::Missing], "x")]
        ),
        RuleError::NothingThere { .. }
    ));
    assert!(matches!(
        build(
            &["a", "b"],
            vec![Rule::new("r", ["a", "b"]).repair([Want::Any, Want::Any], "no spaces")]
        ),
        RuleError::InvalidName { what: "action", .. }
    ));
    // A hostile name is refused, and the error shows only its start.
    let long = "x".repeat(100_000);
    let err = build(
        &["a", "b"],
        vec![Rule::new(long.as_str(), ["a", "b"]).consistent([Want::Any, Want::Any])],
    );
    assert!(matches!(err, RuleError::InvalidName { what: "rule", .. }));
    assert!(err.to_string().len() < 300, "{err}");
    assert!(matches!(
        build(&["a\0", "b"], vec![ok()]),
        RuleError::InvalidName { what: "source", .. }
    ));
    let err = Reconciler::builder(MemoryDifferences::new())
        .source("a", MemorySource::new())
        .source("b", MemorySource::new())
        .rule(ok())
        .page_size(0)
        .build()
        .unwrap_err();
    assert!(matches!(
        err,
        RuleError::Setting {
            setting: "page_size",
            ..
        }
    ));

    macro_rules! repairer {
        (|$b:ident| $e:expr) => {{
            let service = tower::service_fn(|_req: RepairRequest| async {
                Ok::<_, std::io::Error>(RepairAnswer::Applied)
            });
            let $b = Repairer::builder(MemoryDifferences::new(), service);
            $e.build().map(|_| ()).unwrap_err().setting()
        }};
    }
    assert_eq!(repairer!(|b| b.batch(0)), "repairer batch");
    assert_eq!(repairer!(|b| b.max_tries(0)), "repairer max_tries");
    assert_eq!(repairer!(|b| b.timeout(Duration::ZERO)), "repairer timeout");
    assert_eq!(
        repairer!(|b| b.lease(secs(5)).timeout(secs(5))),
        "repairer lease"
    );
    assert_eq!(repairer!(|b| b.name("")), "repairer name");
    assert_eq!(repairer!(|b| b.name("a\nb")), "repairer name");
}

/// Keys are bytes: empty, a megabyte long, with NUL, not UTF-8. They are compared, recorded,
/// repaired and shown without a panic, and shown to people cut short.
#[tokio::test(start_paused = true)]
async fn huge_and_hostile_keys_never_panic() {
    let s = Systems::default();
    let huge = Bytes::from(vec![b'k'; 1 << 20]);
    let keys: Vec<Bytes> = vec![
        Bytes::new(),
        Bytes::from_static(b"\0"),
        Bytes::from_static(b"a\0b"),
        Bytes::from_static(&[0xff, 0xfe, 0x00, 0x80]),
        Bytes::from_static("\u{202e}evil\n".as_bytes()),
        Bytes::from_static("\u{202e}lave".as_bytes()),
        huge.clone(),
    ];
    for k in &keys {
        s.orders
            .put(k.clone(), "awaiting_payment", u64::MAX, ago(3600));
        s.payments.put(k.clone(), "charged", 0, ago(3600));
    }
    let store = MemoryDifferences::new();
    let mut r = reconciler(&s, store.clone());
    let pass = r.run_once(now()).await.unwrap();
    assert_eq!((pass.keys, pass.new), (7, 7), "{pass:?}");
    assert_eq!(r.run_once(now()).await.unwrap().new, 0);
    let target = Target::default();
    let mut repairer = Repairer::builder(store.clone(), target.service())
        .batch(100)
        .build()
        .unwrap();
    assert_eq!(repairer.run_once().await.unwrap().repaired, 7);
    let mut got = target.keys();
    got.sort();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(got, want);
    for item in store.list(None, 100).await.unwrap() {
        let shown = item.difference.key_display();
        assert!(shown.len() < 200, "{} bytes shown", shown.len());
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(!shown.contains('\u{202e}'), "{shown:?}");
    }
}

/// A source that breaks the order it promised (or pages more than asked) fails the pass with
/// an error naming it; nothing panics, and nothing wrong is recorded.
#[tokio::test(start_paused = true)]
async fn a_source_out_of_order_is_an_error() {
    struct Bad(Vec<&'static str>);
    impl Source for Bad {
        fn page(
            &self,
            req: PageRequest<'_>,
        ) -> impl Future<Output = Result<Vec<Fact>, surely::classify::BoxError>> + Send {
            let facts = if req.after.is_some() {
                vec![]
            } else {
                self.0
                    .iter()
                    .map(|k| Fact::new(*k, "x", 1, ago(3600)))
                    .collect()
            };
            ready(Ok(facts))
        }
    }
    struct Failing;
    impl Source for Failing {
        fn page(
            &self,
            _req: PageRequest<'_>,
        ) -> impl Future<Output = Result<Vec<Fact>, surely::classify::BoxError>> + Send {
            ready(Err("connection refused".into()))
        }
    }
    let rule = || Rule::new("r", ["a", "b"]).repair([Want::Any, Want::Any], "fix");
    for (bad, page) in [
        (vec!["b", "a"], 10),
        (vec!["a", "a"], 10),
        (vec!["a", "b", "c"], 2),
    ] {
        let store = MemoryDifferences::new();
        let mut r = Reconciler::builder(store.clone())
            .source("a", MemorySource::new())
            .source("bad", Bad(bad))
            .rule(Rule::new("r", ["a", "bad"]).repair([Want::Any, Want::Any], "fix"))
            .page_size(page)
            .build()
            .unwrap();
        let err = r.run_once(now()).await.unwrap_err();
        assert!(err.is_source(), "{err}");
        assert!(err.to_string().contains("bad"), "{err}");
    }
    let mut r = Reconciler::builder(MemoryDifferences::new())
        .source("a", MemorySource::new())
        .source("b", Failing)
        .rule(rule())
        .build()
        .unwrap();
    let err = r.run_once(now()).await.unwrap_err();
    // The source's failure is the error's source, said once.
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        err.is_source() && cause.as_deref() == Some("connection refused"),
        "{err}: {cause:?}"
    );
    assert!(!err.to_string().contains("connection refused"), "{err}");
}

/// The merge streams: with pages of one fact, three sources of interleaved keys give the same
/// differences as with one big page each.
#[tokio::test(start_paused = true)]
async fn pages_of_any_size_give_the_same_differences() {
    let s = Systems::default();
    for n in 0..300u32 {
        let key = format!("k{n:05}");
        match n % 5 {
            0 => s.orders.put(key.clone(), "awaiting_payment", 1, ago(3600)),
            1 => s.payments.put(key.clone(), "charged", 1, ago(3600)),
            2 => s.inventory.put(key.clone(), "released", 1, ago(3600)),
            _ => {}
        }
        if n % 3 == 0 {
            s.payments.put(key.clone(), "charged", 2, ago(3600));
        }
        if n % 7 == 0 {
            s.orders.put(key, "cancelling", 3, ago(3600));
        }
    }
    let mut found = Vec::new();
    for page in [1, 2, 7, 1000] {
        let store = MemoryDifferences::new();
        let mut b = Reconciler::builder(store.clone())
            .source("orders", s.orders.clone())
            .source("payments", s.payments.clone())
            .source("inventory", s.inventory.clone())
            .page_size(page);
        for rule in super::rules() {
            b = b.rule(rule);
        }
        let pass = b.build().unwrap().run_once(now()).await.unwrap();
        let mut ids: Vec<_> = store
            .list(None, 10_000)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.difference.id)
            .collect();
        ids.sort();
        found.push((pass, ids));
    }
    assert!(found[0].1.len() > 50);
    for f in &found[1..] {
        assert_eq!(f, &found[0]);
    }
}

/// `docs::reconciliation`: a pass holds a page per source, whatever the number of keys; the
/// default page is 1000 facts.
#[tokio::test(start_paused = true)]
async fn a_pass_reads_each_source_a_thousand_facts_at_a_time_by_default() {
    struct Asked(MemorySource, Arc<std::sync::Mutex<Vec<usize>>>);
    impl Source for Asked {
        fn page(
            &self,
            request: PageRequest<'_>,
        ) -> impl Future<Output = Result<Vec<Fact>, surely::classify::BoxError>> + Send {
            self.1.lock().unwrap().push(request.limit);
            self.0.page(request)
        }
    }
    let (events, projection) = (MemorySource::new(), MemorySource::new());
    for n in 0..2_500u32 {
        events.put(format!("e{n:05}"), "published", 1, ago(3600));
        projection.put(format!("e{n:05}"), "applied", 1, ago(3600));
    }
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let pass = Reconciler::builder(MemoryDifferences::new())
        .source("events", Asked(events, asked.clone()))
        .source("projection", Asked(projection, asked.clone()))
        .rule(
            Rule::new("event-projection", ["events", "projection"])
                .consistent([Want::is("published"), Want::is("applied")]),
        )
        .build()
        .unwrap()
        .run_once(now())
        .await
        .unwrap();
    assert_eq!(pass.new, 0);
    let asked = asked.lock().unwrap();
    assert!(asked.iter().all(|&limit| limit == 1000), "{asked:?}");
    assert!(asked.len() >= 6, "three pages of each source: {asked:?}");
}

/// After each pass the store's stats go to the recorder: open differences by rule, the manual
/// queue, the oldest one's age.
#[tokio::test(start_paused = true)]
async fn a_pass_reports_open_differences_by_rule() {
    let s = Systems::default();
    s.orders.put("o-1", "awaiting_payment", 2, ago(3600));
    s.payments.put("o-1", "charged", 1, ago(3500));
    s.orders.put("o-3", "cancelling", 4, ago(4000));
    s.inventory.put("o-3", "released", 2, ago(3900));
    s.orders.put("o-9", "lost", 4, ago(4000));
    s.inventory.put("o-9", "released", 2, ago(3900));
    let store = MemoryDifferences::new();
    let records = InMemoryRecorder::new();
    let mut b = Reconciler::builder(store.clone())
        .source("orders", s.orders.clone())
        .source("payments", s.payments.clone())
        .source("inventory", s.inventory.clone())
        .recorder(records.clone());
    for rule in super::rules() {
        b = b.rule(rule);
    }
    let mut r = b.build().unwrap();
    r.run_once(now()).await.unwrap();
    tokio::time::advance(secs(90)).await;
    r.run_once(now()).await.unwrap();
    let reports = records.reconcile_reports();
    assert_eq!(reports.len(), 2);
    let last = &reports[1];
    assert_eq!(
        last.open_by_rule,
        [
            ("order-inventory".to_owned(), 2),
            ("payment-order".to_owned(), 1)
        ]
    );
    assert_eq!((last.open(), last.manual), (3, 1));
    assert_eq!(last.oldest_open, Some(secs(90)));
    let _ = SystemTime::now();
}

/// `run` passes on a schedule until stopped; a difference that appears between passes is
/// found by the next one.
#[tokio::test(start_paused = true)]
async fn a_running_reconciler_passes_on_schedule_until_stopped() {
    let s = Systems::default();
    let store = MemoryDifferences::new();
    let records = InMemoryRecorder::new();
    let mut b = Reconciler::builder(store.clone())
        .source("orders", s.orders.clone())
        .source("payments", s.payments.clone())
        .source("inventory", s.inventory.clone())
        .recorder(records.clone());
    for rule in super::rules() {
        b = b.rule(rule);
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(b.build().unwrap().run(secs(60), async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(secs(1)).await;
    assert_eq!(records.reconcile_reports().len(), 1);
    // Long settled, so not in flight whatever the wall clock says.
    s.payments.put("o-9", "charged", 1, SystemTime::UNIX_EPOCH);
    tokio::time::sleep(secs(60)).await;
    let reports = records.reconcile_reports();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[1].open(), 1);
    stop.send(()).unwrap();
    task.await.unwrap();
    tokio::time::sleep(secs(600)).await;
    assert_eq!(records.reconcile_reports().len(), 2);
}

/// Four reconcilers at once over the same systems and one store: each difference is one item.
#[tokio::test(start_paused = true)]
async fn four_reconcilers_at_once_record_each_difference_once() {
    let s = Systems::default();
    for n in 0..300 {
        let key = format!("o-{n:04}");
        let status = if n % 3 == 0 {
            "awaiting_payment"
        } else {
            "paid"
        };
        s.orders.put(key.clone(), status, 1, ago(3600));
        if status == "paid" {
            s.inventory.put(key.clone(), "reserved", 1, ago(3600));
        }
        s.payments.put(key, "charged", 1, ago(3600));
    }
    let store = MemoryDifferences::new();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let mut b = Reconciler::builder(store.clone())
                .source("orders", s.orders.clone())
                .source("payments", s.payments.clone())
                .source("inventory", s.inventory.clone())
                .page_size(7);
            for rule in super::rules() {
                b = b.rule(rule);
            }
            let mut r = b.build().unwrap();
            tokio::spawn(async move { r.run_once(now()).await.unwrap() })
        })
        .collect();
    let (mut new, mut known) = (0, 0);
    for t in tasks {
        let pass = t.await.unwrap();
        assert_eq!(pass.differences, 100);
        new += pass.new;
        known += pass.known;
    }
    assert_eq!((new, known), (100, 300));
    assert_eq!(store.list(None, 1000).await.unwrap().len(), 100);
}
