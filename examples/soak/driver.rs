//! The soak's driver: makes the run's world (tables, its own NATS server, the proxy), starts
//! the roles as processes and restarts them, injects the faults, samples, checks the backlog's
//! sweep, then stops everything, drains, and hands the figures to the verdict.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::time::Instant;

use crate::broker::Broker;
use crate::chores::Settings;
use crate::client::{ENV_INCARNATION, ENV_MODE, ENV_ORACLE, ENV_RATE, ENV_SEED, ENV_WORKERS};
use crate::crashpoint::{AFTER_PAYMENT, ENV_CRASH_AT};
use crate::order::{ENV_ADDR, ENV_HOOK};
use crate::proxy::{self, Drops};
use crate::sample::{self, Phase, ProcStat, Sample};
use crate::splitmix::SplitMix;
use crate::verdict::{self, Backlog, Run};
use crate::world::World;
use crate::{chain, BoxError, ACK_WAIT, LEASE};

/// A role that does not serve within this of its start is an error.
const STARTUP_LIMIT: Duration = Duration::from_secs(20);
/// How long a role told to stop may take.
const STOP_LIMIT: Duration = Duration::from_secs(15);
/// The relay and the consumer's limit to catch up at the end.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);
/// Exits the driver did not cause, before the run gives up.
const MAX_UNEXPECTED: usize = 30;
/// A role that exited on its own starts again after this.
const RESTART_AFTER: Duration = Duration::from_secs(1);
/// How long a killed order service stays down: past the client's deadline.
const ORDER_DOWN: Duration = Duration::from_secs(5);
/// How long the broker stays down in a restart.
const BROKER_DOWN: Duration = Duration::from_secs(2);
/// Replies lost in a lost-replies fault, and how long the proxy stays armed at most.
const LOST_REPLIES: u32 = 3;
const LOST_FOR: Duration = Duration::from_secs(5);
/// How long an order service armed to die may take to reach its point before it is killed.
const ARMED_FOR: Duration = Duration::from_secs(10);
/// The backlog's sweep: how long it may take.
const SWEEP_LIMIT: Duration = Duration::from_secs(300);
/// The role's line marking the protocol.
const PROTOCOL: &str = "@@ ";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Role {
    Order,
    Relay,
    Consumer,
    Reconciler,
    Client,
}

pub(crate) const ROLES: [Role; 5] = [
    Role::Order,
    Role::Relay,
    Role::Consumer,
    Role::Reconciler,
    Role::Client,
];

impl Role {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Order => "order",
            Role::Relay => "relay",
            Role::Consumer => "consumer",
            Role::Reconciler => "reconciler",
            Role::Client => "client",
        }
    }
}

/// The faults, in the order a cycle starts from before the seed shuffles it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Fault {
    LostReplies,
    RelayKilled,
    BrokerRestart,
    OrderKilled,
}

impl Fault {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::LostReplies => "lost replies",
            Fault::RelayKilled => "relay killed",
            Fault::BrokerRestart => "broker restart",
            Fault::OrderKilled => "order killed",
        }
    }

    /// Whether it kills a role.
    fn kills(&self) -> bool {
        matches!(self, Fault::RelayKilled | Fault::OrderKilled)
    }
}

/// The driver's options.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) minutes: f64,
    pub(crate) seed: u64,
    pub(crate) rate: f64,
    pub(crate) sample: Duration,
    pub(crate) retention: Duration,
    pub(crate) warmup: Duration,
    pub(crate) backlog: u64,
    pub(crate) workers: u32,
    /// The rows a maintenance batch does at most, and the share of a round its batches work.
    pub(crate) batch: usize,
    pub(crate) duty: f64,
    pub(crate) pg: String,
    pub(crate) nats_server: PathBuf,
    pub(crate) verbose: bool,
    /// The relay reads the outbox from the write-ahead log (`LogRelay`) instead of polling.
    pub(crate) log_relay: bool,
    /// Whether the latency checks (3 and 5) count towards the verdict, or are reported only
    /// (`--timings report`: for CI's minute on a shared machine, where a p99 of a hundred calls
    /// is noise; the long runs check them).
    pub(crate) timings_checked: bool,
}

const USAGE: &str = "usage: soak [driver] [--minutes N] [--seed S] [--rate R] [--sample SECS] \
    [--retention SECS] [--warmup SECS] [--backlog N] [--workers N] [--batch N] [--duty D] [--postgres URL] \
    [--nats-server PATH] [--timings check|report] [--relay poll|log] [--verbose]";

