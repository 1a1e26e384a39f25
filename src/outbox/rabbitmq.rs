//! The RabbitMQ publisher: publisher confirms, mandatory publishes, the event id as message id.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use lapin::message::{BasicReturnMessage, Delivery};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind, PublisherConfirm,
};
use tokio::sync::{mpsc, oneshot, Mutex};
use tokio::time::Instant;
use tower_service::Service;

use super::{Event, EventId, InvalidEvent};
use crate::time::later;
use crate::ConfigError;

/// The aggregate the event is about.
const AGGREGATE: &str = "surely-aggregate";
/// The aggregate's version after the change (a signed 64-bit integer).
const VERSION: &str = "surely-version";
/// What happened.
const KIND: &str = "surely-kind";

/// AMQP's persistent delivery mode: a durable queue keeps the message across a broker restart.
const PERSISTENT: u8 = 2;

/// Publishes outbox events to a RabbitMQ exchange, as a `tower::Service<Event>` for a
/// [`Relay`](super::Relay) (feature `rabbitmq`).
///
/// Each event is one message, published on a channel in **publisher confirm** mode:
///
/// * to the publisher's exchange, with the routing key `prefix.kind` (`orders.OrderCreated`),
///   or the kind alone without a [prefix](RabbitPublisherBuilder::routing_prefix);
/// * **mandatory**: a message that no queue takes comes back to the publisher (`basic.return`)
///   instead of vanishing, and the publish fails;
/// * persistent (delivery mode 2), with the event's [id](Event::id) as **message id**;
/// * with the headers `surely-aggregate`, `surely-version` (an integer) and `surely-kind` beside
///   the event's own (a repeated name is one header holding an array of its values, in order),
///   and the event's `content-type` header, if it has one, as the message's content type too.
///
/// The call answers `Ok` once RabbitMQ **confirmed** the message: routed to every queue the
/// exchange's bindings chose, and, for a durable queue, written to disk. Anything else is a
/// [`RabbitError`], and the relay publishes the event again after its wait, then quarantines
/// it after its limit:
///
/// * no queue took it: RabbitMQ returned it ([`RabbitError::is_returned`]), and then confirmed
///   it, which is **not** a publish;
/// * RabbitMQ refused it (a negative confirm, [`RabbitError::is_nacked`]);
/// * no confirm within the [timeout](RabbitPublisherBuilder::timeout)
///   ([`RabbitError::is_timeout`]): the message may have been routed, and goes out again;
/// * the channel or the connection closed (a missing exchange closes the channel; a broker
///   restart, the connection): the next call opens a new channel, or a new connection, so the
///   publisher recovers by itself once RabbitMQ is back;
/// * an event that cannot be written as a message ([`RabbitError::is_invalid_event`]): a header
///   the publisher writes itself or that RabbitMQ acts on (`surely-*`; `CC` and `BCC`, which
///   route the message to more queues; `x-delay`; the `x-death` family and `x-delivery-count`,
///   which RabbitMQ writes), a routing key or content type over 255 bytes, headers too large
///   for one AMQP frame. Nothing is sent.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use surely::outbox::{MemoryOutbox, RabbitPublisher, Relay};
///
/// let publisher = RabbitPublisher::builder("amqp://guest:guest@127.0.0.1:5672/%2f", "orders")
///     .routing_prefix("orders")
///     .timeout(Duration::from_secs(5))
///     .connect()
///     .await?;
/// let relay = Relay::builder(MemoryOutbox::new(), publisher).build()?;
/// relay.run(std::future::pending()).await;
/// # Ok(()) }
/// ```
///
/// # Duplicates
///
/// RabbitMQ keeps no duplicate window: unlike JetStream with `Nats-Msg-Id`, it stores every copy
/// of a message it is given. An event goes out again, with the same message id, whenever its
/// confirm was lost (a timeout, a connection that dropped after RabbitMQ routed it) or the relay
/// crashed before it marked it. So the consumer must drop copies by message id: the crate's
/// [inbox](crate::inbox) does, keyed by the event id that [`Event::from_amqp`] reads back. See
/// [`docs::boundary`](crate::docs::boundary).
///
/// # Readiness
///
/// Always ready. Calls publish one after the other on one channel, in the order their futures
/// first run (a relay's batch in its order, so that it reaches a queue in order), and await
/// their confirms together. The publisher is cheap to clone: clones share the connection and
/// the channel.
///
/// # The confirm of a returned message
///
/// RabbitMQ sends the `basic.return` of an unroutable message before its confirm, and lapin hands
/// the returned message to the next confirm that arrives. With several publishes in flight,
/// that can be another publish's confirm (acknowledgements may cover several messages at once).
/// The publisher does not trust that pairing: it matches each returned message to its publish
/// by message id, and settles a publish only after every confirm that arrived with it was
/// seen, so a returned event never counts as published. A call dropped while its message is
/// being sent (a timeout in front of the publisher) takes its confirm with it, and perhaps
/// another publish's return: the publishes then in flight on the channel fail as unknown, and
/// the next call opens a new channel.
#[derive(Clone)]
pub struct RabbitPublisher {
    shared: Arc<Shared>,
}

