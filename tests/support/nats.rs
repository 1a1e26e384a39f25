//! The NATS server the tests use, with JetStream on: `SURELY_TEST_NATS_URL`, or by default the
//! one every development and CI machine runs. A server that does not answer fails the tests,
//! with the address they tried. Every test makes a stream of its own, named with
//! [`super::names`], and deletes it at the end.

use std::time::Duration;

use surely::deps::async_nats::jetstream::{self, stream};

/// The variable that names the server.
const VAR: &str = "SURELY_TEST_NATS_URL";
/// The local server of every development and CI machine.
const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// The server the tests use.
pub(crate) fn url() -> String {
    std::env::var(VAR).unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// JetStream on the server; fails `test`, naming the server, if it does not answer.
pub(crate) async fn jetstream(test: &str) -> jetstream::Context {
    let client = surely::deps::async_nats::connect(url())
        .await
        .unwrap_or_else(|e| panic!("{test}: NATS at {} did not answer: {e}", url()));
    jetstream::new(client)
}

/// A stream `name` on the subjects `<name>.>`, that drops a message id it saw in the last two
/// minutes; fails `test` if JetStream refuses it.
///
/// The server removes an account's store directory when the account's last stream is deleted,
/// and a stream created in that moment fails with "error creating store for stream" (error code
/// 10049, the server's log saying its `mkdir` found no parent): the tests delete their streams
/// while others create theirs, so a create that meets this race is tried again, at most twice,
/// 50 ms apart. Any other refusal fails at once.
pub(crate) async fn stream(js: &jetstream::Context, test: &str, name: &str) -> stream::Stream {
    let config = stream::Config {
        name: name.to_owned(),
        subjects: vec![format!("{name}.>")],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    };
    let mut retries = 0;
    loop {
        match js.create_stream(config.clone()).await {
            Ok(stream) => return stream,
            Err(e) if retries < 2 && e.to_string().contains("error creating store") => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{test}: JetStream at {} refused a stream: {e}", url()),
        }
    }
}