impl Options {
    pub(crate) fn parse(args: &[String]) -> Result<Options, BoxError> {
        let mut minutes = 10.0;
        let mut seed = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64 % 1_000_000;
        let mut rate = 20.0;
        let mut timings_checked = true;
        let mut sample = 10.0;
        let (mut retention, mut warmup, mut backlog) = (None, None, None);
        let mut workers = 16;
        let mut batch = 500;
        let mut duty = surely::maintenance::DEFAULT_DUTY;
        let mut pg = std::env::var("SURELY_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let mut nats_server = PathBuf::from("/usr/sbin/nats-server");
        let mut verbose = false;
        let mut log_relay = false;
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value; {USAGE}"))
            };
            match arg.as_str() {
                "--minutes" => minutes = value("--minutes")?.parse()?,
                "--seed" => seed = value("--seed")?.parse()?,
                "--rate" => rate = value("--rate")?.parse()?,
                "--sample" => sample = value("--sample")?.parse()?,
                "--retention" => retention = Some(value("--retention")?.parse::<f64>()?),
                "--warmup" => warmup = Some(value("--warmup")?.parse::<f64>()?),
                "--backlog" => backlog = Some(value("--backlog")?.parse()?),
                "--workers" => workers = value("--workers")?.parse()?,
                "--batch" => batch = value("--batch")?.parse()?,
                "--duty" => duty = value("--duty")?.parse()?,
                "--postgres" => pg = value("--postgres")?,
                "--nats-server" => nats_server = PathBuf::from(value("--nats-server")?),
                "--verbose" => verbose = true,
                "--relay" => {
                    log_relay = match value("--relay")?.as_str() {
                        "log" => true,
                        "poll" => false,
                        other => {
                            return Err(format!("--relay: {other:?} is not poll or log").into())
                        }
                    }
                }
                "--timings" => {
                    timings_checked = match value("--timings")?.as_str() {
                        "check" => true,
                        "report" => false,
                        other => {
                            return Err(format!(
                                "--timings check or report, not {other:?}; {USAGE}"
                            )
                            .into())
                        }
                    }
                }
                other => return Err(format!("unknown argument {other:?}; {USAGE}").into()),
            }
        }
        let valid = |x: f64, lo: f64, hi: f64| x.is_finite() && x >= lo && x <= hi;
        if !valid(minutes, 0.25, 24.0 * 60.0)
            || !valid(rate, 1.0, 1000.0)
            || !valid(sample, 1.0, 600.0)
            || workers == 0
            || batch == 0
            || duty.is_nan()
            || duty <= 0.0
            || duty > 1.0
        {
            return Err(format!(
                "--minutes within 0.25..=1440, --rate within 1..=1000, --sample within 1..=600 s, --workers and --batch at least 1, --duty within (0, 1]; {USAGE}"
            )
            .into());
        }
        let short = minutes <= 2.0;
        let retention = retention.unwrap_or(if short { 10.0 } else { 60.0 });
        if !valid(retention, 1.0, 86_400.0) {
            return Err(format!("--retention within 1..=86400 s; {USAGE}").into());
        }
        let retention = Duration::from_secs_f64(retention);
        let s = Settings::new(retention, batch, duty);
        let total = minutes * 60.0;
        let warmup = warmup
            .unwrap_or_else(|| {
                (2.0 * (s.retention + s.keep_expired_for).as_secs_f64()).min(total / 3.0)
            })
            .clamp(0.0, total * 0.8);
        Ok(Options {
            minutes,
            seed,
            rate,
            sample: Duration::from_secs_f64(sample),
            retention,
            warmup: Duration::from_secs_f64(warmup),
            backlog: backlog.unwrap_or(if short { 20_000 } else { 100_000 }),
            workers,
            batch,
            duty,
            pg,
            nats_server,
            verbose,
            log_relay,
            timings_checked,
        })
    }

    pub(crate) fn total(&self) -> Duration {
        Duration::from_secs_f64(self.minutes * 60.0)
    }

    /// A run under three minutes (CI's minute): faults every tenth of it, kills to the end, a
    /// backlog sweepable 3 s after its insert, and windows of 100 calls for its check.
    pub(crate) fn is_short(&self) -> bool {
        self.minutes * 60.0 < 180.0
    }

    fn replay(&self) -> String {
        format!(
            "cargo run --release --all-features --example soak -- --minutes {} --seed {} --rate {} --sample {} --retention {} --warmup {} --backlog {} --batch {} --duty {}{}",
            self.minutes,
            self.seed,
            self.rate,
            self.sample.as_secs_f64(),
            self.retention.as_secs_f64(),
            self.warmup.as_secs_f64(),
            self.backlog,
            self.batch,
            self.duty,
            if self.timings_checked { "" } else { " --timings report" }
        ) + if self.log_relay { " --relay log" } else { "" }
    }

    /// The faults' schedule, in seconds from the start: every 20 to 60 s (a run of less than
    /// three minutes: every tenth of it), none near the backlog's check; the kinds in a
    /// shuffled cycle. In a run of three minutes or more, the kills (of the order service and
    /// of the relay) stop before the backlog's check: the incarnations that live from there to
    /// the end see more than half of the samples, so their RSS is checked (invariant 2), while
    /// lost replies and broker restarts go on to the end.
    fn faults(&self, backlog_at: f64) -> Vec<(f64, Fault)> {
        let total = self.minutes * 60.0;
        let short = self.is_short();
        let mut rng = SplitMix::new(self.seed ^ 0x50A4_FA17);
        let (before, after) = if short { (12.0, 15.0) } else { (120.0, 240.0) };
        let mut cycle: Vec<Fault> = Vec::new();
        let mut out = Vec::new();
        let mut t = 0.0;
        loop {
            t += if short {
                total / 10.0
            } else {
                20.0 + 40.0 * rng.unit()
            };
            if t >= total - 3.0 {
                return out;
            }
            if t > backlog_at - before && t < backlog_at + after {
                continue;
            }
            let kills = short || t < backlog_at - before;
            if cycle.is_empty() || (!kills && cycle.iter().any(Fault::kills)) {
                cycle = if kills {
                    vec![
                        Fault::LostReplies,
                        Fault::RelayKilled,
                        Fault::BrokerRestart,
                        Fault::OrderKilled,
                    ]
                } else {
                    vec![Fault::LostReplies, Fault::BrokerRestart]
                };
                for i in (1..cycle.len()).rev() {
                    let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                    cycle.swap(i, j);
                }
            }
            out.push((t, cycle.remove(0)));
        }
    }
}

