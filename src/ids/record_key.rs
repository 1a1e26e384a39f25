//! The address of one idempotency record (the server half's store key), bounded whatever the
//! client sends.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};

use super::IdempotencyKey;

/// The address of one idempotency record: the tenant, the operation, and the caller's key.
///
/// Two tenants that send the same key never meet: their records are different records. The same
/// key on two operations (`POST /orders` and `POST /refunds`) are different records too.
///
/// Clones share one allocation; the hash is computed once, when the key is made.
///
/// # Bounded, whatever the client sends
///
/// The tenant and the operation come from the request (a header, the path), so a client
/// chooses their length. A store keys records on them, and a store has limits (PostgreSQL's
/// btree refuses an index entry over 2 704 bytes), which must never turn a client's input into a
/// server error. So a tenant over 256 bytes or an operation over 1024 bytes (or either with a
/// NUL character, which PostgreSQL's text refuses) is kept as a readable prefix followed by
/// `~sha256:` and the hex SHA-256 digest of the whole value: bounded (to those 256 and 1024
/// bytes), still different for different values, and still readable by an operator.
///
/// ```
/// use surely::server::store::RecordKey;
/// use surely::idempotency::IdempotencyKey;
///
/// let key = IdempotencyKey::new("k-1").unwrap();
/// let a = RecordKey::new("tenant-a", "POST /orders", key.clone());
/// let b = RecordKey::new("tenant-b", "POST /orders", key.clone());
/// assert_ne!(a, b);
///
/// let long = format!("POST /search/{}", "x".repeat(3_000));
/// let c = RecordKey::new("tenant-a", long.clone(), key.clone());
/// assert!(c.operation().len() <= 1024);
/// assert!(c.operation().starts_with("POST /search/xxx"));
/// assert_eq!(c, RecordKey::new("tenant-a", long, key.clone()));
/// assert_ne!(c, RecordKey::new("tenant-a", format!("POST /search/{}", "x".repeat(3_001)), key));
/// ```
#[derive(Clone)]
pub struct RecordKey(Arc<KeyInner>);

struct KeyInner {
    /// Computed once, with a per-process random key (no hash flooding): the memory store hashes
    /// a record key once per request, not once per lookup.
    hash: u64,
    tenant: Box<str>,
    operation: Box<str>,
    key: IdempotencyKey,
}

/// The per-process hash key of record keys.
fn hash_key() -> &'static std::collections::hash_map::RandomState {
    static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    STATE.get_or_init(std::collections::hash_map::RandomState::new)
}

impl RecordKey {
    /// The record of `key`, sent by `tenant`, for `operation`. A tenant over 256 bytes or an
    /// operation over 1024 bytes, or either with a NUL, is kept bounded to that length (see
    /// [above](Self#bounded-whatever-the-client-sends)).
    pub fn new(
        tenant: impl Into<Box<str>>,
        operation: impl Into<Box<str>>,
        key: IdempotencyKey,
    ) -> Self {
        use std::hash::BuildHasher;
        let tenant = bounded(tenant.into(), MAX_TENANT_BYTES);
        let operation = bounded(operation.into(), MAX_OPERATION_BYTES);
        let hash = hash_key().hash_one((&*tenant, &*operation, key.as_bytes()));
        RecordKey(Arc::new(KeyInner {
            hash,
            tenant,
            operation,
            key,
        }))
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.0.tenant
    }

    /// The operation, such as `POST /orders`.
    pub fn operation(&self) -> &str {
        &self.0.operation
    }

    /// The caller's key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.0.key
    }

    /// The key's hash, computed once (per-process random key).
    pub(crate) fn hash_value(&self) -> u64 {
        self.0.hash
    }
}

/// The longest tenant a [`RecordKey`] keeps as it is, in bytes.
pub(crate) const MAX_TENANT_BYTES: usize = 256;

/// The longest operation a [`RecordKey`] keeps as it is, in bytes.
pub(crate) const MAX_OPERATION_BYTES: usize = 1024;

/// `~sha256:` and 64 hex digits.
const DIGEST_SUFFIX_BYTES: usize = 8 + 64;

/// `value` if it is at most `max` bytes and has no NUL; otherwise a prefix of it (cut on a
/// character boundary) followed by `~sha256:` and the hex digest of the whole value, `max` bytes
/// at most.
#[inline]
fn bounded(value: Box<str>, max: usize) -> Box<str> {
    if value.len() <= max && !value.as_bytes().contains(&0) {
        return value;
    }
    digested(&value, max)
}

#[cold]
fn digested(value: &str, max: usize) -> Box<str> {
    let mut cut = value.len().min(max - DIGEST_SUFFIX_BYTES);
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    let prefix = value[..cut].replace('\0', " ");
    let digest = Sha256::digest(value.as_bytes());
    let mut out = String::with_capacity(max);
    out.push_str(&prefix);
    out.push_str("~sha256:");
    for b in digest {
        use std::fmt::Write as _;
        let _ = write!(out, "{b:02x}");
    }
    out.into_boxed_str()
}

impl PartialEq for RecordKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.hash == other.0.hash
                && self.0.tenant == other.0.tenant
                && self.0.operation == other.0.operation
                && self.0.key == other.0.key)
    }
}

impl Eq for RecordKey {}

impl Hash for RecordKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

impl fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordKey")
            .field("tenant", &self.0.tenant)
            .field("operation", &self.0.operation)
            .field("key", &self.0.key.as_str())
            .finish()
    }
}

/// A fencing token: the number of times a record has been acquired. Each takeover raises it by
/// one, and a store refuses a completion whose fence is not the record's current one.
///
/// The server layer puts the owner's token in the handler's request extensions (inside a
/// [`Ticket`](crate::server::idempotency::Ticket)), so that a handler can guard its own writes
/// with it (`UPDATE ... WHERE fence < $token`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(u64);

impl Fence {
    /// A fence with this value. Stores number the first owner 1.
    pub fn new(value: u64) -> Self {
        Fence(value)
    }

    /// The value.
    pub fn get(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    #[test]
    fn long_or_nul_values_are_bounded_and_told_apart() {
        for (value, max) in [
            ("a\0b".to_owned(), MAX_TENANT_BYTES),
            ("é".repeat(600), MAX_TENANT_BYTES),
            ("x".repeat(100_000), MAX_OPERATION_BYTES),
            ("x".repeat(MAX_OPERATION_BYTES + 1), MAX_OPERATION_BYTES),
        ] {
            let out = bounded(value.clone().into_boxed_str(), max);
            assert!(out.len() <= max, "{}", out.len());
            assert!(!out.contains('\0'));
            assert!(out.contains("~sha256:"));
            let other = bounded(format!("{value}!").into_boxed_str(), max);
            assert_ne!(out, other);
        }
        let kept = "x".repeat(MAX_TENANT_BYTES);
        assert_eq!(
            &*bounded(kept.clone().into_boxed_str(), MAX_TENANT_BYTES),
            kept
        );
    }
}
