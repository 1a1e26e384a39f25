//! Sources of facts, read in pages by ascending key, and the merge of their pages.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::{ready, Future};
use std::ops::Bound;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bytes::Bytes;

use super::{Fact, ReconcileError};
use crate::classify::BoxError;

/// One page to read: the keys after `after` (all keys when `None`), at most `limit` of them,
/// as of `as_of`.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PageRequest<'a> {
    /// The last key of the previous page: this page starts after it. `None` for the first.
    pub after: Option<&'a [u8]>,
    /// At most this many facts.
    pub limit: usize,
    /// The comparison's time. A source that keeps history answers as of it; one that does not
    /// answers with what it holds now (the rules' grace window then keeps facts changed since
    /// out of the comparison: they are newer than `as_of` minus any grace).
    pub as_of: SystemTime,
}

impl<'a> PageRequest<'a> {
    /// A request; for tests of sources of your own.
    pub fn new(after: Option<&'a [u8]>, limit: usize, as_of: SystemTime) -> Self {
        PageRequest {
            after,
            limit,
            as_of,
        }
    }
}

/// A system's facts, read in pages by ascending key.
///
/// A page holds the facts whose keys come after the request's `after`, in strictly ascending
/// byte order (`[u8]`'s `Ord`: what PostgreSQL's `bytea` and a `COLLATE "C"` text column
/// order by), at most `limit` of them; a page shorter than `limit` is the last. The
/// [`Reconciler`](super::Reconciler) checks the order, and a source that breaks it fails the
/// comparison with an error that names it (never a wrong difference).
///
/// ```
/// use std::future::{ready, Future};
/// use std::time::SystemTime;
/// use surely::reconcile::{Fact, PageRequest, Source};
///
/// /// Every key from `k000` to `k099`, each `ok` at version 1.
/// struct Numbers;
///
/// impl Source for Numbers {
///     fn page(
///         &self,
///         req: PageRequest<'_>,
///     ) -> impl Future<Output = Result<Vec<Fact>, surely::classify::BoxError>> + Send {
///         let first = req.after.map_or(0, |k| {
///             std::str::from_utf8(&k[1..]).unwrap().parse::<usize>().unwrap() + 1
///         });
///         let facts = (first..100)
///             .take(req.limit)
///             .map(|n| Fact::new(format!("k{n:03}"), "ok", 1, SystemTime::UNIX_EPOCH))
///             .collect();
///         ready(Ok(facts))
///     }
/// }
/// ```
pub trait Source: Send + Sync + 'static {
    /// The page `request` asks for.
    fn page(
        &self,
        request: PageRequest<'_>,
    ) -> impl Future<Output = Result<Vec<Fact>, BoxError>> + Send;
}

/// A source as the reconciler holds it: one boxed future per page, not per key.
pub(crate) trait ErasedSource: Send + Sync {
    fn page_boxed<'a>(
        &'a self,
        request: PageRequest<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Fact>, BoxError>> + Send + 'a>>;
}

impl<S: Source> ErasedSource for S {
    fn page_boxed<'a>(
        &'a self,
        request: PageRequest<'a>,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Fact>, BoxError>> + Send + 'a>> {
        Box::pin(self.page(request))
    }
}

/// Facts in memory, for tests, demos and data you already hold. Clones share the facts.
///
/// ```
/// use std::time::SystemTime;
/// use surely::reconcile::MemorySource;
///
/// let orders = MemorySource::new();
/// orders.put("o-1", "paid", 2, SystemTime::now());
/// orders.remove(b"o-1");
/// assert!(orders.is_empty());
/// ```
#[derive(Clone, Default)]
pub struct MemorySource {
    facts: Arc<Mutex<BTreeMap<Bytes, Fact>>>,
}

impl MemorySource {
    /// An empty source.
    pub fn new() -> Self {
        Self::default()
    }

    fn facts(&self) -> MutexGuard<'_, BTreeMap<Bytes, Fact>> {
        // No critical section can panic half-way.
        self.facts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the fact of `key`.
    pub fn put(
        &self,
        key: impl Into<Bytes>,
        value: impl Into<String>,
        version: u64,
        at: SystemTime,
    ) {
        let fact = Fact::new(key, value, version, at);
        self.facts().insert(fact.key.clone(), fact);
    }

    /// Sets many facts at once.
    pub fn extend(&self, facts: impl IntoIterator<Item = Fact>) {
        let mut map = self.facts();
        for fact in facts {
            map.insert(fact.key.clone(), fact);
        }
    }