/// Builds a [`RabbitPublisher`].
#[derive(Clone)]
#[must_use]
pub struct RabbitPublisherBuilder {
    uri: String,
    exchange: String,
    prefix: Option<String>,
    timeout: Duration,
    properties: ConnectionProperties,
}

struct Shared {
    uri: AMQPUri,
    properties: ConnectionProperties,
    exchange: ShortString,
    prefix: Option<String>,
    timeout: Duration,
    /// The connection and channel publishes go out on; `None` until one is opened again.
    link: Mutex<Option<Link>>,
}

/// A connection, its channel in confirm mode, and the task that settles the channel's confirms.
#[derive(Clone)]
struct Link {
    connection: Arc<Connection>,
    channel: Channel,
    confirms: mpsc::UnboundedSender<Registration>,
    /// Publishes issued on the channel.
    issued: Arc<AtomicU64>,
    /// Set when a confirm did not come in time, or a publish was abandoned: the next call
    /// opens a new channel.
    stale: Arc<AtomicBool>,
}

impl Link {
    fn usable(&self) -> bool {
        !self.stale.load(Ordering::Relaxed)
            && self.connection.status().connected()
            && self.channel.status().connected()
    }
}

impl RabbitPublisher {
    /// A builder for a publisher to `exchange` on the broker at `uri`
    /// (`amqp://user:password@host:5672/%2f`; `%2f` is the default virtual host, `/`).
    /// Defaults: the routing key is the event's kind, and a publish waits 5 s for RabbitMQ.
    ///
    /// The exchange is yours to declare (and to bind queues to); `""`, RabbitMQ's default
    /// exchange, routes by queue name.
    pub fn builder(uri: impl Into<String>, exchange: impl Into<String>) -> RabbitPublisherBuilder {
        RabbitPublisherBuilder {
            uri: uri.into(),
            exchange: exchange.into(),
            prefix: None,
            timeout: Duration::from_secs(5),
            properties: ConnectionProperties::default(),
        }
    }

    /// The exchange it publishes to.
    pub fn exchange(&self) -> &str {
        self.shared.exchange.as_str()
    }
}

impl RabbitPublisherBuilder {
    /// Routes each event with the key `prefix.kind` instead of the kind alone.
    pub fn routing_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// How long a publish waits for RabbitMQ (default 5 s): to open the connection or channel
    /// when it needs to, then for the confirm. A confirm that does not come in time fails the
    /// publish (the message may have been routed: it goes out again, a copy the consumer drops),
    /// and the next publish opens a new channel. At most [`MAX_DURATION`](crate::MAX_DURATION)
    /// (ten years): [`connect`](Self::connect) refuses a longer one, and a zero one.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// lapin's connection properties: the connection's name as RabbitMQ shows it, an
    /// authentication provider. Leave lapin's automatic recovery off: the publisher opens a new
    /// connection itself when the one it has closed.
    pub fn properties(mut self, properties: ConnectionProperties) -> Self {
        self.properties = properties;
        self
    }

