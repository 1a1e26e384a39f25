//! The Redis store.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};

use super::{
    AbandonedRecord, Acquire, Checkpoint, ExpiredRecord, Fence, IdempotencyStore, RecordKey,
    RecordState, RecordView, RequestDigest, StoreError, StoredResponse, StuckRecord, UnknownRecord,
};
use crate::classify::BoxError;
use crate::idempotency::IdempotencyKey;
use crate::ConfigError;

/// A shared store on Redis, for services that run more than one instance and can live with
/// **cache-grade** guarantees: each record is a hash, each move of a record one Lua script (so
/// one atomic step on the server), and every lease and retention is read from Redis's own clock
/// (`TIME`), so that instances with skewed clocks agree.
///
/// # What it guarantees, and what it does not
///
/// On one Redis server that keeps its data, it behaves as the
/// [`PostgresStore`][super::PostgresStore] does, state for state: one owner per key, duplicates
/// answered 409 while the owner's lease runs, replays of the stored answer, fenced completions
/// (a stale owner is refused), takeovers with a higher fence, checkpoints, `UNKNOWN` records,
/// retention, the sweep. It does **not** promise what PostgreSQL promises, because Redis does
/// not keep what it acknowledged the way a database does:
///
/// * **Replication is asynchronous.** Redis acknowledges a write before any replica has it. If
///   the primary fails over in that window, the replica that takes over has never seen the
///   claim or the completion: the next request with the key runs the handler **again**. Two
///   requests with one key may both run. (`WAIT` narrows the window; it does not close it.)
/// * **A restart without persistence forgets everything**: every key's record, in flight or
///   completed. After it, every key is new: a retry of a request that had completed runs again,
///   and a stale owner's late completion is accepted under a fresh record's fence 1 if that
///   record's owner also got fence 1. With AOF (`appendfsync always`) a restart loses nothing it
///   acknowledged; with `everysec`, up to a second of moves.
/// * **No transaction with the handler's own writes.** There is no `complete_in` here: a
///   handler that commits its business write elsewhere and crashes before the completion leaves
///   the record `PROCESSING`, and after the lease the retry runs it again (unless its
///   checkpoints and a [recovery hook](crate::server::idempotency::IdempotencyLayerBuilder::recover)
///   say otherwise).
/// * **Eviction is loss.** Run Redis with `maxmemory-policy noeviction`: under an `allkeys-*`
///   policy Redis may drop a live claim, and under a `volatile-*` one a lease or a completed
///   record (they carry a time to live).
///
/// So: use it to spare a service duplicate work, and duplicate answers to most retries; do not
/// use it where the effect must happen once (money, stock, anything a customer is charged
/// for). There, use [`PostgresStore`][super::PostgresStore] and complete in the handler's
/// transaction. See [`docs::server_states`](crate::docs::server_states#on-redis).
///
/// # The keys, and what each call costs
///
/// With the prefix `surely:idem:` (the default; [`with_prefix`](Self::with_prefix)), a record
/// is the hash `surely:idem:rec:<tenant length>:<tenant>:<operation length>:<operation>:<key>`
/// (readable in `redis-cli`, bounded as [`RecordKey`] is), and its owner's lease is the string
/// `surely:idem:lease:...` beside it, claimed with `SET ... NX PX <lease>` and expired by Redis
/// itself. The record outlives its lease: a takeover needs the old fence, digest and
/// checkpoints, so only the claim expires. Four sorted sets index the records by time
/// (`surely:idem:processing` by acquisition, `:leases` by the end of the owner's lease,
/// `:unknown`, `:ended`), kept in step by the same scripts.
///
/// [`take_abandoned`](IdempotencyStore::take_abandoned) reads `:leases`. A record acquired by
/// an earlier version of this store (or by an instance not yet upgraded) is not in it: each
/// call also walks a hundred entries of `:processing`, from where the last call stopped
/// (`:leases:walked`), and adds those it lacks, so that such records are found too, a few
/// rounds later on a store with many records in flight.
///
/// Acquiring, completing, releasing, renewing and checkpointing are one script each, one round
/// trip (a script is sent once, then called by its hash), `O(log n)` in the store's records
/// (the sorted sets). [`stuck`](IdempotencyStore::stuck),
/// [`unknowns`](IdempotencyStore::unknowns) and [`expired`](IdempotencyStore::expired) read a
/// range of their index, `O(log n + limit)`; [`sweep`](IdempotencyStore::sweep) deletes in
/// batches of 1000, one script per batch, so that it never blocks Redis for long. Nothing scans
/// the keyspace.
///
/// A completed or released record also gets a time to live: Redis deletes it by itself
/// [`backstop`](Self::with_backstop) (7 days by default) after its retention ended, so a store
/// whose sweeper never runs does not grow for ever. The sweeper, and the archive before it,
/// see a record only until then.
///
/// # On a cluster
///
/// [`cluster`](Self::cluster) makes a store on Redis Cluster, through the `redis` crate's
/// cluster connection. A script may touch only keys of one slot, so there the keys carry hash
/// tags: the records are kept in [`CLUSTER_BUCKETS`](Self::CLUSTER_BUCKETS) (16) buckets, and
/// bucket `7`'s records, leases and indexes are `surely:idem:{7}rec:...`,
/// `surely:idem:{7}lease:...`, `surely:idem:{7}processing` and so on, all in the slot of `7`.
/// A record's bucket is the FNV-1a (64-bit) hash of its name after `rec:`, modulo 16. So each
/// move of a record is still one script in one slot, as on one server, and the buckets spread
/// over the shards.
///
/// The listings work per bucket, and say so in their cost: [`stuck`](IdempotencyStore::stuck),
/// [`unknowns`](IdempotencyStore::unknowns) and [`expired`](IdempotencyStore::expired) read
/// each bucket's index (16 scripts, each on the shard that holds its slot) and keep the oldest
/// `limit` of them all; [`sweep`](IdempotencyStore::sweep) sweeps bucket by bucket;
/// [`take_abandoned`](IdempotencyStore::take_abandoned) takes from the buckets in turn,
/// starting one further each round, so that no bucket waits behind a busy one;
/// [`forget`](IdempotencyStore::forget) runs one script per bucket it names.
///
/// A redirect is followed by the connection: `MOVED` after a failover or a resharding, `ASK`
/// while a slot migrates. A script that still cannot run (its bucket's keys split between two
/// shards mid-migration, `TRYAGAIN`; a slot without a primary while a replica takes over) is a
/// backend error after the connection's two retries: the layer answers `503`, not processed,
/// when it was claiming the key, and "commit unknown" (`503`, `Retry-After`) when it was
/// storing a handler's answer. Neither runs a handler twice by itself.
///
/// **What a failover can lose** is what the single-server warning above says, per shard: the
/// replica that takes over a dead primary's slots has what replication carried before the
/// primary died. A claim or a completion acknowledged in that window is gone, and the next
/// request with its key runs the handler again, while the first run may still be going. A
/// script sent again after its connection broke may have run on the old primary: sent again
/// to the new one, a claim finds its own record there (`409` in flight, and the key waits for
/// its lease) or nothing (it claims again). And a failover that outlasts a lease (the cluster
/// needs its node timeout and an election: two to three seconds with a one-second node
/// timeout) is a pause of every owner on that shard: the replica expires their leases, the
/// next request with such a key takes it over and runs the handler again, and the first run's
/// late completion is refused by its fence (its caller still gets its answer). The cluster's
/// `WAIT` and `min-replicas-to-write` narrow the first window; a lease longer than a failover
/// closes the last.
///
/// The single server's layout has no tags; a store moved from one server to a cluster starts
/// with empty buckets and does not read the records left on the server.
///
/// # Connections
///
/// On the `redis` crate's [`ConnectionManager`]: one multiplexed connection, shared by clones,
/// reconnected when it drops (a Redis restart). [`connect`](Self::connect) opens it on first
/// use, with a one-second connection timeout, a five-second response timeout and two
/// reconnection attempts, so that a Redis that is down fails a request within seconds (the layer
/// answers `503`, not processed) instead of holding it; [`new`](Self::new) takes a manager you
/// configured. Every Redis error is a [`StoreError::is_backend`], and so is a record under the
/// prefix that does not decode (written by someone else), with the key in its message.
///
/// ```no_run
/// use std::time::Duration;
/// use surely::server::idempotency::IdempotencyLayer;
/// use surely::server::store::RedisStore;
/// use tower::{service_fn, Layer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379")?.with_prefix("orders:idem:")?;
/// let layer = IdempotencyLayer::builder(store)
///     .lease(Duration::from_secs(30))
///     .retention(Duration::from_secs(24 * 3600))
///     .build()?;
/// let app = layer.layer(service_fn(|_req: http::Request<http_body_util::Full<bytes::Bytes>>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
///         bytes::Bytes::from("created"),
///     )))
/// }));
/// # let _ = app;
/// # Ok(()) }
/// ```
#[cfg_attr(
    not(all(feature = "server", feature = "postgres")),
    doc = crate::docs::links::to_features!(
        "super::PostgresStore",
    )
)]
#[derive(Clone)]
pub struct RedisStore {
    conn: Arc<Conn>,
    keys: Arc<Keys>,
}

