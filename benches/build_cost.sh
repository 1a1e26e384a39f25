#!/usr/bin/env bash
# What a new user pays to build the client: a new binary that calls `surely::client()` with
# default features, against the same binary on tower with `retry` and `timeout`, and the README's
# hyper quickstart (`features = ["hyper"]`). Each is a clean `cargo build --release` in its own
# target directory; the three alternate, ROUNDS times (default 3), so that a busy machine slows
# all of them alike. Prints the crates compiled and the wall time of each build.
#
#   benches/build_cost.sh            # from the repository's root
#   ROUNDS=5 benches/build_cost.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${ROUNDS:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

probe() { # name, dependencies, main.rs
  mkdir -p "$work/$1/src"
  printf '[package]\nname = "%s"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n%s\n' \
    "$1" "$2" >"$work/$1/Cargo.toml"
  cat >"$work/$1/src/main.rs"
}

probe tower_retry_timeout 'tokio = { version = "1", features = ["rt", "macros"] }
tower = { version = "0.5", features = ["retry", "timeout"] }' <<'EOF'
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let layers = tower::ServiceBuilder::new().timeout(Duration::from_secs(2));
    println!("{}", std::mem::size_of_val(&layers));
}
EOF

probe surely_client "tokio = { version = \"1\", features = [\"rt\", \"macros\"] }
http = \"1\"
tower-service = \"0.3\"
surely = { path = \"$repo\" }" <<'EOF'
use std::convert::Infallible;
use std::future::{poll_fn, ready, Ready};
use std::task::{Context, Poll};
use std::time::Duration;
use surely::{Outcome, OutcomeExt};
use tower_service::Service;

#[derive(Clone)]
struct Transport;

impl Service<http::Request<String>> for Transport {
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, _: http::Request<String>) -> Self::Future {
        ready(Ok(http::Response::new("ok".to_owned())))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut client = surely::client()
        .timeout(Duration::from_secs(2))
        .per_try_timeout(Duration::from_millis(500))
        .build(Transport)?;
    let order = http::Request::post("/orders").body("o-1".to_owned())?;
    poll_fn(|cx| client.poll_ready(cx)).await?;
    match client.call(order).await.outcome() {
        Outcome::Succeeded => println!("ordered"),
        Outcome::Failed => println!("not ordered"),
        Outcome::Unknown => println!("the order may have been placed"),
    }
    Ok(())
}
EOF

probe surely_hyper_quickstart "tokio = { version = \"1\", features = [\"rt\", \"macros\"] }
http = \"1\"
bytes = \"1\"
http-body-util = \"0.1\"
tower-service = \"0.3\"
surely = { path = \"$repo\", features = [\"hyper\"] }" <<'EOF'
use std::future::poll_fn;
use std::time::Duration;
use bytes::Bytes;
use http_body_util::Full;
use surely::{record::TracingRecorder, Outcome, OutcomeExt};
use tower_service::Service;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = format!("http://{}", std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?);
    let mut client = surely::client::http()
        .timeout(Duration::from_secs(2))
        .per_try_timeout(Duration::from_millis(500))
        .recorder(TracingRecorder::new())
        .build(surely::hyper::transport())?;
    let order = http::Request::post(format!("{base}/orders")).body(Full::new(Bytes::from("o-1")))?;
    poll_fn(|cx| client.poll_ready(cx)).await?;
    let result = client.call(order).await;
    match result.outcome() {
        Outcome::Succeeded => println!("ordered"),
        Outcome::Failed => println!("not ordered: {}", result.unwrap_err()),
        Outcome::Unknown => println!("the order may have been placed"),
    }
    Ok(())
}
EOF

# Resolve (and fetch) once, outside the timed builds.
for p in tower_retry_timeout surely_client surely_hyper_quickstart; do
  (cd "$work/$p" && cargo fetch -q)
done

for round in $(seq 1 "$rounds"); do
  for p in tower_retry_timeout surely_client surely_hyper_quickstart; do
    rm -rf "$work/$p/target"
    start=$(date +%s%N)
    crates=$(cd "$work/$p" && cargo build --release 2>&1 | grep -c '^ *Compiling')
    end=$(date +%s%N)
    ms=$(((end - start) / 1000000))
    printf 'round %s  %-24s %3s crates  %3s.%01s s\n' "$round" "$p" "$crates" $((ms / 1000)) $((ms % 1000 / 100))
  done
done