    /// Validates, connects, opens a channel in confirm mode, and checks that the exchange
    /// exists.
    ///
    /// # Errors
    ///
    /// A URI that does not parse, an exchange name over 255 bytes or a routing prefix over
    /// 254, a timeout that is zero or over [`MAX_DURATION`](crate::MAX_DURATION)
    /// ([`RabbitError::is_config`], its [`ConfigError`] naming `"RabbitMQ publish timeout"`);
    /// RabbitMQ not answering (within the timeout), refusing the connection, or having no such
    /// exchange.
    pub async fn connect(self) -> Result<RabbitPublisher, RabbitError> {
        let uri: AMQPUri = self
            .uri
            .parse()
            .map_err(|e| RabbitError { kind: Kind::Uri(e) })?;
        let exchange = ShortString::try_new(self.exchange).map_err(|_| {
            RabbitError::config(ConfigError::new(
                "RabbitMQ exchange",
                "must be at most 255 bytes",
            ))
        })?;
        if self.prefix.as_ref().is_some_and(|p| p.len() > 254) {
            return Err(RabbitError::config(ConfigError::new(
                "RabbitMQ routing prefix",
                "must be at most 254 bytes",
            )));
        }
        let timeout = ConfigError::positive_at_most_max("RabbitMQ publish timeout", self.timeout)
            .map_err(RabbitError::config)?;
        let shared = Shared {
            uri,
            properties: self.properties,
            exchange,
            prefix: self.prefix,
            timeout,
            link: Mutex::new(None),
        };
        let deadline = later(Instant::now(), shared.timeout);
        let link = within(deadline, shared.timeout, false, shared.open(None)).await??;
        if !shared.exchange.as_str().is_empty() {
            // RabbitMQ closes the channel if there is none: the first publish opens another.
            let passive = ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            };
            let declared = link.channel.exchange_declare(
                shared.exchange.clone(),
                ExchangeKind::Direct,
                passive,
                FieldTable::default(),
            );
            within(deadline, shared.timeout, false, declared)
                .await?
                .map_err(RabbitError::connect)?;
        }
        *shared.link.lock().await = Some(link);
        Ok(RabbitPublisher {
            shared: Arc::new(shared),
        })
    }
}

impl Shared {
    /// A usable link: the current one, or a new channel on its connection, or a new
    /// connection.
    async fn open(&self, old: Option<Link>) -> Result<Link, RabbitError> {
        let connection = match old.map(|l| l.connection) {
            Some(c) if c.status().connected() => c,
            _ => Arc::new(
                Connection::connect_uri(self.uri.clone(), self.properties.clone())
                    .await
                    .map_err(RabbitError::connect)?,
            ),
        };
        let channel = connection
            .create_channel()
            .await
            .map_err(RabbitError::connect)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(RabbitError::connect)?;
        let (confirms, incoming) = mpsc::unbounded_channel();
        let issued = Arc::new(AtomicU64::new(0));
        tokio::spawn(Confirms {
            incoming,
            open: true,
            waiting: Vec::new(),
            returned: HashMap::new(),
            issued: issued.clone(),
            handed: 0,
            looks: 0,
            poisoned: false,
        });
        Ok(Link {
            connection,
            channel,
            confirms,
            issued,
            stale: Arc::new(AtomicBool::new(false)),
        })
    }