/// The connection: one the caller made, or one made from a client on first use (and again on
/// the next use if that failed).
struct Conn {
    client: Option<Source>,
    link: tokio::sync::OnceCell<Link>,
}

/// What a connection is made from.
enum Source {
    Server(redis::Client),
    Cluster(Box<ClusterClient>),
}

/// A connection to one server (reconnecting), or to a cluster (following its slots).
#[derive(Clone)]
enum Link {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Link::Server(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Server(c) => c.req_packed_commands(cmd, offset, count),
            Link::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Server(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}

/// The store's prefix, and the key names made from it.
struct Keys {
    prefix: Box<str>,
    /// The indexes: one set for a single server; on a cluster, one per bucket, each under a
    /// hash tag of its own, so that a record's keys and its bucket's indexes share a slot.
    buckets: Vec<Index>,
    /// Whether the keys carry hash tags (a cluster).
    tagged: bool,
    /// Where the next round of `take_abandoned` starts, so that no bucket waits for ever.
    next: std::sync::atomic::AtomicUsize,
    backstop: Duration,
}

/// One set of the indexes, and the start of its records' and leases' names.
struct Index {
    /// `prefix`, or `prefix{n}` on a cluster: what `rec:` and `lease:` follow.
    base: String,
    processing: String,
    unknown: String,
    ended: String,
    /// The processing records by the end of their owner's lease.
    leases: String,
    /// Where the walk through `processing` for records an earlier version left out of
    /// `leases` stands.
    leases_walked: String,
}

impl Index {
    fn new(base: String) -> Self {
        Index {
            processing: format!("{base}processing"),
            unknown: format!("{base}unknown"),
            ended: format!("{base}ended"),
            leases: format!("{base}leases"),
            leases_walked: format!("{base}leases:walked"),
            base,
        }
    }
}

impl Keys {
    /// The keys under `prefix`: flat for one server, in `buckets` tagged buckets for a cluster.
    fn new(prefix: &str, buckets: Option<u16>, backstop: Duration) -> Self {
        let (tagged, buckets) = match buckets {
            None => (false, vec![Index::new(prefix.to_owned())]),
            Some(n) => (
                true,
                (0..n.max(1))
                    .map(|b| Index::new(format!("{prefix}{{{b}}}")))
                    .collect(),
            ),
        };
        Keys {
            prefix: prefix.into(),
            buckets,
            tagged,
            next: std::sync::atomic::AtomicUsize::new(0),
            backstop,
        }
    }

    /// The number of buckets on a cluster, `None` on one server.
    fn bucket_count(&self) -> Option<u16> {
        self.tagged
            .then(|| u16::try_from(self.buckets.len()).unwrap_or(u16::MAX))
    }

    /// The record's name after `rec:` or `lease:`.
    fn rest(key: &RecordKey) -> String {
        let (t, o, k) = (key.tenant(), key.operation(), key.key().as_str());
        format!("{}:{t}:{}:{o}:{k}", t.len(), o.len())
    }

    /// The record's bucket, its hash and its lease.
    fn record(&self, key: &RecordKey) -> (&Index, String, String) {
        let rest = Self::rest(key);
        let index = &self.buckets[bucket_of(&rest, self.buckets.len())];
        (
            index,
            format!("{}rec:{rest}", index.base),
            format!("{}lease:{rest}", index.base),
        )
    }
}

/// The bucket of a record's name among `n`: FNV-1a, stable across versions and processes (the
/// bucket is part of every key's name).
fn bucket_of(rest: &str, n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in rest.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // `n` is at most `u16::MAX`: the remainder fits.
    (h % n.max(1) as u64) as usize
}

/// The prefix of [`RedisStore::connect`] and [`RedisStore::new`].
const DEFAULT_PREFIX: &str = "surely:idem:";

/// How long after its retention Redis deletes a terminal record by itself, by default.
const DEFAULT_BACKSTOP: Duration = Duration::from_secs(7 * 86_400);

/// The most records one script of the sweep deletes.
const SWEEP_BATCH: u64 = 1000;

/// Ten years ([`MAX_DURATION`](crate::MAX_DURATION)), in milliseconds: the longest lease,
/// retention, sweep age or threshold sent to Redis (see [`IdempotencyStore`]'s durations).
const MAX_MILLIS: u64 = crate::MAX_DURATION.as_millis() as u64;

impl RedisStore {
    /// The number of buckets a store on a Redis Cluster keeps its records in: each is a hash
    /// tag (`{0}` to `{15}`), so a bucket's records and indexes share one slot, and the buckets
    /// spread over the cluster's shards.
    pub const CLUSTER_BUCKETS: u16 = 16;

    /// A store over `manager`, a connection you made and configured, under the prefix
    /// `surely:idem:`.
    pub fn new(manager: ConnectionManager) -> Self {
        Self::with_conn(
            Conn {
                client: None,
                link: tokio::sync::OnceCell::new_with(Some(Link::Server(manager))),
            },
            None,
        )
    }

    /// A store over `client`, connected on first use, as [`connect`](Self::connect) does.
    pub fn from_client(client: redis::Client) -> Self {
        Self::with_conn(
            Conn {
                client: Some(Source::Server(client)),
                link: tokio::sync::OnceCell::new(),
            },
            None,
        )
    }

    /// A store on a Redis Cluster, reached through any of `nodes` (`redis://host:port`; the
    /// client learns the rest from the cluster), under the prefix `surely:idem:`, its records
    /// in [`CLUSTER_BUCKETS`](Self::CLUSTER_BUCKETS) buckets. Nothing connects yet: the first call does, with a
    /// one-second connection timeout, a five-second response timeout and two retries, and a
    /// failed connection is tried again on the next call. See
    /// [on a cluster](Self#on-a-cluster) for what changes.
    ///
    /// # Errors
    ///
    /// No node given, or one that does not parse ([`StoreError::is_backend`]).
    ///
    /// ```
    /// use surely::server::store::RedisStore;
    ///
    /// let store = RedisStore::cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]).unwrap();
    /// assert_eq!(store.buckets(), Some(16));
    /// assert!(RedisStore::cluster(Vec::<String>::new()).unwrap_err().is_backend());
    /// ```
    pub fn cluster<I, T>(nodes: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        let client = ClusterClient::builder(nodes)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(5))
            .retries(2)
            .build()
            .map_err(StoreError::backend)?;
        Ok(Self::from_cluster_client(client))
    }

    /// A store on a Redis Cluster through `client`, a client you configured, connected on first
    /// use, as [`cluster`](Self::cluster) does.
    pub fn from_cluster_client(client: ClusterClient) -> Self {
        Self::with_conn(
            Conn {
                client: Some(Source::Cluster(Box::new(client))),
                link: tokio::sync::OnceCell::new(),
            },
            Some(Self::CLUSTER_BUCKETS),
        )
    }

    /// A store on a Redis Cluster over `connection`, a connection you made, as
    /// [`cluster`](Self::cluster) does.
    pub fn from_cluster_connection(connection: ClusterConnection) -> Self {
        Self::with_conn(
            Conn {
                client: None,
                link: tokio::sync::OnceCell::new_with(Some(Link::Cluster(connection))),
            },
            Some(Self::CLUSTER_BUCKETS),
        )
    }

    /// A store on the Redis at `url` (`redis://host:6379/0`, `rediss://` for TLS when the
    /// `redis` crate has it), under the prefix `surely:idem:`. Nothing connects yet: the first
    /// call does, and a failed connection is tried again on the next call.
    ///
    /// # Errors
    ///
    /// The URL does not parse ([`StoreError::is_backend`], with the `redis` crate's reason).
    ///
    /// ```
    /// use surely::server::store::RedisStore;
    ///
    /// assert!(RedisStore::connect("redis://127.0.0.1:6379").is_ok());
    /// let err = RedisStore::connect("http://127.0.0.1:6379").unwrap_err();
    /// assert!(err.is_backend(), "{err}");
    /// ```
    pub fn connect(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(StoreError::backend)?;
        Ok(Self::from_client(client))
    }

    fn with_conn(conn: Conn, buckets: Option<u16>) -> Self {
        RedisStore {
            conn: Arc::new(conn),
            keys: Arc::new(Keys::new(DEFAULT_PREFIX, buckets, DEFAULT_BACKSTOP)),
        }
    }

    /// The same store under another key prefix, such as `orders:idem:`: two stores with
    /// different prefixes never see each other's records.
    ///
    /// # Errors
    ///
    /// The prefix is empty, over 64 bytes, or has a byte other than ASCII letters, digits and
    /// `_ - . : /`.
    ///
    /// ```
    /// use surely::server::store::RedisStore;
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379").unwrap();
    /// assert_eq!(store.clone().with_prefix("orders:idem:").unwrap().prefix(), "orders:idem:");
    /// let err = store.with_prefix("orders idem").unwrap_err();
    /// assert_eq!(err.setting(), "redis key prefix");
    /// ```
    pub fn with_prefix(self, prefix: &str) -> Result<Self, ConfigError> {
        let valid = !prefix.is_empty()
            && prefix.len() <= 64
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:/".contains(&b));
        if !valid {
            return Err(ConfigError::new(
                "redis key prefix",
                "must be 1 to 64 bytes of ASCII letters, digits and `_ - . : /`",
            ));
        }
        Ok(RedisStore {
            conn: self.conn,
            keys: Arc::new(Keys::new(
                prefix,
                self.keys.bucket_count(),
                self.keys.backstop,
            )),
        })
    }

    /// The same store with Redis deleting a completed or released record by itself `backstop`
    /// after its retention ended (7 days by default), whether or not a sweeper ran. Set it
    /// longer than the longest `keep_expired_for` your sweeper uses: until the sweep, a request
    /// with an expired key gets the explicit `410`, and after Redis deleted the record, it runs
    /// as a new one.
    ///
    /// # Errors
    ///
    /// `backstop` is under a second, or over ten years ([`MAX_DURATION`](crate::MAX_DURATION)).
    pub fn with_backstop(self, backstop: Duration) -> Result<Self, ConfigError> {
        if backstop < Duration::from_secs(1) {
            return Err(ConfigError::new(
                "redis backstop",
                "must be a second or more",
            ));
        }
        ConfigError::at_most_max("redis backstop", backstop)?;
        Ok(RedisStore {
            conn: self.conn,
            keys: Arc::new(Keys::new(
                &self.keys.prefix,
                self.keys.bucket_count(),
                backstop,
            )),
        })
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.keys.prefix
    }

    /// The number of buckets the records are kept in on a cluster ([`CLUSTER_BUCKETS`](Self::CLUSTER_BUCKETS)), `None`
    /// on one server.
    pub fn buckets(&self) -> Option<u16> {
        self.keys.bucket_count()
    }

    /// The connection, made on first use.
    async fn manager(&self) -> Result<Link, StoreError> {
        if let Some(link) = self.conn.link.get() {
            return Ok(link.clone());
        }
        let Some(client) = &self.conn.client else {
            return Err(StoreError::backend("redis store without a connection"));
        };
        // Made here, in the runtime. One server's is lazy: it connects on its first command,
        // which every request waiting meanwhile shares (one attempt for all, not one after the
        // other). A cluster's reads the slots first; the requests waiting share that too.
        self.conn
            .link
            .get_or_try_init(|| async {
                match client {
                    Source::Server(client) => {
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(Duration::from_secs(1)))
                            .set_response_timeout(Some(Duration::from_secs(5)))
                            .set_number_of_retries(2)
                            .set_min_delay(Duration::from_millis(50))
                            .set_max_delay(Duration::from_millis(500));
                        ConnectionManager::new_lazy_with_config(client.clone(), config)
                            .map(Link::Server)
                    }
                    Source::Cluster(client) => {
                        client.get_async_connection().await.map(Link::Cluster)
                    }
                }
            })
            .await
            .cloned()
            .map_err(StoreError::backend)
    }

