//! Runs `N` calls of one stack and nothing else, for `scripts/instructions.sh`, which counts
//! the instructions of two such runs under valgrind's callgrind (1 000 and 11 000 calls) and
//! takes their difference over 10 000: the cost of one call, the setup cancelled out.
//!
//! ```text
//! cargo run --release -p surely-instructions -- --calls 1000 --case ready/surely_client
//! cargo run --release -p surely-instructions -- --list
//! ```
//!
//! The stacks are the ones `benches/assembly.rs` times (`benches/shared/user.rs`: the user's
//! request type, inner services, classifier and `async fn`), and these besides:
//!
//! * `arc/…`, `captured/…`, `hyper_sized/…`: the client, tower's stack and the deadline stack
//!   over inner services shaped like real transports (an `Arc` to shared state, a captured
//!   flag, an `Arc` and settings as large as hyper-util's client), which can fail;
//! * `breaker/surely_breaker`: `BreakerLayer` over `CircuitBreaker::new()` with the user's
//!   classifier, the inner answering at once;
//! * `hedge/surely_hedge`: `HedgeLayer` (learned delay, its own budget) that does not fire;
//!   `hyper_sized/surely_hedge`: the same over the inner as large as hyper-util's client;
//! * `http/…`: a GET (one header, an empty body) through the `client::http()` preset (its
//!   defaults, no backoff), through tower's `Retry(TpsBudget)∘Timeout`, and bare; the inner
//!   answers 200 with a whole body at once; and the preset's floor (`http/floor`,
//!   `benches/shared/floor.rs`): the work on the wire and the return path any such stack must
//!   do, by hand with no layer;
//! * `http_info/…`: the same, over a transport whose responses carry an extension already, as
//!   hyper-util's client's do (its `HttpInfo`), so that handing the outcome back adds one
//!   allocation instead of three;
//! * `replay/…`: a keyed POST answered by the idempotency layer from the memory store (the
//!   key's first request ran before the count), and the handler alone (`bare`).

use std::convert::Infallible;
use std::future::{ready, Ready};
use std::hint::black_box;
use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use http::header::{HeaderValue, ACCEPT};
use http_body_util::{Empty, Full};
use surely::breaker::{BreakerLayer, CircuitBreaker};
use surely::hedge::HedgeLayer;
use surely::retry::backoff::Backoff;
use surely::server::idempotency::IdempotencyLayer;
use surely::server::store::MemoryStore;
use tokio::runtime::Runtime;
use tower::{service_fn, Layer, Service, ServiceExt};

#[path = "../../shared/user.rs"]
#[allow(dead_code)] // the timed bench's `large` shape is not counted here
mod user;
use user::*;

#[path = "../../shared/floor.rs"]
mod floor;
use floor::Floor;

/// One row: its name, and what makes its stack and runs `n` calls of it on the runtime.
struct Row {
    name: &'static str,
    run: fn(&Runtime, u64),
}

/// `n` calls of `svc` through the user's `get`, every one a success.
fn calls<S: Service<Get>>(rt: &Runtime, mut svc: S, n: u64)
where
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        for i in 0..n {
            black_box(get(&mut svc, i).await.expect("every call succeeds"));
        }
    });
}

/// `n` requests made by `request` through `svc`, every one answered.
fn requests<Rq, S: Service<Rq>>(rt: &Runtime, mut svc: S, request: fn(u64) -> Rq, n: u64)
where
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        for i in 0..n {
            let svc = svc.ready().await.expect("ready");
            black_box(svc.call(request(i)).await.expect("every call is answered"));
        }
    });
}

/// The GET of the `http` rows: one header, an empty body, as a client sends it.
fn http_get(_: u64) -> http::Request<Empty<Bytes>> {
    let mut req = http::Request::new(Empty::new());
    req.headers_mut()
        .insert(ACCEPT, HeaderValue::from_static("application/json"));
    req
}

/// The transport of the `http` rows: 200 and a whole body at once, over any request body.
fn http_ok<B>(_: http::Request<B>) -> Ready<io::Result<http::Response<Full<Bytes>>>> {
    ready(Ok(http::Response::new(Full::new(Bytes::from_static(
        b"{}",
    )))))
}

