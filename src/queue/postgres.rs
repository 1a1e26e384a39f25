//! The queue on PostgreSQL: the statements of the protocol, written once for a component's
//! table and columns.
//!
//! The component keeps its table (its migrations, its columns, its inserts and reads); the
//! queue writes the parts of its statements that make the protocol: which rows are due and in
//! what order, the claim (`FOR UPDATE SKIP LOCKED`, the fence, the lease), the condition of a
//! holder's write, the waits, the reopening and the sweep. Times are the database's
//! (`now()`), so instances whose clocks disagree still agree on leases and waits.

use std::marker::PhantomData;

use super::States;

/// The SQL literal of each of a component's states, as its table keeps them (`'open'`, `0`).
pub(crate) trait SqlStates: States {
    /// The state as an SQL literal.
    fn sql(self) -> &'static str;
}

/// Where a component's table keeps the queue's part of a row.
#[derive(Debug)]
pub(crate) struct Columns {
    /// The item's key (`text`, unique).
    pub(crate) key: &'static str,
    /// Its state.
    pub(crate) state: &'static str,
    /// Its fence (`bigint`).
    pub(crate) fence: &'static str,
    /// When it is due (waiting) or its lease ends (claimed) (`timestamptz`, `NULL`: due now).
    pub(crate) until: &'static str,
    /// How many times a holder put it back or parked it (`integer`).
    pub(crate) tries: &'static str,
    /// The order in which due items are claimed: columns of the table, oldest first (an
    /// index on them, over the due states, serves the claim).
    pub(crate) order: &'static [&'static str],
    /// When it was settled (`timestamptz`), for the sweep; `None`: the component does not
    /// sweep.
    pub(crate) settled_at: Option<&'static str>,
}

/// A component's table, as the queue writes statements for it.
#[derive(Debug)]
pub(crate) struct Table<S> {
    name: String,
    columns: &'static Columns,
    states: PhantomData<fn() -> S>,
}

/// `now()` moved on by the duration in microseconds that parameter `$n` holds.
pub(crate) fn later(n: usize) -> String {
    format!("now() + ${n}::int8 * interval '1 microsecond'")
}

/// A fence as a table keeps it (`bigint`): one too large to be there matches nothing.
pub(crate) fn fence(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}

/// A fence read back from a table (never below zero there).
pub(crate) fn fence_of(fence: i64) -> u64 {
    u64::try_from(fence).unwrap_or(0)
}

impl<S: SqlStates> Table<S> {
    /// The table `name` (already checked, optionally schema-qualified), its queue's part in
    /// `columns`.
    pub(crate) fn new(name: &str, columns: &'static Columns) -> Self {
        Table {
            name: name.to_owned(),
            columns,
            states: PhantomData,
        }
    }

    /// The states that `which` picks, as a list of literals.
    fn states(which: impl Fn(S) -> bool) -> String {
        let picked: Vec<&str> = S::ALL
            .iter()
            .copied()
            .filter(|s| which(*s))
            .map(S::sql)
            .collect();
        picked.join(", ")
    }

    /// The claim: up to `$1` due rows, oldest first, each moved to the claimed state with its
    /// fence one higher and held for `$2` microseconds ([`micros`](crate::storage::micros)); `RETURNING {returning}`
    /// (columns of the table, which the statement names `c`). The rows come back in no order:
    /// the caller sorts them by the queue's order (a statement that sorted them, wrapped around
    /// this one, cost the outbox's claim of 500 events about 6% more). Rows that another claim
    /// holds locked are skipped, never waited for.
    pub(crate) fn claim(&self, returning: &str) -> String {
        let Columns {
            key,
            state,
            fence,
            until,
            order,
            ..
        } = self.columns;
        let t = &self.name;
        let claimable = Self::states(S::claimable);
        // A component whose one claimable state is its claimed one (the outbox's pending)
        // only sets the lease.
        let to_claimed = if S::ALL.iter().filter(|s| s.claimable()).count() == 1 {
            String::new()
        } else {
            format!("{state} = {}, ", S::CLAIMED.sql())
        };
        let lease = later(2);
        let order = order.join(", ");
        // The keys as an array, found by the key's index: a join with the locked rows can be
        // planned as a scan of the whole table, settled rows included.
        format!(
            "UPDATE {t} AS c
             SET {to_claimed}{fence} = c.{fence} + 1, {until} = {lease}
             WHERE c.{key} = ANY(ARRAY(
                 SELECT {key} FROM {t}
                 WHERE {state} IN ({claimable}) AND ({until} IS NULL OR {until} <= now())
                 ORDER BY {order}
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED
             ))
             RETURNING {returning}"
        )
    }

