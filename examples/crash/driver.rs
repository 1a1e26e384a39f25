//! The `driver` role: makes the run's schema, starts the other roles as processes, kills them
//! with SIGKILL (at their crash points, and at random times), restarts them, then stops the
//! kills, lets everything drain, reconciles twice and checks the invariants.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::client::{ENV_INCARNATION, ENV_MODE, ENV_ORACLE, ENV_SEED, ENV_WORKERS};
use crate::crashpoint::{
    ADMIN_ACTED, ADMIN_BEGUN, AFTER_ANSWER, AFTER_APPLY, AFTER_CLAIM_COMMIT, AFTER_COMMIT,
    AFTER_PAYMENT, AFTER_PUBLISH, AFTER_SCHEDULE, ENV_CRASH_AT, IN_CLAIM, IN_DOUBT, MID_RECONCILE,
};
use crate::order::{ENV_ADDR, ENV_HOOK};
use crate::partition::{Net, Window};
use crate::splitmix::SplitMix;
use crate::tasks::{self, Fates, ENV_TASKS};
use crate::world::{World, CONSUMER, ENV_PG, ENV_REDIS};
use crate::{chain, invariants, reconcile, BoxError, ACK_WAIT};

/// A role started later than this after its spawn is an error, not a hang.
const STARTUP_LIMIT: Duration = Duration::from_secs(15);
/// How long a role told to stop may take.
const STOP_LIMIT: Duration = Duration::from_secs(15);
/// The asking-again client's limit.
const RECOVER_LIMIT: Duration = Duration::from_secs(90);
/// The relay and the consumer's limit to catch up at the end.
const DRAIN_LIMIT: Duration = Duration::from_secs(40);
/// The mean wait between random kills.
const RANDOM_MEAN: Duration = Duration::from_millis(700);
/// Unexpected exits (not killed by the driver) before the run gives up.
const MAX_UNEXPECTED: usize = 10;
/// A role's line marking the protocol.
const PROTOCOL: &str = "@@ ";

/// The processes the driver runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Role {
    Order,
    Relay,
    Consumer,
    Client,
    Reconciler,
    Admin,
}

const ROLES: [Role; 6] = [
    Role::Order,
    Role::Relay,
    Role::Consumer,
    Role::Client,
    Role::Reconciler,
    Role::Admin,
];

impl Role {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Order => "order",
            Role::Relay => "relay",
            Role::Consumer => "consumer",
            Role::Client => "client",
            Role::Reconciler => "reconciler",
            Role::Admin => "admin",
        }
    }

    /// Its crash points.
    fn points(self) -> &'static [&'static str] {
        match self {
            Role::Order => &[AFTER_COMMIT, AFTER_PAYMENT, IN_CLAIM, AFTER_CLAIM_COMMIT],
            Role::Relay => &[AFTER_PUBLISH],
            Role::Consumer => &[AFTER_APPLY, AFTER_SCHEDULE, AFTER_ANSWER],
            Role::Client => &[IN_DOUBT],
            Role::Reconciler => &[MID_RECONCILE],
            Role::Admin => &[ADMIN_BEGUN, ADMIN_ACTED],
        }
    }

    /// The share of incarnations armed with a point, and the latest hit it fires on.
    fn arming(self) -> (f64, u64) {
        match self {
            Role::Order => (0.6, 40),
            Role::Relay => (0.5, 15),
            // Its points are hit several times a second (a wait's commit as often as an apply's).
            Role::Consumer => (0.5, 15),
            Role::Client => (0.5, 3),
            Role::Reconciler => (0.5, 5),
            // It acts a few times a minute: its first or second settlement.
            Role::Admin => (0.6, 2),
        }
    }

    /// Where it pauses when the driver pauses it (`--pauses`): mid-handler, mid-publish,
    /// mid-apply, mid-settle. The client does not pause.
    fn pause_point(self) -> Option<&'static str> {
        match self {
            Role::Order => Some(AFTER_PAYMENT),
            Role::Relay => Some(AFTER_PUBLISH),
            Role::Consumer => Some(AFTER_ANSWER),
            Role::Reconciler => Some(MID_RECONCILE),
            Role::Client | Role::Admin => None,
        }
    }

    /// How long a pause lasts: past the role's lease (and for the order service, past the
    /// abandoned rounds that take its record over), so that another instance takes over.
    fn pause_length(self) -> Duration {
        match self {
            Role::Order => abandoned_bound() + Duration::from_millis(500),
            Role::Relay => crate::RELAY_LEASE * 2 + Duration::from_millis(500),
            Role::Consumer => ACK_WAIT + Duration::from_secs(1),
            Role::Reconciler => reconcile::CLAIM_LEASE + Duration::from_millis(1500),
            Role::Client | Role::Admin => Duration::ZERO,
        }
    }

    /// Its weight among the random kills.
    fn weight(self) -> f64 {
        match self {
            Role::Order => 0.3,
            Role::Relay => 0.15,
            Role::Consumer => 0.2,
            Role::Client => 0.2,
            Role::Reconciler => 0.15,
            Role::Admin => 0.1,
        }
    }
}

/// The driver's options.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) kills: u32,
    pub(crate) seed: u64,
    pub(crate) timeout: Option<Duration>,
    pub(crate) pg: String,
    pub(crate) nats: String,
    pub(crate) workers: u32,
    pub(crate) hookless: f64,
    pub(crate) verbose: bool,
    /// Partition windows of the order service (0: none, and no namespace).
    pub(crate) partitions: u32,
    /// Pauses: a role stopped (SIGSTOP) at its pause point past its lease while another
    /// instance takes over, then continued (SIGCONT).
    pub(crate) pauses: u32,
    /// The relay reads the outbox from PostgreSQL's write-ahead log (`LogRelay`) instead of
    /// polling the table.
    pub(crate) log_relay: bool,
    /// The events go through RabbitMQ at this URL (`--broker rabbitmq`) instead of JetStream.
    pub(crate) amqp: Option<String>,
    /// The order service keeps its keys on a Redis of the run's own (`--store redis`),
    /// restarted without persistence every [`REDIS_RESTART_EVERY`] kills.
    pub(crate) redis: bool,
}

const DEFAULT_PG: &str = "postgres://postgres@127.0.0.1:5432/test";
const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";
const DEFAULT_AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const DEFAULT_WORKERS: u32 = 4;
const DEFAULT_HOOKLESS: f64 = 0.1;

