//! `Relay::run` as a pipeline: the next batch claimed and the last one marked while a batch is
//! published, on the memory outbox behind a store whose steps take time (paused time). The
//! pipeline keeps what a round promises: one batch published at a time and in order, failed
//! events retried and quarantined, each batch reported; a store that fails stops it cleanly,
//! and a stop finishes what it holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use surely::outbox::{Claimed, Event, Failed, MemoryOutbox, OutboxError, OutboxStore, Relay};
use surely::record::{InMemoryRecorder, OutboxStats};
use tokio::time::Instant;
use tower::service_fn;

use super::event;

/// How long each step takes: a claim, a mark, a publish's acknowledgement.
const STEP: Duration = Duration::from_millis(10);

/// What is in flight, and the most that ever was at once.
#[derive(Default)]
struct Tracker {
    claims: usize,
    marks: usize,
    publishes: usize,
    /// The most steps in flight at once (the batch being published counts as one).
    most: usize,
    /// When each claim started.
    claim_starts: Vec<Instant>,
    /// Acknowledgements received so far.
    acked: usize,
    /// For each event sent, in order: its number and how many acknowledgements were in.
    sends: Vec<(u32, usize)>,
}

impl Tracker {
    fn note(&mut self) {
        let now = self.claims + self.marks + usize::from(self.publishes > 0);
        self.most = self.most.max(now);
    }
}

/// The memory outbox behind a store whose claims and marks take [`STEP`], that can be told to
/// fail its nth claim or nth mark of published events (counted from 1).
#[derive(Clone)]
struct Slow {
    inner: MemoryOutbox,
    tracker: Arc<Mutex<Tracker>>,
    fail_claim: Option<usize>,
    fail_mark: Option<usize>,
    counts: Arc<Mutex<(usize, usize)>>,
}

impl Slow {
    fn new(inner: MemoryOutbox) -> Self {
        Slow {
            inner,
            tracker: Arc::default(),
            fail_claim: None,
            fail_mark: None,
            counts: Arc::default(),
        }
    }

    fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap()
    }
}

impl OutboxStore for Slow {
    async fn claim(&self, max: usize, lease: Duration) -> Result<Vec<Claimed>, OutboxError> {
        let n = {
            let mut counts = self.counts.lock().unwrap();
            counts.0 += 1;
            counts.0
        };
        {
            let mut t = self.tracker();
            t.claims += 1;
            t.claim_starts.push(Instant::now());
            t.note();
        }
        tokio::time::sleep(STEP).await;
        self.tracker().claims -= 1;
        if self.fail_claim == Some(n) {
            return Err(OutboxError::backend("the claim's connection dropped"));
        }
        self.inner.claim(max, lease).await
    }

    async fn published(&self, claimed: &Claimed) -> Result<(), OutboxError> {
        self.inner.published(claimed).await
    }

    async fn published_all(&self, claimed: &[Claimed]) -> Result<usize, OutboxError> {
        if claimed.is_empty() {
            return Ok(0);
        }
        let n = {
            let mut counts = self.counts.lock().unwrap();
            counts.1 += 1;
            counts.1
        };
        {
            let mut t = self.tracker();
            t.marks += 1;
            t.note();
        }
        tokio::time::sleep(STEP).await;
        self.tracker().marks -= 1;
        if self.fail_mark == Some(n) {
            return Err(OutboxError::backend("the mark's connection dropped"));
        }
        self.inner.published_all(claimed).await
    }

    async fn failed(
        &self,
        claimed: &Claimed,
        error: &str,
        retry_after: Duration,
        quarantine_after: u32,
    ) -> Result<Failed, OutboxError> {
        self.inner
            .failed(claimed, error, retry_after, quarantine_after)
            .await
    }

    async fn sweep(&self, retention: Duration) -> Result<u64, OutboxError> {
        self.inner.sweep(retention).await
    }

    async fn stats(&self) -> Result<OutboxStats, OutboxError> {
        self.inner.stats().await
    }
}

/// The numbers of the events a broker published, in order.
type Log = Arc<Mutex<Vec<u32>>>;

/// A broker that acknowledges each event after [`STEP`] (refusing those `refuse` says to, given
/// the event's number and its attempt), keeps the numbers of the events it published in
/// `published`, and tells the tracker what it is doing.
fn broker(
    tracker: Arc<Mutex<Tracker>>,
    published: &Log,
    refuse: impl Fn(u32, usize) -> bool + Clone + Send + 'static,
) -> impl tower::Service<
    Event,
    Response = (),
    Error = std::io::Error,
    Future = impl std::future::Future<Output = Result<(), std::io::Error>> + Send,
