//! What the layer stores of a response, and how it reads it back for a replay.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::Full;

use super::layer::Config;
use super::{ErrorCode, IDEMPOTENT_REPLAYED};
use crate::classify::BoxError;
use crate::server::store::{flag, ExpiredRecord, RecordKey, StoredResponse};

/// Seals a stored body for encryption at rest, and opens it for a replay: the layer's
/// [`seal`](super::IdempotencyLayerBuilder::seal).
///
/// The record's key is given as the associated data of an AEAD: a sealed body then opens only
/// under its own record, and a body copied onto another record is refused. The status, the
/// headers kept for the replay, and a reference's resource and code are stored in clear: keep
/// secrets out of headers, or leave them out with
/// [`never_store_headers`](super::IdempotencyLayerBuilder::never_store_headers).
///
/// A seal that fails to seal leaves the response unstored (as a store that fails does: the client
/// still gets its answer, and the record waits out its lease); one that fails to open answers
/// the duplicate `500` with [`ErrorCode::ReplayFailed`].
///
/// ```
/// use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
/// use chacha20poly1305::{ChaCha20Poly1305, Nonce};
/// use surely::classify::BoxError;
/// use surely::server::idempotency::Seal;
/// use surely::server::store::RecordKey;
///
/// /// ChaCha20-Poly1305 with a random nonce per body, written before the ciphertext.
/// struct AtRest(ChaCha20Poly1305);
///
/// fn aad(record: &RecordKey) -> Vec<u8> {
///     format!("{}\0{}\0{}", record.tenant(), record.operation(), record.key().as_str()).into_bytes()
/// }
///
/// impl Seal for AtRest {
///     fn seal(&self, record: &RecordKey, plain: &[u8]) -> Result<Vec<u8>, BoxError> {
///         let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
///         let aad = aad(record);
///         let sealed = self.0.encrypt(&nonce, Payload { msg: plain, aad: &aad })
///             .map_err(|_| "sealing failed")?;
///         Ok([nonce.as_slice(), &sealed].concat())
///     }
///
///     fn open(&self, record: &RecordKey, sealed: &[u8]) -> Result<Vec<u8>, BoxError> {
///         if sealed.len() < 12 {
///             return Err("sealed body too short".into());
///         }
///         let (nonce, sealed) = sealed.split_at(12);
///         let aad = aad(record);
///         Ok(self.0.decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad: &aad })
///             .map_err(|_| "sealed body does not open under this key and record")?)
///     }
/// }
///
/// let key = ChaCha20Poly1305::generate_key(&mut OsRng); // from your key store, in production
/// let layer = surely::server::idempotency::IdempotencyLayer::builder(
///     surely::server::store::MemoryStore::new(),
/// )
/// .seal(AtRest(ChaCha20Poly1305::new(&key)))
/// .build()
/// .unwrap();
/// # let _ = layer;
/// ```
pub trait Seal: Send + Sync + 'static {
    /// `plain`, sealed for `record`.
    ///
    /// # Errors
    ///
    /// Sealing failed; the response is not stored.
    fn seal(&self, record: &RecordKey, plain: &[u8]) -> Result<Vec<u8>, BoxError>;

    /// What [`seal`](Self::seal) sealed for `record`.
    ///
    /// # Errors
    ///
    /// The bytes do not open (another key, another record, tampered with).
    fn open(&self, record: &RecordKey, sealed: &[u8]) -> Result<Vec<u8>, BoxError>;
}

/// What a handler puts in its response's extensions to have the layer store a **reference**
/// instead of the response: the resource the request made and a stable result code. A
/// duplicate then gets an answer that the layer's
/// [rebuild hook](super::IdempotencyLayerBuilder::rebuild) builds from the resource as it is
/// now. Ignored by a layer without a rebuild hook, which stores the full response.
///
/// ```
/// use surely::server::idempotency::Reference;
///
/// let mut res = http::Response::new("{\"id\":\"o-1\",\"state\":\"new\"}");
/// res.extensions_mut().insert(Reference::new("orders/o-1", "created"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Reference {
    resource: Box<str>,
    code: Box<str>,
}