const USAGE: &str = "usage: crash [driver] [--kills N] [--seed S] [--timeout SECS] [--workers N] \
    [--hookless SHARE] [--partitions N] [--pauses N] [--relay poll|log] [--broker nats|rabbitmq] [--store postgres|redis] [--postgres URL] [--nats URL] [--amqp URL] \
    [--verbose]";

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options, BoxError> {
        let mut o = Options {
            kills: 60,
            seed: SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64 % 1_000_000,
            timeout: None,
            pg: std::env::var("SURELY_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_PG.to_owned()),
            nats: std::env::var("SURELY_NATS_URL").unwrap_or_else(|_| DEFAULT_NATS.to_owned()),
            workers: DEFAULT_WORKERS,
            hookless: DEFAULT_HOOKLESS,
            verbose: false,
            partitions: 0,
            pauses: 0,
            log_relay: false,
            amqp: None,
            redis: false,
        };
        let mut rabbitmq = false;
        let mut amqp_url =
            std::env::var("SURELY_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP.to_owned());
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value; {USAGE}"))
            };
            match arg.as_str() {
                "--kills" => o.kills = value("--kills")?.parse()?,
                "--seed" => o.seed = value("--seed")?.parse()?,
                "--timeout" => o.timeout = Some(Duration::from_secs(value("--timeout")?.parse()?)),
                "--workers" => o.workers = value("--workers")?.parse()?,
                "--hookless" => o.hookless = value("--hookless")?.parse()?,
                "--postgres" => o.pg = value("--postgres")?,
                "--nats" => o.nats = value("--nats")?,
                "--verbose" => o.verbose = true,
                "--partitions" => o.partitions = value("--partitions")?.parse()?,
                "--pauses" => o.pauses = value("--pauses")?.parse()?,
                "--broker" => {
                    rabbitmq = match value("--broker")?.as_str() {
                        "rabbitmq" => true,
                        "nats" => false,
                        other => {
                            return Err(
                                format!("--broker: {other:?} is not nats or rabbitmq").into()
                            )
                        }
                    }
                }
                "--amqp" => amqp_url = value("--amqp")?,
                "--store" => {
                    o.redis = match value("--store")?.as_str() {
                        "redis" => true,
                        "postgres" => false,
                        other => {
                            return Err(
                                format!("--store: {other:?} is not postgres or redis").into()
                            )
                        }
                    }
                }
                "--relay" => {
                    o.log_relay = match value("--relay")?.as_str() {
                        "log" => true,
                        "poll" => false,
                        other => {
                            return Err(format!("--relay: {other:?} is not poll or log").into())
                        }
                    }
                }
                other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
            }
        }
        if rabbitmq {
            if o.log_relay {
                return Err("--broker rabbitmq takes the polling relay, not --relay log".into());
            }
            o.amqp = Some(amqp_url);
        }
        if o.kills == 0 || o.workers == 0 || !(0.0..=1.0).contains(&o.hookless) {
            return Err(format!(
                "--kills and --workers must be at least 1, --hookless within 0..=1; {USAGE}"
            )
            .into());
        }
        Ok(o)
    }

    /// The command that replays this run's schedule.
    pub(crate) fn replay(&self) -> String {
        let mut cmd = format!(
            "cargo run --release --all-features --example crash -- --kills {} --seed {}",
            self.kills, self.seed
        );
        if self.workers != DEFAULT_WORKERS {
            cmd.push_str(&format!(" --workers {}", self.workers));
        }
        if self.hookless != DEFAULT_HOOKLESS {
            cmd.push_str(&format!(" --hookless {}", self.hookless));
        }
        if let Some(t) = self.timeout {
            cmd.push_str(&format!(" --timeout {}", t.as_secs()));
        }
        if self.partitions > 0 {
            cmd.push_str(&format!(" --partitions {}", self.partitions));
        }
        if self.pauses > 0 {
            cmd.push_str(&format!(" --pauses {}", self.pauses));
        }
        if self.log_relay {
            cmd.push_str(" --relay log");
        }
        if self.amqp.is_some() {
            cmd.push_str(" --broker rabbitmq");
        }
        if self.redis {
            cmd.push_str(" --store redis");
        }
        cmd
    }

    /// The chaos phase's limit: given, or 4 s a kill, 10 s a pause, and at least 2 minutes.
    fn chaos_limit(&self) -> Duration {
        self.timeout.unwrap_or(Duration::from_secs(
            (u64::from(self.kills) * 4 + u64::from(self.pauses) * 10).max(120),
        ))
    }
}

/// What a role told the driver, or that it ended.
enum Ev {
    Line(Role, u64, String),
    Exit {
        role: Role,
        incarnation: u64,
        code: Option<i32>,
        killed: bool,
    },
}

/// A role's running process.
struct Proc {
    incarnation: u64,
    pid: u32,
    spawned: Instant,
    ready: Option<Instant>,
    armed: Option<(&'static str, u64)>,
    stdin: Option<ChildStdin>,
    kill: Option<oneshot::Sender<()>>,
    killing: bool,
    stopping: bool,
}

/// What happened, for the summary and the checks.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) kills_at_point: BTreeMap<&'static str, u32>,
    pub(crate) kills_random: BTreeMap<&'static str, u32>,
    pub(crate) restarts: BTreeMap<&'static str, u32>,
    /// From a kill to the role serving again.
    pub(crate) recoveries: Vec<(Role, String, Duration)>,
    pub(crate) unexpected: Vec<String>,
    /// The client incarnations the driver killed.
    pub(crate) killed_clients: BTreeSet<u64>,
    /// The client incarnations that stopped when told to.
    pub(crate) stopped_clients: BTreeSet<u64>,
    /// What the roles noted, counted by kind.
    pub(crate) notes: BTreeMap<String, u64>,
    /// The last note of each kind that carries figures.
    pub(crate) last_notes: BTreeMap<String, String>,
    /// Incarnations started without the recovery hook.
    pub(crate) hookless: u32,
    pub(crate) chaos: Duration,
    pub(crate) failures: Vec<String>,
    /// Partition windows opened, by kind, and their time in all.
    pub(crate) windows: BTreeMap<&'static str, u32>,
    pub(crate) partitioned: Duration,
    /// Once the client and the reconciler stopped, before anything sent a key again: how long
    /// until no record was `PROCESSING`, and the records still `PROCESSING` at the bound.
    pub(crate) abandoned_cleared: Option<(Duration, Vec<String>)>,
    /// Pauses, by role: stopped at the pause point, another instance started, continued.
    pub(crate) pauses: BTreeMap<&'static str, u32>,
    /// Pauses armed whose point was not reached in time (disarmed, tried again elsewhere).
    pub(crate) pauses_missed: u32,
    /// The time processes spent stopped.
    pub(crate) paused_for: Duration,
    /// The pauses asked for (`--pauses`).
    pub(crate) pauses_wanted: u32,
    /// Paused processes continued (SIGCONT and `resume`).
    pub(crate) continued: u32,
    /// Restarts of the run's Redis (`--store redis`), each losing every key it held.
    pub(crate) redis_restarts: u32,
    /// Whether the order service's keys were on Redis.
    pub(crate) on_redis: bool,
}

impl Stats {
    pub(crate) fn kills(&self) -> u32 {
        self.kills_at_point.values().sum::<u32>() + self.kills_random.values().sum::<u32>()
    }

    pub(crate) fn pauses(&self) -> u32 {
        self.pauses.values().sum()
    }
}

/// The pauses' schedule: a wait and a role, from the seed alone.
struct PauseSchedule(SplitMix);