    /// Runs one of the scripts that move `key`'s record: its keys are the record, its lease and
    /// the four indexes.
    async fn run(
        &self,
        script: &Script,
        key: &RecordKey,
        args: &[&[u8]],
    ) -> Result<(String, String, Value), StoreError> {
        let (index, record, lease) = self.keys.record(key);
        let mut invocation = script.prepare_invoke();
        invocation
            .key(&record)
            .key(&lease)
            .key(&index.processing)
            .key(&index.unknown)
            .key(&index.ended)
            .key(&index.leases);
        for arg in args {
            invocation.arg(*arg);
        }
        let mut conn = self.manager().await?;
        let value = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| at(&record, e))?;
        Ok((record, lease, value))
    }

    /// Runs an owner's move: stale unless the script changed the record.
    async fn owned(
        &self,
        script: &Script,
        key: &RecordKey,
        fence: Fence,
        args: &[&[u8]],
    ) -> Result<i64, StoreError> {
        let fence = fence.get().to_string();
        let mut all: Vec<&[u8]> = vec![fence.as_bytes()];
        all.extend_from_slice(args);
        let (record, _, value) = self.run(script, key, &all).await?;
        match value {
            Value::Int(0) => Err(StoreError::stale()),
            Value::Int(n) => Ok(n),
            other => Err(at(&record, format!("unexpected reply {other:?}"))),
        }
    }

    /// Reads up to `limit` records of the index `which` picks whose score is `older_than` ago
    /// or more, oldest first, with `fields` after tenant, operation, key, fence and state;
    /// records in another state than `states` (left behind by a hand-made change) are skipped.
    /// On a cluster, each bucket's index gives its oldest `limit`, and the oldest `limit` of
    /// them all are kept.
    async fn list<T>(
        &self,
        which: fn(&Index) -> &str,
        older_than: Duration,
        limit: usize,
        fields: &[&str],
        states: &[&str],
        read: impl Fn(&Row, RecordKey, Fence, i64) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.manager().await?;
        let mut found = Vec::new();
        let mut now = i64::MIN;
        let score_at = 5 + fields.len();
        for bucket in &self.keys.buckets {
            let index = which(bucket);
            let mut invocation = SCRIPTS.list.prepare_invoke();
            invocation
                .key(index)
                .arg(millis(older_than))
                .arg(limit.min(u32::MAX as usize));
            for field in ["t", "o", "k", "f", "s"].iter().chain(fields) {
                invocation.arg(*field);
            }
            let value: Value = invocation
                .invoke_async(&mut conn)
                .await
                .map_err(|e| at(index, e))?;
            let mut reply = Reply::new(index, value)?;
            now = now.max(reply.int()?);
            while let Some(row) = reply.next_row()? {
                let e = |why: BoxError| at(&row.key, why);
                let (tenant, operation, k) = (row.text(0)?, row.text(1)?, row.text(2)?);
                let fence = row.number(3)?;
                let state = row.text(4)?;
                if !states.contains(&state.as_str()) {
                    continue;
                }
                let k = IdempotencyKey::new(k).map_err(|x| e(x.into()))?;
                let fence = Fence::new(u64::try_from(fence).map_err(|x| e(x.into()))?);
                let score = row.number(score_at)?;
                found.push((score, row, RecordKey::new(tenant, operation, k), fence));
            }
        }
        if self.keys.buckets.len() > 1 {
            found.sort_by_key(|(score, ..)| *score);
            found.truncate(limit);
        }
        // One time for all the buckets (the latest read), so that ages compare.
        found
            .into_iter()
            .map(|(_, row, key, fence)| read(&row, key, fence, now))
            .collect()
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.keys.prefix)
            .field("backstop", &self.keys.backstop)
            .finish()
    }
}