/// What hyper-util's legacy client puts in every response's extensions over its HTTP connector
/// (`hyper_util::client::legacy::connect::HttpInfo`: the connection's two addresses).
#[derive(Clone, Copy)]
#[allow(dead_code)] // carried, as hyper-util's is, not read
struct HttpInfo {
    remote: SocketAddr,
    local: SocketAddr,
}

/// The transport of the `http_info` rows: `http_ok`'s answer with an [`HttpInfo`] in its
/// extensions, as hyper-util's client's answers have, so that the response has an extension map
/// before any layer adds to it.
fn http_ok_info<B>(req: http::Request<B>) -> Ready<io::Result<http::Response<Full<Bytes>>>> {
    let mut res = http_ok(req).into_inner();
    if let Ok(res) = &mut res {
        let addr = SocketAddr::from(([127, 0, 0, 1], 8080));
        res.extensions_mut().insert(HttpInfo {
            remote: addr,
            local: addr,
        });
    }
    ready(res)
}

/// The keyed POST of the `replay` rows: always the same key and body.
fn keyed_post(_: u64) -> http::Request<Full<Bytes>> {
    http::Request::post("/orders")
        .header("idempotency-key", "order-1")
        .body(Full::new(Bytes::from_static(b"{\"item\":\"book\"}")))
        .expect("a request")
}

/// The handler of the `replay` rows: 201 and the order at once.
fn create_order(
    _: http::Request<Full<Bytes>>,
) -> Ready<Result<http::Response<Full<Bytes>>, Infallible>> {
    ready(Ok(http::Response::builder()
        .status(201)
        .body(Full::new(Bytes::from_static(b"{\"id\":\"o-1\"}")))
        .expect("a response")))
}

/// The `client::http()` preset of the `http` and `http_info` rows over `$inner`: its defaults,
/// no backoff, the bench's budget.
macro_rules! http_preset {
    ($inner:expr) => {
        surely::client::http()
            .retry(|r| r.backoff(Backoff::none()))
            .budget(ratio(false))
            .build($inner)
            .expect("a valid client")
    };
}

/// The hedge layer the `hedge` rows count: a learned delay, its own budget, the user's
/// classifier.
macro_rules! hedge {
    () => {
        HedgeLayer::builder()
            .classifier(surely::classify::from_fn(classify_get::<io::Error>))
            .build()
            .expect("a valid hedge layer")
    };
}

fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "ready/bare",
            run: |rt, n| calls(rt, service_fn(answer::<Small>), n),
        },
        Row {
            name: "ready/surely_client",
            run: |rt, n| {
                let svc = surely_client!(service_fn(answer::<Small>), io::Error, false);
                calls(rt, svc, n)
            },
        },
        Row {
            name: "ready/tower_retry_tps_timeout",
            run: |rt, n| calls(rt, tower_retry!(service_fn(answer::<Small>), false), n),
        },
        Row {
            name: "fail_once/bare",
            run: |rt, n| calls(rt, service_fn(refuse_first_bare::<Small>), n),
        },
        Row {
            name: "fail_once/surely_client",
            run: |rt, n| {
                let svc = surely_client!(service_fn(refuse_first::<Small>), io::Error, true);
                calls(rt, svc, n)
            },
        },
        Row {
            name: "fail_once/tower_retry_tps_timeout",
            run: |rt, n| calls(rt, tower_retry!(service_fn(refuse_first::<Small>), true), n),
        },
        Row {
            name: "deadline/bare",
            run: |rt, n| calls(rt, service_fn(answer::<Small>), n),
        },
        Row {
            name: "deadline/surely_deadline_attempt",
            run: |rt, n| calls(rt, surely_deadline_attempt!(service_fn(answer::<Small>)), n),
        },
        Row {
            name: "deadline/tower_timeout",
            run: |rt, n| {
                let svc = tower::timeout::Timeout::new(service_fn(answer::<Small>), LIMIT);
                calls(rt, svc, n)
            },
        },
        Row {
            name: "arc/surely_client",
            run: |rt, n| calls(rt, surely_client!(ArcInner::new(), io::Error, false), n),
        },
        Row {
            name: "arc/tower_retry_tps_timeout",
            run: |rt, n| calls(rt, tower_retry!(ArcInner::new(), false), n),
        },
        Row {
            name: "arc/surely_deadline_attempt",
            run: |rt, n| calls(rt, surely_deadline_attempt!(ArcInner::new()), n),
        },
        Row {
            name: "captured/surely_client",
            run: |rt, n| {
                calls(
                    rt,
                    surely_client!(CapturedInner::new(), io::Error, false),
                    n,
                )
            },
        },
        Row {
            name: "captured/tower_retry_tps_timeout",
            run: |rt, n| calls(rt, tower_retry!(CapturedInner::new(), false), n),
        },
        Row {
            name: "captured/surely_deadline_attempt",
            run: |rt, n| calls(rt, surely_deadline_attempt!(CapturedInner::new()), n),
        },
        Row {
            name: "hyper_sized/surely_client",
            run: |rt, n| {
                calls(
                    rt,
                    surely_client!(HyperSizedInner::new(), io::Error, false),
                    n,
                )
            },
        },
        Row {
            name: "hyper_sized/tower_retry_tps_timeout",
            run: |rt, n| calls(rt, tower_retry!(HyperSizedInner::new(), false), n),
        },
        Row {
            name: "breaker/surely_breaker",
            run: |rt, n| {
                let layer = BreakerLayer::new(CircuitBreaker::new())
                    .classifier(surely::classify::from_fn(classify_get::<io::Error>));
                calls(rt, layer.layer(service_fn(answer::<Small>)), n)
            },
        },
        Row {
            name: "hedge/surely_hedge",
            run: |rt, n| calls(rt, hedge!().layer(service_fn(answer::<Small>)), n),
        },
        Row {
            name: "hyper_sized/surely_hedge",
            run: |rt, n| calls(rt, hedge!().layer(HyperSizedInner::new()), n),
        },
        Row {
            name: "http/bare",
            run: |rt, n| requests(rt, service_fn(http_ok), http_get, n),
        },
        Row {
            name: "http/surely_client_http",
            run: |rt, n| requests(rt, http_preset!(service_fn(http_ok)), http_get, n),
        },
        Row {
            name: "http/floor",
            run: |rt, n| requests(rt, Floor(service_fn(http_ok)), http_get, n),
        },
        Row {
            name: "http/tower_retry_tps_timeout",
            run: |rt, n| requests(rt, tower_retry!(service_fn(http_ok), false), http_get, n),
        },
        Row {
            name: "http_info/bare",
            run: |rt, n| requests(rt, service_fn(http_ok_info), http_get, n),
        },
        Row {
            name: "http_info/surely_client_http",
            run: |rt, n| requests(rt, http_preset!(service_fn(http_ok_info)), http_get, n),
        },
        Row {
            name: "http_info/floor",
            run: |rt, n| requests(rt, Floor(service_fn(http_ok_info)), http_get, n),
        },
        Row {
            name: "http_info/tower_retry_tps_timeout",
            run: |rt, n| {
                requests(
                    rt,
                    tower_retry!(service_fn(http_ok_info), false),
                    http_get,
                    n,
                )
            },
        },
        Row {
            name: "replay/bare",
            run: |rt, n| requests(rt, service_fn(create_order), keyed_post, n),
        },
        Row {
            name: "replay/surely_key_layer",
            run: |rt, n| {
                let layer = IdempotencyLayer::builder(MemoryStore::new())
                    .build()
                    .expect("a valid layer");
                let mut svc = layer.layer(service_fn(create_order));
                // The key's first request runs the handler; every counted one is a replay.
                rt.block_on(async {
                    let ready = ServiceExt::<http::Request<Full<Bytes>>>::ready(&mut svc);
                    let first = ready.await.expect("ready").call(keyed_post(0)).await;
                    assert_eq!(first.expect("answered").status(), 201);
                });
                requests(rt, svc, keyed_post, n)
            },
        },
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    let rows = rows();
    if args.iter().any(|a| a == "--list") {
        for row in &rows {
            println!("{}", row.name);
        }
        return ExitCode::SUCCESS;
    }
    let (Some(n), Some(name)) = (value("--calls"), value("--case")) else {
        eprintln!("usage: surely-instructions --calls N --case GROUP/NAME | --list");
        return ExitCode::from(2);
    };
    let Ok(n) = n.parse::<u64>() else {
        eprintln!("--calls takes a number of calls, not {n:?}");
        return ExitCode::from(2);
    };
    let Some(row) = rows.iter().find(|r| r.name == name.as_str()) else {
        eprintln!("no case {name:?} (--list lists them)");
        return ExitCode::from(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    let _entered = rt.enter();
    (row.run)(&rt, n);
    ExitCode::SUCCESS
}