    /// [`claim`](Self::claim), then `SELECT {columns} FROM claimed AS e {joins}` in the
    /// queue's order: for a component that reads a claimed row with other tables' rows.
    pub(crate) fn claim_joined(&self, columns: &str, joins: &str) -> String {
        let order: Vec<String> = self
            .columns
            .order
            .iter()
            .map(|c| format!("e.{c}"))
            .collect();
        format!(
            "WITH claimed AS ({})
             SELECT {columns} FROM claimed AS e {joins} ORDER BY {}",
            self.claim("c.*"),
            order.join(", ")
        )
    }

    /// A holder's write: `set`, on the row whose key is `$1` while the claim whose fence is
    /// `$2` holds it (in the claimed state with that fence). The statement changes no row for
    /// a late holder.
    pub(crate) fn fenced(&self, set: &str) -> String {
        let Columns {
            key, state, fence, ..
        } = self.columns;
        format!(
            "UPDATE {t} SET {set} WHERE {key} = $1 AND {fence} = $2 AND {state} = {claimed}",
            t = self.name,
            claimed = S::CLAIMED.sql()
        )
    }

    /// [`fenced`](Self::fenced) for many rows at once: `$1` their keys (`text[]`), `$2` their
    /// fences (`bigint[]`), pair by pair; `set` may name the row as `o`.
    pub(crate) fn fenced_all(&self, set: &str) -> String {
        let Columns {
            key, state, fence, ..
        } = self.columns;
        format!(
            "UPDATE {t} AS o SET {set}
             FROM unnest($1::text[], $2::bigint[]) AS m(k, f)
             WHERE o.{key} = m.k AND o.{fence} = m.f AND o.{state} = {claimed}",
            t = self.name,
            claimed = S::CLAIMED.sql()
        )
    }

    /// What settles a row (to `to`, a settled state), for a `SET`: no lease, and (where the
    /// component sweeps) when it was settled.
    pub(crate) fn settle(&self, to: S) -> String {
        debug_assert!(to.settled());
        let Columns {
            state,
            until,
            settled_at,
            ..
        } = self.columns;
        match settled_at {
            Some(at) => format!("{state} = {}, {until} = NULL, {at} = now()", to.sql()),
            None => format!("{state} = {}, {until} = NULL", to.sql()),
        }
    }

    /// What releases a row (to the state `to`, due at `until`: SQL expressions), for a `SET`;
    /// it counts a try.
    fn release(&self, to: &str, until: &str) -> String {
        let c = self.columns;
        format!(
            "{state} = {to}, {tries} = {tries} + 1, {col} = {until}",
            state = c.state,
            tries = c.tries,
            col = c.until,
        )
    }

    /// What puts a row back to wait (in `to`, a claimable state) for the microseconds in `$n`,
    /// for a `SET`; it counts a try.
    pub(crate) fn retry_later(&self, to: S, n: usize) -> String {
        debug_assert!(to.claimable());
        self.release(to.sql(), &later(n))
    }

    /// What parks a row in a manual state (`to`), for a `SET`; it counts a try.
    pub(crate) fn park(&self, to: S) -> String {
        debug_assert!(to.manual());
        self.release(to.sql(), "NULL")
    }

