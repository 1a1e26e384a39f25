//! The `client` role: places orders through surely's client stack (`surely::client::http()` over
//! hyper-util), with a `LedgerRecorder` over the `PostgresLedger`, and writes the oracle.
//!
//! * Keyed orders (`k-{incarnation}-{n}`): `Idempotency-Key` and business key `k-…`; the stack
//!   is told the server honours keys, so a maybe-committed attempt is sent again with the same
//!   key, within the call's deadline.
//! * Keyed orders claimed in the handler's transaction (`t-{incarnation}-{n}`): the same, sent
//!   to `POST /orders-tx`, where the order service claims the key in the transaction that
//!   writes the order.
//! * Unkeyed orders (`u-{incarnation}-{n}`): no key, business key `u-…`; a POST that may have
//!   been committed is never sent again: it ends unknown.
//!
//! The oracle is an append-only file, each line synced to disk before the next step: `started
//! KEY INCARNATION` before a call, `ended KEY OUTCOME DETAIL` after it. A call that ended
//! unknown is written `ended` only once the recorder has flushed it to the ledger; a call killed
//! between the two counts as in flight.
//!
//! With `CRASH_MODE=recover` the role asks again instead: every keyed order that ended unknown,
//! or never ended, and whose ledger entries are not all settled, is sent once more with its key
//! (asking again is the query), so that no idempotency record stays with a dead owner.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use surely::headers::{IDEMPOTENCY_ERROR, IDEMPOTENCY_KEY};
use surely::journal::{Intent, IntentId, IntentJournal, JournalError};
use surely::ledger::{EntryState, Ledger, LedgerRecorder};
use surely::record::BusinessKey;
use surely::retry::backoff::Backoff;
use surely::{Outcome, OutcomeExt};
use tower::ServiceExt;

use crate::crashpoint::{self, IN_DOUBT};
use crate::http_client::HttpClient;
use crate::splitmix::SplitMix;
use crate::world::{in_claim, is_keyed, World};
use crate::{chain, BoxError, CALL_DEADLINE};

/// The oracle file.
pub(crate) const ENV_ORACLE: &str = "CRASH_ORACLE";
/// The header each order carries with the client incarnation that sent it.
pub(crate) const CLIENT_HEADER: &str = "x-crash-client";
/// The client's incarnation (part of its keys).
pub(crate) const ENV_INCARNATION: &str = "CRASH_INCARNATION";
/// The run's seed.
pub(crate) const ENV_SEED: &str = "CRASH_SEED";
/// `recover`: ask again for the orders left in doubt.
pub(crate) const ENV_MODE: &str = "CRASH_MODE";
/// How many calls the client keeps in flight.
pub(crate) const ENV_WORKERS: &str = "CRASH_WORKERS";
/// Calls per second, all workers together (a steady load, as the soak runs it): each call waits
/// for its tick, and every call's latency goes to the driver (`@@ latency MICROS OUTCOME`).
/// Unset: every worker as fast as it can, nothing reported.
pub(crate) const ENV_RATE: &str = "CRASH_RATE";

/// The share of orders placed with a key.
const KEYED_SHARE: f64 = 0.7;
/// A worker's pause between calls.
const PACE: Duration = Duration::from_millis(8);
/// The wait before a retry when the server says nothing.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// At most this many attempts per call; the deadline bounds them first.
const MAX_ATTEMPTS: u32 = 30;
/// The recovery's passes over the orders left in doubt, and its calls in flight.
const RECOVER_PASSES: usize = 2;
const RECOVER_WORKERS: usize = 8;

/// The stack for keyed orders.
fn keyed_stack(
    recorder: &LedgerRecorder,
    journal: &Journal,
) -> Result<impl HttpClient + use<>, BoxError> {
    Ok(surely::client::http()
        .server_honours_keys()
        .timeout(CALL_DEADLINE)
        .no_budget()
        .no_breaker()
        .retry(|r| {
            r.backoff(Backoff::constant(RETRY_BACKOFF))
                .max_attempts(MAX_ATTEMPTS)
        })
        .recorder(recorder.clone())
        // The intent journal: every order's intent is in the ledger before it is sent, so a
        // client killed mid-call leaves its question for the reconciler (invariant 5).
        .journal(journal.clone())
        .build(surely::hyper::transport())?)
}

