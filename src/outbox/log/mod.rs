//! The log relay: the outbox's rows read from PostgreSQL's write-ahead log, through a logical
//! replication slot, instead of claimed and marked in the table
//! ([`docs::boundary`](crate::docs::boundary) compares the two relays).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, Stream};
use futures_util::FutureExt as _;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use tokio::time::Instant;
use tower_service::Service;

use super::{Event, EventId, PostgresOutbox};
use crate::classify::BoxError;
use crate::record::{Recorder, RelayReport, RelayRound};
use crate::ConfigError;

mod pgoutput;
mod rows;
mod setup;

use self::pgoutput::Message;
use self::rows::{Decoded, Tables};

/// The prefix of the heartbeat's logical message (`pg_logical_emit_message`).
const HEARTBEAT_PREFIX: &str = "surely.outbox.heartbeat";

/// The longest wait between two publishes of an event the broker refuses.
const LONGEST_RETRY: Duration = Duration::from_secs(30);

/// A position in PostgreSQL's write-ahead log (an LSN), written as PostgreSQL writes it
/// (`16/B374D848`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WalPosition(u64);

impl WalPosition {
    /// The position as a number of bytes from the start of the log.
    pub fn bytes(self) -> u64 {
        self.0
    }

    fn lsn(self) -> Lsn {
        Lsn::from_u64(self.0)
    }
}

impl From<Lsn> for WalPosition {
    fn from(lsn: Lsn) -> Self {
        WalPosition(lsn.as_u64())
    }
}

impl fmt::Display for WalPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

impl std::str::FromStr for WalPosition {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Lsn::parse(s).map(WalPosition::from).map_err(|_| {
            ConfigError::new(
                "WAL position",
                "must be written as PostgreSQL writes an LSN (`16/B374D848`)",
            )
        })
    }
}

/// Where a [`LogRelay`] reads: a replication connection to the database and the logical
/// replication slot it reads from.
///
/// The connection's user needs the `REPLICATION` attribute (or is a superuser), and
/// `pg_hba.conf` must let it connect to the database (a logical replication connection names
/// its database: the lines for `all` databases cover it, the `replication` ones do not).
/// Without TLS, like [`postgres::connect`](crate::postgres::connect); a user who needs it turns
/// on pgwire-replication's `tls-rustls` feature and builds the source with
/// [`from_config`](Self::from_config).
#[derive(Clone)]
pub struct LogSource {
    config: ReplicationConfig,
}

impl LogSource {
    /// A source over a replication connection to `url` (`postgres://user:password@host:port/db`),
    /// reading the slot `slot`.
    ///
    /// # Errors
    ///
    /// The URL does not parse, names no TCP host or user, or asks for TLS
    /// (`sslmode=require`); or the slot's name is not 1 to 63
    /// lower-case letters, digits and `_` (what PostgreSQL accepts for a slot).
    pub fn new(url: &str, slot: &str) -> Result<Self, ConfigError> {
        let parsed: tokio_postgres::Config = url
            .parse()
            .map_err(|e| ConfigError::new("log source URL", format!("does not parse: {e}")))?;
        let host = parsed
            .get_hosts()
            .iter()
            .find_map(|h| match h {
                tokio_postgres::config::Host::Tcp(h) => Some(h.clone()),
                #[allow(unreachable_patterns)]
                _ => None,
            })
            .ok_or_else(|| ConfigError::new("log source URL", "must name a TCP host"))?;
        if parsed.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(ConfigError::new(
                "log source URL",
                "asks for TLS (sslmode=require): turn on pgwire-replication's `tls-rustls` \
                 feature and build the source with `LogSource::from_config`",
            ));
        }
        let port = parsed.get_ports().first().copied().unwrap_or(5432);
        let user = parsed
            .get_user()
            .ok_or_else(|| ConfigError::new("log source URL", "must name a user"))?;
        let password = match parsed.get_password() {
            Some(p) => String::from_utf8(p.to_vec())
                .map_err(|_| ConfigError::new("log source URL", "the password must be UTF-8"))?,
            None => String::new(),
        };
        let database = parsed.get_dbname().unwrap_or(user).to_owned();
        let mut config = ReplicationConfig::new(host, user, password, database, slot, "");
        config.port = port;
        Self::from_config(config)
    }

    /// A source over pgwire-replication's own settings (TLS, a Unix socket, timeouts). Its
    /// publication, start position, binary mode and status interval are the relay's: they are
    /// set when the relay is built.
    ///
    /// # Errors
    ///
    /// As for [`new`](Self::new), for the slot's name.
    pub fn from_config(config: ReplicationConfig) -> Result<Self, ConfigError> {
        setup::check_slot_name(&config.slot)?;
        Ok(LogSource { config })
    }

    /// The slot's name.
    pub fn slot(&self) -> &str {
        &self.config.slot
    }
}

impl fmt::Debug for LogSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogSource")
            .field("host", &self.config.host)
            .field("port", &self.config.port)
            .field("user", &self.config.user)
            .field("database", &self.config.database)
            .field("slot", &self.config.slot)
            .finish_non_exhaustive()
    }
}

/// A log relay could not run: PostgreSQL is not set up for it (each such error names what to
/// run), the outbox table is not what it expects, the slot is held by another relay, or the
/// database or the replication stream failed. Tell them apart with the `is_*` methods.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct LogError {
    kind: LogErrorKind,
}