    async fn publish(&self, event: Event) -> Result<(), RabbitError> {
        let message = Message::of(&event, self.prefix.as_deref())?;
        let deadline = later(Instant::now(), self.timeout);
        // Publishes go out one at a time, in call order; their confirms are awaited together.
        let mut current = within(deadline, self.timeout, false, self.link.lock()).await?;
        let link = match current.take() {
            Some(link) if link.usable() => link,
            old => within(deadline, self.timeout, false, self.open(old)).await??,
        };
        *current = Some(link.clone());
        let frame_max = link.connection.configuration().frame_max() as usize;
        if message.header_frame > frame_max {
            return Err(RabbitError::invalid(format!(
                "its headers take {} bytes, more than the {frame_max} of one AMQP frame",
                message.header_frame
            )));
        }
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        link.issued.fetch_add(1, Ordering::SeqCst);
        let handover = Handover {
            confirms: link.confirms.clone(),
            stale: link.stale.clone(),
            done: false,
        };
        let sent = link.channel.basic_publish(
            self.exchange.clone(),
            message.routing_key,
            options,
            event.payload(),
            message.properties,
        );
        let confirm = match within(deadline, self.timeout, true, sent).await? {
            Ok(confirm) => confirm,
            Err(e) => return Err(RabbitError::send(e)),
        };
        let (reply, settled) = oneshot::channel();
        let waiting = Waiting {
            id: event.id().clone(),
            confirm,
            result: None,
            seen: 0,
            issued: 0,
            reply: Some(reply),
        };
        // Handed over before the next publish is issued: in the order they were issued.
        let handed = handover.send(waiting);
        drop(current);
        if !handed {
            return Err(RabbitError::lost("the publisher's confirm task has ended"));
        }
        match within(deadline, self.timeout, true, settled).await {
            Ok(Ok(Settled::Ack)) => Ok(()),
            Ok(Ok(Settled::Nack)) => Err(RabbitError { kind: Kind::Nacked }),
            Ok(Ok(Settled::Returned { code, text })) => Err(RabbitError {
                kind: Kind::Returned { code, text },
            }),
            Ok(Ok(Settled::Failed(e))) => Err(RabbitError {
                kind: Kind::Unconfirmed(e),
            }),
            Ok(Ok(Settled::Abandoned)) => Err(RabbitError::lost(
                "another publish on its channel was abandoned before its confirm, which may \
                 have carried this one's return",
            )),
            Ok(Err(_)) => Err(RabbitError::lost("the publisher's confirm task has ended")),
            Err(e) => {
                link.stale.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}

/// `future`, or a timeout error at `deadline`; `sent`: whether the message may have gone out.
async fn within<F: Future>(
    deadline: Instant,
    timeout: Duration,
    sent: bool,
    future: F,
) -> Result<F::Output, RabbitError> {
    tokio::time::timeout_at(deadline, future)
        .await
        .map_err(|_| RabbitError {
            kind: Kind::Timeout { timeout, sent },
        })
}

/// An event written as an AMQP message.
struct Message {
    routing_key: ShortString,
    properties: BasicProperties,
    /// The size of the content header frame that carries the properties: it must fit in one
    /// frame, which RabbitMQ would otherwise answer by closing the connection.
    header_frame: usize,
}

/// Whether RabbitMQ acts on a header named so when it routes a message (`CC`, `BCC`, the
/// delayed-message plugin's `x-delay`), writes one itself (dead-lettering's, quorum queues'),
/// or the publisher writes it (`surely-*`).
fn reserved(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(
        name.as_str(),
        "cc" | "bcc" | "x-delay" | "x-death" | "x-delivery-count"
    ) || ["surely-", "x-first-death-", "x-last-death-"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
}

/// The encoded size of a field table entry holding a long string (`S`: 1 byte of type, 4 of
/// length).
fn text_entry(name: &str, values: &[&str]) -> usize {
    let value = |v: &str| 1 + 4 + v.len();
    1 + name.len()
        + match values {
            [one] => value(one),
            many => 1 + 4 + many.iter().map(|v| value(v)).sum::<usize>(),
        }
}

impl Message {
    fn of(event: &Event, prefix: Option<&str>) -> Result<Message, RabbitError> {
        let key = match prefix {
            Some(prefix) => format!("{prefix}.{}", event.kind()),
            None => event.kind().to_owned(),
        };
        let routing_key = ShortString::try_new(key).map_err(|_| {
            RabbitError::invalid("its routing key (the prefix and its kind) is over 255 bytes")
        })?;
        let mut names: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut content_type = None;
        for (name, value) in event.headers() {
            if reserved(name) {
                return Err(RabbitError::invalid(format!(
                    "its header `{name}` is one RabbitMQ or the publisher writes"
                )));
            }
            if name.eq_ignore_ascii_case("content-type") && content_type.is_none() {
                content_type = Some(value.as_str());
            }
            names.entry(name).or_default().push(value);
        }
        // The frame's 8 bytes; class, weight, body size and property flags; delivery mode;
        // message id; the headers table's length.
        let mut header_frame = 8 + 14 + 1 + (1 + event.id().as_str().len()) + 4;
        let mut headers = FieldTable::default();
        for (name, values) in names {
            header_frame += text_entry(name, &values);
            let value = match values.as_slice() {
                [one] => text(one),
                many => {
                    AMQPValue::FieldArray(many.iter().map(|v| text(v)).collect::<Vec<_>>().into())
                }
            };
            // The event's header names are at most 255 bytes.
            let name = ShortString::try_new(name)
                .map_err(|_| RabbitError::invalid("a header name is over 255 bytes"))?;
            headers.insert(name, value);
        }
        header_frame += text_entry(AGGREGATE, &[event.aggregate()]);
        header_frame += text_entry(KIND, &[event.kind()]);
        header_frame += 1 + VERSION.len() + 1 + 8;
        headers.insert(AGGREGATE.into(), text(event.aggregate()));
        headers.insert(VERSION.into(), AMQPValue::LongLongInt(event.version()));
        headers.insert(KIND.into(), text(event.kind()));
        let mut properties = BasicProperties::default()
            // An event id is at most 255 bytes.
            .with_message_id(
                ShortString::try_new(event.id().as_str())
                    .map_err(|_| RabbitError::invalid("its id is over 255 bytes"))?,
            )
            .with_delivery_mode(PERSISTENT)
            .with_headers(headers);
        if let Some(content_type) = content_type {
            header_frame += 1 + content_type.len();
            properties = properties.with_content_type(
                ShortString::try_new(content_type)
                    .map_err(|_| RabbitError::invalid("its content type is over 255 bytes"))?,
            );
        }
        Ok(Message {
            routing_key,
            properties,
            header_frame,
        })
    }
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes()))
}

impl Event {
    /// The event a [`RabbitPublisher`] published, read back from the message a consumer
    /// received (`basic.deliver` or `basic.get`; feature `rabbitmq`).
    ///
    /// # Errors
    ///
    /// [`InvalidEvent`] if the message lacks what the publisher writes (a message id, the
    /// headers `surely-aggregate`, `surely-version`, `surely-kind`), or one does not parse: a
    /// header that is not text (or an array of texts) in UTF-8, a version that is not an
    /// integer. It was not published by a relay.
    ///
    /// An AMQP header table keeps its names sorted, so the event's own headers come back
    /// sorted by name; the values of one name keep their order.
    pub fn from_amqp(delivery: &Delivery) -> Result<Event, InvalidEvent> {
        let missing = InvalidEvent::message;
        let properties = &delivery.properties;
        let id = properties
            .message_id()
            .as_ref()
            .ok_or(missing("the message has no message id"))?;
        let headers = properties
            .headers()
            .as_ref()
            .ok_or(missing("the message has no headers: no relay published it"))?
            .inner();
        let get = |name: &str, why: &'static str| match headers.get(name) {
            Some(AMQPValue::LongString(s)) => utf8(s).ok_or(missing(why)),
            _ => Err(missing(why)),
        };
        let version = match headers.get(VERSION) {
            Some(AMQPValue::LongLongInt(v)) => *v,
            Some(AMQPValue::LongInt(v)) => i64::from(*v),
            Some(AMQPValue::ShortInt(v)) => i64::from(*v),
            Some(AMQPValue::ShortShortInt(v)) => i64::from(*v),
            Some(AMQPValue::LongUInt(v)) => i64::from(*v),
            Some(AMQPValue::ShortUInt(v)) => i64::from(*v),
            Some(AMQPValue::ShortShortUInt(v)) => i64::from(*v),
            _ => {
                return Err(missing(
                    "the message has no surely-version that is an integer",
                ))
            }
        };
        let mut event = Event::new(
            EventId::new(id.as_str())?,
            get(
                AGGREGATE,
                "the message has no surely-aggregate in UTF-8 text",
            )?,
            version,
            get(KIND, "the message has no surely-kind in UTF-8 text")?,
            delivery.data.clone(),
        )?;
        let not_text = "a header of the message is not UTF-8 text or an array of it";
        for (name, value) in headers {
            if [AGGREGATE, VERSION, KIND].contains(&name.as_str()) {
                continue;
            }
            match value {
                AMQPValue::LongString(s) => {
                    event = event.with_header(name.as_str(), utf8(s).ok_or(missing(not_text))?)?;
                }
                AMQPValue::FieldArray(values) => {
                    for value in values.as_slice() {
                        let AMQPValue::LongString(s) = value else {
                            return Err(missing(not_text));
                        };
                        event =
                            event.with_header(name.as_str(), utf8(s).ok_or(missing(not_text))?)?;
                    }
                }
                _ => return Err(missing(not_text)),
            }
        }
        Ok(event)
    }
}

fn utf8(s: &LongString) -> Option<String> {
    std::str::from_utf8(s.as_bytes()).ok().map(str::to_owned)
}

impl Service<Event> for RabbitPublisher {
    type Response = ();
    type Error = RabbitError;
    type Future = Pin<Box<dyn Future<Output = Result<(), RabbitError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), RabbitError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, event: Event) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { shared.publish(event).await })
    }
}