impl Reference {
    /// The `resource` the request made, and its stable `result_code`.
    pub fn new(resource: impl Into<Box<str>>, result_code: impl Into<Box<str>>) -> Self {
        Reference {
            resource: resource.into(),
            code: result_code.into(),
        }
    }
}

/// How the answer a handler returned differs from the one it stored itself.
#[derive(Debug)]
pub(super) struct Differences {
    /// The stored status, if it is not the one returned.
    pub(super) stored_status: Option<StatusCode>,
    /// The headers (among those the layer stores) whose values differ, or that one of the two
    /// has and the other has not.
    pub(super) headers: Vec<http::HeaderName>,
    /// Whether the bodies differ.
    pub(super) body: bool,
}

/// The rebuild hook, boxed.
pub(super) type RebuildFn = dyn Fn(RecordKey, StoredResponse) -> Pin<Box<dyn Future<Output = Response<Bytes>> + Send>>
    + Send
    + Sync;

/// The archive hook, boxed.
pub(super) type ArchiveFn = dyn Fn(Vec<ExpiredRecord>) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>
    + Send
    + Sync;

/// The stored-size limit's default: 1 MiB.
pub(super) const DEFAULT_MAX_STORED: usize = 1 << 20;

impl<St> Config<St> {
    /// What to store of the handler's response: a reference when the handler gave one and the
    /// layer can rebuild from it; else the response, its body left out past the size limit,
    /// compressed and sealed as configured.
    pub(super) fn to_store(
        &self,
        key: &RecordKey,
        head: &http::response::Parts,
        body: &Bytes,
    ) -> Result<StoredResponse, BoxError> {
        if self.rebuild.is_some()
            && let Some(reference) = head.extensions.get::<Reference>()
        {
            return Ok(StoredResponse::reference(
                head.status,
                reference.resource.clone(),
                reference.code.clone(),
            ));
        }
        self.encode(key, head.status, &head.headers, body)
    }

    /// A full response as the layer stores it: headers it never stores left out, the body
    /// left out past the size limit, compressed and sealed as configured.
    pub(super) fn encode(
        &self,
        key: &RecordKey,
        status: StatusCode,
        headers: &http::HeaderMap,
        body: &Bytes,
    ) -> Result<StoredResponse, BoxError> {
        let (mut bytes, mut flags) = (body.clone(), 0);
        if body.len() > self.max_stored {
            (bytes, flags) = (Bytes::new(), flag::OMITTED);
        } else {
            if let Some(over) = self.compress_over
                && bytes.len() >= over
            {
                let packed = compress(&bytes)?;
                if packed.len() < bytes.len() {
                    bytes = packed;
                    flags |= flag::COMPRESSED;
                }
            }
            if let Some(seal) = &self.seal {
                bytes = Bytes::from(seal.seal(key, &bytes)?);
                flags |= flag::SEALED;
            }
        }
        Ok(StoredResponse::encoded(
            status,
            headers,
            bytes,
            flags,
            &self.never_store,
        ))
    }

    /// How the answer leaving the handler (`head`, `body`) differs from `stored`, the answer the
    /// handler stored itself: the status, the headers the layer stores (every one but those it
    /// never stores), and the body (already read whole, to store it); `None` if it does not.
    /// A reference is compared by its status alone: it keeps no headers nor body.
    pub(super) fn differences(
        &self,
        stored: &StoredResponse,
        head: &http::response::Parts,
        body: &Bytes,
    ) -> Option<Differences> {
        let status = (stored.status() != head.status).then_some(stored.status());
        if stored.resource().is_some() {
            return status.map(|stored| Differences {
                stored_status: Some(stored),
                headers: Vec::new(),
                body: false,
            });
        }
        let kept = |name: &http::HeaderName| {
            crate::server::store::replayable(name) && !self.never_store.contains(name)
        };
        let (a, b) = (stored.headers(), &head.headers);
        let mut headers: Vec<http::HeaderName> = Vec::new();
        for name in a.keys().chain(b.keys()) {
            if kept(name)
                && !headers.contains(name)
                && !a.get_all(name).iter().eq(b.get_all(name).iter())
            {
                headers.push(name.clone());
            }
        }
        // A body the handler gave already encoded (compressed, sealed) is not comparable.
        let body = stored.flags() == 0 && stored.body() != body;
        (status.is_some() || !headers.is_empty() || body).then_some(Differences {
            stored_status: status,
            headers,
            body,
        })
    }