#[derive(Debug, thiserror::Error)]
enum LogErrorKind {
    #[error(
        "wal_level is `{0}`, and a log relay needs `logical`: run \
         `ALTER SYSTEM SET wal_level = logical` and restart PostgreSQL"
    )]
    WalLevel(String),
    #[error(
        "no publication `{publication}` publishes the outbox table `{table}`: run the crate's \
         migrations (`surely::postgres::migrate`, or `PostgresOutbox::migrate`), or, if it was \
         dropped after them, `CREATE PUBLICATION {publication} FOR TABLE {table} \
         WITH (publish = 'insert, update')`"
    )]
    NoPublication { publication: String, table: String },
    #[error(
        "no replication slot `{0}` in this database: create it with `PostgresOutbox::create_slot` \
         (or `SELECT pg_create_logical_replication_slot('{0}', 'pgoutput')`)"
    )]
    NoSlot(String),
    #[error(
        "replication slot `{slot}` decodes with `{plugin}`, and a log relay reads `pgoutput`: \
         drop it (`PostgresOutbox::drop_slot`) and create it again with \
         `PostgresOutbox::create_slot`"
    )]
    WrongPlugin { slot: String, plugin: String },
    #[error("replication slot `{0}` is held by another connection (another relay is active)")]
    SlotInUse(String),
    #[error("the outbox table as the log describes it at {position} cannot be read: {reason}")]
    Table {
        position: WalPosition,
        reason: String,
    },
    #[error("the log relay's database failed")]
    Backend(#[source] BoxError),
    #[error("the replication stream failed")]
    Stream(#[source] BoxError),
}

impl LogError {
    fn new(kind: LogErrorKind) -> Self {
        LogError { kind }
    }

    fn backend(e: impl Into<BoxError>) -> Self {
        LogError::new(LogErrorKind::Backend(e.into()))
    }

    fn stream(e: impl Into<BoxError>) -> Self {
        LogError::new(LogErrorKind::Stream(e.into()))
    }

    /// Whether PostgreSQL is not set up for a log relay: `wal_level` below `logical`, the
    /// publication or the slot missing, a slot of another plugin. The message names what to
    /// run; the relay does not start until it is done.
    pub fn is_setup(&self) -> bool {
        matches!(
            self.kind,
            LogErrorKind::WalLevel(_)
                | LogErrorKind::NoPublication { .. }
                | LogErrorKind::NoSlot(_)
                | LogErrorKind::WrongPlugin { .. }
        )
    }

    /// Whether `wal_level` is below `logical`.
    pub fn is_wal_level(&self) -> bool {
        matches!(self.kind, LogErrorKind::WalLevel(_))
    }

    /// Whether the outbox table has no publication.
    pub fn is_no_publication(&self) -> bool {
        matches!(self.kind, LogErrorKind::NoPublication { .. })
    }

    /// Whether the slot does not exist.
    pub fn is_no_slot(&self) -> bool {
        matches!(self.kind, LogErrorKind::NoSlot(_))
    }

    /// Whether the slot is held by another connection: another relay is active on it.
    pub fn is_slot_in_use(&self) -> bool {
        matches!(self.kind, LogErrorKind::SlotInUse(_))
    }

    /// Whether the outbox table, as the log describes it, lacks a column the relay reads (a
    /// column renamed or dropped by hand): no row of it can be read until it is put back.
    pub fn is_table(&self) -> bool {
        matches!(self.kind, LogErrorKind::Table { .. })
    }

    /// Whether the database or the replication stream failed (the relay connects again).
    pub fn is_transient(&self) -> bool {
        matches!(
            self.kind,
            LogErrorKind::Backend(_) | LogErrorKind::Stream(_) | LogErrorKind::SlotInUse(_)
        )
    }
}

/// Publishes an outbox's events as PostgreSQL's write-ahead log carries them: each committed
/// row of the outbox table, in commit order, through a `tower::Service<Event>` (the broker),
/// at least once. Nothing is written to the table to claim or to mark an event.
///
/// The relay reads a logical replication slot with the `pgoutput` plugin, through the
/// publication that the crate's migrations create on the outbox table. It publishes each
/// event as its row arrives, up to [`max_in_flight`](LogRelayBuilder::max_in_flight) at once
/// and in the order of the log, and moves the slot's confirmed position past a transaction
/// only once the broker acknowledged every event up to it: a relay killed anywhere starts
/// again from there, and publishes again (with the same ids) what it had not confirmed.
///
/// * **One relay per slot.** PostgreSQL lets one connection read a slot at a time: a second
///   relay on the same slot stands by, and takes over when the first one's connection ends.
/// * **An idle outbox does not hold the log.** A [heartbeat](LogRelayBuilder::heartbeat)
///   writes a logical message into the log while the relay waits, and the relay confirms past
///   it: a slot whose outbox is idle while other tables write keeps no more WAL than a
///   heartbeat's worth.
/// * **A row that is not an event** (a column changed by hand, a payload over
///   [`max_payload`](LogRelayBuilder::max_payload)) is quarantined in the table, with its
///   position and the reason, and the relay goes on; an operator requeues or discards it as
///   any quarantined event. A requeued event is published again from the log (the requeue is
///   an update the publication carries).
/// * **A broker that refuses** holds the position: nothing is confirmed past an event that
///   is not acknowledged, no new event is sent, and the refused ones go again after a wait
///   that doubles from [`retry_after`](LogRelayBuilder::retry_after) to 30 s. An event that
///   fails [`quarantine_after`](LogRelayBuilder::quarantine_after) times in a row is
///   quarantined, so that one event cannot stop the outbox.
/// * **Events enqueued before the slot existed** are published from the table once, when
///   the relay first reads a new slot, before any event of the log.
///
/// ```no_run
/// # async fn run(outbox: surely::outbox::PostgresOutbox,
/// #     broker: impl tower::Service<surely::outbox::Event, Error = std::io::Error, Future = impl Send + 'static> + Send)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use surely::outbox::{LogRelay, LogSource};
///
/// let url = "postgres://postgres@127.0.0.1:5432/test";
/// outbox.create_slot("orders_relay").await?; // once, at set-up
/// let source = LogSource::new(url, "orders_relay")?;
/// let relay = LogRelay::builder(outbox, source, broker).build()?;
/// relay.run(std::future::pending()).await?;
/// # Ok(()) }
/// ```
pub struct LogRelay<P> {
    outbox: PostgresOutbox,
    source: LogSource,
    publisher: P,
    config: Config,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

#[derive(Clone, Copy, Debug)]
struct Config {
    max_in_flight: usize,
    heartbeat: Duration,
    retry_after: Duration,
    quarantine_after: u32,
    max_payload: usize,
    standby: Duration,
    /// Above which lag (bytes of log kept, time since the relay last confirmed) it warns.
    warn_lag: (u64, Duration),
    /// How long the server may say nothing before the relay stops publishing (`None`: three
    /// heartbeats, at least 30 s).
    fence: Option<Duration>,
    retention: Option<Duration>,
}

/// Builds a [`LogRelay`]; made by [`LogRelay::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct LogRelayBuilder<P> {
    relay: LogRelay<P>,
}

impl<P> LogRelay<P> {
    /// Its settings, for a [review](crate::review) of the service: the relay that reads the
    /// write-ahead log.
    pub fn describe(&self) -> crate::review::OutboxSettings {
        crate::review::OutboxSettings {
            relay: crate::review::RelayKind::Log,
        }
    }

    /// A builder of a relay that reads `source`'s slot for the rows of `outbox`'s table and
    /// publishes them through `publisher`. Defaults: 500 events in flight, a heartbeat every
    /// 10 s, a refused event sent again after 1 s (doubling to 30 s) and quarantined after 10
    /// refusals, payloads up to 1 MiB, a standby that looks at the slot every 5 s, events
    /// swept 24 hours after the relay confirmed them.
    pub fn builder(outbox: PostgresOutbox, source: LogSource, publisher: P) -> LogRelayBuilder<P> {
        LogRelayBuilder {
            relay: LogRelay {
                outbox,
                source,
                publisher,
                config: Config {
                    max_in_flight: 500,
                    heartbeat: Duration::from_secs(10),
                    retry_after: Duration::from_secs(1),
                    quarantine_after: 10,
                    max_payload: 1 << 20,
                    standby: Duration::from_secs(5),
                    fence: None,
                    warn_lag: (1 << 30, Duration::from_secs(300)),
                    retention: Some(Duration::from_secs(24 * 3600)),
                },
                recorder: None,
            },
        }
    }

    /// The outbox.
    pub fn outbox(&self) -> &PostgresOutbox {
        &self.outbox
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }
}

impl<P> LogRelayBuilder<P> {
    /// How many events may wait for the broker's acknowledgement at once (default 500): the
    /// relay sends the next one without waiting for the last. 1 sends one at a time. At least
    /// 1 and at most 65 536.
    pub fn max_in_flight(mut self, events: usize) -> Self {
        self.relay.config.max_in_flight = events;
        self
    }

    /// How often the idle relay writes a heartbeat into the log and confirms past it, records
    /// how far the table's events are published (what the sweep reads), sweeps, and reports
    /// (default 10 s; at least 10 ms).
    pub fn heartbeat(mut self, interval: Duration) -> Self {
        self.relay.config.heartbeat = interval;
        self
    }

    /// The first wait before an event the broker refused goes again (default 1 s); it
    /// doubles at each refusal, to 30 s.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.relay.config.retry_after = wait;
        self
    }

    /// After how many refusals in a row an event is quarantined (default 10; at least 1).
    pub fn quarantine_after(mut self, refusals: u32) -> Self {
        self.relay.config.quarantine_after = refusals;
        self
    }

    /// The largest payload published (default 1 MiB): a row with a larger one is
    /// quarantined.
    pub fn max_payload(mut self, bytes: usize) -> Self {
        self.relay.config.max_payload = bytes;
        self
    }

    /// How often a relay whose slot another relay holds looks again (default 5 s; the first
    /// look comes after 100 ms, and the waits double up to this).
    pub fn standby(mut self, interval: Duration) -> Self {
        self.relay.config.standby = interval;
        self
    }

    /// How long the stream may bring nothing before the relay stops publishing, lets the slot
    /// go and connects again (default three heartbeats, at least 30 s; at least twice the
    /// [heartbeat](Self::heartbeat), whose message comes back through the stream while all is
    /// well). Keep it below the server's `wal_sender_timeout` (60 s by default), after which
    /// PostgreSQL lets a standby take the slot of a relay it no longer hears: a relay cut off
    /// from the database has then stopped publishing before another one starts, and events
    /// do not go out from two relays at once.
    pub fn fence_after(mut self, silence: Duration) -> Self {
        self.relay.config.fence = Some(silence);
        self
    }

    /// Above which lag the relay warns, at each heartbeat: when the server keeps more than
    /// `bytes` of write-ahead log for the slot, or the relay last recorded a confirmation more
    /// than `age` ago (defaults: 1 GiB, 5 minutes). The lag is in the outbox's
    /// [stats](crate::record::OutboxStats::log_lag_bytes) too, for the OpenTelemetry gauges, the
    /// admin's overview and `surely outbox stats`.
    pub fn warn_lag(mut self, bytes: u64, age: Duration) -> Self {
        self.relay.config.warn_lag = (bytes, age);
        self
    }

    /// How long events are kept in the table after the relay confirmed them (default 24
    /// hours): swept after that, every sixth heartbeat (once a minute by default). Durations count up to
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.relay.config.retention = Some(retention);
        self
    }

    /// The relay sweeps nothing: an [`OutboxSweeper`](super::OutboxSweeper) does, or nothing.
    pub fn no_sweep(mut self) -> Self {
        self.relay.config.retention = None;
        self
    }

    /// Reports each batch the relay confirmed, as a [`RelayRound`], to `recorder`.
    pub fn recorder(mut self, recorder: impl Recorder + Send + Sync + 'static) -> Self {
        self.relay.recorder = Some(Arc::new(recorder));
        self
    }

    /// The relay.
    ///
    /// # Errors
    ///
    /// A setting out of its range, named.
    pub fn build(self) -> Result<LogRelay<P>, ConfigError> {
        let c = &self.relay.config;
        if !(1..=65_536).contains(&c.max_in_flight) {
            return Err(ConfigError::new(
                "log relay max_in_flight",
                "must be 1 to 65536",
            ));
        }
        if c.heartbeat < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "log relay heartbeat",
                "must be at least 10 ms",
            ));
        }
        if c.fence.is_some_and(|f| f < c.heartbeat.saturating_mul(2)) {
            return Err(ConfigError::new(
                "log relay fence_after",
                "must be at least twice the heartbeat",
            ));
        }
        if c.quarantine_after == 0 {
            return Err(ConfigError::new(
                "log relay quarantine_after",
                "must be at least 1",
            ));
        }
        let mut relay = self.relay;
        let c = &mut relay.config;
        c.heartbeat = c.heartbeat.min(crate::MAX_DURATION);
        c.retry_after = c.retry_after.min(LONGEST_RETRY);
        c.standby = c.standby.min(crate::MAX_DURATION);
        let three_beats = c.heartbeat.saturating_mul(3).max(Duration::from_secs(30));
        c.fence = Some(c.fence.unwrap_or(three_beats).min(crate::MAX_DURATION));
        c.retention = c.retention.map(|r| r.min(crate::MAX_DURATION));
        let rc = &mut relay.source.config;
        rc.publication = super::postgres::publication(relay.outbox.table()).into();
        rc.start_lsn = Lsn::ZERO;
        rc.binary = true;
        // The slot's confirmed position follows the broker's acknowledgements within 100 ms.
        rc.status_interval = Duration::from_millis(100);
        rc.idle_wakeup_interval = Duration::from_secs(1);
        if rc.application_name.is_none() {
            rc.application_name = Some(format!("surely log relay {}", rc.slot));
        }
        Ok(relay)
    }
}