/// A publish handed to the confirm task, or one abandoned between being sent and being
/// handed over (its call failed or was dropped).
enum Registration {
    Sent(Waiting),
    Abandoned,
}

/// A publish sent, waiting for its confirm.
struct Waiting {
    id: EventId,
    confirm: PublisherConfirm,
    /// The confirm, once it came: acknowledged (`true`) or not.
    result: Option<Result<bool, lapin::Error>>,
    /// The look that saw the confirm, and how many publishes had been issued by then.
    seen: u64,
    issued: u64,
    reply: Option<oneshot::Sender<Settled>>,
}

/// What became of a publish.
enum Settled {
    Ack,
    Nack,
    Returned { code: u16, text: String },
    Failed(lapin::Error),
    Abandoned,
}

/// Hands a sent publish to the confirm task, or, if its call ends first, tells the task that
/// it was abandoned.
struct Handover {
    confirms: mpsc::UnboundedSender<Registration>,
    stale: Arc<AtomicBool>,
    done: bool,
}

impl Handover {
    fn send(mut self, waiting: Waiting) -> bool {
        self.done = true;
        self.confirms.send(Registration::Sent(waiting)).is_ok()
    }
}

impl Drop for Handover {
    fn drop(&mut self) {
        if !self.done {
            self.stale.store(true, Ordering::Relaxed);
            let _ = self.confirms.send(Registration::Abandoned);
        }
    }
}