/// `d` in whole milliseconds for Redis, at most ten years.
fn millis(d: Duration) -> u64 {
    d.as_millis().min(u128::from(MAX_MILLIS)) as u64
}

/// A lease in whole milliseconds: at least one (`PX 0` is an error).
fn lease_millis(d: Duration) -> u64 {
    millis(d).max(1)
}

/// An error about one key of the store: Redis's, or a value there that does not decode (its
/// source).
#[derive(Debug, thiserror::Error)]
#[error("redis key `{key}`")]
struct AtKey {
    key: String,
    #[source]
    why: BoxError,
}

fn at(key: &str, why: impl Into<BoxError>) -> StoreError {
    StoreError::backend(AtKey {
        key: key.to_owned(),
        why: why.into(),
    })
}

/// The scripts, loaded into Redis by hash (`EVALSHA`, and `SCRIPT LOAD` again after a restart).
struct Scripts {
    acquire: Script,
    complete: Script,
    release: Script,
    renew: Script,
    checkpoint: Script,
    mark_unknown: Script,
    list: Script,
    inspect: Script,
    sweep: Script,
    forget: Script,
    take_abandoned: Script,
}

/// What every script starts with: Redis's clock, and the owner check.
///
/// The record is `KEYS[1]`, its lease `KEYS[2]`, the indexes of processing, unknown and ended
/// records `KEYS[3..5]`, and the index of processing records by their lease's end `KEYS[6]`;
/// an owner's move has its fence in `ARGV[1]`.
const PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function owned(open)
  local r = redis.call('HMGET', KEYS[1], 's', 'f')
  return r[2] == ARGV[1] and open[r[1]] == true
end
local function unindex()
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[3], KEYS[1])
  redis.call('ZREM', KEYS[4], KEYS[1])
  redis.call('ZREM', KEYS[6], KEYS[1])
end
"#;

/// `ARGV`: digest, lease (ms), tenant, operation, key.
const ACQUIRE: &str = r#"
local now = now_ms()
local lease = tonumber(ARGV[2])
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  if not redis.call('SET', KEYS[2], 1, 'NX', 'PX', lease) then
    return {'inflight', redis.call('PTTL', KEYS[2])}
  end
  redis.call('HSET', KEYS[1], 't', ARGV[3], 'o', ARGV[4], 'k', ARGV[5], 'd', ARGV[1],
    's', 'p', 'f', 1, 'lu', now + lease, 'at', now)
  redis.call('ZADD', KEYS[3], now, KEYS[1])
  redis.call('ZADD', KEYS[6], now + lease, KEYS[1])
  return {'owner', 1}
end
if kind ~= 'hash' then
  return {'corrupt', KEYS[1], 'holds a ' .. kind .. ', not a record'}
end
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'd', 'lu', 'at', 'e', 'ev', 'cp')
local s, f = r[1], tonumber(r[2])
if not f then
  return {'corrupt', KEYS[1], 'has no fence'}
end
if s == 'c' then
  local e = tonumber(r[6])
  if not e then
    return {'corrupt', KEYS[1], 'is completed without an end of retention'}
  end
  if e <= now then
    return {'expired'}
  end
  if r[3] ~= ARGV[1] then
    return {'mismatch'}
  end
  local c = redis.call('HMGET', KEYS[1], 'st', 'h', 'b', 'rs', 'rc', 'fl')
  return {'completed', c[1], c[2], c[3], c[4], c[5], c[6]}