/// The slots of a [`LogRelay`] (feature `postgres-log`).
impl PostgresOutbox {
    /// Creates the logical replication slot `slot` (plugin `pgoutput`) on this outbox's database,
    /// through its pool (whose user then needs the `REPLICATION` attribute), and records where
    /// it starts: the events committed before it are published from the table when a relay
    /// first reads it. Returns the slot's first position. Made again after
    /// [`drop_slot`](Self::drop_slot), it resumes from the table: the events the old slot
    /// had not confirmed go out again (duplicates that the broker's window or the consumer's
    /// inbox absorbs), none is lost.
    ///
    /// A slot keeps the write-ahead log from its confirmed position on the primary until a
    /// relay reads it: create it when a relay is about to run, and drop it when none will.
    ///
    /// # Errors
    ///
    /// A slot of this name exists, the name is not one PostgreSQL takes, `wal_level` is below
    /// `logical`, or the user may not create slots.
    pub async fn create_slot(&self, slot: &str) -> Result<WalPosition, LogError> {
        setup::create(self, slot).await
    }

    /// Drops the slot `slot` (its record in the outbox's `_slots` table is kept, for a slot
    /// made again under the name). Returns whether there was one.
    ///
    /// # Errors
    ///
    /// The slot is being read (stop its relay first), or the database failed.
    pub async fn drop_slot(&self, slot: &str) -> Result<bool, LogError> {
        setup::drop(self, slot).await
    }
}