/// The task that settles a channel's publishes: it polls every confirm, pairs each message
/// RabbitMQ returned with its publish by message id, and answers each call. It ends once the
/// channel's link is dropped and every publish is settled (a channel that closes fails its
/// confirms).
///
/// lapin hands a returned message to the first confirm it resolves after the return, which
/// need not be the returned publish's own: an acknowledgement of several messages resolves
/// them in no set order, and a publish confirmed alone may come between the return and the
/// returned one's confirm. Either way the confirm that carries it was resolved before the
/// returned publish's own was seen, and belongs to a publish issued by then. So a publish is
/// settled only once every publish issued when its confirm was seen has been handed over, and
/// every confirm has been looked at again since: the message was recorded by then.
///
/// A publish abandoned between being sent and being handed over takes its confirm with it,
/// and with it perhaps another publish's returned message: every publish of the channel then
/// settles as unknown (and the channel is not used again).
struct Confirms {
    incoming: mpsc::UnboundedReceiver<Registration>,
    open: bool,
    waiting: Vec<Waiting>,
    /// Returned messages by message id, until their publish is settled.
    returned: HashMap<String, Vec<(u16, String)>>,
    /// Publishes issued on the channel (counted before each is sent), and handed over.
    issued: Arc<AtomicU64>,
    handed: u64,
    looks: u64,
    poisoned: bool,
}

impl Confirms {
    fn receive(&mut self, cx: &mut Context<'_>) {
        while self.open {
            match self.incoming.poll_recv(cx) {
                Poll::Ready(Some(registration)) => {
                    self.handed += 1;
                    match registration {
                        Registration::Sent(w) => self.waiting.push(w),
                        Registration::Abandoned => self.poisoned = true,
                    }
                }
                Poll::Ready(None) => self.open = false,
                Poll::Pending => break,
            }
        }
    }

    /// Polls the confirms not yet seen; records the returned messages they carry.
    fn look(&mut self, cx: &mut Context<'_>) {
        self.looks += 1;
        for w in self.waiting.iter_mut().filter(|w| w.result.is_none()) {
            if let Poll::Ready(confirmation) = Pin::new(&mut w.confirm).poll(cx) {
                w.seen = self.looks;
                w.issued = self.issued.load(Ordering::SeqCst);
                w.result = Some(confirmation.map(|c| {
                    let ack = !c.is_nack();
                    if let Some(message) = c.take_message() {
                        record(&mut self.returned, message);
                    }
                    ack
                }));
            }
        }
    }