end
if s == 'u' then
  if r[3] ~= ARGV[1] then
    return {'mismatch'}
  end
  return {'unknown', r[7]}
end
if s ~= 'p' and s ~= 'r' then
  return {'corrupt', KEYS[1], 'has no known state'}
end
if s == 'p' and r[3] ~= ARGV[1] then
  return {'mismatch'}
end
if not redis.call('SET', KEYS[2], f + 1, 'NX', 'PX', lease) then
  return {'inflight', redis.call('PTTL', KEYS[2])}
end
redis.call('HSET', KEYS[1], 'd', ARGV[1], 's', 'p', 'f', f + 1, 'lu', now + lease, 'at', now)
redis.call('ZADD', KEYS[3], now, KEYS[1])
redis.call('ZADD', KEYS[6], now + lease, KEYS[1])
if s == 'r' then
  redis.call('HDEL', KEYS[1], 'e')
  redis.call('ZREM', KEYS[5], KEYS[1])
  redis.call('PERSIST', KEYS[1])
  return {'owner', f + 1}
end
local overdue = math.max(now - (tonumber(r[4]) or now), 0)
local age = math.max(now - (tonumber(r[5]) or now), 0)
return {'taken', f + 1, overdue, age, r[8]}
"#;

/// `ARGV`: fence, retention (ms), status, headers, body, flags, whether a reference, resource,
/// result code, time to live (ms).
const COMPLETE: &str = r#"
if not owned({p = true, u = true}) then
  return 0
end
local e = now_ms() + tonumber(ARGV[2])
redis.call('HDEL', KEYS[1], 'lu', 'ev', 'ua', 'rs', 'rc')
redis.call('HSET', KEYS[1], 's', 'c', 'e', e, 'st', ARGV[3], 'h', ARGV[4], 'b', ARGV[5],
  'fl', ARGV[6])
if ARGV[7] == '1' then
  redis.call('HSET', KEYS[1], 'rs', ARGV[8], 'rc', ARGV[9])
end
unindex()
redis.call('ZADD', KEYS[5], e, KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[10])
return 1
"#;

/// `ARGV`: fence, time to live (ms).
const RELEASE: &str = r#"
if not owned({p = true, u = true}) then
  return 0
end
local now = now_ms()
redis.call('HDEL', KEYS[1], 'lu', 'ev', 'ua', 'cp', 'cn', 'st', 'h', 'b', 'rs', 'rc', 'fl')
redis.call('HSET', KEYS[1], 's', 'r', 'e', now)
unindex()
redis.call('ZADD', KEYS[5], now, KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

/// `ARGV`: fence, lease (ms).
const RENEW: &str = r#"
if not owned({p = true}) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
local lu = now_ms() + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lu', lu)
redis.call('ZADD', KEYS[6], lu, KEYS[1])
return 1
"#;

/// `ARGV`: fence, the checkpoint as `name=value\n`, the most a record keeps. `-1`: full.
const CHECKPOINT: &str = r#"
if not owned({p = true}) then
  return 0
end
local n = tonumber(redis.call('HGET', KEYS[1], 'cn')) or 0
if n >= tonumber(ARGV[3]) then
  return -1
end
local held = redis.call('HGET', KEYS[1], 'cp') or ''
redis.call('HSET', KEYS[1], 'cp', held .. ARGV[2], 'cn', n + 1)
return 1
"#;

/// `ARGV`: fence, evidence.
const MARK_UNKNOWN: &str = r#"
if not owned({p = true}) then
  return 0
end
local now = now_ms()
redis.call('HDEL', KEYS[1], 'lu')
redis.call('HSET', KEYS[1], 's', 'u', 'ev', ARGV[2], 'ua', now)
unindex()
redis.call('ZADD', KEYS[4], now, KEYS[1])
return 1
"#;

/// Reads the record (`KEYS[1]`) and its lease (`KEYS[2]`), changing nothing: `none`, or
/// `record` with its state, fence, digest, the lease's time to live, Redis's time, the end of
/// its retention, its evidence, its checkpoints, then the completed answer's fields.
const INSPECT: &str = r#"
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return {'none'}
end
if kind ~= 'hash' then
  return {'corrupt', KEYS[1], 'holds a ' .. kind .. ', not a record'}
end
local r = redis.call('HMGET', KEYS[1], 's', 'f', 'd', 'e', 'ev', 'cp')
local c = redis.call('HMGET', KEYS[1], 'st', 'h', 'b', 'rs', 'rc', 'fl')
return {'record', r[1], r[2], r[3], redis.call('PTTL', KEYS[2]), now_ms(), r[4], r[5], r[6],
  c[1], c[2], c[3], c[4], c[5], c[6]}
"#;

/// `KEYS[1]`: an index. `ARGV`: how old (ms), the most to read, the fields to read. Returns
/// Redis's time, then each record's key and fields, its score in the index last; a record gone (deleted by its time to
/// live) leaves the index. A key that is not a record stops the listing, named.
const LIST: &str = r#"
local now = now_ms()
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]),
  'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local out = {now}
for i = 1, #names, 2 do
  local name = names[i]
  local r = redis.pcall('HMGET', name, unpack(ARGV, 3))
  if r.err then
    return {'corrupt', name, r.err}
  end
  if r[1] then
    table.insert(r, names[i + 1])
    table.insert(out, name)
    table.insert(out, r)
  else
    redis.call('ZREM', KEYS[1], name)
  end
end
return out
"#;

/// `KEYS[1]`: the index of ended records. `ARGV`: how long after their end (ms), the most to
/// delete. Returns how many records it deleted and how many index entries it read.
const SWEEP: &str = r#"
local now = now_ms()
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]),
  'LIMIT', 0, tonumber(ARGV[2]))
local deleted = 0
for _, name in ipairs(names) do
  local s = redis.pcall('HGET', name, 's')
  if type(s) == 'table' and s.err then
    return {'corrupt', name, s.err}
  end
  if s == 'c' or s == 'r' then
    redis.call('DEL', name)
    deleted = deleted + 1
  end
  redis.call('ZREM', KEYS[1], name)