    /// The replay of `stored`: rebuilt from its reference, or its body read back.
    pub(super) async fn replay(
        &self,
        key: &RecordKey,
        stored: StoredResponse,
    ) -> Response<Full<Bytes>> {
        let mut res = match self.read_back(key, stored).await {
            Ok(res) => res,
            Err(e) => {
                tracing::error!(
                    ?key,
                    error = &*e as &dyn std::error::Error,
                    "stored idempotency response not replayed"
                );
                return super::service::error(
                    &self.problems,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    ErrorCode::ReplayFailed,
                    "the stored response for this idempotency key could not be read back",
                );
            }
        };
        res.headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        res
    }

    async fn read_back(
        &self,
        key: &RecordKey,
        stored: StoredResponse,
    ) -> Result<Response<Full<Bytes>>, BoxError> {
        let flags = stored.flags();
        if flags & !flag::KNOWN != 0 {
            return Err(
                format!("stored with flags {flags:#04x} this version does not know").into(),
            );
        }
        if stored.resource().is_some() {
            let Some(rebuild) = &self.rebuild else {
                return Err("stored as a reference, and the layer has no rebuild hook".into());
            };
            let (head, body) = rebuild(key.clone(), stored).await.into_parts();
            return Ok(Response::from_parts(head, Full::new(body)));
        }
        let mut body = stored.body().clone();
        if flags & flag::OMITTED != 0 {
            body = Bytes::new();
        }
        if flags & flag::SEALED != 0 {
            let seal = self
                .seal
                .as_ref()
                .ok_or("stored sealed, and the layer has no seal to open it")?;
            body = Bytes::from(seal.open(key, &body)?);
        }
        if flags & flag::COMPRESSED != 0 {
            body = decompress(&body, self.max_stored)?;
        }
        let mut res = Response::new(Full::new(body));
        *res.status_mut() = stored.status();
        *res.headers_mut() = stored.headers().clone();
        if flags & flag::OMITTED != 0 {
            res.headers_mut().insert(
                crate::headers::REPLAY_BODY_OMITTED,
                HeaderValue::from_static("true"),
            );
        }
        Ok(res)
    }
}

#[cfg(feature = "compression")]
fn compress(body: &[u8]) -> Result<Bytes, BoxError> {
    use std::io::Write as _;
    let mut packer = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    packer.write_all(body)?;
    Ok(Bytes::from(packer.finish()?))
}

#[cfg(not(feature = "compression"))]
fn compress(body: &[u8]) -> Result<Bytes, BoxError> {
    Ok(Bytes::copy_from_slice(body))
}

/// Inflates `body`, refusing more than `max` bytes (a stored body is never larger).
#[cfg(feature = "compression")]
fn decompress(body: &[u8], max: usize) -> Result<Bytes, BoxError> {
    use std::io::Read as _;
    let mut out = Vec::new();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    flate2::read::DeflateDecoder::new(body)
        .take(limit)
        .read_to_end(&mut out)?;
    if out.len() > max {
        return Err(format!("stored body inflates past the limit of {max} bytes").into());
    }
    Ok(Bytes::from(out))
}

#[cfg(not(feature = "compression"))]
fn decompress(_: &[u8], _: usize) -> Result<Bytes, BoxError> {
    Err("stored compressed; this build has no `compression` feature to inflate it".into())
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reference({}, {})", self.resource, self.code)
    }
}
