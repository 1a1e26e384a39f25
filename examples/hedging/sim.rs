//! The tail-latency experiment, shared by `examples/hedging` and `tests/hedge`: a simulated
//! server whose latency is 10 ms for 98% of attempts and 200 ms for 2%, called `n` times in
//! sequence on paused tokio time with a seeded RNG, so every run gives the same numbers.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use surely::hedge::{HedgeDelay, HedgeLayer};
use tokio::time::Instant;
use tower::{service_fn, BoxError, Layer, Service, ServiceExt};

/// The fast latency, the slow one, and the share of slow attempts.
pub(crate) const FAST: Duration = Duration::from_millis(10);
pub(crate) const SLOW: Duration = Duration::from_millis(200);
pub(crate) const SLOW_SHARE: f64 = 0.02;

/// What one configuration did.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stats {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) p999: Duration,
    /// Attempts beyond one per call, as a share of calls.
    pub(crate) extra_load: f64,
}

/// The three configurations, same server, same seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Report {
    pub(crate) calls: usize,
    pub(crate) none: Stats,
    pub(crate) tower: Stats,
    pub(crate) surely: Stats,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} calls; server latency {} ms for {}% of attempts, {} ms for {}%",
            self.calls,
            FAST.as_millis(),
            100.0 - SLOW_SHARE * 100.0,
            SLOW.as_millis(),
            SLOW_SHARE * 100.0
        )?;
        writeln!(
            f,
            "{:<16} {:>9} {:>9} {:>9} {:>11} {:>12}",
            "hedging", "p50", "p99", "p99.9", "p99 ÷ p50", "extra load"
        )?;
        for (name, s) in [
            ("none", &self.none),
            ("tower Hedge", &self.tower),
            ("surely hedge", &self.surely),
        ] {
            writeln!(
                f,
                "{name:<16} {:>9} {:>9} {:>9} {:>11.2} {:>11.2}%",
                fmt_ms(s.p50),
                fmt_ms(s.p99),
                fmt_ms(s.p999),
                s.p99.as_secs_f64() / s.p50.as_secs_f64(),
                s.extra_load * 100.0
            )?;
        }
        Ok(())
    }
}

fn fmt_ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

/// The simulated server: each attempt draws its latency from the shared seeded RNG.
#[derive(Clone)]
struct Server {
    rng: Arc<Mutex<SmallRng>>,
    attempts: Arc<AtomicU64>,
}

impl Server {
    fn new(seed: u64) -> Self {
        Server {
            rng: Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))),
            attempts: Arc::new(AtomicU64::new(0)),
        }
    }

    fn service(
        &self,
    ) -> impl Service<
        http::Request<()>,
        Response = http::Response<()>,
        Error = std::io::Error,
        Future = impl std::future::Future<Output = Result<http::Response<()>, std::io::Error>>
                     + Send
                     + use<>,
    > + Clone
           + Send
           + use<> {
        let server = self.clone();
        service_fn(move |_req: http::Request<()>| {
            server.attempts.fetch_add(1, Ordering::Relaxed);
            let slow = server
                .rng
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .random_bool(SLOW_SHARE);
            let latency = if slow { SLOW } else { FAST };
            async move {
                tokio::time::sleep(latency).await;
                Ok(http::Response::new(()))
            }
        })
    }
}

fn get() -> http::Request<()> {
    http::Request::get("/items/1").body(()).unwrap()
}

/// Makes `calls` calls in sequence and measures each one.
async fn drive<S>(mut svc: S, calls: usize, server: &Server) -> Stats
where
    S: Service<http::Request<()>, Response = http::Response<()>>,
    S::Error: fmt::Debug,
{
    let mut latencies = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        svc.ready()
            .await
            .expect("ready")
            .call(get())
            .await
            .expect("an answer");
        latencies.push(start.elapsed());
    }
    latencies.sort();
    let at = |q: f64| {
        // Nearest rank.
        let rank = ((q * calls as f64).ceil() as usize).clamp(1, calls);
        latencies[rank - 1]
    };
    let attempts = server.attempts.load(Ordering::Relaxed) as f64;
    Stats {
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
        extra_load: (attempts - calls as f64) / calls as f64,
    }
}

/// tower's hedge policy: every request may be hedged.
#[derive(Clone, Copy)]
struct HedgeAll;

impl tower::hedge::Policy<http::Request<()>> for HedgeAll {
    fn clone_request(&self, req: &http::Request<()>) -> Option<http::Request<()>> {
        Some(req.clone())
    }

    fn can_retry(&self, _req: &http::Request<()>) -> bool {
        true
    }
}

/// Runs the experiment: `calls` calls per configuration, the server's RNG seeded with `seed`.
///
/// Both hedges learn the 95th percentile: tower's from 100 data points over a 10 s rotating
/// window, surely's from 100 successful attempts over the last 1000.
pub(crate) async fn run(calls: usize, seed: u64) -> Report {
    let server = Server::new(seed);
    let none = drive(server.service(), calls, &server).await;

    let server = Server::new(seed);
    let tower = tower::hedge::Hedge::new::<http::Request<()>>(
        server.service(),
        HedgeAll,
        100,
        0.95,
        Duration::from_secs(10),
    );
    let tower = drive(tower.map_err(|e: BoxError| e.to_string()), calls, &server).await;

    let server = Server::new(seed);
    let layer = HedgeLayer::builder()
        .delay(HedgeDelay::percentile(95.0).min_samples(100).window(1000))
        .build()
        .expect("a valid hedge layer");
    let surely = drive(layer.layer(server.service()), calls, &server).await;

    Report {
        calls,
        none,
        tower,
        surely,
    }
}