impl<P> fmt::Debug for LogRelay<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogRelay")
            .field("outbox", &self.outbox)
            .field("source", &self.source)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<P> fmt::Debug for LogRelayBuilder<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogRelayBuilder")
            .field("relay", &self.relay)
            .finish()
    }
}

/// How a session ended.
enum Ended {
    Stopped,
}

impl<P> LogRelay<P>
where
    P: Service<Event> + Send,
    P::Error: Into<BoxError>,
    P::Future: Send + 'static,
{
    /// Runs until `stop` completes (then returns `Ok`), connecting again after the stream or
    /// the database failed, and standing by while another relay holds the slot.
    ///
    /// # Errors
    ///
    /// PostgreSQL is not set up for a log relay ([`LogError::is_setup`]), or the outbox
    /// table lacks a column it reads ([`LogError::is_table`]): the relay stops, as no wait
    /// would mend either.
    pub async fn run(mut self, stop: impl Future<Output = ()>) -> Result<(), LogError> {
        let mut stop = std::pin::pin!(stop);
        let mut wait = self.config.retry_after;
        // A slot is held for a moment after its relay stopped (its walsender ends): a standby
        // looks again after 100 ms, then less often, up to its interval.
        let first_look = Duration::from_millis(100).min(self.config.standby);
        let mut look = first_look;
        loop {
            let started = Instant::now();
            let ended = self.session(stop.as_mut()).await;
            if !matches!(&ended, Err(e) if e.is_slot_in_use()) {
                look = first_look;
            }
            let pause = match ended {
                Ok(Ended::Stopped) => return Ok(()),
                Err(e) if e.is_slot_in_use() => {
                    tracing::debug!(slot = %self.source.slot(), "log relay standing by: another relay holds the slot");
                    let w = look;
                    look = look.saturating_mul(2).min(self.config.standby);
                    w
                }
                Err(e) if e.is_transient() => {
                    tracing::warn!(error = &e as &dyn std::error::Error, slot = %self.source.slot(), "log relay lost its stream; connecting again");
                    // A session that ran a while starts the waits over.
                    if started.elapsed() > LONGEST_RETRY {
                        wait = self.config.retry_after;
                    }
                    let w = wait;
                    wait = wait.saturating_mul(2).min(LONGEST_RETRY);
                    w
                }
                Err(e) => return Err(e),
            };
            tokio::select! {
                biased;
                () = stop.as_mut() => return Ok(()),
                () = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Checks that PostgreSQL is set up for this relay: `wal_level`, the publication, the
    /// slot. [`run`](Self::run) checks the same at each connection.
    ///
    /// # Errors
    ///
    /// What is missing, with what to run ([`LogError::is_setup`]); or the database failed.
    pub async fn check(&self) -> Result<(), LogError> {
        setup::check(&self.outbox, self.source.slot())
            .await
            .map(drop)
    }

    async fn session(
        &mut self,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Ended, LogError> {
        // Not `self.check()`: that would hold `&self`, and the relay's future would need a
        // publisher that is `Sync`.
        let slot = self.source.slot();
        let fence = self.config.fence;
        let connect = async {
            let timeout = setup::check(&self.outbox, slot).await?;
            if let (Some(timeout), Some(fence)) = (timeout, fence)
                && fence >= timeout
            {
                tracing::warn!(
                    slot, ?fence, wal_sender_timeout = ?timeout,
                    "log relay's fence_after is not below the server's wal_sender_timeout: \
                     a standby may take the slot before a relay cut off from the database \
                     stops publishing"
                );
            }
            let mut client = ReplicationClient::connect_gated(self.source.config.clone())
                .await
                .map_err(LogError::stream)?;
            client.start().await.map_err(LogError::stream)?;
            match client.wait_started().await {
                Ok(()) => Ok(client),
                Err(e) => Err(setup::started_error(slot, e)),
            }
        };
        // A connection that hangs (a server that does not answer) does not keep the relay
        // from stopping.
        let mut client = tokio::select! {
            biased;
            () = stop.as_mut() => return Ok(Ended::Stopped),
            client = connect => client?,
        };
        let slot = setup::slot_row(&self.outbox, self.source.slot()).await?;
        tracing::info!(slot = %self.source.slot(), table = %self.outbox.table(), "log relay reading its slot");
        let mut pipeline = Pipeline::new(self);
        if !slot.caught_up
            && let Some(ended) = pipeline.catch_up(stop.as_mut()).await?
        {
            return Ok(ended);
        }
        let ended = pipeline.stream(&mut client, stop).await;
        // The last confirmed position is sent before the stream ends (the client sends it
        // within its status interval), so that the next relay does not publish again what this
        // one had confirmed; bounded, for a stream that is gone.
        let confirmed = pipeline.confirmed.lsn();
        let deadline = Instant::now() + Duration::from_millis(1500);
        while client.metrics().last_applied_lsn() < confirmed
            && client.is_running()
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The stream is ended (bounded) before the relay returns, so that the slot is free for
        // the next relay as soon as the server has seen the end.
        let _ = tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await;
        ended
    }
}

/// An event on its way to the broker.
struct Publishing {
    id: EventId,
    /// The event, until it is handed to the publisher: one that went out and was refused is
    /// read again from the table (where it is pending) to go out again, so that the one
    /// publish of the usual case costs no copy.
    event: Option<Event>,
    /// Where the log had it (or, from the table, where the log stood).
    position: WalPosition,
    /// The claim to mark it published with, once acknowledged: an event read from the table
    /// (before the slot, or requeued), whose row says it is pending.
    mark: Option<i64>,
    /// Its row's place in the order enqueued, for an event of the log.
    seq: Option<i64>,
    refusals: u32,
    state: Sending,
}

enum Sending {
    /// Its publish is among the pipeline's futures.
    Sent,
    Acked,
    Refused(String),
    /// Refused, waiting to go again.
    Waiting,
}

enum Entry {
    Publish(Box<Publishing>),
    /// The log's position up to which everything before it is accounted for.
    Confirm(WalPosition),
}

/// The events between the log and the broker, in the log's order.
struct Pipeline<'a, P: Service<Event>> {
    outbox: &'a PostgresOutbox,
    slot: &'a str,
    publisher: &'a mut P,
    config: Config,
    recorder: Option<&'a (dyn Recorder + Send + Sync)>,
    entries: VecDeque<Entry>,
    /// The number of the entry in front: each entry is numbered in the order it came.
    base: u64,
    /// The publishes sent and not answered, each with its entry's number: polled when woken,
    /// a new one first, in the order sent.
    inflight: FuturesUnordered<Tagged<P::Future>>,
    /// Entries whose publish is sent and not answered.
    sent: usize,
    /// Entries refused and not yet sent again.
    refused: usize,
    /// When the refused ones go again.
    retry_at: Option<Instant>,
    /// Acknowledged events read from the table, to be marked published.
    marks: Vec<(EventId, i64)>,
    confirmed: WalPosition,
    /// The highest place in the order enqueued of an event published with every one before it
    /// in the log.
    published_seq: Option<i64>,
    /// When the relay last swept.
    last_sweep: Option<Instant>,
    /// What the last batch did, reported at the next confirm.
    round: RelayRound,
    tables: Tables,
}

impl<'a, P> Pipeline<'a, P>
where
    P: Service<Event> + Send,
    P::Error: Into<BoxError>,
    P::Future: Send + 'static,
{
    fn new(relay: &'a mut LogRelay<P>) -> Self {
        Pipeline {
            outbox: &relay.outbox,
            slot: &relay.source.config.slot,
            publisher: &mut relay.publisher,
            config: relay.config,
            recorder: relay.recorder.as_deref(),
            entries: VecDeque::new(),
            base: 0,
            inflight: FuturesUnordered::new(),
            sent: 0,
            refused: 0,
            retry_at: None,
            marks: Vec::new(),
            confirmed: WalPosition::default(),
            published_seq: None,
            last_sweep: None,
            round: RelayRound::default(),
            tables: Tables::default(),
        }
    }

    /// Publishes the events enqueued before the slot existed (and those requeued before), in
    /// the order enqueued, from the table; marks them published; records that it is done.
    async fn catch_up(
        &mut self,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Ended>, LogError> {
        let mut after = i64::MIN;
        loop {
            let rows = setup::before_slot(self.outbox, self.slot, after, self.config.max_in_flight)
                .await?;
            let Some(last) = rows.last().map(|r| r.0) else {
                setup::caught_up(self.outbox, self.slot).await?;
                tracing::info!(slot = %self.slot, "log relay published the events enqueued before its slot");
                return Ok(None);
            };
            after = last;
            for (_, event, claim) in rows {
                if let Some(ended) = self
                    .send(
                        event,
                        WalPosition::default(),
                        Some(claim),
                        None,
                        stop.as_mut(),
                    )
                    .await?
                {
                    return Ok(Some(ended));
                }
            }
            while !self.entries.is_empty() {
                if let Some(ended) = self.drive(stop.as_mut()).await? {
                    return Ok(Some(ended));
                }
            }
        }
    }

    /// Reads the log until `stop`, or until the stream fails.
    async fn stream(
        &mut self,
        client: &mut ReplicationClient,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Ended, LogError> {
        let mut in_transaction = false;
        let mut heartbeat = tokio::time::interval(self.config.heartbeat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut watermark: Option<setup::Watermark> = None;
        let mut told = self.confirmed;
        let fence = self.config.fence.unwrap_or(LONGEST_RETRY);
        // When the server was last heard from; the fence's timer is moved only when it goes
        // off early, not at each message.
        let mut heard = Instant::now();
        let fenced = tokio::time::sleep(fence);
        tokio::pin!(fenced);
        loop {
            self.settle().await?;
            if self.confirmed > told {
                told = self.confirmed;
                client.update_applied_lsn(told.lsn());
            }
            if !self.open() {
                // Not reading: the server's silence says nothing.
                heard = Instant::now();
            }
            let open = self.open();
            let retry_at = self.retry_at;
            let sent = self.sent;
            tokio::select! {
                biased;
                () = stop.as_mut() => return Ok(Ended::Stopped),
                () = &mut fenced => {
                    let due = heard + fence;
                    if open && Instant::now() >= due {
                        return Err(LogError::stream(format!(
                            "nothing from the server for {fence:?} while the heartbeat writes \
                             into the log every {:?}: the relay stops publishing and reads the \
                             slot again",
                            self.config.heartbeat
                        )));
                    }
                    fenced.as_mut().reset(due.max(Instant::now() + Duration::from_millis(1)));
                }
                () = std::future::poll_fn(|cx| self.poll_sent(cx)), if sent > 0 => {}
                () = sleep_until(retry_at), if retry_at.is_some() => {
                    if let Some(ended) = self.resend(stop.as_mut()).await? {
                        return Ok(ended);
                    }
                }
                _ = heartbeat.tick() => self.beat(&mut watermark).await,
                event = client.recv(), if open => {
                    let mut event = event
                        .map_err(LogError::stream)?
                        .ok_or_else(|| LogError::stream("the replication stream ended"))?;
                    heard = Instant::now();
                    // What the client holds already is taken at once, as far as the window
                    // allows: one turn of the loop for many messages.
                    loop {
                        if let Some(ended) =
                            self.message(event, &mut in_transaction, stop.as_mut()).await?
                        {
                            return Ok(ended);
                        }
                        if !self.open() {
                            break;
                        }
                        match client.recv().now_or_never() {
                            Some(next) => {
                                event = next
                                    .map_err(LogError::stream)?
                                    .ok_or_else(|| LogError::stream("the replication stream ended"))?;
                            }
                            None => break,
                        }
                    }
                }
            }
        }
    }

    /// Whether the relay reads the log: nothing refused waits, and the window has room.
    fn open(&self) -> bool {
        self.refused == 0 && self.sent < self.config.max_in_flight
    }

    /// One message of the stream.
    async fn message(
        &mut self,
        event: ReplicationEvent,
        in_transaction: &mut bool,
        stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Ended>, LogError> {
        match event {
            ReplicationEvent::Begin { .. } => *in_transaction = true,
            ReplicationEvent::Commit { end_lsn, .. } => {
                *in_transaction = false;
                self.confirm_at(end_lsn.into());
            }
            ReplicationEvent::XLogData {
                wal_start, data, ..
            } => return self.row(wal_start.into(), &data, stop).await,
            // Everything the server sent before a keepalive or a message outside a
            // transaction is in the pipeline ahead of it.
            ReplicationEvent::KeepAlive { wal_end: at, .. }
            | ReplicationEvent::Message { lsn: at, .. } => {
                if !*in_transaction {
                    self.confirm_at(at.into());
                }
            }
            ReplicationEvent::StoppedAt { .. } => {
                return Err(LogError::stream("the replication stream stopped"))
            }
        }
        Ok(None)
    }

    /// A message of the log that carries a row.
    async fn row(
        &mut self,
        position: WalPosition,
        data: &bytes::Bytes,
        stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Ended>, LogError> {
        let message = pgoutput::decode(data).map_err(|e| {
            LogError::new(LogErrorKind::Table {
                position,
                reason: e.to_string(),
            })
        })?;
        let table_error = |reason: String| LogError::new(LogErrorKind::Table { position, reason });
        let (relation, values, update) = match message {
            Message::Relation(r) => {
                self.tables.learn(&r).map_err(table_error)?;
                return Ok(None);
            }
            Message::Insert { relation, values } => (relation, values, false),
            Message::Update { relation, values } => (relation, values, true),
            Message::Other(_) => return Ok(None),
        };
        let layout = self
            .tables
            .get(relation)
            .ok_or_else(|| table_error("a row of a table the log did not describe".to_owned()))?;
        match rows::decode(layout, &values, data, self.config.max_payload).map_err(table_error)? {
            Decoded::Event { event, claim, seq } => {
                // An update publishes a requeued event: it is marked published once sent.
                let mark = update.then_some(claim);
                self.send(event, position, mark, Some(seq), stop).await
            }
            Decoded::Unchanged { id } => {
                // A requeued event whose payload the log left out (TOASTed, unchanged): read
                // from the table.
                match setup::pending_event(self.outbox, &id).await? {
                    Some((event, claim)) => {
                        self.send(event, position, Some(claim), None, stop).await
                    }
                    None => Ok(None),
                }
            }
            Decoded::Skip => Ok(None),
            Decoded::Bad { id, reason } => {
                let reason = format!("log relay at {position}: {reason}");
                tracing::warn!(event = %id, %reason, "outbox event quarantined");
                setup::quarantine(self.outbox, &id, &reason).await?;
                self.round.quarantined = self.round.quarantined.saturating_add(1);
                Ok(None)
            }
        }
    }

    /// Waits for the publisher to be ready (driving what is sent meanwhile), and sends
    /// `event` (`seq`: its row's place in the order enqueued, for an event of the log).
    async fn send(
        &mut self,
        event: Event,
        position: WalPosition,
        mark: Option<i64>,
        seq: Option<i64>,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Ended>, LogError> {
        let ready = tokio::select! {
            biased;
            () = stop.as_mut() => return Ok(Some(Ended::Stopped)),
            ready = std::future::poll_fn(|cx| {
                let _ = self.poll_sent(cx);
                self.publisher.poll_ready(cx)
            }) => ready,
        };
        let number = self.base + self.entries.len() as u64;
        let id = event.id().clone();
        let (state, event) = match ready {
            Ok(()) => {
                self.sent += 1;
                self.inflight.push(Tagged {
                    seq: number,
                    inner: self.publisher.call(event),
                });
                (Sending::Sent, None)
            }
            Err(e) => {
                self.refused += 1;
                (Sending::Refused(with_sources(&*e.into())), Some(event))
            }
        };
        self.round.claimed = self.round.claimed.saturating_add(1);
        self.entries.push_back(Entry::Publish(Box::new(Publishing {
            id,
            event,
            position,
            mark,
            seq,
            refusals: 0,
            state,
        })));
        Ok(None)
    }

    /// Drives the sent publishes: ready once one answered.
    fn poll_sent(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut answered = false;
        while let Poll::Ready(Some((seq, out))) = Pin::new(&mut self.inflight).poll_next(cx) {
            self.sent -= 1;
            answered = true;
            let at = usize::try_from(seq.wrapping_sub(self.base)).unwrap_or(usize::MAX);
            let Some(Entry::Publish(p)) = self.entries.get_mut(at) else {
                continue;
            };
            p.state = match out {
                Ok(()) => Sending::Acked,
                Err(error) => {
                    self.refused += 1;
                    Sending::Refused(error)
                }
            };
        }
        if answered {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Takes the front entry off.
    fn pop(&mut self) {
        if self.entries.pop_front().is_some() {
            self.base += 1;
        }
    }

    /// The log is accounted for up to `position` once everything before it is.
    fn confirm_at(&mut self, position: WalPosition) {
        if let Some(Entry::Confirm(last)) = self.entries.back_mut() {
            *last = (*last).max(position);
        } else {
            self.entries.push_back(Entry::Confirm(position));
        }
    }

    /// Takes the answered entries off the front, in order: confirms the log's positions,
    /// marks the events read from the table, quarantines an event refused too often, and
    /// schedules the refused ones to go again.
    async fn settle(&mut self) -> Result<(), LogError> {
        let mut confirm = None;
        while let Some(front) = self.entries.front_mut() {
            match front {
                Entry::Confirm(p) => {
                    confirm = Some(*p);
                    self.pop();
                }
                Entry::Publish(p) => match &p.state {
                    Sending::Acked => {
                        self.round.published = self.round.published.saturating_add(1);
                        if let Some(claim) = p.mark {
                            self.marks.push((p.id.clone(), claim));
                        }
                        if let Some(seq) = p.seq {
                            self.published_seq = self.published_seq.max(Some(seq));
                        }
                        self.pop();
                    }
                    Sending::Refused(error) => {
                        p.refusals = p.refusals.saturating_add(1);
                        self.round.failed = self.round.failed.saturating_add(1);
                        tracing::info!(event = %p.id, refusals = p.refusals, %error, "outbox publish failed");
                        if p.refusals >= self.config.quarantine_after {
                            let reason = format!("log relay at {}: {error}", p.position);
                            tracing::warn!(event = %p.id, %reason, "outbox event quarantined");
                            let id = p.id.clone();
                            self.refused -= 1;
                            self.pop();
                            setup::quarantine(self.outbox, id.as_str(), &reason).await?;
                            self.round.quarantined = self.round.quarantined.saturating_add(1);
                        } else {
                            let doublings = p.refusals.saturating_sub(1).min(16);
                            let wait = self
                                .config
                                .retry_after
                                .saturating_mul(1 << doublings)
                                .min(LONGEST_RETRY);
                            p.state = Sending::Waiting;
                            self.retry_at = Some(Instant::now() + wait);
                            break;
                        }
                    }
                    Sending::Sent | Sending::Waiting => break,
                },
            }
        }
        if !self.marks.is_empty() && (self.marks.len() >= 100 || self.entries.is_empty()) {
            let marks = std::mem::take(&mut self.marks);
            setup::mark_published(self.outbox, &marks).await?;
        }
        if let Some(position) = confirm {
            self.confirmed = self.confirmed.max(position);
            self.report();
        }
        Ok(())
    }

    /// Sends the refused events again, in order.
    async fn resend(
        &mut self,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Ended>, LogError> {
        self.retry_at = None;
        for i in 0..self.entries.len() {
            let refused = matches!(&self.entries[i], Entry::Publish(p) if matches!(p.state, Sending::Refused(_) | Sending::Waiting));
            if !refused {
                continue;
            }
            let ready = tokio::select! {
                biased;
                () = stop.as_mut() => return Ok(Some(Ended::Stopped)),
                ready = std::future::poll_fn(|cx| {
                    let _ = self.poll_sent(cx);
                    self.publisher.poll_ready(cx)
                }) => ready,
            };
            let number = self.base + i as u64;
            // The publisher's error is not kept across the wait below (it need not be `Send`).
            if let Err(error) = ready.map_err(|e| with_sources(&*e.into())) {
                if let Entry::Publish(p) = &mut self.entries[i] {
                    p.state = Sending::Refused(error);
                }
                break;
            }
            let Entry::Publish(p) = &mut self.entries[i] else {
                continue;
            };
            let event = match p.event.take() {
                Some(event) => Some(event),
                None => setup::pending_event(self.outbox, &p.id)
                    .await?
                    .map(|(e, _)| e),
            };
            let Entry::Publish(p) = &mut self.entries[i] else {
                continue;
            };
            self.refused -= 1;
            match event {
                Some(event) => {
                    self.sent += 1;
                    self.inflight.push(Tagged {
                        seq: number,
                        inner: self.publisher.call(event),
                    });
                    p.state = Sending::Sent;
                }
                // No longer pending (a person discarded or quarantined it meanwhile): nothing
                // to publish.
                None => p.state = Sending::Acked,
            }
        }
        Ok(None)
    }

    /// Drives the pipeline once without a stream (the catch-up): a publish answered, or the
    /// refused ones sent again; then settles what it can.
    async fn drive(
        &mut self,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Ended>, LogError> {
        let retry_at = self.retry_at;
        let sent = self.sent;
        tokio::select! {
            biased;
            () = stop.as_mut() => return Ok(Some(Ended::Stopped)),
            () = std::future::poll_fn(|cx| self.poll_sent(cx)), if sent > 0 => {}
            () = sleep_until(retry_at), if retry_at.is_some() => {
                if let Some(ended) = self.resend(stop.as_mut()).await? {
                    return Ok(Some(ended));
                }
            }
        }
        self.settle().await?;
        Ok(None)
    }

    /// The heartbeat: a message into the log (confirmed when it comes back, if nothing is
    /// waiting before it), the table's published mark, the sweep, the stats and the report.
    async fn beat(&mut self, watermark: &mut Option<setup::Watermark>) {
        // The table's events are published below the mark once the log is confirmed past
        // where the mark was taken.
        if let Some(w) = watermark.take_if(|w| w.position <= self.confirmed) {
            let recorded = setup::published_below(
                self.outbox,
                self.slot,
                &w,
                self.confirmed,
                self.published_seq,
            )
            .await;
            if let Err(e) = recorded {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "log relay could not record its progress"
                );
            }
        }
        match setup::heartbeat(self.outbox).await {
            Ok(w) => {
                watermark.get_or_insert(w);
            }
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "log relay heartbeat failed"
                )
            }
        }
        // The sweep every sixth heartbeat, and at most as often as the polling relay's (once a
        // minute): it deletes in batches while the stream waits.
        let every = self
            .config
            .heartbeat
            .saturating_mul(6)
            .min(super::relay::SWEEP_EVERY);
        let sweep_due = self.last_sweep.is_none_or(|at| at.elapsed() >= every);
        if let (Some(retention), true) = (self.config.retention, sweep_due) {
            self.last_sweep = Some(Instant::now());
            match setup::sweep(self.outbox, retention).await {
                Ok(n) => self.round.swept = self.round.swept.saturating_add(n),
                Err(e) => {
                    tracing::warn!(error = &e as &dyn std::error::Error, "outbox sweep failed")
                }
            }
        }
        let stats = match super::OutboxStore::stats(self.outbox).await {
            Ok(stats) => Some(stats),
            Err(e) => {
                tracing::warn!(
                    error = &e as &dyn std::error::Error,
                    "outbox stats could not be read"
                );
                None
            }
        };
        if let Some(stats) = stats {
            let (bytes, age) = (
                stats.log_lag_bytes.unwrap_or(0),
                stats.log_lag.unwrap_or_default(),
            );
            let (most_bytes, most_age) = self.config.warn_lag;
            if bytes > most_bytes || age > most_age {
                tracing::warn!(
                    slot = %self.slot,
                    lag_bytes = bytes,
                    lag_secs = age.as_secs(),
                    warn_bytes = most_bytes,
                    warn_secs = most_age.as_secs(),
                    "a log relay's slot is behind: the server keeps the write-ahead log from its \
                     confirmed position, and a slot that stays behind fills the disk"
                );
            }
        }
        let round = std::mem::take(&mut self.round);
        if let Some(recorder) = self.recorder {
            let round = (round != RelayRound::default()).then_some(round);
            if round.is_some() || stats.is_some() {
                recorder.record_relay(&RelayReport { round, stats });
            }
        }
    }

    fn report(&mut self) {
        let round = std::mem::take(&mut self.round);
        if let Some(recorder) = self.recorder
            && round != RelayRound::default()
        {
            recorder.record_relay(&RelayReport {
                round: Some(round),
                stats: None,
            });
        }
    }
}

pin_project_lite::pin_project! {
    /// A publish, answering with its entry's number and, on failure, its error and sources.
    struct Tagged<F> {
        seq: u64,
        #[pin]
        inner: F,
    }
}

impl<F, T, E> Future for Tagged<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = (u64, Result<(), String>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        this.inner.poll(cx).map(|out| {
            (
                *this.seq,
                out.map(drop).map_err(|e| with_sources(&*e.into())),
            )
        })
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

use super::relay::with_sources;
