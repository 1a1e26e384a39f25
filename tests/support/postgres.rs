//! The PostgreSQL server the tests use: `SURELY_TEST_POSTGRES_URL`, or by default the one every
//! development and CI machine runs. A server that does not answer fails the tests, with the
//! address they tried: they never pass without it. Every test makes tables (or a schema) of
//! its own, named with [`super::names`], and drops them at the end, so runs may overlap and
//! repeat.

use std::fmt::Display;

use deadpool_postgres::Object;
use surely::postgres::Pool;

use super::names::unique;

/// The variable that names the server.
const VAR: &str = "SURELY_TEST_POSTGRES_URL";
/// The local server of every development and CI machine.
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The server the tests use.
pub(crate) fn url() -> String {
    std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A pool on the server (it connects on first use).
pub(crate) fn pool() -> Pool {
    surely::postgres::connect(&url()).unwrap()
}

/// Fails `test`: the server did not answer.
pub(crate) fn did_not_answer(test: &str, e: impl Display) -> ! {
    panic!(
        "{test}: PostgreSQL at {} (set {VAR} to use another) did not answer: {e}",
        url()
    )
}

/// A connection from `pool`; fails `test`, naming the server, if it does not answer.
async fn client(pool: &Pool, test: &str) -> Object {
    pool.get().await.unwrap_or_else(|e| did_not_answer(test, e))
}

/// Drops `tables` (in this order), then forgets the migrations recorded for `targets`.
pub(crate) async fn forget(pool: &Pool, tables: &[&str], targets: &[&str]) {
    let client = client(pool, "dropping a test's tables").await;
    let drops: String = tables
        .iter()
        // The idempotency store's table comes with its acquire function, an inbox's with its
        // tasks' tables, an outbox's with its slots' table.
        .map(|t| {
            format!(
                "DROP TABLE IF EXISTS {t}_task_steps, {t}_tasks, {t}_slots; DROP TABLE IF EXISTS {t};
                 DROP FUNCTION IF EXISTS {t}_acquire;"
            )
        })
        .collect();
    client.batch_execute(&drops).await.unwrap();
    forget_migrations(&client, targets).await;
}

/// A schema of `test`'s own, named `<prefix>_<suffix>`, and the connection that made it.
pub(crate) async fn schema(pool: &Pool, test: &str, prefix: &str) -> (Object, String) {
    let schema = unique(prefix);
    let client = client(pool, test).await;
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    (client, schema)
}

/// Drops `schema` and all it holds, then forgets the migrations recorded for `targets`.
pub(crate) async fn forget_schema(client: &Object, schema: &str, targets: &[&str]) {
    client
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .unwrap();
    forget_migrations(client, targets).await;
}

async fn forget_migrations(client: &Object, targets: &[&str]) {
    for target in targets {
        // An outbox's table has the publication its log relay reads (a database's object:
        // dropping the table or its schema leaves it, empty).
        client
            .batch_execute(&format!(
                "DROP PUBLICATION IF EXISTS {}_publication",
                target.replace('.', "_")
            ))
            .await
            .unwrap();
        client
            .execute("DELETE FROM surely_migrations WHERE target = $1", &[target])
            .await
            .unwrap();
    }
}