    /// What puts a row back to wait (`waiting`) for the microseconds in `$after`, or parks it
    /// (`manual`) once this try makes `$limit` of them, for a `SET`; it counts a try.
    pub(crate) fn retry_or_park(
        &self,
        waiting: S,
        manual: S,
        after: usize,
        limit: usize,
    ) -> String {
        debug_assert!(waiting.claimable() && manual.manual());
        let last = format!("{tries} + 1 >= ${limit}", tries = self.columns.tries);
        let to = format!(
            "CASE WHEN {last} THEN {manual} ELSE {waiting} END",
            manual = manual.sql(),
            waiting = waiting.sql()
        );
        let until = format!("CASE WHEN {last} THEN NULL ELSE {} END", later(after));
        self.release(&to, &until)
    }

    /// A person sends the row whose key is `$1` back to be claimed, at once, from one of the
    /// states `from` (to `to`, a claimable state), with `set` besides: its fence moves on, so
    /// that no claim from before counts; `RETURNING {returning}` unless it is empty.
    pub(crate) fn reopen(&self, from: &[S], to: S, set: &str, returning: &str) -> String {
        debug_assert!(to.claimable());
        let Columns {
            key,
            state,
            fence,
            until,
            ..
        } = self.columns;
        let from = Self::states(|s| from.contains(&s));
        format!(
            "UPDATE {t} SET {state} = {to}, {fence} = {fence} + 1, {until} = NULL{set}
             WHERE {key} = $1 AND {state} IN ({from}){returning}",
            t = self.name,
            to = to.sql(),
            set = if set.is_empty() {
                String::new()
            } else {
                format!(", {set}")
            },
            returning = if returning.is_empty() {
                String::new()
            } else {
                format!(" RETURNING {returning}")
            },
        )
    }

    /// A person's write, not fenced: `set` on the row whose key is `$n`, unless it is settled.
    pub(crate) fn unsettled(&self, set: &str, n: usize) -> String {
        let Columns { key, state, .. } = self.columns;
        format!(
            "UPDATE {t} SET {set} WHERE {key} = ${n} AND {state} NOT IN ({settled})",
            t = self.name,
            settled = Self::states(S::settled)
        )
    }

    /// The sweep, one bounded batch: deletes at most `$2` of the settled rows settled `$1`
    /// microseconds ago or more ([`micros`](crate::storage::micros)), the longest settled
    /// first, and no other row. The rows are picked through the component's index on its
    /// settled time (over its settled states) and locked with `FOR UPDATE SKIP LOCKED`: two
    /// batches at once (two instances) delete disjoint rows and never wait on each other, and a
    /// row another statement holds is left for the next batch.
    pub(crate) fn sweep(&self) -> String {
        let Columns {
            key,
            state,
            settled_at,
            ..
        } = self.columns;
        // A component without the column does not sweep: its statement deletes nothing.
        let settled_at = settled_at.unwrap_or("NULL::timestamptz");
        // The keys as an array, found by the key's index (as the claim does): a join with the
        // picked rows can be planned as a scan of the whole table.
        format!(
            "DELETE FROM {t}
             WHERE {key} = ANY(ARRAY(
                 SELECT {key} FROM {t}
                 WHERE {state} IN ({settled})
                     AND {settled_at} <= now() - $1::int8 * interval '1 microsecond'
                 ORDER BY {settled_at}
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED
             ))",
            t = self.name,
            settled = Self::states(S::settled)
        )
    }

    /// `SELECT {columns}` of the row whose key is `$1`: what a component reads to say why a
    /// write changed nothing.
    pub(crate) fn look(&self, columns: &str) -> String {
        format!(
            "SELECT {columns} FROM {t} WHERE {key} = $1",
            t = self.name,
            key = self.columns.key
        )
    }
}
