//! The NATS JetStream publisher.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_nats::jetstream;
use tower_service::Service;

use super::Event;
use crate::classify::BoxError;

/// Publishes outbox events to NATS JetStream, as a `tower::Service<Event>` for a
/// [`Relay`](super::Relay) (feature `nats`).
///
/// Each event goes to the subject `prefix.kind` (`orders.OrderCreated`) with its
/// [id](Event::id) as `Nats-Msg-Id`, so that JetStream's duplicate window drops a second publish
/// of it (a relay that crashed before marking it, a lost acknowledgement), and with the event's
/// headers beside `Surely-Aggregate`, `Surely-Version` and `Surely-Kind`. The call answers once
/// JetStream acknowledged the publish: the event is then stored by a stream (or was a
/// duplicate of one stored, which [`Published::duplicate`] says). No stream takes the subject,
/// or no acknowledgement in time: an error, and the relay publishes it again later.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use surely::outbox::{JetStreamPublisher, MemoryOutbox, Relay};
///
/// let client = async_nats::connect("nats://127.0.0.1:4222").await?;
/// let jetstream = async_nats::jetstream::new(client);
/// let publisher = JetStreamPublisher::new(jetstream, "orders");
/// let relay = Relay::builder(MemoryOutbox::new(), publisher).build()?;
/// relay.run(std::future::pending()).await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct JetStreamPublisher {
    jetstream: jetstream::Context,
    prefix: Arc<str>,
}

impl JetStreamPublisher {
    /// Publishes on `jetstream`, to `prefix.kind`.
    pub fn new(jetstream: jetstream::Context, prefix: impl Into<Arc<str>>) -> Self {
        JetStreamPublisher {
            jetstream,
            prefix: prefix.into(),
        }
    }
}

impl fmt::Debug for JetStreamPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamPublisher")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// What JetStream acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Published {
    /// The stream that stored it.
    pub stream: String,
    /// Its sequence in the stream.
    pub sequence: u64,
    /// Whether JetStream had it already (same `Nats-Msg-Id` within its duplicate window), and
    /// dropped this copy.
    pub duplicate: bool,
}

/// The headers the publisher writes beside the event's own.
const OWN_HEADERS: [&str; 4] = [
    "Nats-Msg-Id",
    "Surely-Aggregate",
    "Surely-Version",
    "Surely-Kind",
];

impl Event {
    /// The event a [`JetStreamPublisher`] published, read back from the message a consumer
    /// received (feature `nats`).
    ///
    /// # Errors
    ///
    /// [`InvalidEvent`](super::InvalidEvent) if the message lacks the headers the publisher
    /// writes (`Nats-Msg-Id`, `Surely-Aggregate`, `Surely-Version`, `Surely-Kind`), or one
    /// does not parse: it was not published by a relay.
    ///
    /// A NATS header map does not keep the order between different names, so the event's own
    /// headers come back sorted by name; the values of one name keep their order.
    pub fn from_nats(message: &async_nats::Message) -> Result<Event, super::InvalidEvent> {
        let missing = super::InvalidEvent::message;
        let headers = message
            .headers
            .as_ref()
            .ok_or(missing("the message has no headers: no relay published it"))?;
        let get = |name: &str| headers.get(name).map(|v| v.as_str().to_owned());
        let id = headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str().to_owned())
            .ok_or(missing("the message has no Nats-Msg-Id"))?;
        let version = get("Surely-Version")
            .and_then(|v| v.parse::<i64>().ok())
            .ok_or(missing("the message has no Surely-Version that parses"))?;
        let mut event = Event::new(
            super::EventId::new(id)?,
            get("Surely-Aggregate").ok_or(missing("the message has no Surely-Aggregate"))?,
            version,
            get("Surely-Kind").ok_or(missing("the message has no Surely-Kind"))?,
            message.payload.clone(),
        )?;
        let mut names: Vec<&str> = headers
            .iter()
            .map(|(name, _)| name.as_ref())
            .filter(|name: &&str| !OWN_HEADERS.iter().any(|own| own.eq_ignore_ascii_case(name)))
            .collect();
        names.sort_unstable();
        for name in names {
            for value in headers.get_all(name) {
                event = event.with_header(name, value.as_str())?;
            }
        }
        Ok(event)
    }
}

impl Service<Event> for JetStreamPublisher {
    type Response = Published;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Published, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, event: Event) -> Self::Future {
        let jetstream = self.jetstream.clone();
        let subject = format!("{}.{}", self.prefix, event.kind());
        Box::pin(async move {
            let mut headers = async_nats::HeaderMap::new();
            for (name, value) in event.headers() {
                // NATS acts on its `Nats-` headers (a second `Nats-Msg-Id` would replace the
                // event's), and the publisher writes the `Surely-` ones.
                if name.len() >= 5
                    && (name[..5].eq_ignore_ascii_case("nats-")
                        || name.len() >= 7 && name[..7].eq_ignore_ascii_case("surely-"))
                {
                    return Err(format!(
                        "event not published: its header `{name}` is one NATS or the publisher writes"
                    )
                    .into());
                }
                headers.append(name.as_str(), value.as_str());
            }
            headers.insert(async_nats::header::NATS_MESSAGE_ID, event.id().as_str());
            headers.insert("Surely-Aggregate", event.aggregate());
            headers.insert("Surely-Version", event.version().to_string().as_str());
            headers.insert("Surely-Kind", event.kind());
            let ack = jetstream
                .publish_with_headers(subject, headers, event.payload().clone())
                .await?
                .await?;
            Ok(Published {
                stream: ack.stream,
                sequence: ack.sequence,
                duplicate: ack.duplicate,
            })
        })
    }
}
