//! The forms' CSRF tokens: an HMAC-SHA256, under a secret each admin draws at random, of the
//! operator's name. A page from this admin carries the operator's token; a cross-site form
//! cannot read it.

use hmac::{Hmac, Mac};
use rand::TryRngCore;
use sha2::Sha256;

pub(super) struct Csrf {
    secret: [u8; 32],
}

impl Csrf {
    pub(super) fn new() -> Self {
        let mut secret = [0u8; 32];
        if rand::rngs::OsRng.try_fill_bytes(&mut secret).is_err() {
            // No secret to be had: every token is refused (an empty key is never used: the
            // check below refuses before it).
            secret = [0; 32];
        }
        Csrf { secret }
    }

    fn mac(&self, who: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(b"surely admin csrf\0");
        mac.update(who.as_bytes());
        mac
    }

    /// The token of `who`'s forms: 64 hex digits.
    pub(super) fn token(&self, who: &str) -> String {
        let tag = self.mac(who).finalize().into_bytes();
        tag.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `token` is `who`'s (compared in constant time).
    pub(super) fn check(&self, who: &str, token: &str) -> bool {
        if self.secret == [0; 32] || token.len() != 64 {
            return false;
        }
        let bytes: Option<Vec<u8>> = (0..32)
            .map(|i| u8::from_str_radix(token.get(2 * i..2 * i + 2)?, 16).ok())
            .collect();
        bytes.is_some_and(|b| self.mac(who).verify_slice(&b).is_ok())
    }
}