end
return {deleted, #names}
"#;

/// `KEYS`: the index of ended records, then the records. `ARGV`: their fences.
const FORGET: &str = r#"
local n = 0
for i = 2, #KEYS do
  local r = redis.call('HMGET', KEYS[i], 's', 'f')
  if (r[1] == 'c' or r[1] == 'r') and r[2] == ARGV[i - 1] then
    redis.call('DEL', KEYS[i])
    redis.call('ZREM', KEYS[1], KEYS[i])
    n = n + 1
  end
end
return n
"#;

/// `KEYS`: the index of processing records by their lease's end, the index of processing
/// records by when they were acquired, and where the walk through it stands. `ARGV`: the new
/// lease (ms), the most to take, what the records' and leases' names start with (the prefix,
/// and a cluster's bucket tag). Returns Redis's time, then each record
/// taken: its key and its fields (tenant, operation, key, new fence, `p`, digest, checkpoints,
/// age and overdue in ms).
///
/// First a step of a walk through the processing records by acquisition, from where the last
/// round left it: a record that an earlier version of the store (or an instance not yet
/// upgraded) acquired is not in the index by lease, and is added to it with the end of its
/// lease. Then the records whose lease ended, oldest first: each taken over if its lease key
/// is gone (Redis expired it) as a request's takeover does, its fence raised and a lease of
/// its own set; a record no longer processing leaves the index, and one whose lease key still
/// lives (renewed by an earlier version) goes back in at its end.
const TAKE_ABANDONED: &str = r#"
local now = now_ms()
local lease = tonumber(ARGV[1])
local base = ARGV[3]
local from = redis.call('GET', KEYS[3]) or '-inf'
local walked = redis.call('ZRANGEBYSCORE', KEYS[2], from, '+inf', 'WITHSCORES', 'LIMIT', 0, 100)
for i = 1, #walked, 2 do
  local name = walked[i]
  if not redis.call('ZSCORE', KEYS[1], name) then
    local lu = tonumber(redis.pcall('HGET', name, 'lu'))
    if lu then
      redis.call('ZADD', KEYS[1], lu, name)
    end
  end
end
if #walked > 0 then
  local last = walked[#walked]
  if #walked == 200 and walked[2] == last then
    -- A hundred records acquired in one millisecond: step past it.
    last = '(' .. last
  end
  redis.call('SET', KEYS[3], last)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[4]), 'LIMIT', 0,
  tonumber(ARGV[2]))
local out = {now}
for _, name in ipairs(due) do
  local kind = redis.call('TYPE', name).ok
  if kind ~= 'hash' then
    if kind ~= 'none' then
      return {'corrupt', name, 'holds a ' .. kind .. ', not a record'}
    end
    redis.call('ZREM', KEYS[1], name)
  else
    local r = redis.call('HMGET', name, 's', 'f', 'lu', 'at', 't', 'o', 'k', 'd', 'cp')
    local f = tonumber(r[2])
    if r[1] ~= 'p' then
      redis.call('ZREM', KEYS[1], name)
    elseif not f then
      return {'corrupt', name, 'has no fence'}
    else
      local held = base .. 'lease:' .. string.sub(name, #base + 5)
      if redis.call('SET', held, f + 1, 'NX', 'PX', lease) then
        redis.call('HSET', name, 'f', f + 1, 'lu', now + lease, 'at', now)
        redis.call('ZADD', KEYS[2], now, name)
        redis.call('ZADD', KEYS[1], now + lease, name)
        local age = math.max(now - (tonumber(r[4]) or now), 0)
        local overdue = math.max(now - (tonumber(r[3]) or now), 0)
        table.insert(out, name)
        table.insert(out, {r[5], r[6], r[7], tostring(f + 1), 'p', r[8], r[9] or '',
          tostring(age), tostring(overdue)})
      else
        redis.call('ZADD', KEYS[1], now + math.max(redis.call('PTTL', held), 0), name)
      end
    end
  end
end
return out
"#;

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let script = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
    Scripts {
        acquire: script(ACQUIRE),
        complete: script(COMPLETE),
        release: script(RELEASE),
        renew: script(RENEW),
        checkpoint: script(CHECKPOINT),
        mark_unknown: script(MARK_UNKNOWN),
        list: script(LIST),
        inspect: script(INSPECT),
        sweep: script(SWEEP),
        forget: script(FORGET),
        take_abandoned: script(TAKE_ABANDONED),
    }
});

/// A script's reply, read in order, naming `key` in every error.
struct Reply<'a> {
    key: &'a str,
    values: std::vec::IntoIter<Value>,
}

impl<'a> Reply<'a> {
    /// The reply to read; a script that found a key it cannot read said so, with the key.
    fn new(key: &'a str, value: Value) -> Result<Self, StoreError> {
        let Value::Array(values) = value else {
            return Err(at(key, format!("unexpected reply {value:?}")));
        };
        let mut reply = Reply {
            key,
            values: values.into_iter(),
        };
        if let Some(Value::BulkString(tag)) = reply.values.as_slice().first()
            && tag.as_slice() == b"corrupt"
        {
            reply.values.next();
            let name = reply.text()?;
            let why = reply.text()?;
            return Err(at(&name, why));
        }
        Ok(reply)
    }

    fn fail(&self, why: impl Into<BoxError>) -> StoreError {
        at(self.key, why)
    }

    fn value(&mut self) -> Result<Value, StoreError> {
        self.values
            .next()
            .ok_or_else(|| self.fail("a reply shorter than expected"))
    }

    fn bytes(&mut self) -> Result<Option<Vec<u8>>, StoreError> {
        match self.value()? {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(b)),
            Value::SimpleString(s) => Ok(Some(s.into_bytes())),
            other => Err(self.fail(format!("a string expected, {other:?} found"))),
        }
    }

    fn text(&mut self) -> Result<String, StoreError> {
        let bytes = self.bytes()?.unwrap_or_default();
        String::from_utf8(bytes).map_err(|e| self.fail(e))
    }

    fn int(&mut self) -> Result<i64, StoreError> {
        match self.value()? {
            Value::Int(n) => Ok(n),
            other => Err(self.fail(format!("an integer expected, {other:?} found"))),
        }
    }

    /// The next record of a listing: its key and the fields read.
    fn next_row(&mut self) -> Result<Option<Row>, StoreError> {
        let Some(name) = self.values.next() else {
            return Ok(None);
        };
        let Value::BulkString(name) = name else {
            return Err(self.fail(format!("a key expected, {name:?} found")));
        };
        let key = String::from_utf8_lossy(&name).into_owned();
        let Value::Array(fields) = self.value()? else {
            return Err(at(&key, "its fields are not an array"));
        };
        Ok(Some(Row { key, fields }))
    }
}

/// The fields of one record, as a listing read them.
struct Row {
    key: String,
    fields: Vec<Value>,
}

impl Row {
    fn fail(&self, why: impl Into<BoxError>) -> StoreError {
        at(&self.key, why)
    }

    fn bytes(&self, i: usize) -> Result<Option<&[u8]>, StoreError> {
        match self.fields.get(i) {
            None | Some(Value::Nil) => Ok(None),
            Some(Value::BulkString(b)) => Ok(Some(b)),
            Some(other) => Err(self.fail(format!("field {i}: {other:?}"))),
        }
    }

    fn text(&self, i: usize) -> Result<String, StoreError> {
        let bytes = self.bytes(i)?.unwrap_or_default();
        String::from_utf8(bytes.to_vec()).map_err(|e| self.fail(e))
    }

    fn number(&self, i: usize) -> Result<i64, StoreError> {
        number(&self.text(i)?).ok_or_else(|| self.fail(format!("field {i} is not a number")))
    }
}

fn number(s: &str) -> Option<i64> {
    s.parse().ok()
}

/// `name:value\n` for each header: names have no `:`, values no line break.
fn encode_headers(response: &StoredResponse) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in response.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
    out
}