    /// The fact of `key`.
    pub fn get(&self, key: &[u8]) -> Option<Fact> {
        self.facts().get(key).cloned()
    }

    /// Removes the fact of `key`.
    pub fn remove(&self, key: &[u8]) -> Option<Fact> {
        self.facts().remove(key)
    }

    /// How many facts it holds.
    pub fn len(&self) -> usize {
        self.facts().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.facts().is_empty()
    }
}

impl fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySource")
            .field("facts", &self.len())
            .finish()
    }
}

impl Source for MemorySource {
    /// Every fact it holds now (it keeps no history): `as_of` is not used.
    fn page(
        &self,
        request: PageRequest<'_>,
    ) -> impl Future<Output = Result<Vec<Fact>, BoxError>> + Send {
        let facts = self.facts();
        let from = match request.after {
            Some(k) => Bound::Excluded(k),
            None => Bound::Unbounded,
        };
        let page: Vec<Fact> = facts
            .range::<[u8], _>((from, Bound::Unbounded))
            .take(request.limit)
            .map(|(_, f)| f.clone())
            .collect();
        ready(Ok(page))
    }
}

/// One source's place in the merge.
struct Cursor {
    name: String,
    page: VecDeque<Fact>,
    /// The last key taken from this source: the next page starts after it, and every key
    /// must come after it.
    last: Option<Bytes>,
    done: bool,
}

/// The sources' pages merged by key: each [`next`](Merge::next) is one key, and what every
/// source holds for it.
pub(crate) struct Merge<'s> {
    sources: &'s [Arc<dyn ErasedSource>],
    cursors: Vec<Cursor>,
    page_size: usize,
    as_of: SystemTime,
}

impl<'s> Merge<'s> {
    pub(crate) fn new(
        sources: &'s [Arc<dyn ErasedSource>],
        names: &[String],
        page_size: usize,
        as_of: SystemTime,
    ) -> Self {
        Merge {
            sources,
            cursors: names
                .iter()
                .map(|n| Cursor {
                    name: n.clone(),
                    page: VecDeque::new(),
                    last: None,
                    done: false,
                })
                .collect(),
            page_size,
            as_of,
        }
    }

    /// Reads the next page of every source whose page is used up.
    async fn fill(&mut self) -> Result<(), ReconcileError> {
        for (i, cursor) in self.cursors.iter_mut().enumerate() {
            if cursor.done || !cursor.page.is_empty() {
                continue;
            }
            let request = PageRequest::new(cursor.last.as_deref(), self.page_size, self.as_of);
            let page = self.sources[i]
                .page_boxed(request)
                .await
                .map_err(|e| ReconcileError::source_failed(&cursor.name, e))?;
            if page.len() > self.page_size {
                return Err(ReconcileError::order(
                    &cursor.name,
                    format!(
                        "a page of {} facts, for a limit of {}",
                        page.len(),
                        self.page_size
                    ),
                ));
            }
            // Strictly ascending, and after the previous page's last key.
            let mut prev = cursor.last.as_deref();
            for fact in &page {
                if prev.is_some_and(|p| fact.key.as_ref() <= p) {
                    return Err(ReconcileError::order(
                        &cursor.name,
                        format!(
                            "key {} does not come after {}",
                            super::key_display(&fact.key),
                            super::key_display(prev.unwrap_or_default())
                        ),
                    ));
                }
                prev = Some(&fact.key);
            }
            cursor.done = page.len() < self.page_size;
            if let Some(f) = page.last() {
                cursor.last = Some(f.key.clone());
            }
            cursor.page = page.into();
        }
        Ok(())
    }

    /// The next key, and each source's fact for it (in the sources' order); `None` at the end.
    pub(crate) async fn next(
        &mut self,
    ) -> Result<Option<(Bytes, Vec<Option<Fact>>)>, ReconcileError> {
        self.fill().await?;
        let Some(key) = self
            .cursors
            .iter()
            .filter_map(|c| c.page.front().map(|f| &f.key))
            .min()
            .cloned()
        else {
            return Ok(None);
        };
        let row = self
            .cursors
            .iter_mut()
            .map(|c| {
                if c.page.front().is_some_and(|f| f.key == key) {
                    c.page.pop_front()
                } else {
                    None
                }
            })
            .collect();
        Ok(Some((key, row)))
    }
}