/// The stack for unkeyed orders: no key is generated, so a POST that may have been committed
/// is never sent again.
fn unkeyed_stack(
    recorder: &LedgerRecorder,
    journal: &Journal,
) -> Result<impl HttpClient + use<>, BoxError> {
    Ok(surely::client::http()
        .no_idempotency_keys()
        .timeout(CALL_DEADLINE)
        .no_budget()
        .no_breaker()
        .retry(|r| {
            r.backoff(Backoff::constant(RETRY_BACKOFF))
                .max_attempts(MAX_ATTEMPTS)
        })
        .recorder(recorder.clone())
        .journal(journal.clone())
        .build(surely::hyper::transport())?)
}

/// The ledger recorder as the journal, telling the oracle when a call's intent is durable
/// (`journaled KEY`: from then on the call may go out) and when its call ended definitively
/// (`concluded KEY OUTCOME`, before the intent may be forgotten): what the checks need to know
/// of a call whose client was killed before its `ended` line.
#[derive(Clone)]
pub(crate) struct Journal {
    recorder: LedgerRecorder,
    oracle: Oracle,
    keys: Arc<Mutex<HashMap<IntentId, String>>>,
}

impl IntentJournal for Journal {
    async fn begin(&self, intent: &Intent) -> Result<(), JournalError> {
        self.recorder.begin(intent).await?;
        let key = intent.key.clone().unwrap_or_default();
        self.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(intent.id, key.clone());
        self.oracle
            .line(format!("journaled {key}"))
            .await
            .map_err(|e| JournalError::new(format!("the oracle: {e}")))
    }

    fn end(&self, id: IntentId, outcome: Outcome) {
        let key = self
            .keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        if let Some(key) = key {
            // Synced before the recorder may forget the intent (a short blocking write: this
            // is a test's client).
            if let Err(e) = self
                .oracle
                .line_now(&format!("concluded {key} {}", outcome_name(outcome)))
            {
                eprintln!("crash client: the oracle: {e}");
            }
        }
        self.recorder.end(id, outcome);
    }
}

/// The append-only oracle, each line synced before the caller goes on.
#[derive(Clone)]
struct Oracle(Arc<Mutex<File>>);

impl Oracle {
    fn open(path: &PathBuf) -> Result<Oracle, BoxError> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Oracle(Arc::new(Mutex::new(file))))
    }

    /// Writes and syncs `line` on this thread.
    fn line_now(&self, line: &str) -> std::io::Result<()> {
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(line.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_data()
    }

    async fn line(&self, line: String) -> Result<(), BoxError> {
        let file = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
            f.write_all(line.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_data()
        })
        .await??;
        Ok(())
    }
}

/// How a call ended, for the oracle.
fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Succeeded => "succeeded",
        Outcome::Failed => "failed",
        Outcome::Unknown => "unknown",
    }
}

/// One order, through `stack`: the outcome and a word on the answer (its status, and the
/// server's `idempotency-error` if any; or `error`).
async fn place(
    stack: impl HttpClient,
    uri: &str,
    key: &str,
    incarnation: u64,
) -> Result<(Outcome, String), BoxError> {
    let mut req = Request::post(uri).header(CLIENT_HEADER, incarnation);
    if is_keyed(key) {
        req = req.header(IDEMPOTENCY_KEY, key);
    }
    let mut req = req.body(Full::new(Bytes::from(key.to_owned())))?;
    req.extensions_mut().insert(BusinessKey::new(key));
    let res = stack.oneshot(req).await;
    let outcome = res.outcome();
    let detail = match res {
        Ok(res) => {
            let status = res.status().as_u16();
            let error = res
                .headers()
                .get(IDEMPOTENCY_ERROR)
                .and_then(|v| v.to_str().ok())
                .map_or(String::new(), |v| format!("/{v}"));
            let replayed = if res.is_replayed() { "/replayed" } else { "" };
            // Reading the body to its end settles the attempt's record.
            match res.into_body().collect().await {
                Ok(_) => format!("{status}{error}{replayed}"),
                Err(_) => format!("{status}/body-broke"),
            }
        }
        Err(e) => format!("error:{}", chain(&e).replace(' ', "_")),
    };
    Ok((outcome, detail))
}

struct Calls<K, U> {
    keyed: K,
    unkeyed: U,
    recorder: LedgerRecorder,
    oracle: Oracle,
    uri: String,
    /// Where orders claimed in the handler's transaction go.
    uri_tx: String,
    incarnation: u64,
    /// Whether each call's latency goes to the driver.
    report_latency: bool,
}