fn decode_headers(blob: &[u8]) -> impl Iterator<Item = (&str, &[u8])> {
    blob.split(|b| *b == b'\n').filter_map(|line| {
        let at = line.iter().position(|b| *b == b':')?;
        let name = std::str::from_utf8(&line[..at]).ok()?;
        Some((name, &line[at + 1..]))
    })
}

/// `name=value\n` for each checkpoint, oldest first: names have no `=`, values no line break.
fn decode_checkpoints(key: &str, blob: &[u8]) -> Result<Vec<Checkpoint>, StoreError> {
    let text = std::str::from_utf8(blob).map_err(|e| at(key, e))?;
    text.lines()
        .map(|line| {
            let (name, value) = line
                .split_once('=')
                .ok_or_else(|| at(key, "a checkpoint without `=`"))?;
            Checkpoint::new(name, value).map_err(|e| at(key, e))
        })
        .collect()
}

fn duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// What the acquire script answered.
fn acquired(record: &str, lease: &str, value: Value) -> Result<Acquire, StoreError> {
    let mut reply = Reply::new(record, value)?;
    let tag = reply.text()?;
    Ok(match tag.as_str() {
        "owner" => Acquire::Owner(Fence::new(fence(&mut reply)?)),
        "taken" => {
            let fence = Fence::new(fence(&mut reply)?);
            let overdue = duration(reply.int()?);
            let age = duration(reply.int()?);
            let checkpoints = decode_checkpoints(record, &reply.bytes()?.unwrap_or_default())?;
            Acquire::TakenOver {
                fence,
                overdue,
                age,
                checkpoints,
            }
        }
        "inflight" => {
            let left = reply.int()?;
            if left < 0 {
                // A lease without an expiry: nothing of this store's makes one.
                return Err(at(lease, "has no time to live"));
            }
            Acquire::InFlight {
                retry_after: duration(left),
            }
        }
        "mismatch" => Acquire::Mismatch,
        "expired" => Acquire::Expired,
        "unknown" => Acquire::Unknown {
            evidence: reply.text()?,
        },
        "completed" => Acquire::Completed(completed(&mut reply)?),
        other => return Err(at(record, format!("unexpected reply `{other}`"))),
    })
}

/// What the inspect script read.
fn inspected(record: &str, value: Value) -> Result<Option<RecordView>, StoreError> {
    let mut reply = Reply::new(record, value)?;
    match reply.text()?.as_str() {
        "none" => return Ok(None),
        "record" => {}
        other => return Err(at(record, format!("unexpected reply `{other}`"))),
    }
    let state = reply.text()?;
    let fence = reply.text()?;
    let fence = number(&fence)
        .and_then(|f| u64::try_from(f).ok())
        .ok_or_else(|| at(record, "has no fence"))?;
    let digest = reply.bytes()?.unwrap_or_default();
    let digest = <[u8; 32]>::try_from(digest.as_slice())
        .map_err(|_| at(record, "its digest is not 32 bytes"))?;
    let lease_ttl = reply.int()?;
    let now = reply.int()?;
    let ends = reply.bytes()?;
    let evidence = reply.bytes()?;
    let checkpoints = decode_checkpoints(record, &reply.bytes()?.unwrap_or_default())?;
    let state = match state.as_str() {
        "p" => RecordState::Processing {
            lease_left: duration(lease_ttl),
        },
        "c" => {
            let ends = ends
                .as_deref()
                .and_then(|e| number(std::str::from_utf8(e).ok()?))
                .ok_or_else(|| at(record, "is completed without an end of retention"))?;
            RecordState::Completed {
                response: completed(&mut reply)?,
                expired: ends <= now,
            }
        }
        "r" => RecordState::Released,
        "u" => RecordState::Unknown {
            evidence: String::from_utf8(evidence.unwrap_or_default()).map_err(|e| at(record, e))?,
        },
        _ => return Err(at(record, "has no known state")),
    };
    Ok(Some(RecordView::new(
        state,
        Fence::new(fence),
        RequestDigest::from_bytes(digest),
        checkpoints,
    )))
}

fn fence(reply: &mut Reply<'_>) -> Result<u64, StoreError> {
    let n = reply.int()?;
    u64::try_from(n).map_err(|e| reply.fail(e))
}

/// The stored response of a completed record: status, headers, body, resource, result code,
/// flags.
fn completed(reply: &mut Reply<'_>) -> Result<StoredResponse, StoreError> {
    let status = reply.text()?;
    let status = number(&status)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| reply.fail(format!("stored status `{status}` out of range")))?;
    let headers = reply.bytes()?.unwrap_or_default();
    let body = reply.bytes()?.unwrap_or_default();
    let resource = reply.bytes()?;
    let code = reply.bytes()?;
    let flags = reply.text()?;
    let flags = number(&flags)
        .and_then(|f| u8::try_from(f).ok())
        .ok_or_else(|| reply.fail(format!("stored flags `{flags}` out of range")))?;
    let stored = match (resource, code) {
        (Some(resource), Some(code)) => StoredResponse::reference(
            status,
            String::from_utf8(resource).map_err(|e| reply.fail(e))?,
            String::from_utf8(code).map_err(|e| reply.fail(e))?,
        ),
        _ => StoredResponse::from_parts(status, decode_headers(&headers), Bytes::from(body)),
    };
    Ok(stored.with_flags(flags))
}

