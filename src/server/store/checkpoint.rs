//! Checkpoints: an owner's step progress, kept on its record.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Fence, RecordKey};

/// The most checkpoints a record keeps. A handler records a handful of steps (the payment
/// channel's request id, the stock reservation's id); more than this is a handler writing a log
/// into its record.
pub(crate) const MAX_CHECKPOINTS: usize = 16;

/// The longest checkpoint name, in bytes.
const MAX_NAME_BYTES: usize = 64;

/// The longest checkpoint value, in bytes.
const MAX_VALUE_BYTES: usize = 512;

/// One step an owner recorded on its record: a name (`charge`, `reserve`) and a value (the
/// external system's request id, say), fenced by the owner's [`Fence`].
///
/// Checkpoints are what a [recovery hook](crate::server::idempotency::IdempotencyLayerBuilder::recover)
/// reads after a takeover, to ask the external system what became of the step instead of running
/// it again. They are small by construction: a name of 1 to 64 bytes of ASCII letters, digits
/// and `_ - . :`, a value of at most 512 bytes of text without control characters, at most 16
/// on a record. Binary values are encoded by the caller (hex, base64); a value that breaks
/// these rules is refused with [`InvalidCheckpoint`], before any store sees it.
///
/// ```
/// use surely::server::store::Checkpoint;
///
/// let step = Checkpoint::new("charge", "ch_3MmlLrLkdIwHu7ix").unwrap();
/// assert_eq!(step.name(), "charge");
/// assert_eq!(step.value(), "ch_3MmlLrLkdIwHu7ix");
///
/// let err = Checkpoint::new("charge", "a\u{0}b").unwrap_err();
/// assert_eq!(err.to_string(), "checkpoint `charge`: its value has a control character at byte 1");
/// assert!(Checkpoint::new("", "x").is_err());
/// assert!(Checkpoint::new("charge", "x".repeat(513)).is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Checkpoint(Arc<Inner>);

#[derive(PartialEq, Eq)]
struct Inner {
    name: Box<str>,
    value: Box<str>,
}

/// A checkpoint that breaks the rules of [`Checkpoint`]: what it is and why, in its message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidCheckpoint(String);

impl Checkpoint {
    /// A checkpoint named `name` with `value`.
    ///
    /// # Errors
    ///
    /// The name is empty, over 64 bytes, or has a byte other than ASCII letters, digits and
    /// `_ - . :`; the value is over 512 bytes or has a control character.
    pub fn new(
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<Self, InvalidCheckpoint> {
        let (name, value) = (name.into(), value.into());
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            return Err(InvalidCheckpoint(format!(
                "a checkpoint name is 1 to {MAX_NAME_BYTES} bytes; this one has {}",
                name.len()
            )));
        }
        if let Some(at) = name
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || b"_-.:".contains(&b)))
        {
            return Err(InvalidCheckpoint(format!(
                "a checkpoint name is ASCII letters, digits and `_ - . :`; this one has another \
                 byte at {at}"
            )));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(InvalidCheckpoint(format!(
                "checkpoint `{name}`: its value is {} bytes, over the limit of {MAX_VALUE_BYTES}",
                value.len()
            )));
        }
        if let Some((at, _)) = value.char_indices().find(|(_, c)| c.is_control()) {
            return Err(InvalidCheckpoint(format!(
                "checkpoint `{name}`: its value has a control character at byte {at}"
            )));
        }
        Ok(Checkpoint(Arc::new(Inner {
            name: name.into(),
            value: value.into(),
        })))
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// What the owner recorded for it.
    pub fn value(&self) -> &str {
        &self.0.value
    }

    /// Refuses one more checkpoint on a record that holds `held` already.
    pub(crate) fn room_after(held: usize) -> Result<(), InvalidCheckpoint> {
        if held >= MAX_CHECKPOINTS {
            Err(InvalidCheckpoint(format!(
                "a record keeps at most {MAX_CHECKPOINTS} checkpoints"
            )))
        } else {
            Ok(())
        }
    }
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}", self.name(), self.value())
    }
}

/// The latest value recorded under `name` in `checkpoints`, oldest first.
pub(crate) fn latest<'a>(checkpoints: &'a [Checkpoint], name: &str) -> Option<&'a str> {
    checkpoints
        .iter()
        .rev()
        .find(|c| c.name() == name)
        .map(Checkpoint::value)
}

/// A record whose outcome is unknown: its owner's work may have taken effect, and nobody has
/// settled it yet. Listed by [`IdempotencyStore::unknowns`](super::IdempotencyStore::unknowns).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct UnknownRecord {
    /// Its scope: tenant, operation, key.
    pub key: RecordKey,
    /// The fence of the owner that found it unknown: what settles it.
    pub fence: Fence,
    /// Why it is unknown, as the owner (or its recovery hook) wrote it.
    pub evidence: String,
    /// The steps its owners recorded, oldest first.
    pub checkpoints: Vec<Checkpoint>,
    /// How long ago it became unknown.
    pub age: Duration,
}

impl UnknownRecord {
    /// An unknown record; for stores of your own.
    pub fn new(
        key: RecordKey,
        fence: Fence,
        evidence: impl Into<String>,
        checkpoints: Vec<Checkpoint>,
        age: Duration,
    ) -> Self {
        UnknownRecord {
            key,
            fence,
            evidence: evidence.into(),
            checkpoints,
            age,
        }
    }

    /// The latest value recorded under `name`.
    pub fn checkpoint(&self, name: &str) -> Option<&str> {
        latest(&self.checkpoints, name)
    }
}
