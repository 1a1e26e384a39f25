//! What outlives a process, on the memory stores and on the machine's PostgreSQL and NATS
//! JetStream: migrations, the outbox and its relay, the inbox, the UNKNOWN ledger.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod bounds;
mod durations;
mod inbox;
mod ledger;
mod outbox;
mod postgres;
mod reconcile;
mod sweepers;

/// An error and its sources, `: `-separated: what an error-chain printer shows. The durable
/// half's errors say their cause once, in their source.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

/// The retention chores: what the sweep tests of each table share.
#[cfg(feature = "postgres")]
pub(crate) mod sweeping {
    use std::time::Duration;

    use surely::maintenance::Chore;
    use surely::postgres::Pool;

    /// An hour: the shortest retention a sweeper of settled rows takes.
    pub(crate) const HOUR: Duration = Duration::from_secs(3600);

    /// Runs `sql` (an `UPDATE` that sets rows back in time, say) on `pool`.
    pub(crate) async fn exec(pool: &Pool, sql: &str) {
        pool.get().await.unwrap().execute(sql, &[]).await.unwrap();
    }

    /// Runs a batch of `a` and one of `b` (two instances' sweepers of one table) at once,
    /// while another transaction holds the rows that `lock` (a `SELECT ... FOR UPDATE`)
    /// picks: neither batch waits for the held rows, neither fails, and between them they
    /// delete every row they may that is not held, each once. Returns what they deleted.
    pub(crate) async fn two_batches_beside_held_rows(
        pool: &Pool,
        a: &impl Chore,
        b: &impl Chore,
        lock: &str,
    ) -> u64 {
        let mut other = pool.get().await.unwrap();
        let txn = other.transaction().await.unwrap();
        let held = txn.query(lock, &[]).await.unwrap().len();
        assert!(held > 0, "the test holds rows");
        let (x, y) = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(a.run(1000), b.run(1000))
        })
        .await
        .expect("no batch waits for the held rows");
        txn.rollback().await.unwrap();
        x.unwrap().done + y.unwrap().done
    }
}