    /// Settles the publishes whose confirm came, and whose pairing is known.
    fn settle(&mut self, handed: u64) {
        let (looks, poisoned) = (self.looks, self.poisoned);
        let returned = &mut self.returned;
        self.waiting.retain_mut(|w| {
            let settled = if poisoned {
                Settled::Abandoned
            } else if w.seen < looks && w.issued <= handed {
                let by_id = returned.get_mut(w.id.as_str());
                match (by_id.and_then(Vec::pop), w.result.take()) {
                    (Some((code, text)), _) => Settled::Returned { code, text },
                    (None, Some(Ok(true))) => Settled::Ack,
                    (None, Some(Ok(false))) => Settled::Nack,
                    (None, Some(Err(e))) => Settled::Failed(e),
                    (None, None) => return true,
                }
            } else {
                return true;
            };
            if returned.get(w.id.as_str()).is_some_and(Vec::is_empty) {
                returned.remove(w.id.as_str());
            }
            if let Some(reply) = w.reply.take() {
                // A call that timed out has gone: nobody to tell.
                let _ = reply.send(settled);
            }
            false
        });
        if poisoned {
            self.returned.clear();
        }
    }
}

fn record(returned: &mut HashMap<String, Vec<(u16, String)>>, message: BasicReturnMessage) {
    match message.delivery.properties.message_id() {
        Some(id) => returned
            .entry(id.to_string())
            .or_default()
            .push((message.reply_code, message.reply_text.to_string())),
        None => tracing::warn!("RabbitMQ returned a message without a message id"),
    }
}