impl PauseSchedule {
    fn next(&mut self, roles: &[Role]) -> (Duration, Role) {
        let wait = Duration::from_secs(1)
            .mul_f64(self.0.exponential())
            .clamp(Duration::from_millis(200), Duration::from_secs(3));
        let role = roles[(self.0.next_u64() % roles.len() as u64) as usize];
        (wait, role)
    }
}

/// A process stopped at its pause point, and what comes next for it.
struct Paused {
    role: Role,
    proc: Proc,
    /// When it is continued.
    resume_at: Instant,
    /// Once continued: when it goes (SIGKILL), its late writes tried.
    gone_at: Option<Instant>,
}

/// With `--store redis`, the run's Redis restarts after every this many kills.
pub(crate) const REDIS_RESTART_EVERY: u32 = 15;

/// A Redis server of the run's own, without persistence, on a port of its own.
pub(crate) struct OwnRedis {
    port: u16,
    /// The addresses it listens on: 127.0.0.1, and the host's side of the order service's
    /// veth pair when there is one (a cut window cuts the order service from Redis too).
    binds: Vec<String>,
    child: std::process::Child,
}

impl OwnRedis {
    async fn start(port: u16, binds: Vec<String>) -> Result<OwnRedis, BoxError> {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind"])
            .args(&binds)
            .args(["--protected-mode", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server (--store redis runs its own): {e}"))?;
        let redis = OwnRedis { port, binds, child };
        let client = surely::deps::redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
                let pong: Result<String, _> = surely::deps::redis::cmd("PING")
                    .query_async(&mut conn)
                    .await;
                if pong.is_ok() {
                    return Ok(redis);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("the run's Redis on port {port} did not answer within 2 s").into())
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a continued process runs beside the one that took over before it goes.
const RESUMED_FOR: Duration = Duration::from_secs(2);
/// How long an armed pause may wait for its point.
const PAUSE_ARMED_LIMIT: Duration = Duration::from_secs(6);

/// Sends `signal` (`STOP`, `CONT`) to `pid`, with the system's `kill`.
fn signal(pid: u32, signal: &str) -> Result<(), BoxError> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(|e| format!("kill -{signal} {pid}: {e}"))?;
    if !status.success() {
        return Err(format!("kill -{signal} {pid}: {status}").into());
    }
    Ok(())
}

/// The random kills' schedule: a wait and a role, one after the other, from the seed alone.
struct RandomKills(SplitMix);

impl RandomKills {
    fn next(&mut self) -> (Duration, Role) {
        let wait = RANDOM_MEAN
            .mul_f64(self.0.exponential())
            .clamp(Duration::from_millis(30), Duration::from_secs(4));
        let total: f64 = ROLES.iter().map(|r| r.weight()).sum();
        let mut pick = self.0.unit() * total;
        let mut role = Role::Order;
        for r in ROLES {
            role = r;
            if pick < r.weight() {
                break;
            }
            pick -= r.weight();
        }
        (wait, role)
    }
}

/// The partition windows' schedule: a wait, a kind and a length, from the seed alone.
struct Partitions(SplitMix);

impl Partitions {
    fn next(&mut self) -> (Duration, Window, Duration) {
        let wait = Duration::from_secs(2)
            .mul_f64(self.0.exponential())
            .clamp(Duration::from_millis(100), Duration::from_secs(5));
        let window = match self.0.next_u64() % 3 {
            0 => Window::Cut,
            1 => Window::Loss,
            _ => Window::Delay,
        };
        let length = Duration::from_millis(300 + self.0.next_u64() % 1200);
        (wait, window, length)
    }
}

struct Supervisor {
    exe: PathBuf,
    net: Option<Arc<Net>>,
    env: Vec<(&'static str, String)>,
    opts: Options,
    procs: HashMap<Role, Proc>,
    tx: mpsc::UnboundedSender<Ev>,
    rx: mpsc::UnboundedReceiver<Ev>,
    /// Each role's arming decisions, one stream per role: the same seed arms the same
    /// incarnations the same way, whatever the order of events in real time.
    arming: HashMap<Role, SplitMix>,
    arm: bool,
    incarnations: HashMap<Role, u64>,
    /// Killed roles waiting to serve again: when, and at what.
    pending: HashMap<Role, (Instant, String)>,
    stats: Stats,
    /// Processes stopped at their pause point, or continued and about to go.
    paused: Vec<Paused>,
    /// The pause armed now: the role, its incarnation, and until when it may wait.
    pausing: Option<(Role, u64, Instant)>,
    /// The run's own Redis (`--store redis`).
    redis: Option<OwnRedis>,
}

/// Figures a note carries: the `(word, number)` pairs of its line.
fn figures(words: &[&str]) -> Vec<(String, u64)> {
    words
        .windows(2)
        .filter_map(|w| Some((w[0].to_owned(), w[1].parse().ok()?)))
        .collect()
}

impl Supervisor {
    fn spawn(&mut self, role: Role, recover: bool) -> Result<(), BoxError> {
        let incarnation = {
            let n = self.incarnations.entry(role).or_default();
            *n += 1;
            *n
        };
        let rng = self
            .arming
            .entry(role)
            .or_insert_with(|| SplitMix::new(self.opts.seed ^ ((role as u64 + 1) * 0x9E37_79B9)));
        // Four draws per spawn, armed or not, so that the schedule depends on the seed alone.
        let (share, max) = role.arming();
        let (arm, pick, hit, hook) = (rng.unit(), rng.next_u64(), rng.next_u64(), rng.unit());
        let points = role.points();
        let armed = (self.arm && !recover && arm < share)
            .then(|| (points[(pick % points.len() as u64) as usize], 1 + hit % max));
        let hook = role != Role::Order || !self.arm || hook >= self.opts.hookless;
        if !hook {
            self.stats.hookless += 1;
        }
        let mut cmd = match &self.net {
            Some(net) if role == Role::Order => net.command(&self.exe),
            _ => Command::new(&self.exe),
        };
        cmd.arg(role.name())
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .env(ENV_INCARNATION, incarnation.to_string())
            .env(ENV_HOOK, if hook { "1" } else { "0" })
            .env(ENV_MODE, if recover { "recover" } else { "run" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        match armed {
            Some((point, n)) => cmd.env(ENV_CRASH_AT, format!("{point}:{n}")),
            None => cmd.env_remove(ENV_CRASH_AT),
        };
        if let Some(net) = self.net.as_ref().filter(|_| role == Role::Order) {
            // Inside the namespace, PostgreSQL is reached through the driver's relay, and the
            // run's Redis at the host's side of the veth pair.
            cmd.env(ENV_PG, &net.pg_url);
            if let Some(redis) = &self.redis {
                cmd.env(
                    ENV_REDIS,
                    format!("redis://{}:{}", net.outer_ip, redis.port),
                );
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start the role {}: {e}", role.name()))?;
        let pid = child.id().unwrap_or(0);
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(Ev::Line(role, incarnation, line)).is_err() {
                    return;
                }
            }
        });
        let (kill, killed) = oneshot::channel::<()>();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            // A dropped sender kills too: the driver let go of the process.
            let (status, killed) = tokio::select! {
                status = child.wait() => (status, false),
                _ = killed => {
                    let _ = child.start_kill();
                    (child.wait().await, true)
                }
            };
            let code = status.ok().and_then(|s| s.code());
            let _ = tx.send(Ev::Exit {
                role,
                incarnation,
                code,
                killed,
            });
        });
        if self.opts.verbose {
            println!(
                "  start      {} #{incarnation} (pid {pid}), crash point {}{}",
                role.name(),
                armed.map_or("none".to_owned(), |(p, n)| format!("{p}:{n}")),
                if hook { "" } else { ", no recovery hook" }
            );
        }
        self.procs.insert(
            role,
            Proc {
                incarnation,
                pid,
                spawned: Instant::now(),
                ready: None,
                armed,
                stdin,
                kill: Some(kill),
                killing: false,
                stopping: false,
            },
        );
        Ok(())
    }

    /// SIGKILLs the role's process, counted as a kill at `what` (a point, or `random`).
    fn kill(&mut self, role: Role, what: &'static str) {
        let Some(p) = self.procs.get_mut(&role) else {
            return;
        };
        if p.killing {
            return;
        }
        p.killing = true;
        if let Some(kill) = p.kill.take() {
            let _ = kill.send(());
        }
        if what == "random" {
            *self.stats.kills_random.entry(role.name()).or_default() += 1;
        } else {
            *self.stats.kills_at_point.entry(what).or_default() += 1;
        }
        if role == Role::Client {
            self.stats.killed_clients.insert(p.incarnation);
        }
        let at = if what == "random" {
            format!("{} (random)", role.name())
        } else {
            format!("{} ({what})", role.name())
        };
        self.pending.insert(role, (Instant::now(), at.clone()));
        let kills = self.stats.kills();
        if self.opts.verbose {
            println!(
                "  kill #{kills:<4} {at}, pid {}, #{} ",
                p.pid, p.incarnation
            );
        } else if kills.is_multiple_of(10) {
            println!("  {kills} kills");
        }
    }

    fn is_up(&self, role: Role) -> bool {
        self.procs
            .get(&role)
            .is_some_and(|p| p.ready.is_some() && !p.killing && !p.stopping)
    }

    fn handle(&mut self, ev: Ev) -> Result<(), BoxError> {
        match ev {
            Ev::Line(role, incarnation, line) => {
                let current = self.procs.get(&role).map(|p| p.incarnation) == Some(incarnation);
                let Some(said) = line.strip_prefix(PROTOCOL) else {
                    if self.opts.verbose {
                        println!("  {:<10} #{incarnation}: {line}", role.name());
                    }
                    return Ok(());
                };
                let words: Vec<&str> = said.split(' ').collect();
                match words.as_slice() {
                    ["ready"] if current => {
                        if let Some(p) = self.procs.get_mut(&role) {
                            p.ready = Some(Instant::now());
                        }
                        if let Some((at, what)) = self.pending.remove(&role) {
                            self.stats.recoveries.push((role, what, at.elapsed()));
                        }
                    }
                    ["crashpoint", point] if current => {
                        let point = role
                            .points()
                            .iter()
                            .find(|p| *p == point)
                            .copied()
                            .ok_or_else(|| {
                                format!("{} named an unknown point {point}", role.name())
                            })?;
                        self.kill(role, point);
                    }
                    ["pausepoint", point] if current => {
                        self.pause(role, point)?;
                    }
                    ["note", "takeover", _key, verdict] => {
                        *self
                            .stats
                            .notes
                            .entry(format!("takeover {verdict}"))
                            .or_default() += 1;
                    }
                    ["note", "abandoned", _key, verdict] => {
                        *self
                            .stats
                            .notes
                            .entry(format!("abandoned {verdict}"))
                            .or_default() += 1;
                    }
                    ["note", kind, rest @ ..] => {
                        *self.stats.notes.entry((*kind).to_owned()).or_default() += 1;
                        for (name, n) in figures(rest) {
                            *self
                                .stats
                                .notes
                                .entry(format!("{kind} {name}"))
                                .or_default() += n;
                        }
                        self.stats
                            .last_notes
                            .insert((*kind).to_owned(), rest.join(" "));
                    }
                    _ => {}
                }
            }
            Ev::Exit {
                role,
                incarnation,
                code,
                killed,
            } => {
                let Some(p) = self.procs.get(&role) else {
                    return Ok(());
                };
                if p.incarnation != incarnation {
                    return Ok(());
                }
                let p = self.procs.remove(&role).ok_or("gone")?;
                if p.stopping && !killed {
                    if role == Role::Client && code == Some(0) {
                        self.stats.stopped_clients.insert(incarnation);
                    }
                    if code != Some(0) {
                        self.stats.failures.push(format!(
                            "{} #{incarnation} stopped with exit code {code:?}",
                            role.name()
                        ));
                    }
                    return Ok(());
                }
                if p.stopping {
                    return Ok(());
                }
                if !killed {
                    let what = format!(
                        "{} #{incarnation} (pid {}) exited on its own with code {code:?}",
                        role.name(),
                        p.pid
                    );
                    println!("  unexpected {what}");
                    self.stats.unexpected.push(what);
                    if self.stats.unexpected.len() > MAX_UNEXPECTED {
                        return Err(format!(
                            "more than {MAX_UNEXPECTED} processes exited on their own: giving up"
                        )
                        .into());
                    }
                }
                *self.stats.restarts.entry(role.name()).or_default() += 1;
                self.spawn(role, false)?;
            }
        }
        Ok(())
    }

    /// The role's process reached its pause point: stops it (SIGSTOP), sets it aside to be
    /// continued past its lease, and starts another instance, which takes over.
    fn pause(&mut self, role: Role, point: &str) -> Result<(), BoxError> {
        if role.pause_point() != Some(point) {
            return Err(format!("{} paused at an unknown point {point}", role.name()).into());
        }
        self.pausing = None;
        if self
            .procs
            .get(&role)
            .is_none_or(|p| p.killing || p.stopping)
        {
            // Killed (or told to stop) as it reached the point: nothing to pause.
            self.stats.pauses_missed += 1;
            return Ok(());
        }
        let p = self.procs.remove(&role).ok_or("no process to pause")?;
        if let Err(e) = signal(p.pid, "STOP") {
            // Gone on its own meanwhile: its exit says so.
            self.stats.failures.push(format!(
                "{} #{} could not be paused: {e}",
                role.name(),
                p.incarnation
            ));
            self.procs.insert(role, p);
            return Ok(());
        }
        let length = role.pause_length();
        *self.stats.pauses.entry(role.name()).or_default() += 1;
        self.stats.paused_for += length;
        if self.opts.verbose {
            println!(
                "  pause      {} #{} (pid {}) at {point} for {}",
                role.name(),
                p.incarnation,
                p.pid,
                ms(length)
            );
        }
        self.paused.push(Paused {
            role,
            proc: p,
            resume_at: Instant::now() + length,
            gone_at: None,
        });
        self.spawn(role, false)
    }

    /// Restarts the run's Redis without persistence: every key it held is lost.
    async fn restart_redis(&mut self) -> Result<(), BoxError> {
        let Some(redis) = self.redis.take() else {
            return Ok(());
        };
        let (port, binds) = (redis.port, redis.binds.clone());
        redis.stop();
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.redis = Some(OwnRedis::start(port, binds).await?);
        self.stats.redis_restarts += 1;
        if self.opts.verbose {
            println!("  restart    Redis (127.0.0.1:{port}): every key lost");
        }
        Ok(())
    }

    /// The next thing due for a paused process, if any.
    fn paused_due(&self) -> Option<Instant> {
        self.paused
            .iter()
            .map(|p| p.gone_at.unwrap_or(p.resume_at))
            .min()
    }

    /// Continues the paused processes whose time came (SIGCONT, then `resume`), and kills those
    /// that ran their while beside the instance that took over.
    async fn tend_paused(&mut self) -> Result<(), BoxError> {
        let now = Instant::now();
        let mut i = 0;
        while i < self.paused.len() {
            let p = &mut self.paused[i];
            match p.gone_at {
                None if p.resume_at <= now => {
                    if let Err(e) = signal(p.proc.pid, "CONT") {
                        // Nothing but the driver may end a stopped process.
                        self.stats.failures.push(format!(
                            "{} #{} (pid {}) was gone when it was to be continued: {e}",
                            p.role.name(),
                            p.proc.incarnation,
                            p.proc.pid
                        ));
                    }
                    if let Some(stdin) = p.proc.stdin.as_mut() {
                        let _ = stdin.write_all(b"resume\n").await;
                        let _ = stdin.flush().await;
                    }
                    p.gone_at = Some(now + RESUMED_FOR);
                    self.stats.continued += 1;
                    if self.opts.verbose {
                        println!(
                            "  continue   {} #{} (pid {})",
                            p.role.name(),
                            p.proc.incarnation,
                            p.proc.pid
                        );
                    }
                }
                Some(gone) if gone <= now => {
                    let mut p = self.paused.swap_remove(i);
                    if let Some(kill) = p.proc.kill.take() {
                        let _ = kill.send(());
                    }
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        Ok(())
    }

    /// Arms `role`'s serving process to pause at its point.
    async fn arm_pause(&mut self, role: Role) -> bool {
        let Some(point) = role.pause_point() else {
            return false;
        };
        if !self.is_up(role) || self.paused.iter().any(|p| p.role == role) {
            return false;
        }
        let Some(p) = self.procs.get_mut(&role) else {
            return false;
        };
        let Some(stdin) = p.stdin.as_mut() else {
            return false;
        };
        let line = format!("pause {point}:1\n");
        if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
            return false;
        }
        p.armed = None;
        self.pausing = Some((role, p.incarnation, Instant::now() + PAUSE_ARMED_LIMIT));
        true
    }

    /// An armed pause whose point did not come in time: disarmed, counted, tried elsewhere.
    async fn pause_missed(&mut self) {
        let Some((role, incarnation, until)) = self.pausing else {
            return;
        };
        if Instant::now() < until {
            return;
        }
        self.pausing = None;
        self.stats.pauses_missed += 1;
        if let Some(p) = self
            .procs
            .get_mut(&role)
            .filter(|p| p.incarnation == incarnation)
            && let Some(stdin) = p.stdin.as_mut()
        {
            let _ = stdin.write_all(b"disarm\n").await;
            let _ = stdin.flush().await;
        }
    }

    /// A process that does not come up in time is an error.
    fn check_startup(&self) -> Result<(), BoxError> {
        for (role, p) in &self.procs {
            if p.ready.is_none() && !p.killing && p.spawned.elapsed() > STARTUP_LIMIT {
                return Err(format!(
                    "{} #{} (pid {}) did not come up within {}s",
                    role.name(),
                    p.incarnation,
                    p.pid,
                    STARTUP_LIMIT.as_secs()
                )
                .into());
            }
        }
        Ok(())
    }

    /// Handles what comes until `until`.
    async fn pump(&mut self, until: Instant) -> Result<(), BoxError> {
        while let Ok(Some(ev)) = tokio::time::timeout_at(until, self.rx.recv()).await {
            self.handle(ev)?;
        }
        self.check_startup()
    }

    /// Waits for every role to serve.
    async fn all_up(&mut self, roles: &[Role]) -> Result<(), BoxError> {
        let until = Instant::now() + STARTUP_LIMIT;
        while !roles.iter().all(|r| self.is_up(*r)) {
            if Instant::now() >= until {
                return Err(format!(
                    "the roles did not all come up within {}s",
                    STARTUP_LIMIT.as_secs()
                )
                .into());
            }
            self.pump(Instant::now() + Duration::from_millis(50))
                .await?;
        }
        Ok(())
    }

    /// The chaos: kills at the armed points and at random times, until `kills` of them.
    async fn chaos(&mut self) -> Result<(), BoxError> {
        let limit = self.opts.chaos_limit();
        let until = Instant::now() + limit;
        let mut random = RandomKills(SplitMix::new(self.opts.seed ^ 0x0BAD_5EED));
        let (wait, mut target) = random.next();
        let mut due = Instant::now() + wait;
        let mut partitions = Partitions(SplitMix::new(self.opts.seed ^ 0x9A47_1710));
        let (wait, mut window, mut length) = partitions.next();
        let mut partition_due = Instant::now() + wait;
        // The window open now, and when it heals.
        let mut open: Option<Instant> = None;
        let windows = |s: &Stats| s.windows.values().sum::<u32>();
        let far = Duration::from_secs(3600);
        // The pauses: the log relay has no claims to take over, so it is not paused.
        let pausable: Vec<Role> = [Role::Order, Role::Relay, Role::Consumer, Role::Reconciler]
            .into_iter()
            .filter(|r| *r != Role::Relay || !self.opts.log_relay)
            .collect();
        let mut pauses = PauseSchedule(SplitMix::new(self.opts.seed ^ 0x9A05_E5ED));
        let (wait, mut pause_target) = pauses.next(&pausable);
        let mut pause_due = Instant::now() + wait;
        while self.stats.kills() < self.opts.kills
            || windows(&self.stats) < self.opts.partitions
            || open.is_some()
            || self.stats.pauses() < self.opts.pauses
            || self.pausing.is_some()
            || !self.paused.is_empty()
        {
            if Instant::now() >= until {
                return Err(format!(
                    "the chaos did not reach {} kills within {}s ({} so far)",
                    self.opts.kills,
                    limit.as_secs(),
                    self.stats.kills()
                )
                .into());
            }
            self.check_startup()?;
            enum Step {
                Ev(Option<Ev>),
                Due,
                Partition,
                Pause,
                Paused,
            }
            let kills_left = self.stats.kills() < self.opts.kills;
            if !kills_left && self.arm {
                // The kills are done; the partitions go on without them.
                self.disarm().await;
            }
            let kill_at = if kills_left {
                due
            } else {
                Instant::now() + far
            };
            let partition_at = match (&self.net, open) {
                (Some(_), Some(heal)) => heal,
                (Some(_), None) if windows(&self.stats) < self.opts.partitions => partition_due,
                _ => Instant::now() + far,
            };
            // One pause at a time: armed, then stopped, then continued and gone.
            let pause_at = match self.pausing {
                Some((_, _, until)) => until,
                None if self.paused.is_empty() && self.stats.pauses() < self.opts.pauses => {
                    pause_due
                }
                None => Instant::now() + far,
            };
            let paused_at = self.paused_due().unwrap_or(Instant::now() + far);
            let step = tokio::select! {
                ev = self.rx.recv() => Step::Ev(ev),
                _ = tokio::time::sleep_until(kill_at) => Step::Due,
                _ = tokio::time::sleep_until(partition_at) => Step::Partition,
                _ = tokio::time::sleep_until(pause_at) => Step::Pause,
                _ = tokio::time::sleep_until(paused_at) => Step::Paused,
            };
            match step {
                Step::Ev(Some(ev)) => self.handle(ev)?,
                Step::Ev(None) => return Err("the event channel closed".into()),
                Step::Partition => {
                    let Some(net) = self.net.clone() else {
                        continue;
                    };
                    if open.take().is_some() {
                        net.heal()?;
                        if self.opts.verbose {
                            println!("  heal       the order service's network");
                        }
                        let (wait, w, l) = partitions.next();
                        (window, length) = (w, l);
                        partition_due = Instant::now() + wait;
                    } else {
                        net.open(window)?;
                        *self.stats.windows.entry(window.name()).or_default() += 1;
                        self.stats.partitioned += length;
                        if self.opts.verbose {
                            println!("  partition  {} for {}", window.name(), ms(length));
                        }
                        open = Some(Instant::now() + length);
                    }
                }
                Step::Due if self.is_up(target) => {
                    self.kill(target, "random");
                    let (wait, next) = random.next();
                    target = next;
                    due = Instant::now() + wait;
                }
                // The role is not serving yet: its kill waits for it.
                Step::Due => due = Instant::now() + Duration::from_millis(20),
                Step::Pause if self.pausing.is_some() => self.pause_missed().await,
                Step::Pause => {
                    if self.arm_pause(pause_target).await {
                        let (wait, next) = pauses.next(&pausable);
                        pause_target = next;
                        pause_due = Instant::now() + wait;
                    } else {
                        pause_due = Instant::now() + Duration::from_millis(20);
                    }
                }
                Step::Paused => self.tend_paused().await?,
            }
            if self.redis.is_some()
                && self.stats.kills() >= (self.stats.redis_restarts + 1) * REDIS_RESTART_EVERY
            {
                self.restart_redis().await?;
            }
        }
        Ok(())
    }

    /// Tells the role to stop (its standard input closed) and waits; kills it past the limit.
    async fn stop(&mut self, role: Role) -> Result<(), BoxError> {
        let until = Instant::now() + STOP_LIMIT;
        loop {
            let Some(p) = self.procs.get_mut(&role) else {
                return Ok(());
            };
            p.stopping = true;
            p.stdin.take();
            if Instant::now() >= until {
                self.stats.failures.push(format!(
                    "{} #{} did not stop within {}s: killed",
                    role.name(),
                    p.incarnation,
                    STOP_LIMIT.as_secs()
                ));
                if let Some(kill) = p.kill.take() {
                    let _ = kill.send(());
                }
                self.pump(Instant::now() + Duration::from_secs(2)).await?;
                return Ok(());
            }
            self.pump(Instant::now() + Duration::from_millis(50))
                .await?;
        }
    }

    /// Clears every process's armed point.
    async fn disarm(&mut self) {
        self.arm = false;
        for p in self.procs.values_mut() {
            if let Some(stdin) = p.stdin.as_mut() {
                let _ = stdin.write_all(b"disarm\n").await;
                let _ = stdin.flush().await;
            }
            p.armed = None;
        }
    }

    /// The asking-again client, to its end.
    async fn ask_again(&mut self) -> Result<(), BoxError> {
        self.spawn(Role::Client, true)?;
        let until = Instant::now() + RECOVER_LIMIT;
        loop {
            let Some(p) = self.procs.get_mut(&Role::Client) else {
                return Ok(());
            };
            // It ends by itself; it is not restarted.
            p.stopping = true;
            if Instant::now() >= until {
                return Err(format!(
                    "the asking-again client did not finish within {}s",
                    RECOVER_LIMIT.as_secs()
                )
                .into());
            }
            self.pump(Instant::now() + Duration::from_millis(50))
                .await?;
        }
    }

    /// With nobody sending a key (the client and the reconciler stopped), waits for the order
    /// service's rounds over abandoned records to leave no record `PROCESSING`, for at most
    /// [`abandoned_bound`]: an owner that died with its client is recovered without a request.
    /// What it found is checked with the invariants.
    async fn abandoned_recovered(&mut self, world: &World) -> Result<(), BoxError> {
        let store = world.keys()?;
        let started = Instant::now();
        let until = started + abandoned_bound();
        loop {
            let processing =
                surely::server::store::IdempotencyStore::stuck(&store, Duration::ZERO, 1_000)
                    .await?;
            if processing.is_empty() {
                self.stats.abandoned_cleared = Some((started.elapsed(), Vec::new()));
                return Ok(());
            }
            if Instant::now() >= until {
                let left = processing
                    .iter()
                    .map(|s| {
                        format!(
                            "{} (fence {}, {}ms)",
                            s.key.key().as_str(),
                            s.fence.get(),
                            s.age.as_millis()
                        )
                    })
                    .collect();
                self.stats.abandoned_cleared = Some((started.elapsed(), left));
                return Ok(());
            }
            self.pump(Instant::now() + Duration::from_millis(50))
                .await?;
        }
    }

    /// Waits until the outbox is empty and every order's event is settled: recorded by the
    /// inbox (applied or stale) or in the manual queue; none waits any more.
    async fn drain(&mut self, world: &World) -> Result<(), BoxError> {
        let until = Instant::now() + DRAIN_LIMIT;
        let outbox = world.outbox()?;
        let missing = world.sql(
            "SELECT count(*) FROM {p}_orders o WHERE NOT EXISTS
                 (SELECT 1 FROM {p}_inbox i WHERE i.consumer = $1 AND i.aggregate = 'order ' || o.key)
             AND NOT EXISTS (SELECT 1 FROM {p}_inbox_tasks t
                 WHERE t.consumer = $1 AND t.aggregate = 'order ' || o.key AND t.state = 'manual')",
        );
        loop {
            let backlog = surely::outbox::OutboxStore::stats(&outbox).await?.backlog;
            let client = world.pool.get().await?;
            let left: i64 = client.query_one(&missing, &[&CONSUMER]).await?.get(0);
            drop(client);
            if backlog == 0 && left == 0 {
                return Ok(());
            }
            if Instant::now() >= until {
                self.stats.failures.push(format!(
                    "not drained within {}s: {backlog} events unpublished, {left} orders whose event is neither recorded nor in the manual queue",
                    DRAIN_LIMIT.as_secs()
                ));
                return Ok(());
            }
            self.pump(Instant::now() + Duration::from_millis(200))
                .await?;
        }
    }
}

/// A free port on 127.0.0.1 for the order service, kept across its restarts.
fn free_port() -> Result<std::net::SocketAddr, BoxError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

pub(crate) async fn main(args: &[String]) -> Result<bool, BoxError> {
    let opts = Options::parse(args)?;
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos();
    let prefix = format!("crash_{}_{nanos}", std::process::id());
    println!("crash: seed {} (replay: {})", opts.seed, opts.replay());
    println!(
        "  PostgreSQL {}, NATS {}; tables and stream {prefix}; {} kills; client: {} calls in flight, 70% keyed",
        opts.pg, opts.nats, opts.kills, opts.workers
    );
    // The run's own Redis, on a port of its own, when the keys go there.
    let redis = opts
        .redis
        .then(|| free_port().map(|a| a.port()))
        .transpose()?;
    let world = World::new(&opts.pg, &opts.nats, &prefix)?
        .with_log_relay(opts.log_relay)
        .with_amqp(opts.amqp.clone())
        .with_redis(redis.map(|port| format!("redis://127.0.0.1:{port}")));
    if let Some(port) = redis {
        println!(
            "  the order service's keys on a Redis of the run's own (127.0.0.1:{port}, no persistence), restarted every {REDIS_RESTART_EVERY} kills"
        );
    }
    if opts.log_relay {
        println!("  the relay reads the outbox from the write-ahead log (slot {prefix})");
    }
    if let Some(url) = &opts.amqp {
        println!(
            "  the events go through RabbitMQ at {url} (exchange and queue {prefix}, dead letters {prefix}.dead), every one applied at once"
        );
    }
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir)?;
    let oracle = dir.join("oracle.log");
    let created = world.create(ACK_WAIT).await;
    // The namespace, when asked for: it fails the run with the reason if it cannot be made.
    let net = match (&created, opts.partitions) {
        (Ok(()), 1..) => match Net::create(&opts.pg).await {
            Ok(net) => {
                println!(
                    "  partitions: the order service in the network namespace {} ({}), {} windows",
                    net.ns, net.inner_ip, opts.partitions
                );
                Ok(Some(Arc::new(net)))
            }
            Err(e) => Err(e),
        },
        _ => Ok(None),
    };
    let created = match (created, net) {
        (Ok(()), Ok(net)) => match redis {
            Some(port) => {
                let mut binds = vec!["127.0.0.1".to_owned()];
                if let Some(net) = &net {
                    binds.push(net.outer_ip.to_string());
                }
                OwnRedis::start(port, binds).await.map(|r| (net, Some(r)))
            }
            None => Ok((net, None)),
        },
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    let ran = match created {
        // Interrupted: the roles go with the driver's handles (killed on drop), and the tables
        // and stream are dropped all the same.
        Ok((net, redis)) => tokio::select! {
            ran = run(&world, &opts, &oracle, net, redis) => ran,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
        },
        Err(e) => Err(e),
    };
    let keep = !matches!(ran, Ok(true)) && std::env::var_os("CRASH_KEEP_FAILED").is_some();
    match if keep {
        Ok("nothing (CRASH_KEEP_FAILED)".to_owned())
    } else {
        world.drop_all().await
    } {
        Ok(what) => println!("crash: dropped {what}"),
        Err(e) => println!(
            "crash: could not drop the run's tables and stream: {}",
            chain(&*e)
        ),
    }
    match &ran {
        Ok(true) => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        _ => {
            if oracle.exists() {
                println!("crash: the oracle is kept at {}", oracle.display());
            } else {
                let _ = std::fs::remove_dir_all(&dir);
            }
            println!("crash: seed {}; replay: {}", opts.seed, opts.replay());
        }
    }
    ran
}

async fn run(
    world: &World,
    opts: &Options,
    oracle: &std::path::Path,
    net: Option<Arc<Net>>,
    redis: Option<OwnRedis>,
) -> Result<bool, BoxError> {
    let started = Instant::now();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut env = world.env();
    let mut order_addr = free_port()?;
    if let Some(net) = &net {
        order_addr.set_ip(net.inner_ip.into());
    }
    env.push((ENV_ADDR, order_addr.to_string()));
    env.push((ENV_ORACLE, oracle.display().to_string()));
    env.push((ENV_SEED, opts.seed.to_string()));
    env.push((ENV_WORKERS, opts.workers.to_string()));
    // The consumer's handlers answer with reasons, from this seed (tasks.rs).
    env.push((ENV_TASKS, opts.seed.to_string()));
    let mut sup = Supervisor {
        exe: std::env::current_exe()?,
        net,
        env,
        opts: opts.clone(),
        procs: HashMap::new(),
        tx,
        rx,
        arming: HashMap::new(),
        arm: true,
        incarnations: HashMap::new(),
        pending: HashMap::new(),
        stats: Stats {
            pauses_wanted: opts.pauses,
            on_redis: redis.is_some(),
            ..Stats::default()
        },
        redis,
        paused: Vec::new(),
        pausing: None,
    };
    // The services first; the client once the order service serves.
    let services = [
        Role::Order,
        Role::Relay,
        Role::Consumer,
        Role::Reconciler,
        Role::Admin,
    ];
    for role in services {
        sup.spawn(role, false)?;
    }
    sup.all_up(&services).await?;
    sup.spawn(Role::Client, false)?;
    sup.all_up(&[Role::Client]).await?;
    println!(
        "  all six roles serve after {}; the kills begin",
        ms(started.elapsed())
    );

    let chaos_started = Instant::now();
    sup.chaos().await?;
    sup.stats.chaos = chaos_started.elapsed();
    println!(
        "  {} kills in {}; stopping the kills, then: the client stops, the reconciler stops, orders in doubt asked again, relay and consumer drain",
        sup.stats.kills(),
        ms(sup.stats.chaos)
    );
    let end_started = Instant::now();
    sup.disarm().await;
    sup.stop(Role::Client).await?;
    sup.stop(Role::Reconciler).await?;
    sup.stop(Role::Admin).await?;
    // Every role that was being restarted serves before the asking again.
    sup.all_up(&[Role::Order, Role::Relay, Role::Consumer])
        .await?;
    // Nothing sends a key now: the abandoned records must clear by the rounds alone.
    sup.abandoned_recovered(world).await?;
    sup.ask_again().await?;
    sup.drain(world).await?;
    for role in [Role::Order, Role::Relay, Role::Consumer] {
        sup.stop(role).await?;
    }
    // The person decides the refused tasks: discards some, leaves the others queued.
    let fates = if opts.amqp.is_some() {
        Fates::new(opts.seed).all_at_once()
    } else {
        Fates::new(opts.seed)
    };
    let (discarded, queued) = tasks::person(&world.inbox()?, fates).await?;
    println!(
        "  person: discarded {discarded} of the {queued} tasks in the manual queue (refused by the fraud rule, the refusal upheld)"
    );
    let reconciled_at = Instant::now();
    let fin = reconcile::twice(world).await?;
    let reconciling = reconciled_at.elapsed();
    println!(
        "  end: asked again and drained in {}, reconciled twice in {} ({} rounds)",
        ms(end_started.elapsed() - reconciling),
        ms(reconciling),
        fin.rounds
    );

    let (ok, ops, tasks) = invariants::check(world, oracle, &sup.stats, &fin, fates).await?;
    summary(&sup.stats, &ops, &tasks, started.elapsed());
    Ok(ok)
}

/// How long the records of owners that died with their clients may stay `PROCESSING` once no
/// request comes: a lease for the last owner's to pass, a round's interval, the hook's limit,
/// and a second lease should the round's hook fail and leave the record to the next round.
pub(crate) fn abandoned_bound() -> Duration {
    crate::LEASE * 2 + crate::ABANDONED_ROUND + crate::ABANDONED_TIMEOUT
}

/// The late writes the fences refused, by what was written: the roles' `late-write-refused:WHAT
/// n N` notes, summed.
pub(crate) fn late_writes_refused(stats: &Stats) -> BTreeMap<String, u64> {
    stats
        .notes
        .iter()
        .filter_map(|(k, n)| {
            let what = k.strip_prefix("late-write-refused:")?.strip_suffix(" n")?;
            Some((what.to_owned(), *n))
        })
        .collect()
}

fn summary(stats: &Stats, ops: &str, tasks: &[String], elapsed: Duration) {
    println!();
    println!("Summary:");
    println!("  operations {ops}");
    for (i, line) in tasks.iter().enumerate() {
        println!(
            "  {} {line}",
            if i == 0 { "tasks     " } else { "          " }
        );
    }
    let kills = stats.kills();
    let at_points: Vec<String> = stats
        .kills_at_point
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .collect();
    let random: Vec<String> = stats
        .kills_random
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    println!(
        "  kills      {kills}: at crash points {} ({}); at random times {} ({})",
        stats.kills_at_point.values().sum::<u32>(),
        at_points.join(", "),
        stats.kills_random.values().sum::<u32>(),
        random.join(", ")
    );
    if stats.pauses() > 0 || stats.pauses_missed > 0 {
        let by_role: Vec<String> = stats
            .pauses
            .iter()
            .map(|(r, n)| format!("{r} {n}"))
            .collect();
        let refused: Vec<String> = late_writes_refused(stats)
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!(
            "  pauses     {} ({}), {} stopped in all, {} armed whose point did not come; late writes refused by their fence after a takeover: {}",
            stats.pauses(),
            by_role.join(", "),
            ms(stats.paused_for),
            stats.pauses_missed,
            if refused.is_empty() {
                "none".to_owned()
            } else {
                refused.join(", ")
            }
        );
    }
    let restarts: Vec<String> = stats
        .restarts
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    println!(
        "  restarts   {}: {}; {} order incarnations without the recovery hook; {} exits not caused by the driver",
        stats.restarts.values().sum::<u32>(),
        restarts.join(", "),
        stats.hookless,
        stats.unexpected.len()
    );
    let mut recoveries = stats.recoveries.clone();
    recoveries.sort_by_key(|r| r.2);
    if let Some((role, what, slowest)) = recoveries.last() {
        let median = recoveries[recoveries.len() / 2].2;
        println!(
            "  recovery   slowest {} ({} after a kill of {what}), median {} over {} restarts",
            ms(*slowest),
            role.name(),
            ms(median),
            recoveries.len()
        );
    }
    let takeovers: Vec<String> = stats
        .notes
        .iter()
        .filter(|(k, _)| k.starts_with("takeover "))
        .map(|(k, n)| format!("{} {n}", k.trim_start_matches("takeover ")))
        .collect();
    println!(
        "  takeovers  {} seen by the recovery hook ({}); duplicate deliveries absorbed by the inbox: {}",
        stats
            .notes
            .iter()
            .filter(|(k, _)| k.starts_with("takeover "))
            .map(|(_, n)| n)
            .sum::<u64>(),
        if takeovers.is_empty() {
            "none".to_owned()
        } else {
            takeovers.join(", ")
        },
        stats.notes.get("duplicate-absorbed").unwrap_or(&0)
    );
    let note = |k: &str| stats.notes.get(k).copied().unwrap_or(0);
    let abandoned: Vec<String> = stats
        .notes
        .iter()
        .filter(|(k, _)| k.starts_with("abandoned ") && !k.starts_with("abandoned-"))
        .map(|(k, n)| format!("{} {n}", k.trim_start_matches("abandoned ")))
        .collect();
    println!(
        "  abandoned  {} rounds took {} records without a request: {} completed, {} failed, {} unknown, {} released, {} left for a later round; the hook's findings: {}; {} rounds failed",
        note("abandoned-round"),
        note("abandoned-round seen"),
        note("abandoned-round completed"),
        note("abandoned-round failed"),
        note("abandoned-round unknown"),
        note("abandoned-round released"),
        note("abandoned-round left"),
        if abandoned.is_empty() {
            "none".to_owned()
        } else {
            abandoned.join(", ")
        },
        note("abandoned-round-failed")
    );
    println!(
        "  reconciler while killed and restarted: calls settled {} succeeded, {} failed, {} to the manual queue; \
         server records {} completed, {} released",
        note("reconciled succeeded"),
        note("reconciled failed"),
        note("reconciled manual"),
        note("reconciled completed"),
        note("reconciled released")
    );
    println!(
        "  ledger     the clients that stopped cleanly wrote {} entries ({} failed), {} settled by a replay; asked again: {}",
        note("ledger-writes written"),
        note("ledger-writes failed"),
        note("ledger-writes settled-by-replay"),
        stats
            .last_notes
            .get("asked-again")
            .map_or("nothing", String::as_str)
    );
    if !stats.windows.is_empty() {
        let windows: Vec<String> = stats
            .windows
            .iter()
            .map(|(w, n)| format!("{w} {n}"))
            .collect();
        println!(
            "  partitions {} windows of the order service ({}), {} in all",
            stats.windows.values().sum::<u32>(),
            windows.join(", "),
            ms(stats.partitioned)
        );
    }
    let minutes = stats.chaos.as_secs_f64() / 60.0;
    println!(
        "  elapsed    {:.1}s in all, {:.1}s of kills: {:.0} kills per minute",
        elapsed.as_secs_f64(),
        stats.chaos.as_secs_f64(),
        if minutes > 0.0 {
            f64::from(kills) / minutes
        } else {
            0.0
        }
    );
}
