//! The key itself: validation and generation.

use std::cell::RefCell;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use http::HeaderValue;
use rand::rngs::OsRng;
use rand::TryRngCore;

use super::key_error::InvalidKey;

/// The longest key accepted, in bytes.
pub(crate) const MAX_LEN: usize = 255;

/// A valid idempotency key: 1 to 255 bytes of visible ASCII (`0x21..=0x7E`).
///
/// The IETF `Idempotency-Key` draft leaves the format to the server and recommends a UUID or a
/// similar random identifier. This type accepts any key a server could read back unchanged:
/// **no space** (HTTP strips it at the ends of a header value, and servers differ on the middle),
/// no control character, nothing beyond ASCII, and at most 255 bytes (a common server limit;
/// Stripe's too). The header value is the key byte for byte: a caller's key written as a
/// structured-field string (`"abc"`, quotes included) is kept and compared as such.
///
/// The key holds its bytes as a [`HeaderValue`], so that the header a layer writes and the
/// key it keeps share one allocation; cloning a key does not allocate.
///
/// ```
/// use surely::idempotency::IdempotencyKey;
///
/// let key = IdempotencyKey::new("order-o-1").unwrap();
/// assert_eq!(key.as_str(), "order-o-1");
/// assert_eq!(key.to_header_value(), "order-o-1");
///
/// let fresh = IdempotencyKey::generate();
/// assert_eq!(fresh.as_str().len(), 36); // 8e03978e-40d5-43e8-bc93-6894a57f9324
/// assert!(IdempotencyKey::new("").is_err());
/// ```
#[derive(Clone)]
pub struct IdempotencyKey(HeaderValue);

impl IdempotencyKey {
    /// Validates `key`.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`] if `key` is empty, longer than 255 bytes, or holds a byte outside
    /// `0x21..=0x7E`.
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidKey> {
        let key = key.into();
        validate(key.as_bytes())?;
        // Visible ASCII is always a valid header value; this takes over the string's buffer.
        HeaderValue::try_from(key)
            .map(IdempotencyKey)
            .map_err(|_| InvalidKey::empty())
    }

    /// Validates a header value, such as a caller's `Idempotency-Key` header. Does not copy it.
    ///
    /// # Errors
    ///
    /// As for [`new`](Self::new).
    pub fn from_header_value(value: &HeaderValue) -> Result<Self, InvalidKey> {
        validate(value.as_bytes())?;
        Ok(IdempotencyKey(value.clone()))
    }

    /// A fresh random key: 122 random bits in the shape of a version 4 UUID, lower-case
    /// (`8e03978e-40d5-43e8-bc93-6894a57f9324`), the form the draft recommends and that servers
    /// which insist on UUIDs accept.
    ///
    /// The bits come from the operating system's cryptographically strong generator (read 32
    /// words at a time per thread), so that a key seen on the wire does not predict the next one
    /// (a server that scopes keys loosely could otherwise be fed a victim's next key). Should
    /// the operating system's entropy be unavailable, they come from std's random hasher keys
    /// instead; this never panics.
    pub fn generate() -> Self {
        let mut uuid = random_u128().to_be_bytes();
        uuid[6] = (uuid[6] & 0x0f) | 0x40; // version 4
        uuid[8] = (uuid[8] & 0x3f) | 0x80; // RFC 9562 variant
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut bytes = [0u8; 36];
        let mut at = 0;
        for (i, b) in uuid.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                bytes[at] = b'-';
                at += 1;
            }
            bytes[at] = HEX[usize::from(b >> 4)];
            bytes[at + 1] = HEX[usize::from(b & 0x0f)];
            at += 2;
        }
        // Hex digits and dashes are always a valid header value; the fallback is never taken.
        IdempotencyKey(
            HeaderValue::from_bytes(&bytes).unwrap_or_else(|_| {
                HeaderValue::from_static("00000000-0000-4000-8000-000000000000")
            }),
        )
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        // Visible ASCII only, so always a valid string.
        self.0.to_str().unwrap_or_default()
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The key as the value of an `Idempotency-Key` header. Shares the key's bytes: no
    /// allocation.
    pub fn to_header_value(&self) -> HeaderValue {
        self.0.clone()
    }
}

/// 1 to 255 bytes, each visible ASCII.
pub(crate) fn validate(key: &[u8]) -> Result<(), InvalidKey> {
    if key.is_empty() {
        return Err(InvalidKey::empty());
    }
    if key.len() > MAX_LEN {
        return Err(InvalidKey::too_long(key.len()));
    }
    match key.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        Some(position) => Err(InvalidKey::byte(position, key[position])),
        None => Ok(()),
    }
}

/// Random words read from the operating system at a time: one read serves 16 keys.
const BATCH: usize = 32;

thread_local! {
    /// Words read from the operating system and not handed out yet, and how many are left.
    static WORDS: RefCell<([u64; BATCH], usize)> = const { RefCell::new(([0; BATCH], 0)) };
}

/// 128 bits from the operating system's generator, read in batches per thread.
pub(crate) fn random_u128() -> u128 {
    let draw = |words: &mut ([u64; BATCH], usize)| {
        if words.1 < 2 {
            fill(&mut words.0);
            words.1 = BATCH;
        }
        words.1 -= 2;
        let (hi, lo) = (words.0[words.1 + 1], words.0[words.1]);
        // Handed out once: never left behind for a later reader of this memory.
        words.0[words.1] = 0;
        words.0[words.1 + 1] = 0;
        u128::from(hi) << 64 | u128::from(lo)
    };
    let one_off = || draw(&mut ([0; BATCH], 0));
    WORDS
        .try_with(|cell| match cell.try_borrow_mut() {
            Ok(mut words) => draw(&mut words),
            // Re-entered (it cannot be, but never panic): a one-off read.
            Err(_) => one_off(),
        })
        // The thread is tearing down its thread-locals: a one-off read.
        .unwrap_or_else(|_| one_off())
}

/// Fills `words` from the operating system; should its entropy be unavailable, from std's
/// per-process random hasher keys instead. Never panics.
fn fill(words: &mut [u64; BATCH]) {
    let mut bytes = [0u8; BATCH * 8];
    if OsRng.try_fill_bytes(&mut bytes).is_err() {
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            chunk.copy_from_slice(&state.hash_one(i).to_le_bytes());
        }
    }
    for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        *word = u64::from_le_bytes(b);
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyKey")
            .field(&self.as_str())
            .finish()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for IdempotencyKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for IdempotencyKey {}

impl PartialEq<str> for IdempotencyKey {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for IdempotencyKey {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Hash for IdempotencyKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl FromStr for IdempotencyKey {
    type Err = InvalidKey;

    fn from_str(s: &str) -> Result<Self, InvalidKey> {
        Self::new(s)
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(s: &str) -> Result<Self, InvalidKey> {
        Self::new(s)
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(s: String) -> Result<Self, InvalidKey> {
        Self::new(s)
    }
}

impl TryFrom<&HeaderValue> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(value: &HeaderValue) -> Result<Self, InvalidKey> {
        Self::from_header_value(value)
    }
}

impl From<IdempotencyKey> for HeaderValue {
    fn from(key: IdempotencyKey) -> Self {
        key.0
    }
}