impl Future for Confirms {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.receive(cx);
        let handed = this.handed;
        this.look(cx);
        this.settle(handed);
        if this.waiting.iter().any(|w| w.seen == this.looks) {
            // Confirms seen on this look are settled after the next one.
            cx.waker().wake_by_ref();
        }
        if !this.open && this.waiting.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisher")
            .field("exchange", &self.shared.exchange.as_str())
            .field("routing_prefix", &self.shared.prefix)
            .field("timeout", &self.shared.timeout)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RabbitPublisherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not the URI: it holds the password.
        f.debug_struct("RabbitPublisherBuilder")
            .field("exchange", &self.exchange)
            .field("routing_prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A RabbitMQ publish failed, or the publisher could not be built. See [`RabbitPublisher`].
///
/// Its message says what failed; lapin's error, when there is one, is its
/// [`source`](std::error::Error::source) (and [`broker_error`](Self::broker_error)), not part
/// of the message.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RabbitError {
    kind: Kind,
}

#[derive(Debug, thiserror::Error)]
enum Kind {
    #[error(transparent)]
    Config(ConfigError),
    #[error("invalid RabbitMQ URI: {0}")]
    Uri(String),
    #[error("event not sent to RabbitMQ: {0}")]
    Invalid(String),
    #[error("event not published: RabbitMQ returned it, no queue took it ({code} {text})")]
    Returned { code: u16, text: String },
    #[error("event not published: RabbitMQ refused it (a negative confirm)")]
    Nacked,
    #[error("event {} within {timeout:?}", timed_out(*.sent))]
    Timeout { timeout: Duration, sent: bool },
    #[error("RabbitMQ connection or channel failed")]
    Connect(#[source] lapin::Error),
    #[error("event not sent to RabbitMQ: the publish failed")]
    Send(#[source] lapin::Error),
    #[error("event publish unknown: the channel failed before RabbitMQ confirmed it")]
    Unconfirmed(#[source] lapin::Error),
    #[error("event publish unknown: {0}")]
    Lost(&'static str),
}

/// What a failed publish means to a classifier (`RabbitError` is a
/// [`TransportError`](crate::TransportError), so it is [`ClassifyError`](crate::classify::ClassifyError)
/// too: the retry layer, a breaker or a relay's classifier around the publisher read it):
///
/// | the failure | class | phase |
/// | --- | --- | --- |
/// | a setting, a URI or an event RabbitMQ would never take | final | not sent |
/// | returned: no queue takes its routing key (`312 NO_ROUTE`) | final | answered |
/// | a negative confirm: refused, not stored | rejected (send it again) | answered |
/// | no connection or channel, or the publish failed before it went out | rejected | not sent |
/// | no channel in time | rejected | not sent |
/// | no confirm in time, or the channel failed after the publish | maybe committed | sent |
///
/// A maybe-committed event goes out again with the same message id, and the consumer drops
/// the copy.
///
/// ```
/// use surely::classify::{AttemptClass, ClassifyError, DeliveryPhase};
/// use surely::outbox::RabbitPublisher;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// // A URI that is not AMQP: final, never sent.
/// let err = RabbitPublisher::builder("http://127.0.0.1:5672", "orders")
///     .connect()
///     .await
///     .err()
///     .unwrap();
/// let c = err.classify_error(DeliveryPhase::Sent);
/// assert_eq!((c.class(), c.phase()), (AttemptClass::Final, DeliveryPhase::NotSent));
/// # }
/// ```
impl crate::TransportError for RabbitError {
    fn classify(&self, _phase: crate::classify::DeliveryPhase) -> crate::classify::Classification {
        use crate::classify::{AttemptClass, Classification, DeliveryPhase};
        match &self.kind {
            Kind::Config(_) | Kind::Uri(_) | Kind::Invalid(_) => {
                Classification::new(AttemptClass::Final, DeliveryPhase::NotSent)
            }
            Kind::Returned { .. } => {
                Classification::new(AttemptClass::Final, DeliveryPhase::ResponseStarted)
            }
            Kind::Nacked => {
                Classification::new(AttemptClass::Rejected, DeliveryPhase::ResponseStarted)
            }
            Kind::Timeout { sent: false, .. } | Kind::Connect(_) | Kind::Send(_) => {
                Classification::new(AttemptClass::Rejected, DeliveryPhase::NotSent)
            }
            Kind::Timeout { sent: true, .. } | Kind::Unconfirmed(_) | Kind::Lost(_) => {
                Classification::new(AttemptClass::MaybeCommitted, DeliveryPhase::Sent)
            }
        }
    }
}

fn timed_out(sent: bool) -> &'static str {
    if sent {
        "publish unknown: no confirm from RabbitMQ"
    } else {
        "not published: no RabbitMQ channel"
    }
}

impl RabbitError {
    fn config(error: ConfigError) -> Self {
        RabbitError {
            kind: Kind::Config(error),
        }
    }

    fn invalid(why: impl Into<String>) -> Self {
        RabbitError {
            kind: Kind::Invalid(why.into()),
        }
    }

    fn connect(error: lapin::Error) -> Self {
        RabbitError {
            kind: Kind::Connect(error),
        }
    }

    fn send(error: lapin::Error) -> Self {
        RabbitError {
            kind: Kind::Send(error),
        }
    }

    fn lost(why: &'static str) -> Self {
        RabbitError {
            kind: Kind::Lost(why),
        }
    }

    /// Whether no queue took the message: RabbitMQ returned it (`basic.return`, `312
    /// NO_ROUTE`). Publishing it again fails the same way until a queue is bound that takes
    /// its routing key.
    pub fn is_returned(&self) -> bool {
        matches!(self.kind, Kind::Returned { .. })
    }

    /// Whether RabbitMQ refused the message with a negative confirm (an internal error of the
    /// queue that should have taken it).
    pub fn is_nacked(&self) -> bool {
        matches!(self.kind, Kind::Nacked)
    }

    /// Whether the publish ran out of time: no channel in time (nothing sent), or no confirm
    /// in time (the message may have been routed).
    pub fn is_timeout(&self) -> bool {
        matches!(self.kind, Kind::Timeout { .. })
    }

    /// Whether the message may have reached a queue although the publish failed: no confirm
    /// in time, or the channel failed after the message was sent. The event goes out again
    /// with the same message id, and the consumer drops the copy.
    pub fn is_unknown(&self) -> bool {
        matches!(
            self.kind,
            Kind::Timeout { sent: true, .. } | Kind::Unconfirmed(_) | Kind::Lost(_)
        )
    }

    /// Whether the event could not be written as an AMQP message (a header the publisher
    /// writes or RabbitMQ acts on, a routing key or content type over 255 bytes, headers too
    /// large for a frame): nothing was sent, and publishing it again fails the same way, so the
    /// relay quarantines it after its limit.
    pub fn is_invalid_event(&self) -> bool {
        matches!(self.kind, Kind::Invalid(_))
    }

    /// Whether the publisher's settings were refused (by
    /// [`connect`](RabbitPublisherBuilder::connect)).
    pub fn is_config(&self) -> bool {
        matches!(self.kind, Kind::Config(_) | Kind::Uri(_))
    }

    /// lapin's error, when the connection, the channel or the publish failed in lapin or in
    /// RabbitMQ (a missing exchange, a closed connection).
    pub fn broker_error(&self) -> Option<&lapin::Error> {
        match &self.kind {
            Kind::Connect(e) | Kind::Send(e) | Kind::Unconfirmed(e) => Some(e),
            _ => None,
        }
    }
}
