//! The Redis server the tests use: `SURELY_TEST_REDIS_URL`, or by default the one every
//! development and CI machine runs. A server that does not answer fails the tests, with the
//! address they tried: they never pass without it. Every test keeps its keys under a prefix of
//! its own, named with [`super::names`], and deletes them at the end, so runs may overlap and
//! repeat.

use std::time::Duration;

use surely::deps::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use surely::deps::redis::{self, AsyncCommands as _};

/// The variable that names the server.
const VAR: &str = "SURELY_TEST_REDIS_URL";
/// The local server of every development and CI machine.
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The server the tests use.
pub(crate) fn url() -> String {
    std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// Fails `test`: the server did not answer.
pub(crate) fn did_not_answer(test: &str, e: impl std::fmt::Display) -> ! {
    panic!(
        "{test}: Redis at {} (set {VAR} to use another) did not answer: {e}",
        url()
    )
}

/// A connection that answered `PING`; fails `test`, naming the server, if it does not.
pub(crate) async fn connection(test: &str) -> ConnectionManager {
    let client = redis::Client::open(url()).unwrap_or_else(|e| did_not_answer(test, e));
    // One second to connect, one retry: a server that is not there fails at once.
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(1)))
        .set_number_of_retries(1);
    let mut conn = ConnectionManager::new_with_config(client, config)
        .await
        .unwrap_or_else(|e| did_not_answer(test, e));
    let pong: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| did_not_answer(test, e));
    assert_eq!(pong, "PONG");
    conn
}

/// Every key under `prefix`, sorted.
pub(crate) async fn keys(conn: &mut ConnectionManager, prefix: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let mut iter: redis::AsyncIter<'_, String> =
        conn.scan_match(format!("{prefix}*")).await.unwrap();
    while let Some(key) = iter.next_item().await {
        found.push(key.unwrap());
    }
    found.sort();
    found
}

/// Deletes every key under `prefix`.
pub(crate) async fn forget(conn: &mut ConnectionManager, prefix: &str) {
    for key in keys(conn, prefix).await {
        let _: () = conn.del(key).await.unwrap();
    }
}