> + Send
       + 'static {
    let attempts: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
    let log = published.clone();

    service_fn(move |event: Event| {
        let n: u32 = std::str::from_utf8(event.payload())
            .unwrap()
            .trim_start_matches("o-")
            .parse()
            .unwrap();
        let attempt = {
            let mut attempts = attempts.lock().unwrap();
            let a = attempts.entry(n).or_default();
            *a += 1;
            *a
        };
        {
            let mut t = tracker.lock().unwrap();
            t.publishes += 1;
            let acked = t.acked;
            t.sends.push((n, acked));
            t.note();
        }
        let (tracker, log, refused) = (tracker.clone(), log.clone(), refuse(n, attempt));
        async move {
            tokio::time::sleep(STEP).await;
            let mut t = tracker.lock().unwrap();
            t.publishes -= 1;
            t.acked += 1;
            if refused {
                Err(std::io::Error::other("refused"))
            } else {
                log.lock().unwrap().push(n);
                Ok(())
            }
        }
    })
}

fn backlog(n: u32) -> MemoryOutbox {
    let outbox = MemoryOutbox::new();
    for i in 1..=n {
        assert!(outbox.enqueue(event(i)));
    }
    outbox
}

/// Runs `relay` until `until` holds (checked every 5 ms), then stops it and waits for it.
async fn run_until<St, P>(relay: Relay<St, P>, until: impl Fn() -> bool)
where
    St: OutboxStore,
    P: tower::Service<Event> + Send + 'static,
    P::Future: Send,
    P::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    while !until() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(1), running)
        .await
        .expect("the relay stopped")
        .unwrap();
}

/// With the default depth, a backlog goes out with the three steps overlapped: a claim, a
/// publish and a mark in flight at once, and the whole in about one step per batch rather
/// than three. Publishes stay one batch at a time, in order: no event of a batch is sent
/// before every acknowledgement of the batch before it is in. Each batch is reported as its
/// own round.
#[tokio::test(start_paused = true)]
async fn run_overlaps_claim_publish_and_mark_and_keeps_the_order() {
    for (depth, most) in [(1, 1), (2, 2), (3, 3)] {
        let store = Slow::new(backlog(40));
        let tracker = store.tracker.clone();
        let published = Log::default();
        let broker = broker(tracker.clone(), &published, |_, _| false);
        let recorder = InMemoryRecorder::new();
        let relay = Relay::builder(store.clone(), broker)
            .batch(4)
            .pipeline_depth(depth)
            .recorder(recorder.clone())
            .build()
            .unwrap();
        let started = Instant::now();
        let done = published.clone();
        run_until(relay, move || done.lock().unwrap().len() == 40).await;
        let took = started.elapsed();
        assert_eq!(*published.lock().unwrap(), (1..=40).collect::<Vec<_>>());
        assert_eq!(store.inner.stats_now().backlog, 0, "depth {depth}");
        let t = tracker.lock().unwrap();
        assert_eq!(t.most, most, "steps in flight at once, depth {depth}");
        for &(n, acked) in &t.sends {
            let batch_start = (n - 1) / 4 * 4;
            assert!(
                acked >= batch_start as usize,
                "depth {depth}: event {n} sent with {acked} acknowledgements in"
            );
        }
        let rounds: Vec<usize> = recorder
            .relay_reports()
            .iter()
            .filter_map(|r| r.round.map(|r| r.published))
            .collect();
        assert_eq!(rounds, [4; 10], "depth {depth}: one report per batch");
        // Ten batches: one after the other, three steps each; overlapped, about one.
        match depth {
            1 => assert!(took >= STEP * 30, "depth 1 took {took:?}"),
            3 => assert!(took < STEP * 15, "depth 3 took {took:?}"),
            _ => {}
        }
    }
}

/// A publisher that refuses some events: within the pipeline they are marked failed, retried
/// after their wait, and quarantined at the limit, as in a round; the rest go out once each.
#[tokio::test(start_paused = true)]
async fn run_retries_and_quarantines_failed_events() {
    let store = Slow::new(backlog(20));
    // Event 3 refused once, event 7 every time.
    let published = Log::default();
    let broker = broker(store.tracker.clone(), &published, |n, attempt| {
        n == 7 || (n == 3 && attempt == 1)
    });
    let recorder = InMemoryRecorder::new();
    let relay = Relay::builder(store.clone(), broker)
        .batch(4)
        .retry_after(Duration::from_millis(100))
        .quarantine_after(2)
        .poll(Duration::from_millis(50))
        .recorder(recorder.clone())
        .build()
        .unwrap();
    let inner = store.inner.clone();
    run_until(relay, move || {
        let stats = inner.stats_now();
        stats.backlog == 0 && stats.quarantined == 1
    })
    .await;
    let mut out = published.lock().unwrap().clone();
    out.sort_unstable();
    let expected: Vec<u32> = (1..=20).filter(|&n| n != 7).collect();
    assert_eq!(out, expected, "each once, but the quarantined one");
    let rounds: Vec<_> = recorder
        .relay_reports()
        .iter()
        .filter_map(|r| r.round)
        .collect();
    let sum = |f: fn(&surely::record::RelayRound) -> usize| rounds.iter().map(f).sum::<usize>();
    assert_eq!(
        (
            sum(|r| r.published),
            sum(|r| r.failed),
            sum(|r| r.quarantined)
        ),
        (19, 3, 1)
    );
    assert_eq!(
        store.inner.last_error(event(7).id()).as_deref(),
        Some("refused")
    );
}

