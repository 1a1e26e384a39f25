//! Idempotency key errors.

use std::fmt;

use super::key::MAX_LEN;

/// An idempotency key was rejected: it was empty, longer than 255 bytes, held a byte that is not
/// visible ASCII (`0x21..=0x7E`: no space, no control character, nothing beyond ASCII), or the
/// request carried the `Idempotency-Key` header more than once.
///
/// As the error of a call (through [`Error::invalid_key`](crate::Error::invalid_key)) it is
/// *final* and *not sent*: the request never reached the inner service, and sending it again
/// would fail the same way.
///
/// ```
/// use surely::idempotency::IdempotencyKey;
///
/// let err = IdempotencyKey::new("order 1").unwrap_err();
/// assert_eq!(err.invalid_byte(), Some((5, b' ')));
/// assert_eq!(
///     err.to_string(),
///     "invalid idempotency key: byte 0x20 at position 5 is not visible ascii (0x21..=0x7e)",
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// Word-aligned: as a variant of every `surely::Error`, copied with every poll's output, a
// payload that starts at a word boundary is copied in whole words.
#[repr(align(8))]
pub struct InvalidKey {
    reason: Reason,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Empty,
    TooLong(usize),
    Byte { position: usize, byte: u8 },
    Repeated,
}

impl InvalidKey {
    pub(super) fn empty() -> Self {
        InvalidKey {
            reason: Reason::Empty,
        }
    }

    pub(super) fn too_long(len: usize) -> Self {
        InvalidKey {
            reason: Reason::TooLong(len),
        }
    }

    pub(super) fn byte(position: usize, byte: u8) -> Self {
        InvalidKey {
            reason: Reason::Byte { position, byte },
        }
    }

    pub(crate) fn repeated() -> Self {
        InvalidKey {
            reason: Reason::Repeated,
        }
    }

    /// Whether the key was empty.
    pub fn is_empty(&self) -> bool {
        matches!(self.reason, Reason::Empty)
    }

    /// The key's length in bytes, if it was longer than the limit of 255.
    pub fn len_over_limit(&self) -> Option<usize> {
        match self.reason {
            Reason::TooLong(len) => Some(len),
            _ => None,
        }
    }

    /// The position (in bytes, from zero) and value of the first byte that is not visible ASCII,
    /// if that is what was wrong.
    pub fn invalid_byte(&self) -> Option<(usize, u8)> {
        match self.reason {
            Reason::Byte { position, byte } => Some((position, byte)),
            _ => None,
        }
    }

    /// Whether the request carried more than one `Idempotency-Key` header, so that the server
    /// would have seen a list of keys rather than one key.
    pub fn is_repeated(&self) -> bool {
        matches!(self.reason, Reason::Repeated)
    }
}

impl fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid idempotency key: ")?;
        match self.reason {
            Reason::Empty => f.write_str("empty"),
            Reason::TooLong(len) => write!(f, "{len} bytes long, at most {MAX_LEN} allowed"),
            Reason::Byte { position, byte } => write!(
                f,
                "byte {byte:#04x} at position {position} is not visible ascii (0x21..=0x7e)"
            ),
            Reason::Repeated => f.write_str("the idempotency-key header appears more than once"),
        }
    }
}

impl std::error::Error for InvalidKey {}
