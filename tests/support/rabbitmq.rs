//! The RabbitMQ broker the tests use: `SURELY_TEST_AMQP_URL`, or by default the one every
//! development and CI machine runs (`guest`, on 127.0.0.1:5672). A broker that does not answer
//! fails the tests, with the address they tried. Every test declares an exchange and a queue of
//! its own, named with [`super::names`], and deletes them at the end.

use surely::deps::lapin::message::Delivery;
use surely::deps::lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use surely::deps::lapin::types::FieldTable;
use surely::deps::lapin::uri::AMQPUri;
use surely::deps::lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use super::names::unique;

/// The variable that names the broker.
const VAR: &str = "SURELY_TEST_AMQP_URL";
/// The local broker of every development and CI machine.
const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The broker the tests use.
pub(crate) fn url() -> String {
    std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// The broker's address, `host:port`, for messages (the URL holds a password).
pub(crate) fn address() -> String {
    match url().parse::<AMQPUri>() {
        Ok(uri) => format!("{}:{}", uri.authority.host, uri.authority.port),
        Err(e) => panic!("{VAR} is not an AMQP URI: {e}"),
    }
}

/// The same broker, reached through `proxy` (`host:port`) instead.
pub(crate) fn url_through(proxy: std::net::SocketAddr) -> String {
    let uri: AMQPUri = url().parse().unwrap();
    let vhost = uri.vhost.replace('%', "%25").replace('/', "%2f");
    let user = &uri.authority.userinfo;
    format!("amqp://{}:{}@{proxy}/{vhost}", user.username, user.password)
}

/// A topic exchange and a queue of one test: `<prefix>_<suffix>` both; the queue is exclusive
/// to the test's connection (RabbitMQ deletes it with the connection), the exchange is deleted
/// by [`delete`](Self::delete).
pub(crate) struct Topology {
    pub(crate) connection: Connection,
    pub(crate) channel: Channel,
    pub(crate) exchange: String,
    pub(crate) queue: String,
}

impl Topology {
    /// Declares them, the queue bound with `binding` (a topic pattern: `#` takes every key)
    /// or not bound at all; fails `test`, naming the broker, if it does not answer.
    pub(crate) async fn new(test: &str, binding: Option<&str>) -> Topology {
        let connection = Connection::connect(&url(), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("{test}: RabbitMQ at {} did not answer: {e}", address()));
        let channel = connection.create_channel().await.unwrap();
        let name = unique("surely");
        let topology = Topology {
            connection,
            channel,
            exchange: name.clone(),
            queue: name,
        };
        topology.declare_exchange().await;
        let options = QueueDeclareOptions {
            exclusive: true,
            ..QueueDeclareOptions::default()
        };
        topology
            .channel
            .queue_declare(
                topology.queue.clone().into(),
                options,
                FieldTable::default(),
            )
            .await
            .unwrap();
        if let Some(binding) = binding {
            topology.bind(binding).await;
        }
        topology
    }

    /// Declares the exchange (again).
    async fn declare_exchange(&self) {
        self.channel
            .exchange_declare(
                self.exchange.clone().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ at {} refused an exchange: {e}", address()));
    }

    /// Binds the queue to the exchange with `binding`.
    pub(crate) async fn bind(&self, binding: &str) {
        self.channel
            .queue_bind(
                self.queue.clone().into(),
                self.exchange.clone().into(),
                binding.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    /// The next message in the queue, taken (acknowledged on delivery).
    pub(crate) async fn get(&self) -> Option<Delivery> {
        let options = BasicGetOptions { no_ack: true };
        self.channel
            .basic_get(self.queue.clone().into(), options)
            .await
            .unwrap()
            .map(|m| m.delivery)
    }

    /// Every message in the queue, taken.
    pub(crate) async fn drain(&self) -> Vec<Delivery> {
        let mut all = Vec::new();
        while let Some(delivery) = self.get().await {
            all.push(delivery);
        }
        all
    }

    /// Deletes the exchange, as a test that removes it under a publisher does.
    pub(crate) async fn delete_exchange(&self) {
        self.channel
            .exchange_delete(
                self.exchange.clone().into(),
                ExchangeDeleteOptions::default(),
            )
            .await
            .unwrap();
    }

    /// Declares the exchange again and binds the queue with `binding`.
    pub(crate) async fn redeclare(&self, binding: &str) {
        self.declare_exchange().await;
        self.bind(binding).await;
    }

    /// Deletes the queue and the exchange, and closes the connection.
    pub(crate) async fn delete(self) {
        self.channel
            .queue_delete(self.queue.clone().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        self.delete_exchange().await;
        let _ = self.connection.close(200, "OK".into()).await;
    }
}

/// `rabbitmqctl`'s list of connections, one a line: the connection's process id, then its
/// client properties (where the name it was given is).
async fn list_connections() -> String {
    let out = rabbitmqctl(&["-q", "list_connections", "pid", "client_properties"]).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// How many open connections carry the name `name`.
pub(crate) async fn connections_named(name: &str) -> usize {
    list_connections()
        .await
        .lines()
        .filter(|line| line.contains(name))
        .count()
}

/// Closes, from the broker's side, the connections named `name`; fails if there is none.
pub(crate) async fn close_connection(name: &str) {
    let listed = list_connections().await;
    let pids: Vec<&str> = listed
        .lines()
        .filter(|line| line.contains(name))
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(!pids.is_empty(), "no connection named {name}: {listed}");
    for pid in pids {
        rabbitmqctl(&["-q", "close_connection", pid, "closed by a test"]).await;
    }
}

/// Runs `rabbitmqctl` (on the machine of every developer and of CI, run as root), for at most
/// 30 seconds; fails if it fails.
async fn rabbitmqctl(args: &[&str]) -> Vec<u8> {
    let run = tokio::process::Command::new("rabbitmqctl")
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(30), run)
        .await
        .unwrap_or_else(|_| panic!("rabbitmqctl {args:?} took over 30 s"))
        .unwrap_or_else(|e| panic!("rabbitmqctl {args:?} could not run: {e}"));
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