impl IdempotencyStore for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn acquire(
        &self,
        key: &RecordKey,
        digest: &RequestDigest,
        lease: Duration,
    ) -> Result<Acquire, StoreError> {
        let lease = lease_millis(lease).to_string();
        let args: [&[u8]; 5] = [
            digest.as_bytes(),
            lease.as_bytes(),
            key.tenant().as_bytes(),
            key.operation().as_bytes(),
            key.key().as_bytes(),
        ];
        let (record, lease, value) = self.run(&SCRIPTS.acquire, key, &args).await?;
        acquired(&record, &lease, value)
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fence: Fence,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let retention = millis(retention);
        let ttl = retention
            .saturating_add(millis(self.keys.backstop))
            .to_string();
        let retention = retention.to_string();
        let status = response.status().as_u16().to_string();
        let flags = response.flags().to_string();
        let headers = encode_headers(response);
        let (is_reference, resource, code) = match (response.resource(), response.result_code()) {
            (Some(resource), Some(code)) => (&b"1"[..], resource, code),
            _ => (&b"0"[..], "", ""),
        };
        let args: [&[u8]; 9] = [
            retention.as_bytes(),
            status.as_bytes(),
            &headers,
            response.body(),
            flags.as_bytes(),
            is_reference,
            resource.as_bytes(),
            code.as_bytes(),
            ttl.as_bytes(),
        ];
        self.owned(&SCRIPTS.complete, key, fence, &args)
            .await
            .map(drop)
    }

    async fn release(&self, key: &RecordKey, fence: Fence) -> Result<(), StoreError> {
        let ttl = millis(self.keys.backstop).to_string();
        self.owned(&SCRIPTS.release, key, fence, &[ttl.as_bytes()])
            .await
            .map(drop)
    }

    async fn renew(
        &self,
        key: &RecordKey,
        fence: Fence,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let lease = lease_millis(lease).to_string();
        self.owned(&SCRIPTS.renew, key, fence, &[lease.as_bytes()])
            .await
            .map(drop)
    }

    async fn checkpoint(
        &self,
        key: &RecordKey,
        fence: Fence,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        let entry = format!("{}={}\n", checkpoint.name(), checkpoint.value());
        let max = super::checkpoint::MAX_CHECKPOINTS.to_string();
        let args: [&[u8]; 2] = [entry.as_bytes(), max.as_bytes()];
        match self.owned(&SCRIPTS.checkpoint, key, fence, &args).await? {
            1 => Ok(()),
            _ => Checkpoint::room_after(super::checkpoint::MAX_CHECKPOINTS)
                .map_err(StoreError::rejected),
        }
    }

    async fn mark_unknown(
        &self,
        key: &RecordKey,
        fence: Fence,
        evidence: &str,
    ) -> Result<(), StoreError> {
        self.owned(&SCRIPTS.mark_unknown, key, fence, &[evidence.as_bytes()])
            .await
            .map(drop)
    }

    async fn unknowns(&self, limit: usize) -> Result<Vec<UnknownRecord>, StoreError> {
        self.list(
            |i| &i.unknown,
            Duration::ZERO,
            limit,
            &["ev", "cp", "ua"],
            &["u"],
            |row, key, fence, now| {
                let evidence = row.text(5)?;
                let steps = decode_checkpoints(&row.key, row.bytes(6)?.unwrap_or_default())?;
                let since = row.number(7)?;
                Ok(UnknownRecord::new(
                    key,
                    fence,
                    evidence,
                    steps,
                    duration(now.saturating_sub(since)),
                ))
            },
        )
        .await
    }

    async fn expired(
        &self,
        keep_expired_for: Duration,
        limit: usize,
    ) -> Result<Vec<ExpiredRecord>, StoreError> {
        self.list(
            |i| &i.ended,
            keep_expired_for,
            limit,
            &["st", "rs", "rc", "cp"],
            &["c", "r"],
            |row, key, fence, _| {
                let status = row
                    .bytes(5)?
                    .and_then(|s| std::str::from_utf8(s).ok())
                    .and_then(|s| s.parse::<u16>().ok())
                    .and_then(|s| StatusCode::from_u16(s).ok());
                // A resource only with its result code, as the record was stored.
                let resource = match (row.bytes(6)?, row.bytes(7)?) {
                    (Some(_), Some(_)) => Some(row.text(6)?),
                    _ => None,
                };
                let steps = decode_checkpoints(&row.key, row.bytes(8)?.unwrap_or_default())?;
                Ok(ExpiredRecord::new(key, fence, status, resource, steps))
            },
        )
        .await
    }

    async fn forget(&self, records: &[ExpiredRecord]) -> Result<u64, StoreError> {
        if records.is_empty() {
            return Ok(0);
        }
        // One script per bucket: a script's keys share one slot.
        let mut by_bucket: Vec<(&Index, Vec<(String, u64)>)> = Vec::new();
        for record in records {
            let (index, name, _) = self.keys.record(&record.key);
            let entry = (name, record.fence.get());
            match by_bucket.iter_mut().find(|(i, _)| std::ptr::eq(*i, index)) {
                Some((_, names)) => names.push(entry),
                None => by_bucket.push((index, vec![entry])),
            }
        }
        let mut conn = self.manager().await?;
        let mut forgotten = 0;
        for (index, names) in by_bucket {
            let mut invocation = SCRIPTS.forget.prepare_invoke();
            invocation.key(&index.ended);
            for (name, _) in &names {
                invocation.key(name);
            }
            for (_, fence) in &names {
                invocation.arg(*fence);
            }
            let n: i64 = invocation
                .invoke_async(&mut conn)
                .await
                .map_err(|e| at(&index.ended, e))?;
            forgotten += u64::try_from(n).unwrap_or(0);
        }
        Ok(forgotten)
    }

    async fn sweep(&self, keep_expired_for: Duration) -> Result<u64, StoreError> {
        let mut conn = self.manager().await?;
        let mut deleted = 0;
        for index in &self.keys.buckets {
            loop {
                let value: Value = SCRIPTS
                    .sweep
                    .key(&index.ended)
                    .arg(millis(keep_expired_for))
                    .arg(SWEEP_BATCH)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| at(&index.ended, e))?;
                let mut reply = Reply::new(&index.ended, value)?;
                deleted += u64::try_from(reply.int()?).unwrap_or(0);
                if u64::try_from(reply.int()?).unwrap_or(0) < SWEEP_BATCH {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Option<RecordView>, StoreError> {
        let (record, _, value) = self.run(&SCRIPTS.inspect, key, &[]).await?;
        inspected(&record, value)
    }

    async fn take_abandoned(
        &self,
        overdue_by: Duration,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<AbandonedRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut conn = self.manager().await?;
        let mut taken = Vec::new();
        // Each round starts at the next bucket, so that a busy one never starves the rest.
        let n = self.keys.buckets.len();
        let first = self
            .keys
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for i in 0..n {
            let left = limit - taken.len();
            if left == 0 {
                break;
            }
            let index = &self.keys.buckets[(first + i) % n];
            let mut invocation = SCRIPTS.take_abandoned.prepare_invoke();
            invocation
                .key(&index.leases)
                .key(&index.processing)
                .key(&index.leases_walked)
                .arg(lease_millis(lease))
                .arg(left.min(u32::MAX as usize))
                .arg(&index.base)
                .arg(lease_millis(overdue_by));
            let value: Value = invocation
                .invoke_async(&mut conn)
                .await
                .map_err(|e| at(&index.leases, e))?;
            let mut reply = Reply::new(&index.leases, value)?;
            reply.int()?;
            while let Some(row) = reply.next_row()? {
                let e = |why: BoxError| at(&row.key, why);
                let (tenant, operation, k) = (row.text(0)?, row.text(1)?, row.text(2)?);
                let k = IdempotencyKey::new(k).map_err(|x| e(x.into()))?;
                let fence = u64::try_from(row.number(3)?).map_err(|x| e(x.into()))?;
                let digest = row.bytes(5)?.unwrap_or_default();
                let digest = <[u8; 32]>::try_from(digest)
                    .map_err(|_| row.fail("its digest is not 32 bytes"))?;
                let steps = decode_checkpoints(&row.key, row.bytes(6)?.unwrap_or_default())?;
                taken.push(AbandonedRecord::new(
                    RecordKey::new(tenant, operation, k),
                    Fence::new(fence),
                    duration(row.number(7)?),
                    duration(row.number(8)?),
                    RequestDigest::from_bytes(digest),
                    steps,
                ));
            }
        }
        Ok(taken)
    }

    async fn stuck(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StuckRecord>, StoreError> {
        self.list(
            |i| &i.processing,
            older_than,
            limit,
            &["at"],
            &["p"],
            |row, key, fence, now| {
                let since = row.number(5)?;
                Ok(StuckRecord::new(
                    key,
                    fence,
                    duration(now.saturating_sub(since)),
                ))
            },
        )
        .await
    }
}
