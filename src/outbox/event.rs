//! Events and their ids.

use std::fmt;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};

/// An event's stable id: the same on every publish of the event, so that a broker that
/// deduplicates by id (NATS JetStream's `Nats-Msg-Id`) or a consumer's inbox drops a second
/// copy. 1 to 255 bytes of visible ASCII, like an idempotency key, since it travels as one.
///
/// ```
/// use surely::outbox::EventId;
///
/// // Derived from what the event is about: the same order's creation always has the same id.
/// let a = EventId::derive("order o-1", "OrderCreated");
/// assert_eq!(a, EventId::derive("order o-1", "OrderCreated"));
/// assert_ne!(a, EventId::derive("order o-1", "OrderShipped"));
/// assert!(a.as_str().starts_with("evt-"));
///
/// // Or given.
/// assert!(EventId::new("order-o-1-created").is_ok());
/// assert!(EventId::new("two words").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    /// A given id.
    ///
    /// # Errors
    ///
    /// [`InvalidEvent`] if it is empty, longer than 255 bytes, or holds a byte outside
    /// `0x21..=0x7E`.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidEvent> {
        let id = id.into();
        if id.is_empty() || id.len() > 255 || !id.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(InvalidEvent(
                "the event id must be 1 to 255 bytes of visible ASCII",
            ));
        }
        Ok(EventId(id))
    }

    /// The id of the event of `kind` about `business_key` (`"order o-1"`, `"OrderCreated"`):
    /// `evt-` and 32 hex digits of a SHA-256 over both. Stable across processes and versions.
    pub fn derive(business_key: &str, kind: &str) -> Self {
        let mut hash = Sha256::new();
        // Length-prefixed, so that ("ab", "c") and ("a", "bc") differ.
        hash.update((business_key.len() as u64).to_be_bytes());
        hash.update(business_key.as_bytes());
        hash.update(kind.as_bytes());
        let digest = hash.finalize();
        let mut id = String::with_capacity(36);
        id.push_str("evt-");
        for b in digest.iter().take(16) {
            use std::fmt::Write as _;
            let _ = write!(id, "{b:02x}");
        }
        EventId(id)
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An event to publish: what happened (its kind), to which aggregate and at which version, with
/// headers and an opaque payload (bytes: the crate requires no serialisation format).
///
/// ```
/// use surely::outbox::{Event, EventId};
///
/// let event = Event::new(
///     EventId::derive("order o-1", "OrderCreated"),
///     "order o-1",
///     1,
///     "OrderCreated",
///     r#"{"order":"o-1","sku":"sku-42","qty":1}"#,
/// )
/// .unwrap()
/// .with_header("content-type", "application/json")
/// .unwrap();
/// assert_eq!(event.kind(), "OrderCreated");
/// assert_eq!(event.version(), 1);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    id: EventId,
    aggregate: String,
    version: i64,
    kind: String,
    headers: Vec<(String, String)>,
    payload: Bytes,
}

impl Event {
    /// An event. The aggregate is 1 to 255 bytes without a control character; the kind is 1 to
    /// 255 ASCII letters, digits, `_`, `-` or `.` (it names a subject or a header on the
    /// wire); the version is the aggregate's version after the change (consumers order by it).
    ///
    /// # Errors
    ///
    /// [`InvalidEvent`] for an empty or over-long aggregate or kind, a control character in the
    /// aggregate, or another character in the kind.
    pub fn new(
        id: EventId,
        aggregate: impl Into<String>,
        version: i64,
        kind: impl Into<String>,
        payload: impl Into<Bytes>,
    ) -> Result<Self, InvalidEvent> {
        let (aggregate, kind) = (aggregate.into(), kind.into());
        if aggregate.is_empty() || aggregate.len() > 255 {
            return Err(InvalidEvent("the aggregate must be 1 to 255 bytes"));
        }
        if aggregate.chars().any(char::is_control) {
            return Err(InvalidEvent("the aggregate must have no control character"));
        }
        if kind.is_empty() || kind.len() > 255 {
            return Err(InvalidEvent("the kind must be 1 to 255 bytes"));
        }
        if !kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(InvalidEvent(
                "the kind must be ASCII letters, digits, `_`, `-` or `.`",
            ));
        }
        Ok(Event {
            id,
            aggregate,
            version,
            kind,
            headers: Vec::new(),
            payload: payload.into(),
        })
    }

    /// The same event with one more header.
    ///
    /// # Errors
    ///
    /// [`InvalidEvent`] for a name that is not 1 to 255 bytes of visible ASCII, or a value
    /// with a control character.
    pub fn with_header(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self, InvalidEvent> {
        let (name, value) = (name.into(), value.into());
        if name.is_empty() || name.len() > 255 || !name.bytes().all(|b| (0x21..=0x7e).contains(&b))
        {
            return Err(InvalidEvent(
                "a header name must be 1 to 255 bytes of visible ASCII",
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(InvalidEvent(
                "a header value must have no control character",
            ));
        }
        self.headers.push((name, value));
        Ok(self)
    }

    /// The id.
    pub fn id(&self) -> &EventId {
        &self.id
    }

    /// The aggregate it is about.
    pub fn aggregate(&self) -> &str {
        &self.aggregate
    }

    /// The aggregate's version after the change.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// What happened.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The headers, in the order given.
    pub fn headers(&self) -> &[(String, String)] {
        &self.headers
    }

    /// The payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// Rebuilds an event as a store read it back (already validated when it was written).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn from_parts(
        id: EventId,
        aggregate: String,
        version: i64,
        kind: String,
        headers: Vec<(String, String)>,
        payload: Bytes,
    ) -> Self {
        Event {
            id,
            aggregate,
            version,
            kind,
            headers,
            payload,
        }
    }
}

/// An event (or its id) was refused: it says what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid event: {0}")]
pub struct InvalidEvent(&'static str);

impl InvalidEvent {
    /// A message that lacks what makes it an event: `why` says what.
    #[cfg_attr(not(any(feature = "nats", feature = "rabbitmq")), allow(dead_code))]
    pub(crate) fn message(why: &'static str) -> Self {
        InvalidEvent(why)
    }
}
