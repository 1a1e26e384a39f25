//! The invariants, checked with SQL (and the crate's read APIs) once the run has drained and
//! been reconciled twice: one line each, then `invariants: ok` or what failed.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use surely::ledger::{Entry, EntryState, Filter, Ledger, Verdict};
use surely::server::store::IdempotencyStore;

use crate::checks::Checks;
use crate::client::{read_oracle, Line};
use crate::driver::Stats;
use crate::reconcile::Final;
use crate::task_invariants;
use crate::tasks::Fates;
use crate::world::{is_keyed, pays, World};
use crate::{BoxError, LEASE};

/// One call, from the oracle: its key, the client incarnation that made it, and how it ended.
struct Call {
    key: String,
    incarnation: u64,
    ended: Option<(String, String)>,
    /// Its intent was durable: it may have gone out.
    journaled: bool,
    /// How it ended, as the journal was told (definitively), if its `ended` line is missing.
    concluded: Option<String>,
}

fn calls(lines: Vec<Line>) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    let mut open: HashMap<String, usize> = HashMap::new();
    for line in lines {
        match line {
            Line::Started { key, incarnation } => {
                open.insert(key.clone(), calls.len());
                calls.push(Call {
                    key,
                    incarnation,
                    ended: None,
                    journaled: false,
                    concluded: None,
                });
            }
            Line::Journaled { key } => {
                if let Some(&i) = open.get(&key) {
                    calls[i].journaled = true;
                }
            }
            Line::Concluded { key, outcome } => {
                if let Some(&i) = open.get(&key) {
                    calls[i].concluded = Some(outcome);
                }
            }
            Line::Ended {
                key,
                outcome,
                detail,
            } => {
                if let Some(i) = open.remove(&key) {
                    calls[i].ended = Some((outcome, detail));
                }
            }
        }
    }
    calls
}

async fn counts(world: &World, statement: &str) -> Result<HashMap<String, i64>, BoxError> {
    let client = world.pool.get().await?;
    let rows = client.query(&world.sql(statement), &[]).await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// At most a few examples of a list, for a line.
pub(crate) fn some(items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let shown: Vec<&str> = items.iter().take(5).map(String::as_str).collect();
    let more = if items.len() > 5 {
        format!(", … {} more", items.len() - 5)
    } else {
        String::new()
    };
    format!(" [{}{more}]", shown.join(", "))
}

fn ended_as<'a>(calls: &'a [Call], outcome: &'a str) -> impl Iterator<Item = &'a Call> + 'a {
    calls
        .iter()
        .filter(move |c| c.ended.as_ref().is_some_and(|(o, _)| o == outcome))
}