/// What a role said, that it ended, or what a task of the driver's finished.
enum Ev {
    Line(Role, u64, String),
    Exit {
        role: Role,
        incarnation: u64,
        code: Option<i32>,
        killed: bool,
    },
    BrokerBack(Result<(), String>),
    Backlog(BacklogEv),
}

enum BacklogEv {
    Inserted { from: f64, to: f64, rows: u64 },
    Swept { at: f64 },
    Failed(String),
}

struct Proc {
    incarnation: u64,
    pid: u32,
    spawned: Instant,
    ready: bool,
    stdin: Option<ChildStdin>,
    kill: Option<oneshot::Sender<()>>,
    killing: bool,
    stopping: bool,
}

/// One call as the client reported it: when it ended (seconds since the start) and its
/// latency.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub(crate) at: f64,
    pub(crate) us: u64,
}

impl Call {
    pub(crate) fn started(&self) -> f64 {
        self.at - self.us as f64 / 1e6
    }
}

struct Sup {
    exe: PathBuf,
    env: Vec<(&'static str, String)>,
    /// The per-role variables over the common ones.
    role_env: HashMap<Role, Vec<(&'static str, String)>>,
    procs: HashMap<Role, Proc>,
    tx: mpsc::UnboundedSender<Ev>,
    rx: mpsc::UnboundedReceiver<Ev>,
    incarnations: HashMap<Role, u64>,
    /// Roles to start again, and when.
    restart_at: HashMap<Role, Instant>,
    /// The delay of the next restart of a role the driver kills.
    down_for: HashMap<Role, Duration>,
    verbose: bool,
    start: Instant,
    calls: Vec<Call>,
    /// Calls the client reported as anything but succeeded, by outcome.
    outcomes: BTreeMap<String, u64>,
    unexpected: Vec<String>,
    failures: Vec<String>,
    /// The order service armed to die at `after-payment`, since when.
    order_armed: Option<Instant>,
    /// An order service killed: from when, waiting for it to serve again.
    order_down_since: Option<f64>,
    /// The windows (seconds) in which the client's calls met a fault; calls in flight in one
    /// are left out of the latency comparisons.
    windows: Vec<(f64, f64, &'static str)>,
    kills: BTreeMap<&'static str, u32>,
}

impl Sup {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn spawn(&mut self, role: Role) -> Result<(), BoxError> {
        let incarnation = {
            let n = self.incarnations.entry(role).or_default();
            *n += 1;
            *n
        };
        let mut cmd = Command::new(&self.exe);
        cmd.arg(role.name())
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .envs(
                self.role_env
                    .get(&role)
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (*k, v.as_str())),
            )
            .env(ENV_INCARNATION, incarnation.to_string())
            .env_remove(ENV_CRASH_AT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if self.verbose {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true);
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
        if self.verbose {
            println!("  start      {} #{incarnation} (pid {pid})", role.name());
        }
        self.procs.insert(
            role,
            Proc {
                incarnation,
                pid,
                spawned: Instant::now(),
                ready: false,
                stdin,
                kill: Some(kill),
                killing: false,
                stopping: false,
            },
        );
        Ok(())
    }

    /// SIGKILLs a role; it starts again after `down`.
    fn kill(&mut self, role: Role, down: Duration, why: &'static str) {
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
        *self.kills.entry(why).or_default() += 1;
        self.down_for.insert(role, down);
        if self.verbose {
            println!("  kill       {} #{} ({why})", role.name(), p.incarnation);
        }
    }

    async fn say(&mut self, role: Role, line: &str) {
        if let Some(stdin) = self.procs.get_mut(&role).and_then(|p| p.stdin.as_mut()) {
            let _ = stdin.write_all(format!("{line}\n").as_bytes()).await;
            let _ = stdin.flush().await;
        }
    }

    fn handle(&mut self, ev: Ev) -> Result<Option<Ev>, BoxError> {
        match ev {
            Ev::Line(role, incarnation, line) => {
                let current = self.procs.get(&role).map(|p| p.incarnation) == Some(incarnation);
                let Some(said) = line.strip_prefix(PROTOCOL) else {
                    if self.verbose {
                        println!("  {:<10} #{incarnation}: {line}", role.name());
                    }
                    return Ok(None);
                };
                let words: Vec<&str> = said.split(' ').collect();
                match words.as_slice() {
                    ["latency", us, outcome] => {
                        let at = self.now();
                        if let Ok(us) = us.parse() {
                            self.calls.push(Call { at, us });
                        }
                        *self.outcomes.entry((*outcome).to_owned()).or_default() += 1;
                    }
                    ["ready"] if current => {
                        if let Some(p) = self.procs.get_mut(&role) {
                            p.ready = true;
                        }
                        if role == Role::Order
                            && let Some(from) = self.order_down_since.take()
                        {
                            let to = self.now();
                            self.windows.push((from, to, "order killed"));
                        }
                    }
                    ["crashpoint", point]
                        if current && role == Role::Order && *point == AFTER_PAYMENT =>
                    {
                        self.order_armed = None;
                        self.order_down_since = Some(self.now());
                        self.kill(Role::Order, ORDER_DOWN, "order killed after a payment");
                    }
                    _ => {}
                }
                Ok(None)
            }
            Ev::Exit {
                role,
                incarnation,
                code,
                killed,
            } => {
                let Some(p) = self.procs.get(&role) else {
                    return Ok(None);
                };
                if p.incarnation != incarnation {
                    return Ok(None);
                }
                let p = self.procs.remove(&role).ok_or("gone")?;
                if p.stopping {
                    if !killed && code != Some(0) {
                        self.failures.push(format!(
                            "{} #{incarnation} stopped with exit code {code:?}",
                            role.name()
                        ));
                    }
                    return Ok(None);
                }
                let down = if killed {
                    self.down_for.remove(&role).unwrap_or_default()
                } else {
                    let what = format!(
                        "{} #{incarnation} (pid {}) exited on its own with code {code:?} at {:.1}s",
                        role.name(),
                        p.pid,
                        self.now()
                    );
                    if self.verbose {
                        println!("  unexpected {what}");
                    }
                    self.unexpected.push(what);
                    if self.unexpected.len() > MAX_UNEXPECTED {
                        return Err(format!(
                            "more than {MAX_UNEXPECTED} processes exited on their own: giving up"
                        )
                        .into());
                    }
                    RESTART_AFTER
                };
                self.restart_at.insert(role, Instant::now() + down);
                Ok(None)
            }
            other => Ok(Some(other)),
        }
    }

    /// Starts the roles whose restart is due; a role that does not serve in time is an error.
    fn restarts(&mut self) -> Result<(), BoxError> {
        let due: Vec<Role> = self
            .restart_at
            .iter()
            .filter(|(_, at)| **at <= Instant::now())
            .map(|(r, _)| *r)
            .collect();
        for role in due {
            self.restart_at.remove(&role);
            self.spawn(role)?;
        }
        for (role, p) in &self.procs {
            if !p.ready && !p.killing && p.spawned.elapsed() > STARTUP_LIMIT {
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

    /// Handles what comes until `until`; returns the driver's own events.
    async fn pump(&mut self, until: Instant) -> Result<Vec<Ev>, BoxError> {
        let mut own = Vec::new();
        loop {
            let next = self
                .restart_at
                .values()
                .min()
                .copied()
                .map_or(until, |r| r.min(until));
            match tokio::time::timeout_at(next, self.rx.recv()).await {
                Ok(Some(ev)) => own.extend(self.handle(ev)?),
                Ok(None) => return Err("the event channel closed".into()),
                Err(_) => {}
            }
            self.restarts()?;
            if Instant::now() >= until {
                return Ok(own);
            }
        }
    }

    fn is_up(&self, role: Role) -> bool {
        self.procs
            .get(&role)
            .is_some_and(|p| p.ready && !p.killing && !p.stopping)
    }

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
            let own = self
                .pump(Instant::now() + Duration::from_millis(50))
                .await?;
            if !own.is_empty() {
                return Err("a task's event came before the roles served".into());
            }
        }
        Ok(())
    }

    /// Tells the role to stop (its standard input closed) and waits; kills it past the limit.
    async fn stop(&mut self, role: Role) -> Result<Vec<Ev>, BoxError> {
        self.restart_at.remove(&role);
        let until = Instant::now() + STOP_LIMIT;
        let mut own = Vec::new();
        loop {
            let Some(p) = self.procs.get_mut(&role) else {
                return Ok(own);
            };
            p.stopping = true;
            p.stdin.take();
            if Instant::now() >= until {
                self.failures.push(format!(
                    "{} #{} did not stop within {}s: killed",
                    role.name(),
                    p.incarnation,
                    STOP_LIMIT.as_secs()
                ));
                if let Some(kill) = p.kill.take() {
                    let _ = kill.send(());
                }
                own.extend(self.pump(Instant::now() + Duration::from_secs(2)).await?);
                return Ok(own);
            }
            own.extend(
                self.pump(Instant::now() + Duration::from_millis(50))
                    .await?,
            );
        }
    }

    fn procs_stat(&self, broker: Option<u32>) -> Vec<(&'static str, Option<ProcStat>)> {
        let mut out: Vec<(&'static str, Option<ProcStat>)> = ROLES
            .iter()
            .map(|r| {
                let stat = self
                    .procs
                    .get(r)
                    .filter(|p| !p.killing)
                    .and_then(|p| sample::proc_stat(p.pid));
                (r.name(), stat)
            })
            .collect();
        out.push(("driver", sample::proc_stat(std::process::id())));
        out.push(("nats", broker.and_then(sample::proc_stat)));
        out
    }
}

/// The latency quantiles of the calls that ended in `(from, to]`.
fn interval(calls: &[Call], from: f64, to: f64) -> (usize, Option<f64>, Option<f64>) {
    let mut us: Vec<u64> = calls
        .iter()
        .filter(|c| c.at > from && c.at <= to)
        .map(|c| c.us)
        .collect();
    us.sort_unstable();
    (
        us.len(),
        sample::quantile(&us, 0.5),
        sample::quantile(&us, 0.99),
    )
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

pub(crate) async fn main(args: &[String]) -> Result<bool, BoxError> {
    let opts = Options::parse(args)?;
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos();
    let prefix = format!("soak_{}_{nanos}", std::process::id());
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let run_name = format!("soak-{}m-seed{}-{stamp}", opts.minutes, opts.seed);
    let out_dir = target_dir().join("soak");
    std::fs::create_dir_all(&out_dir)?;
    let dir = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&dir)?;
    println!("soak: seed {} (replay: {})", opts.seed, opts.replay());
    let broker = Broker::start(&opts.nats_server, &dir.join("nats")).await?;
    // Every connection of the run's names it, so that the samples count the run's alone.
    let sep = if opts.pg.contains('?') { '&' } else { '?' };
    let pg = format!("{}{sep}application_name={prefix}", opts.pg);
    let world = World::new(&pg, &broker.url(), &prefix)?.with_log_relay(opts.log_relay);
    let broker = Arc::new(Mutex::new(broker));
    let created = async {
        world.create(ACK_WAIT).await?;
        surely::maintenance::PostgresLeases::new(world.pool.clone())
            .with_table(&world.t("leases"))?
            .migrate()
            .await?;
        Ok::<_, BoxError>(())
    }
    .await;
    let ran = match created {
        Ok(()) => tokio::select! {
            ran = run(&world, &opts, &dir, &out_dir, &run_name, broker.clone()) => ran,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
        },
        Err(e) => Err(e),
    };
    match world.drop_all().await {
        Ok(what) => println!("soak: dropped {what}"),
        Err(e) => println!(
            "soak: could not drop the run's tables and stream: {}",
            chain(&*e)
        ),
    }
    broker.lock().await.down().await;
    let _ = std::fs::remove_dir_all(&dir);
    if !matches!(ran, Ok(true)) {
        println!("soak: seed {}; replay: {}", opts.seed, opts.replay());
    }
    ran
}

async fn run(
    world: &World,
    opts: &Options,
    dir: &std::path::Path,
    out_dir: &std::path::Path,
    run_name: &str,
    broker: Arc<Mutex<Broker>>,
) -> Result<bool, BoxError> {
    let settings = Settings::new(opts.retention, opts.batch, opts.duty);
    let (tx, rx) = mpsc::unbounded_channel();
    let order_addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let drops = Arc::new(Drops::default());
    let proxy_addr = proxy::start(order_addr, drops.clone()).await?;
    let mut env = world.env();
    env.extend(settings.env());
    let mut role_env = HashMap::new();
    role_env.insert(
        Role::Order,
        vec![
            (ENV_ADDR, order_addr.to_string()),
            (ENV_HOOK, "1".to_owned()),
        ],
    );
    role_env.insert(
        Role::Client,
        vec![
            (ENV_ADDR, proxy_addr.to_string()),
            (ENV_ORACLE, dir.join("oracle.log").display().to_string()),
            (ENV_SEED, opts.seed.to_string()),
            (ENV_WORKERS, opts.workers.to_string()),
            (ENV_RATE, opts.rate.to_string()),
            (ENV_MODE, "run".to_owned()),
        ],
    );
    let total = opts.total().as_secs_f64();
    let warmup = opts.warmup.as_secs_f64();
    let backlog_at = warmup + (total - warmup) / 2.0;
    let faults = opts.faults(backlog_at);
    println!(
        "  PostgreSQL {}, NATS {} (the run's own), tables and stream {}",
        opts.pg, world.nats_url, world.prefix
    );
    println!(
        "  {:.0}s at {} calls/s (70% keyed), sampled every {:.0}s; retention {:.0}s (idempotency records {:.0}s more), chores every {:.0}s in batches of {} at a duty of {}; warm-up {:.0}s; a backlog of {} rows at {:.0}s; {} faults",
        total,
        opts.rate,
        opts.sample.as_secs_f64(),
        settings.retention.as_secs_f64(),
        settings.keep_expired_for.as_secs_f64(),
        settings.every.as_secs_f64(),
        settings.batch_size,
        settings.duty,
        warmup,
        opts.backlog,
        backlog_at,
        faults.len()
    );
    let tables: Vec<String> = {
        let client = world.pool.get().await?;
        let pattern = format!("{}\\_%", world.prefix);
        let rows = client
            .query(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE $1 ORDER BY tablename",
                &[&pattern],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let t: String = r.get(0);
                t[world.prefix.len() + 1..].to_owned()
            })
            .collect()
    };
    let mut sup = Sup {
        exe: std::env::current_exe()?,
        env,
        role_env,
        procs: HashMap::new(),
        tx,
        rx,
        incarnations: HashMap::new(),
        restart_at: HashMap::new(),
        down_for: HashMap::new(),
        verbose: opts.verbose,
        start: Instant::now(),
        calls: Vec::new(),
        outcomes: BTreeMap::new(),
        unexpected: Vec::new(),
        failures: Vec::new(),
        order_armed: None,
        order_down_since: None,
        windows: Vec::new(),
        kills: BTreeMap::new(),
    };
    let services = [Role::Order, Role::Relay, Role::Consumer, Role::Reconciler];
    for role in services {
        sup.spawn(role)?;
    }
    sup.all_up(&services).await?;
    sup.spawn(Role::Client)?;
    sup.all_up(&[Role::Client]).await?;
    sup.start = Instant::now();
    println!("  the five roles serve; the load begins");

    let started = sup.start;
    let at = |secs: f64| started + Duration::from_secs_f64(secs);
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = opts.sample.as_secs_f64();
    let mut last_sample = 0.0;
    let mut fault_marks: Vec<(f64, &'static str)> = Vec::new();
    let mut pending_faults = faults.into_iter().peekable();
    let mut lost: Option<f64> = None;
    let mut broker_restarting: Option<f64> = None;
    let mut broker_outages: Vec<f64> = Vec::new();
    let mut backlog = Backlog::default();
    let mut backlog_started = false;
    let mut phase_backlog = false;
    loop {
        let now = sup.now();
        if now >= total {
            break;
        }
        let mut wake = total.min(next_sample);
        if let Some((t, _)) = pending_faults.peek() {
            wake = wake.min(*t);
        }
        if !backlog_started {
            wake = wake.min(backlog_at);
        }
        // The faults that last are looked at every 100 ms.
        if lost.is_some() || sup.order_armed.is_some() {
            wake = wake.min(now + 0.1);
        }
        for ev in sup.pump(at(wake.max(now))).await? {
            match ev {
                Ev::BrokerBack(result) => {
                    if let Some(from) = broker_restarting.take() {
                        broker_outages.push(sup.now() - from);
                    }
                    if let Err(e) = result {
                        return Err(format!("the broker did not come back: {e}").into());
                    }
                }
                Ev::Backlog(BacklogEv::Inserted { from, to, rows }) => {
                    backlog.inserted = Some((from, to, rows));
                }
                Ev::Backlog(BacklogEv::Swept { at }) => {
                    backlog.swept = Some(at);
                    phase_backlog = false;
                }
                Ev::Backlog(BacklogEv::Failed(e)) => {
                    backlog.error = Some(e);
                    phase_backlog = false;
                }
                _ => {}
            }
        }
        let now = sup.now();
        // A lost-replies fault ends when its replies are lost, or after LOST_FOR.
        if let Some(from) = lost {
            let done = drops_left(&drops) == 0;
            if done || now - from >= LOST_FOR.as_secs_f64() {
                drops.disarm();
                sup.windows.push((from, now, "lost replies"));
                lost = None;
            }
        }
        // An order service armed to die that has not reached its point: killed all the same.
        if let Some(armed) = sup.order_armed
            && armed.elapsed() >= ARMED_FOR
        {
            sup.order_armed = None;
            sup.order_down_since = Some(now);
            sup.kill(
                Role::Order,
                ORDER_DOWN,
                "order killed (its point not reached)",
            );
        }
        if let Some(&(t, fault)) = pending_faults.peek()
            && now >= t
        {
            pending_faults.next();
            fault_marks.push((now, fault.name()));
            if opts.verbose {
                println!("  fault      {} at {now:.1}s", fault.name());
            }
            match fault {
                Fault::LostReplies => {
                    drops.arm(LOST_REPLIES);
                    lost = Some(now);
                }
                Fault::RelayKilled => sup.kill(Role::Relay, Duration::ZERO, "relay killed"),
                Fault::BrokerRestart if broker_restarting.is_none() => {
                    broker_restarting = Some(now);
                    let (broker, tx) = (broker.clone(), sup.tx.clone());
                    tokio::spawn(async move {
                        let back = broker.lock().await.restart(BROKER_DOWN).await;
                        let _ = tx.send(Ev::BrokerBack(back.map_err(|e| chain(&*e))));
                    });
                }
                Fault::BrokerRestart => {}
                Fault::OrderKilled => {
                    sup.say(Role::Order, &format!("arm {AFTER_PAYMENT}:1"))
                        .await;
                    sup.order_armed = Some(Instant::now());
                }
            }
        }
        if !backlog_started && now >= backlog_at {
            backlog_started = true;
            phase_backlog = true;
            let (world, tx, rows) = (world.clone(), sup.tx.clone(), opts.backlog);
            let eligible = Eligible {
                after: if opts.is_short() { 3.0 } else { 30.0 },
                keep_expired_for: settings.keep_expired_for.as_secs_f64(),
            };
            tokio::spawn(async move {
                let ev = match insert_backlog(&world, rows, eligible, started, &tx).await {
                    Ok(at) => BacklogEv::Swept { at },
                    Err(e) => BacklogEv::Failed(chain(&*e)),
                };
                let _ = tx.send(Ev::Backlog(ev));
            });
        }
        if now >= next_sample {
            next_sample += opts.sample.as_secs_f64();
            let broker_pid = broker.try_lock().ok().and_then(|b| b.pid());
            let db = sample::database(world, &tables, LEASE, settings.every).await?;
            let (n, p50, p99) = interval(&sup.calls, last_sample, now);
            let phase = if phase_backlog {
                Phase::Backlog
            } else if now < warmup {
                Phase::Warmup
            } else {
                Phase::Steady
            };
            let s = Sample {
                t: now,
                phase,
                calls: n,
                p50_ms: p50,
                p99_ms: p99,
                pg_conns: db.conns,
                ledger_open: db.ledger_open,
                processing: db.processing,
                stuck: db.stuck,
                stuck_past_round: db.stuck_past_round,
                procs: sup.procs_stat(broker_pid),
                tables: db.tables,
            };
            last_sample = now;
            let rows: Vec<String> = s
                .tables
                .iter()
                .filter(|t| ["idem", "outbox", "inbox", "ledger"].contains(&t.table.as_str()))
                .map(|t| format!("{} {}", t.table, t.rows))
                .collect();
            println!(
                "  {:>6.1}s {:<7} calls {:>4} p50 {:>7} p99 {:>7}  rows: {}  processing {} (past 2x lease {})",
                s.t,
                match s.phase {
                    Phase::Warmup => "warmup",
                    Phase::Steady => "steady",
                    Phase::Backlog => "backlog",
                },
                s.calls,
                p50.map_or("-".to_owned(), |v| format!("{v:.1}ms")),
                p99.map_or("-".to_owned(), |v| format!("{v:.1}ms")),
                rows.join(", "),
                s.processing,
                s.stuck
            );
            samples.push(s);
        }
    }

    // The end: the load stops, the pipeline drains, the services stop.
    let end = sup.now();
    println!("  {end:.0}s: the load stops; the relay and the consumer drain");
    let mut own = sup.stop(Role::Client).await?;
    if let Some(from) = lost.take() {
        drops.disarm();
        sup.windows.push((from, sup.now(), "lost replies"));
    }
    // The broker comes back first if it is restarting, and the order service if it is down.
    let until = Instant::now() + DRAIN_LIMIT;
    while broker_restarting.is_some() || !sup.is_up(Role::Order) || !sup.is_up(Role::Relay) {
        if Instant::now() >= until {
            return Err("the broker or the services did not come back at the end".into());
        }
        for ev in sup
            .pump(Instant::now() + Duration::from_millis(100))
            .await?
        {
            if let Ev::BrokerBack(r) = ev {
                if let Some(from) = broker_restarting.take() {
                    broker_outages.push(sup.now() - from);
                }
                r.map_err(|e| format!("the broker did not come back: {e}"))?;
            }
        }
    }
    own.extend(drain(&mut sup, world).await?);
    for role in [Role::Reconciler, Role::Relay, Role::Consumer, Role::Order] {
        own.extend(sup.stop(role).await?);
    }
    drop(own);

    let csv = out_dir.join(format!("{run_name}.csv"));
    let svg = out_dir.join(format!("{run_name}.svg"));
    sample::write_csv(&csv, &samples)?;
    crate::plot::svg(
        &svg,
        &format!(
            "soak: {} min at {} calls/s, seed {}, retention {:.0}s",
            opts.minutes,
            opts.rate,
            opts.seed,
            opts.retention.as_secs_f64()
        ),
        &samples,
        &fault_marks,
        backlog
            .inserted
            .map(|(from, _, _)| (from, backlog.swept.unwrap_or(from))),
    )?;
    println!("  samples: {} and {}", csv.display(), svg.display());

    let faults_seen: BTreeMap<&str, usize> =
        fault_marks.iter().fold(BTreeMap::new(), |mut m, (_, f)| {
            *m.entry(*f).or_default() += 1;
            m
        });
    let ok = verdict::check(&Run {
        world,
        opts,
        settings: &settings,
        samples: &samples,
        calls: &sup.calls,
        windows: &sup.windows,
        backlog: &backlog,
        broker_outage: broker_outages.iter().copied().fold(0.0, f64::max),
        outcomes: &sup.outcomes,
        faults: &faults_seen,
        kills: &sup.kills,
        unexpected: &sup.unexpected,
        failures: &sup.failures,
        dropped: drops.dropped.load(std::sync::atomic::Ordering::SeqCst),
        end,
    })
    .await?;
    Ok(ok)
}

fn drops_left(drops: &Drops) -> u32 {
    drops.left()
}

/// When the backlog's rows become the sweep's: `after` seconds past their insert, with the
/// idempotency records' safety window `keep_expired_for`.
struct Eligible {
    after: f64,
    keep_expired_for: f64,
}

/// Inserts the backlog (completed records, swept once `eligible.after` seconds have passed),
/// vacuums the table as a table that grew to it would have been, then waits for the
/// maintenance to sweep it; returns when the last of it went (seconds since `start`). The
/// backlog's `Inserted` event says when it became the sweep's, not when its insert ended: a
/// table whose retention is shortened (or whose first sweep starts) holds rows that it wrote
/// over weeks, vacuumed meanwhile, while an insert of 100 000 rows at once leaves the
/// autovacuum a table to vacuum whole, which it did during the sweep and which the check then
/// blamed on the sweep.
async fn insert_backlog(
    world: &World,
    rows: u64,
    eligible: Eligible,
    start: Instant,
    tx: &mpsc::UnboundedSender<Ev>,
) -> Result<f64, BoxError> {
    let secs = || start.elapsed().as_secs_f64();
    let from = secs();
    let client = world.pool.get().await?;
    let rows = i64::try_from(rows)?;
    // State 1 is `COMPLETED`; its retention ends so that the sweep may take it `after`
    // seconds from now.
    let inserted = client
        .execute(
            &world.sql(
                "INSERT INTO {p}_idem (tenant, operation, key, digest, state, fence, lease_until,
                     expires_at, status, body, acquired_at)
                 SELECT '', 'POST /backlog', 'backlog-' || g, '\\x00'::bytea, 1, 1, NULL,
                     now() + make_interval(secs => $2::float8 - $3::float8), 201, ''::bytea,
                     now() - interval '1 day'
                 FROM generate_series(1, $1::int8) g",
            ),
            &[&rows, &eligible.after, &eligible.keep_expired_for],
        )
        .await?;
    client
        .batch_execute(&world.sql("VACUUM (ANALYZE) {p}_idem"))
        .await?;
    let sweepable = from + eligible.after;
    let wait = sweepable - secs();
    if wait > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
    }
    let _ = tx.send(Ev::Backlog(BacklogEv::Inserted {
        from,
        to: sweepable,
        rows: inserted,
    }));
    // Whether a row of it is left: a count of the rows left, five times a second, read the
    // whole backlog's range of the key's index each time and was itself most of the load
    // that the check measured (x1.3 to x2 on the p99); one live row ends this read.
    let any_left = world.sql(
        "SELECT EXISTS (SELECT 1 FROM {p}_idem WHERE tenant = '' AND operation = 'POST /backlog')",
    );
    let left = world
        .sql("SELECT count(*) FROM {p}_idem WHERE tenant = '' AND operation = 'POST /backlog'");
    let until = Instant::now() + SWEEP_LIMIT;
    loop {
        let some: bool = client.query_one(&any_left, &[]).await?.get(0);
        if !some {
            return Ok(secs());
        }
        if Instant::now() >= until {
            let n: i64 = client.query_one(&left, &[]).await?.get(0);
            return Err(format!(
                "the backlog was not swept within {}s: {n} rows left",
                SWEEP_LIMIT.as_secs()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the outbox is empty of unpublished events and every order has its inventory
/// change; the failure says what is left.
async fn drain(sup: &mut Sup, world: &World) -> Result<Vec<Ev>, BoxError> {
    let until = Instant::now() + DRAIN_LIMIT;
    let outbox = world.outbox()?;
    let missing = world.sql(
        "SELECT count(*) FROM {p}_orders o WHERE NOT EXISTS
             (SELECT 1 FROM {p}_inventory_changes i WHERE i.order_key = o.key)",
    );
    let mut own = Vec::new();
    loop {
        let backlog = surely::outbox::OutboxStore::stats(&outbox).await?.backlog;
        let client = world.pool.get().await?;
        let left: i64 = client.query_one(&missing, &[]).await?.get(0);
        drop(client);
        if backlog == 0 && left == 0 {
            return Ok(own);
        }
        if Instant::now() >= until {
            sup.failures.push(format!(
                "not drained within {}s: {backlog} events unpublished, {left} orders without their inventory change",
                DRAIN_LIMIT.as_secs()
            ));
            return Ok(own);
        }
        own.extend(
            sup.pump(Instant::now() + Duration::from_millis(200))
                .await?,
        );
    }
}