impl<K: HttpClient + Sync, U: HttpClient + Sync> Calls<K, U> {
    /// One call, between its two oracle lines.
    async fn call(&self, key: &str) -> Result<(Outcome, String), BoxError> {
        self.oracle
            .line(format!("started {key} {}", self.incarnation))
            .await?;
        let sent = std::time::Instant::now();
        let (outcome, detail) = if in_claim(key) {
            place(self.keyed.clone(), &self.uri_tx, key, self.incarnation).await?
        } else if is_keyed(key) {
            place(self.keyed.clone(), &self.uri, key, self.incarnation).await?
        } else {
            place(self.unkeyed.clone(), &self.uri, key, self.incarnation).await?
        };
        if self.report_latency {
            crashpoint::say(&format!(
                "latency {} {}",
                sent.elapsed().as_micros(),
                outcome_name(outcome)
            ));
        }
        if outcome == Outcome::Unknown {
            crashpoint::at(IN_DOUBT).await;
            self.recorder.flush().await;
        }
        let mut detail = detail;
        detail.truncate(200);
        self.oracle
            .line(format!("ended {key} {} {detail}", outcome_name(outcome)))
            .await?;
        Ok((outcome, detail))
    }
}

pub(crate) async fn run() -> Result<(), BoxError> {
    let stopped = crashpoint::control();
    let world = World::from_env()?;
    world.reach_postgres().await?;
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let oracle = Oracle::open(&PathBuf::from(var(ENV_ORACLE)?))?;
    let incarnation: u64 = var(ENV_INCARNATION)?.parse()?;
    let seed: u64 = var(ENV_SEED)?.parse()?;
    let workers: u64 = var(ENV_WORKERS)?.parse()?;
    let addr = var(crate::order::ENV_ADDR)?;
    let recover = std::env::var(ENV_MODE).is_ok_and(|m| m == "recover");
    let rate: Option<f64> = match std::env::var(ENV_RATE) {
        Ok(r) => Some(r.parse().map_err(|e| format!("{ENV_RATE}={r}: {e}"))?),
        Err(_) => None,
    };
    let ledger = world.ledger()?;
    let recorder = LedgerRecorder::new(ledger.clone());
    let journal = Journal {
        recorder: recorder.clone(),
        oracle: oracle.clone(),
        keys: Arc::default(),
    };
    let calls = Arc::new(Calls {
        keyed: keyed_stack(&recorder, &journal)?,
        unkeyed: unkeyed_stack(&recorder, &journal)?,
        recorder: recorder.clone(),
        oracle,
        uri: format!("http://{addr}/orders"),
        uri_tx: format!("http://{addr}/orders-tx"),
        incarnation,
        report_latency: rate.is_some(),
    });
    // The steady load's ticks, shared by the workers: a tick missed while every worker waits
    // for an answer is skipped, not made up in a burst.
    let ticks = rate.filter(|r| *r > 0.0).map(|r| {
        let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / r));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        Arc::new(tokio::sync::Mutex::new(every))
    });
    crashpoint::ready();
    if recover {
        let path = PathBuf::from(var(ENV_ORACLE)?);
        ask_again(&calls, &ledger, &path).await?;
    } else {
        let next = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for w in 0..workers {
            let calls = calls.clone();
            let next = next.clone();
            let stopped = stopped.clone();
            let ticks = ticks.clone();
            let mut rng = SplitMix::new(seed ^ (incarnation << 20) ^ (w << 8) ^ 0xC11E);
            tasks.push(tokio::spawn(async move {
                while !*stopped.borrow() {
                    if let Some(ticks) = &ticks {
                        let mut stop = stopped.clone();
                        tokio::select! {
                            _ = async { ticks.lock().await.tick().await } => {}
                            _ = stop.wait_for(|s| *s) => break,
                        }
                    }
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    let draw = rng.unit();
                    let kind = if draw < KEYED_SHARE / 2.0 {
                        "k"
                    } else if draw < KEYED_SHARE {
                        "t"
                    } else {
                        "u"
                    };
                    let key = format!("{kind}-{incarnation}-{n}");
                    calls.call(&key).await?;
                    if ticks.is_none() {
                        tokio::time::sleep(PACE).await;
                    }
                }
                Ok::<_, BoxError>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
    }
    recorder.flush().await;
    let w = recorder.writes();
    crashpoint::say(&format!(
        "note ledger-writes written {} failed {} settled-by-replay {}",
        w.written, w.failed, w.settled_by_replay
    ));
    Ok(())
}

/// What the oracle says of each key: how often it was started, and its last ending.
pub(crate) fn read_oracle(path: &PathBuf) -> Result<Vec<Line>, BoxError> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().filter_map(Line::parse).collect())
}

/// One line of the oracle.
#[derive(Clone, Debug)]
pub(crate) enum Line {
    Started {
        key: String,
        incarnation: u64,
    },
    Ended {
        key: String,
        outcome: String,
        detail: String,
    },
    /// The call's intent is durable: it may go out.
    Journaled {
        key: String,
    },
    /// The call ended definitively, as the journal was told.
    Concluded {
        key: String,
        outcome: String,
    },
}

impl Line {
    fn parse(line: &str) -> Option<Line> {
        let mut words = line.split(' ');
        match words.next()? {
            "started" => Some(Line::Started {
                key: words.next()?.to_owned(),
                incarnation: words.next()?.parse().ok()?,
            }),
            "ended" => Some(Line::Ended {
                key: words.next()?.to_owned(),
                outcome: words.next()?.to_owned(),
                detail: words.next().unwrap_or("").to_owned(),
            }),
            "journaled" => Some(Line::Journaled {
                key: words.next()?.to_owned(),
            }),
            "concluded" => Some(Line::Concluded {
                key: words.next()?.to_owned(),
                outcome: words.next()?.to_owned(),
            }),
            _ => None,
        }
    }
}

/// The keyed orders to ask about again: those whose last call ended unknown or never ended.
fn in_doubt(lines: &[Line]) -> Vec<String> {
    let mut last: HashMap<&str, Option<&str>> = HashMap::new();
    let mut order = Vec::new();
    for line in lines {
        match line {
            Line::Started { key, .. } => {
                if !last.contains_key(key.as_str()) {
                    order.push(key.as_str());
                }
                last.insert(key, None);
            }
            Line::Ended { key, outcome, .. } => {
                last.insert(key, Some(outcome));
            }
            Line::Journaled { .. } | Line::Concluded { .. } => {}
        }
    }
    order
        .into_iter()
        .filter(|k| is_keyed(k) && matches!(last.get(k), Some(None) | Some(Some("unknown"))))
        .map(str::to_owned)
        .collect()
}

async fn ask_again<K, U>(
    calls: &Arc<Calls<K, U>>,
    ledger: &surely::ledger::PostgresLedger,
    oracle: &PathBuf,
) -> Result<(), BoxError>
where
    K: HttpClient + Sync,
    U: HttpClient + Sync,
{
    let mut asked = 0;
    let mut skipped = 0;
    let mut ends: HashMap<&'static str, usize> = HashMap::new();
    for _ in 0..RECOVER_PASSES {
        let mut todo = Vec::new();
        for key in in_doubt(&read_oracle(oracle)?) {
            let entries = ledger.by_key(&key).await?;
            // A settled verdict is final: the caller does not send the key again.
            if !entries.is_empty() && entries.iter().all(|e| e.state == EntryState::Settled) {
                skipped += 1;
                continue;
            }
            todo.push(key);
        }
        if todo.is_empty() {
            break;
        }
        let queue = Arc::new(Mutex::new(todo));
        let mut tasks = Vec::new();
        for _ in 0..RECOVER_WORKERS {
            let queue = queue.clone();
            let calls = calls.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let Some(key) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                        return Ok::<_, BoxError>(got);
                    };
                    let (outcome, detail) = calls.call(&key).await?;
                    // The server's own UNKNOWN: asking again changes nothing until it is settled.
                    let server_unknown = detail.contains("IDEMPOTENCY_OUTCOME_UNKNOWN");
                    got.push((outcome, server_unknown));
                }
            }));
        }
        let mut again = false;
        for t in tasks {
            for (outcome, server_unknown) in t.await?? {
                asked += 1;
                *ends.entry(outcome_name(outcome)).or_default() += 1;
                again |= outcome == Outcome::Unknown && !server_unknown;
            }
        }
        if !again {
            break;
        }
    }
    crashpoint::say(&format!(
        "note asked-again asked {asked} skipped {skipped} succeeded {} failed {} unknown {}",
        ends.get("succeeded").unwrap_or(&0),
        ends.get("failed").unwrap_or(&0),
        ends.get("unknown").unwrap_or(&0)
    ));
    Ok(())
}
