//! Waking an idle relay when events are enqueued.

use std::fmt;
use std::sync::{Arc, Weak};

use tokio::sync::{watch, Notify};

/// Wakes an idle [`Relay`](super::Relay) as soon as events are enqueued, instead of at its next
/// poll: give one to [`RelayBuilder::wake_on`](super::RelayBuilder::wake_on).
///
/// The poll interval stays the safety net: a wake that is lost (a listening connection that
/// dropped, a notification sent while nobody listened) costs at most one interval, never an
/// event.
///
/// [`MemoryOutbox::wakeup`](super::MemoryOutbox::wakeup) gives one that its enqueues wake;
/// `PostgresOutbox::listen` (feature `postgres`) one woken by the database's `NOTIFY`, sent
/// when a transaction that enqueued commits. [`wake`](Self::wake) wakes it by hand, from any
/// other source.
///
/// A wake given while the relay is busy is kept: the relay's next wait returns at once. Clones
/// share one wakeup; with several relays on one, each wake wakes one of them.
#[derive(Clone, Default)]
pub struct Wakeup {
    inner: Arc<Inner>,
}

struct Inner {
    notify: Notify,
    /// Dropped with the last wakeup: a listener's task sees it and ends.
    alive: watch::Sender<()>,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            notify: Notify::new(),
            alive: watch::Sender::new(()),
        }
    }
}

impl Wakeup {
    /// A wakeup nobody wakes yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes one waiting relay, or the next one that waits.
    pub fn wake(&self) {
        self.inner.notify.notify_one();
    }

    /// Resolves at the next wake (at once if one is pending).
    pub(crate) async fn woken(&self) {
        self.inner.notify.notified().await;
    }

    /// A handle that wakes this wakeup without keeping it alive, and knows when it is gone.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn waker(&self) -> WeakWakeup {
        WeakWakeup {
            inner: Arc::downgrade(&self.inner),
            gone: self.inner.alive.subscribe(),
        }
    }
}

impl fmt::Debug for Wakeup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeup").finish_non_exhaustive()
    }
}

/// Wakes a [`Wakeup`] while one exists.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct WeakWakeup {
    inner: Weak<Inner>,
    gone: watch::Receiver<()>,
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl WeakWakeup {
    /// Wakes it; false if every [`Wakeup`] is gone.
    pub(crate) fn wake(&self) -> bool {
        match self.inner.upgrade() {
            Some(inner) => {
                inner.notify.notify_one();
                true
            }
            None => false,
        }
    }

    /// Resolves once every [`Wakeup`] is gone.
    pub(crate) async fn gone(&self) {
        // Nothing is ever sent: this returns when the sender, kept by the wakeup, is dropped.
        let mut gone = self.gone.clone();
        while gone.changed().await.is_ok() {}
    }
}