/// Checks every invariant and prints one line each; whether all held, the line on the calls
/// made and the lines on the consumer's tasks, for the summary.
pub(crate) async fn check(
    world: &World,
    oracle: &Path,
    stats: &Stats,
    fin: &Final,
    fates: Fates,
) -> Result<(bool, String, Vec<String>), BoxError> {
    let calls = calls(read_oracle(&oracle.to_path_buf())?);
    let orders = counts(world, "SELECT key, count(*) FROM {p}_orders GROUP BY key").await?;
    let payments = counts(
        world,
        "SELECT order_key, count(*) FROM {p}_payments GROUP BY order_key",
    )
    .await?;
    let arrivals = counts(
        world,
        "SELECT key, count(*) FROM {p}_arrivals WHERE NOT keyed GROUP BY key",
    )
    .await?;
    let changes = counts(
        world,
        "SELECT event_id, count(*) FROM {p}_inventory_changes GROUP BY event_id",
    )
    .await?;
    let ledger = world.ledger()?;
    let entries: Vec<Entry> = ledger.list(&Filter::new().limit(1_000_000)).await?;
    let mut by_key: HashMap<&str, Vec<&Entry>> = HashMap::new();
    for e in &entries {
        if let Some(k) = e.evidence.key.as_deref() {
            by_key.entry(k).or_default().push(e);
        }
    }
    let store = world.keys()?;
    let has_order = |k: &str| orders.get(k).copied().unwrap_or(0) > 0;

    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &calls {
        let o = c.ended.as_ref().map_or("in flight", |(o, _)| o.as_str());
        *outcomes.entry(o).or_default() += 1;
    }
    let keyed = calls.iter().filter(|c| is_keyed(&c.key)).count();
    let ops = format!(
        "{} calls ({} keyed, {} unkeyed): {}",
        calls.len(),
        keyed,
        calls.len() - keyed,
        outcomes
            .iter()
            .map(|(o, n)| format!("{o} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!();
    println!("Calls: {ops}; {} orders written.", orders.len());
    println!("Invariants:");
    let mut checks = Checks::default();

    // 1. One order per key; a call that succeeded has its order, one that failed has none;
    //    an unkeyed write reached the handler at most once.
    let twice: Vec<String> = orders
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| format!("{k} x{n}"))
        .collect();
    let lost: Vec<String> = ended_as(&calls, "succeeded")
        .filter(|c| !has_order(&c.key))
        .map(|c| c.key.clone())
        .collect();
    let failed_but_done: Vec<String> = ended_as(&calls, "failed")
        .filter(|c| has_order(&c.key))
        .map(|c| format!("{} ({})", c.key, c.ended.as_ref().map_or("", |(_, d)| d)))
        .collect();
    let resent: Vec<String> = arrivals
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| format!("{k} x{n}"))
        .collect();
    checks.invariant(
        twice.is_empty() && lost.is_empty() && failed_but_done.is_empty() && resent.is_empty(),
        format!(
            "1. one order per key: {} keys, {} with more than one{}; succeeded without an order {}{}; \
             failed yet written {}{}; unkeyed writes that reached the handler twice {}{}",
            orders.len(),
            twice.len(),
            some(&twice),
            lost.len(),
            some(&lost),
            failed_but_done.len(),
            some(&failed_but_done),
            resent.len(),
            some(&resent)
        ),
    );

    // 2. One payment per order key; every keyed order paid.
    let paid_twice: Vec<String> = payments
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| format!("{k} x{n}"))
        .collect();
    let unpaid: Vec<String> = orders
        .keys()
        .filter(|k| pays(k) && payments.get(*k).copied().unwrap_or(0) == 0)
        .cloned()
        .collect();
    let without_order = payments.keys().filter(|k| !has_order(k)).count();
    checks.invariant(
        paid_twice.is_empty() && unpaid.is_empty(),
        format!(
            "2. one payment per order key: {} paid, {} more than once{}; keyed orders unpaid {}{}; \
             paid without an order (left to a person) {without_order}",
            payments.len(),
            paid_twice.len(),
            some(&paid_twice),
            unpaid.len(),
            some(&unpaid)
        ),
    );

    // 3. One inventory change per applied event, none for the others.
    let evidence = task_invariants::load(world, &orders, &changes, fates).await?;
    evidence.check_changes(stats, &mut checks);

    // 4. Every unknown the client saw is in the ledger, settled once or in the manual queue;
    //    the verdicts agree with the order table.
    let mut unknown_by_key: HashMap<&str, usize> = HashMap::new();
    for c in ended_as(&calls, "unknown") {
        *unknown_by_key.entry(c.key.as_str()).or_default() += 1;
    }
    let mut not_in_ledger = Vec::new();
    let mut unsettled = Vec::new();
    let (mut settled, mut manual) = (0, 0);
    for (key, n) in &unknown_by_key {
        let of_key = by_key.get(key).map_or(&[][..], Vec::as_slice);
        if of_key.len() < *n {
            not_in_ledger.push(format!("{key} ({n} unknown, {} entries)", of_key.len()));
        }
        for e in of_key {
            match e.state {
                EntryState::Settled => settled += 1,
                EntryState::Manual => manual += 1,
                other => unsettled.push(format!("{key} {}", other.as_str())),
            }
        }
    }
    let mut disagree = Vec::new();
    let (mut succeeded, mut failed) = (0, 0);
    for e in &entries {
        let (Some(key), Some(s)) = (e.evidence.key.as_deref(), e.settlement.as_ref()) else {
            continue;
        };
        let agrees = match s.verdict {
            Verdict::Succeeded => {
                succeeded += 1;
                has_order(key)
            }
            Verdict::Failed => {
                failed += 1;
                !has_order(key)
            }
        };
        if !agrees {
            disagree.push(format!("{key} settled {}", s.verdict.as_str()));
        }
    }
    checks.invariant(
        not_in_ledger.is_empty() && unsettled.is_empty() && disagree.is_empty(),
        format!(
            "4. every unknown in the ledger, settled once or in the manual queue, verdicts true: \
             {} unknown calls ({} keys); missing from the ledger {}{}; their entries settled {settled}, manual {manual}, \
             neither {}{}; verdicts {succeeded} succeeded and {failed} failed, {} against the order table{}",
            unknown_by_key.values().sum::<usize>(),
            unknown_by_key.len(),
            not_in_ledger.len(),
            some(&not_in_ledger),
            unsettled.len(),
            some(&unsettled),
            disagree.len(),
            some(&disagree)
        ),
    );

    // 5. The calls a killed client had in flight: answered, or in the ledger (the client
    //    journals every order's intent before it is sent), and settled once or in the manual
    //    queue.
    let in_flight: Vec<&Call> = calls
        .iter()
        .filter(|c| c.ended.is_none() && stats.killed_clients.contains(&c.incarnation))
        .collect();
    // Which client incarnation's requests reached the order service, by key.
    let sent_by = counts(
        world,
        "SELECT key || ' ' || client, count(*) FROM {p}_arrivals WHERE client IS NOT NULL \
         GROUP BY key, client",
    )
    .await?;
    let (mut never_sent, mut concluded, mut asked) = (0, 0, 0);
    let mut sent_unjournaled = Vec::new();
    let mut lost_in_flight = Vec::new();
    let mut concluded_wrong = Vec::new();
    for c in &in_flight {
        if !c.journaled {
            // Killed before its intent was durable: its first attempt never went out.
            if sent_by.contains_key(&format!("{} {}", c.key, c.incarnation)) {
                sent_unjournaled.push(c.key.clone());
            } else {
                never_sent += 1;
            }
        } else if let Some(outcome) = &c.concluded {
            // It ended definitively and its intent was forgotten, before its `ended` line.
            concluded += 1;
            if outcome == "succeeded" && !has_order(&c.key) {
                concluded_wrong.push(format!("{} {outcome}", c.key));
            }
        } else if by_key.contains_key(c.key.as_str()) {
            asked += 1;
        } else {
            lost_in_flight.push(c.key.clone());
        }
    }
    let in_flight_unsettled: Vec<String> = in_flight
        .iter()
        .filter(|c| c.journaled && c.concluded.is_none())
        .flat_map(|c| by_key.get(c.key.as_str()).map_or(&[][..], Vec::as_slice))
        .filter(|e| !matches!(e.state, EntryState::Settled | EntryState::Manual))
        .map(|e| {
            format!(
                "{} {}",
                e.evidence.key.as_deref().unwrap_or("-"),
                e.state.as_str()
            )
        })
        .collect();
    checks.invariant(
        lost_in_flight.is_empty()
            && in_flight_unsettled.is_empty()
            && sent_unjournaled.is_empty()
            && concluded_wrong.is_empty(),
        format!(
            "5. every call a killed client had started is answered or in the ledger (the intent journal), settled once or in the manual queue: \
             {} killed clients left {} calls in flight: {never_sent} killed before their intent was durable and never sent, \
             {} sent without a durable intent{}; {concluded} ended definitively before the kill; {asked} in the ledger, {} of them unsettled{}; \
             {} journaled and in doubt yet not in the ledger{}; {} concluded as succeeded without an order{}",
            stats.killed_clients.len(),
            in_flight.len(),
            sent_unjournaled.len(),
            some(&sent_unjournaled),
            in_flight_unsettled.len(),
            some(&in_flight_unsettled),
            lost_in_flight.len(),
            some(&lost_in_flight),
            concluded_wrong.len(),
            some(&concluded_wrong)
        ),
    );
    let unfinished: Vec<String> = calls
        .iter()
        .filter(|c| c.ended.is_none() && stats.stopped_clients.contains(&c.incarnation))
        .map(|c| c.key.clone())
        .collect();
    checks.check(
        unfinished.is_empty(),
        format!(
            "a client told to stop finished its calls: {} left in flight{}",
            unfinished.len(),
            some(&unfinished)
        ),
    );

    // 6. With nobody sending a key, the rounds over abandoned records leave nothing
    // PROCESSING within the bound.
    let bound = crate::driver::abandoned_bound();
    match &stats.abandoned_cleared {
        Some((took, left)) => checks.invariant(
            left.is_empty(),
            format!(
                "6. nothing PROCESSING without a request, before the asking again: {} records left after {}ms (bound {}ms){}",
                left.len(),
                took.as_millis(),
                bound.as_millis(),
                some(left)
            ),
        ),
        None => checks.invariant(
            false,
            "6. nothing PROCESSING without a request, before the asking again: never checked",
        ),
    }

    // 7. Nothing PROCESSING past its lease after the recovery.
    let stuck = store.stuck(LEASE, 1_000).await?;
    let unknown_records = store.unknowns(1_000).await?;
    let stuck_keys: Vec<String> = stuck
        .iter()
        .map(|s| format!("{} ({}ms)", s.key.key().as_str(), s.age.as_millis()))
        .collect();
    checks.invariant(
        stuck.is_empty(),
        format!(
            "7. nothing PROCESSING past its lease after recovery: {} records{}; UNKNOWN records left for a person {}",
            stuck.len(),
            some(&stuck_keys),
            unknown_records.len()
        ),
    );

    // 8. Reconciliation twice: the second settles nothing and changes nothing.
    let again = &fin.again_calls;
    let idle = again.succeeded + again.failed + again.to_manual == 0
        && fin.again_records.completed + fin.again_records.released == 0;
    checks.invariant(
        idle && fin.same && fin.left_open == 0,
        format!(
            "8. reconciliation twice gives the same result: the first settled {} calls ({} succeeded, {} failed, {} to manual) \
             and {} server records ({} completed, {} released), {} left open; the second settled {} calls and {} records, \
             ledger and records {}",
            fin.calls.succeeded + fin.calls.failed + fin.calls.to_manual,
            fin.calls.succeeded,
            fin.calls.failed,
            fin.calls.to_manual,
            fin.records.completed + fin.records.released,
            fin.records.completed,
            fin.records.released,
            fin.left_open,
            again.succeeded + again.failed + again.to_manual,
            fin.again_records.completed + fin.again_records.released,
            if fin.same { "unchanged" } else { "CHANGED" }
        ),
    );

    // 9 to 11. The consumer's tasks.
    let tasks = evidence.check(stats, &mut checks);

    // 12. The pauses: each process stopped at its point past its lease while another instance
    // took over, then continued; what it wrote late was refused by its fence, or would show
    // above (a second payment or order: 1, 2; a second inventory change: 3; a settlement
    // changed: 4, 8).
    if stats.pauses_wanted > 0 {
        let went_on = stats.notes.get("resumed").copied().unwrap_or(0);
        let refused = crate::driver::late_writes_refused(stats);
        checks.invariant(
            stats.pauses() >= stats.pauses_wanted && stats.continued == stats.pauses(),
            format!(
                "12. paused past the lease and continued: {} of {} pauses ({}), {} continued, {went_on} of them past their point (the others' work timed out meanwhile); their late writes refused by the fence: {}",
                stats.pauses(),
                stats.pauses_wanted,
                stats
                    .pauses
                    .iter()
                    .map(|(r, n)| format!("{r} {n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                stats.continued,
                if refused.is_empty() {
                    "none tried".to_owned()
                } else {
                    refused
                        .iter()
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        );
    }

    // 13. The admin: every action audited before it was taken, its outcome after; a line
    // without an outcome (killed between) means the action may have happened, and it did or
    // did not, never half; no entry settled by the admin without a line.
    let lines = crate::admin::audit_lines(world).await?;
    let by_id: HashMap<String, &Entry> = entries
        .iter()
        .map(|e| (e.evidence.id.to_string(), e))
        .collect();
    let settles: Vec<_> = lines
        .iter()
        .filter(|l| l.action == surely::admin::AuditAction::Settle)
        .collect();
    let (mut done, mut refused, mut open_happened, mut open_not, mut wrong) =
        (0, 0, 0, 0, Vec::new());
    for l in &settles {
        let entry = by_id.get(&l.target);
        // A line killed before its outcome took the action if the entry is the admin's and no
        // later line on it took or may have taken it (a later try of a taken one is refused).
        let later_may = settles.iter().any(|m| {
            m.target == l.target && m.id > l.id && m.outcome.as_deref().is_none_or(|o| o == "done")
        });
        let happened =
            entry.is_some_and(|e| crate::admin::by_admin(e)) && (l.outcome.is_some() || !later_may);
        match l.outcome.as_deref() {
            Some("done") if happened => done += 1,
            Some("done") => wrong.push(format!("{} done but not settled by the admin", l.target)),
            Some(_) => refused += 1,
            None if happened => open_happened += 1,
            None => open_not += 1,
        }
    }
    let lined: std::collections::HashSet<&str> = settles
        .iter()
        .filter(|l| l.outcome.as_deref().is_none_or(|o| o == "done"))
        .map(|l| l.target.as_str())
        .collect();
    for e in entries.iter().filter(|e| crate::admin::by_admin(e)) {
        let id = e.evidence.id.to_string();
        if !lined.contains(id.as_str()) {
            wrong.push(format!("{id} settled by the admin without an audit line"));
        }
    }
    let discards = lines
        .iter()
        .filter(|l| l.action == surely::admin::AuditAction::DiscardTask)
        .count();
    checks.invariant(
        wrong.is_empty(),
        format!(
            "13. the admin's actions audited before they were taken: {} settlements ({done} done, {refused} refused, {} killed between the line and its outcome: {open_happened} of them taken, {open_not} not), {discards} task discards; {} without their line or done yet not taken{}",
            settles.len(),
            open_happened + open_not,
            wrong.len(),
            some(&wrong)
        ),
    );

    // 14. RabbitMQ in (`--broker rabbitmq`): every message was an event (none dead-lettered),
    // and a consumer killed between its commit and its acknowledgement had its redelivery
    // absorbed by the inbox (invariants 3 and 9: applied once, none lost).
    if world.amqp_url.is_some() {
        let dead = world.dead_lettered().await?;
        checks.invariant(
            dead == 0,
            format!(
                "14. RabbitMQ in: {dead} messages dead-lettered (none expected: every message an event); {} redeliveries absorbed by the inbox",
                stats.notes.get("duplicate-absorbed").copied().unwrap_or(0)
            ),
        );
    }

    // 15. The keys on Redis (`--store redis`), restarted without persistence: what a restart
    // lost ran again, and the downstream's idempotency (the order by its key, the payment by
    // its id) kept one order and one payment per key (1, 2).
    if stats.on_redis {
        let reruns = counts(
            world,
            "SELECT key, count(*) FROM {p}_arrivals WHERE keyed GROUP BY key HAVING count(*) > 1",
        )
        .await?;
        let absorbed = stats
            .notes
            .get("order-again-absorbed")
            .copied()
            .unwrap_or(0);
        let wanted = stats.kills() / crate::driver::REDIS_RESTART_EVERY;
        // The keys went through Redis at all: keyed orders were written.
        let keyed = orders.keys().filter(|k| is_keyed(k)).count();
        checks.invariant(
            stats.redis_restarts >= wanted && keyed > 0,
            format!(
                "15. the keys on Redis, restarted {} times without persistence (every {} kills): {keyed} keyed orders written through it, {} keys whose handler ran more than once, {absorbed} orders written again absorbed by their key; one order and one payment per key all the same (1, 2)",
                stats.redis_restarts,
                crate::driver::REDIS_RESTART_EVERY,
                reruns.len()
            ),
        );
    }

    for u in &stats.unexpected {
        checks.check(false, format!("a process exited on its own: {u}"));
    }
    for f in &stats.failures {
        checks.check(false, f.clone());
    }
    Ok((checks.verdict(), ops, tasks))
}
