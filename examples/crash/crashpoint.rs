//! A role's side of the driver's protocol: the lines it prints (`@@ ready`, `@@ crashpoint
//! NAME`, `@@ note …`), the crash point the driver armed for this incarnation, and its
//! standard input (`disarm`; `arm NAME:N`, as the soak's driver arms a running process; end of
//! input: stop).
//!
//! A crash point is a named place in a role's code. The driver arms at most one per process
//! incarnation, with `CRASH_AT=NAME:N`: the `N`-th time the process reaches `NAME`, it prints
//! `@@ crashpoint NAME` (flushed) and waits there forever; the driver reads the line and kills
//! the process with SIGKILL. Nothing after the point runs.
//!
//! A point armed to pause (`pause NAME:N` on standard input) prints `@@ pausepoint NAME`
//! instead and waits for `resume`: meanwhile the driver stops the process (SIGSTOP), lets
//! another instance of the role take over past the lease, and continues it (SIGCONT). Then it
//! goes on past the point, its writes now late, and [`resumed`] tells the role so, for the
//! notes it prints when a fence refuses one.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::{Mutex, OnceLock};

use tokio::sync::watch;

/// The order service, after its transaction committed and before it replies.
pub(crate) const AFTER_COMMIT: &str = "after-commit";
/// The order service, after the payment provider took the payment and before the checkpoint
/// that records it.
pub(crate) const AFTER_PAYMENT: &str = "after-payment";
/// The order service, on an order whose key is claimed in the handler's transaction: the
/// order and its event written in it, not committed.
pub(crate) const IN_CLAIM: &str = "in-claim";
/// The order service, on such an order: after the layer committed it, before the reply leaves.
pub(crate) const AFTER_CLAIM_COMMIT: &str = "after-claim-commit";
/// The relay, after JetStream acknowledged a batch and before the outbox marks it published.
pub(crate) const AFTER_PUBLISH: &str = "after-publish";
/// The consumer, after its transaction (inventory change and inbox record, or a stale or
/// manual task's record) committed and before it acknowledges the message.
pub(crate) const AFTER_APPLY: &str = "after-apply";
/// The consumer, after a task's wait committed (its schedule and its step) and before the
/// delivery is acknowledged negatively with the delay: JetStream delivers it again after its
/// ack wait, maybe before the task's time.
pub(crate) const AFTER_SCHEDULE: &str = "after-schedule";
/// The consumer, in a task's handler: the inventory change written and the answer (applied, or
/// why it waits) decided, before the inbox commits either.
pub(crate) const AFTER_ANSWER: &str = "after-answer";
/// The reconciler, with an entry or a record claimed and its answer found, before it settles.
pub(crate) const MID_RECONCILE: &str = "mid-reconcile";
/// The admin, settling an entry by hand: its audit line written, the settlement not made.
pub(crate) const ADMIN_BEGUN: &str = "admin-begun";
/// The admin, settling an entry by hand: the settlement made, its outcome not audited.
pub(crate) const ADMIN_ACTED: &str = "admin-acted";
/// The client, after a call ended unknown and before it knows the ledger has the entry.
pub(crate) const IN_DOUBT: &str = "in-doubt";

/// The variable that arms a point: `NAME:N`.
pub(crate) const ENV_CRASH_AT: &str = "CRASH_AT";

#[derive(Default)]
struct Armed {
    /// The point and on which hit it fires.
    point: Option<(String, u32)>,
    /// Whether it pauses there (waits for `resume`) rather than waiting to be killed.
    pause: bool,
    hits: HashMap<String, u32>,
}

/// `resume` from the driver: wakes a paused point.
fn resume() -> &'static tokio::sync::Notify {
    static RESUME: OnceLock<tokio::sync::Notify> = OnceLock::new();
    RESUME.get_or_init(tokio::sync::Notify::new)
}

/// Whether this process was paused at a point and resumed: what it writes now is late.
pub(crate) fn resumed() -> bool {
    RESUMED.load(std::sync::atomic::Ordering::SeqCst)
}

static RESUMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn armed() -> &'static Mutex<Armed> {
    static ARMED: OnceLock<Mutex<Armed>> = OnceLock::new();
    ARMED.get_or_init(|| {
        let point = std::env::var(ENV_CRASH_AT).ok().and_then(|v| {
            let (name, n) = v.split_once(':')?;
            Some((name.to_owned(), n.parse().ok()?))
        });
        Mutex::new(Armed {
            point,
            pause: false,
            hits: HashMap::new(),
        })
    })
}

fn lock() -> std::sync::MutexGuard<'static, Armed> {
    armed().lock().unwrap_or_else(|e| e.into_inner())
}

/// Reaches `point`: if it is armed and this is its hit, says so and never returns, or, armed to
/// pause, waits for `resume` and goes on.
pub(crate) async fn at(point: &str) {
    let (fire, pause) = {
        let mut armed = lock();
        let hits = armed.hits.entry(point.to_owned()).or_default();
        *hits += 1;
        let hit = *hits;
        let fire = matches!(&armed.point, Some((name, n)) if name == point && *n == hit);
        let pause = fire && armed.pause;
        if pause {
            // Once: the point does not pause again.
            armed.point = None;
            armed.pause = false;
        }
        (fire, pause)
    };
    if pause {
        let resumed = resume().notified();
        say(&format!("pausepoint {point}"));
        resumed.await;
        say(&format!("note resumed {point}"));
    } else if fire {
        say(&format!("crashpoint {point}"));
        std::future::pending::<()>().await;
    }
}

/// One protocol line to the driver, flushed.
pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    // The driver is gone if its pipe is: nothing to tell then.
    let _ = writeln!(out, "@@ {line}");
    let _ = out.flush();
}

/// Tells the driver the role serves.
pub(crate) fn ready() {
    say("ready");
}

/// Reads the driver's commands from standard input on a thread of its own: `disarm` clears the
/// armed point; `arm NAME:N` arms one; `pause NAME:N` arms one to pause, `resume` continues
/// it; the end of input (the driver closed it, or died) turns the returned watch true:
/// the role stops.
pub(crate) fn control() -> watch::Receiver<bool> {
    let (stop, stopped) = watch::channel(false);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            match line {
                Ok(l) if l.trim() == "disarm" => {
                    let mut armed = lock();
                    armed.point = None;
                    armed.pause = false;
                }
                Ok(l) if l.trim() == "resume" => {
                    // Late from now on, whether the paused point goes on or the work around it
                    // was given up meanwhile (a timeout that ran out while the process stood).
                    RESUMED.store(true, std::sync::atomic::Ordering::SeqCst);
                    resume().notify_one();
                }
                // `arm NAME:N` (`pause NAME:N`): the point fires (pauses) on its N-th hit from
                // now on.
                Ok(l) if l.starts_with("arm ") || l.starts_with("pause ") => {
                    let (verb, rest) = l.split_once(' ').unwrap_or_default();
                    let point = rest
                        .trim()
                        .split_once(':')
                        .and_then(|(name, n)| Some((name.to_owned(), n.parse().ok()?)));
                    let mut armed = lock();
                    if let Some((name, _)) = &point {
                        armed.hits.remove(name);
                    }
                    armed.point = point;
                    armed.pause = verb == "pause";
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let _ = stop.send(true);
    });
    stopped
}

/// Resolves once `stopped` turns true (or its sender is gone).
pub(crate) async fn stop_of(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}