/// A claim that fails while batches are in the pipeline: the batches already claimed are
/// published and marked, nothing more is claimed, and the relay waits its poll interval
/// before it claims again. Nothing goes out twice.
#[tokio::test(start_paused = true)]
async fn a_failed_claim_stops_the_pipeline_after_what_it_holds() {
    let mut store = Slow::new(backlog(24));
    store.fail_claim = Some(3);
    let published = Log::default();
    let broker = broker(store.tracker.clone(), &published, |_, _| false);
    let poll = Duration::from_secs(1);
    let relay = Relay::builder(store.clone(), broker)
        .batch(4)
        .poll(poll)
        .build()
        .unwrap();
    let done = published.clone();
    run_until(relay, move || done.lock().unwrap().len() == 24).await;
    assert_eq!(*published.lock().unwrap(), (1..=24).collect::<Vec<_>>());
    assert_eq!(store.inner.stats_now().backlog, 0);
    let starts = store.tracker().claim_starts.clone();
    // The fourth claim waited for the poll interval after the third failed.
    assert!(starts[3] - starts[2] >= poll, "{starts:?}");
}

/// A mark that fails while the next batch is being published: that batch is still marked
/// (the store answers again), the batch claimed behind it is not published but left to its
/// lease, and the relay waits. The failed mark's events go out again after their lease, with
/// their ids: the only ones published twice. Every event ends published.
#[tokio::test(start_paused = true)]
async fn a_failed_mark_stops_the_pipeline_and_leaves_the_rest_to_the_lease() {
    let mut store = Slow::new(backlog(24));
    store.fail_mark = Some(2);
    let published = Log::default();
    let broker = broker(store.tracker.clone(), &published, |_, _| false);
    let lease = Duration::from_secs(5);
    let relay = Relay::builder(store.clone(), broker)
        .batch(4)
        .lease(lease)
        .poll(Duration::from_millis(100))
        .build()
        .unwrap();
    let started = Instant::now();
    let inner = store.inner.clone();
    run_until(relay, move || inner.stats_now().backlog == 0).await;
    assert!(started.elapsed() >= lease, "the lease had to pass");
    let out = published.lock().unwrap().clone();
    let mut times: HashMap<u32, usize> = HashMap::new();
    for n in &out {
        *times.entry(*n).or_default() += 1;
    }
    let twice: Vec<u32> = (1..=24).filter(|n| times.get(n) == Some(&2)).collect();
    assert_eq!(twice, [5, 6, 7, 8], "the second batch, whose mark failed");
    assert!((1..=24).all(|n| times.get(&n).is_some_and(|&t| t <= 2)));
    // Within each batch, the order of enqueueing.
    let retried: Vec<u32> = out
        .iter()
        .copied()
        .filter(|n| (5..=8).contains(n))
        .collect();
    assert_eq!(retried, [5, 6, 7, 8, 5, 6, 7, 8]);
}

/// `stop` while batches are in flight: the relay claims nothing more, publishes and marks
/// what it had claimed, and returns promptly; it leaves no event held by its lease, so
/// another relay takes the rest at once.
#[tokio::test(start_paused = true)]
async fn stop_finishes_the_batches_in_flight_and_leaves_nothing_held() {
    let store = Slow::new(backlog(40));
    let published = Log::default();
    let broker = broker(store.tracker.clone(), &published, |_, _| false);
    let relay = Relay::builder(store.clone(), broker)
        .batch(4)
        .lease(Duration::from_secs(3600))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run(async {
        let _ = stopped.await;
    }));
    // In the middle of the backlog: a batch published, one claimed or being claimed, one
    // being marked.
    tokio::time::sleep(STEP * 5 + STEP / 2).await;
    let before = published.lock().unwrap().len();
    assert!(before > 0 && before < 40, "{before}");
    stop.send(()).unwrap();
    let asked = Instant::now();
    running.await.unwrap();
    assert!(asked.elapsed() <= STEP * 6, "took {:?}", asked.elapsed());
    let out = published.lock().unwrap().clone();
    let n = out.len();
    assert_eq!(
        out,
        (1..=n as u32).collect::<Vec<_>>(),
        "each once, in order"
    );
    assert!(n > before, "the batches in flight were finished");
    assert_eq!(n % 4, 0, "whole batches");
    let left = store.inner.stats_now().backlog as usize;
    assert_eq!(left, 40 - n, "every published event marked");
    let taken = store
        .inner
        .claim(100, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(taken.len(), left, "none held");
    assert_eq!(
        taken.first().map(|c| c.event.id().clone()),
        Some(event(n as u32 + 1).id().clone())
    );
}
