//! The webhook publisher over the crate's own `client::http()` stack and hyper-util, against a
//! real hyper server on 127.0.0.1: every publish of an event, every attempt of it, carries the
//! event id as its idempotency key; a failed, refused or lost publish goes again with that key,
//! and one that keeps failing is quarantined, never marked published.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use surely::outbox::{Event, EventId, MemoryOutbox, OutboxStore, Relay, WebhookPublisher};
use surely::retry::backoff::Backoff;
use surely::retry::ReplayBody;
use surely::{Outcome, OutcomeExt};
use tower::{service_fn, Service, ServiceExt};

use super::event;
use crate::support::serve::serve;

type Transport = Client<HttpConnector, ReplayBody<Full<Bytes>>>;

/// What the receiver does with each request, in turn (then answers `then`).
#[derive(Clone, Copy, Debug)]
enum Answer {
    Status(u16),
    /// Reads the request, then drops the connection without an answer: the reply is lost.
    Drop,
}

/// A request the receiver read.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

impl Seen {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }
}

/// A webhook receiver that follows a script and keeps what it read.
#[derive(Clone)]
struct Receiver {
    script: Arc<Mutex<VecDeque<Answer>>>,
    then: Answer,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Receiver {
    fn new(script: impl IntoIterator<Item = Answer>, then: Answer) -> Self {
        Receiver {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            then,
            seen: Arc::default(),
        }
    }

    /// Serves on 127.0.0.1; the URI of its hook.
    async fn start(&self) -> http::Uri {
        let receiver = self.clone();
        let svc = service_fn(move |req: Request<Incoming>| {
            let receiver = receiver.clone();
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect().await?.to_bytes();
                receiver.seen.lock().unwrap().push(Seen {
                    path: parts.uri.path().to_owned(),
                    headers: parts.headers,
                    body,
                });
                let answer = receiver
                    .script
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or(receiver.then);
                match answer {
                    Answer::Status(status) => Ok(Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::from_static(b"noted")))
                        .unwrap()),
                    Answer::Drop => Err::<_, Box<dyn std::error::Error + Send + Sync>>(
                        "the receiver crashed before it answered".into(),
                    ),
                }
            }
        });
        format!("http://{}/hooks/orders", serve(svc).await)
            .parse()
            .unwrap()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests came with each idempotency key.
    fn per_key(&self) -> HashMap<String, usize> {
        let mut keys = HashMap::new();
        for seen in self.seen() {
            *keys
                .entry(seen.header("idempotency-key").to_owned())
                .or_default() += 1;
        }
        keys
    }
}

/// The crate's HTTP client stack over hyper-util, retrying at once, up to `attempts` attempts.
fn publisher(
    uri: http::Uri,
    attempts: u32,
) -> WebhookPublisher<
    impl Service<
            Request<Full<Bytes>>,
            Response = Response<impl http_body::Body + Send + 'static>,
            Error = surely::Error<hyper_util::client::legacy::Error>,
            Future: Send + 'static,
        > + Send
        + 'static,
> {
    let transport: Transport = Client::builder(TokioExecutor::new()).build_http();
    let client = surely::client::http()
        .timeout(Duration::from_secs(2))
        .no_budget()
        .retry(|r| r.max_attempts(attempts).backoff(Backoff::none()))
        .build(transport)
        .unwrap();
    WebhookPublisher::new(client, uri)
}

fn key(id: &EventId) -> String {
    id.as_str().to_owned()
}

#[tokio::test]
async fn events_are_posted_with_their_id_as_the_idempotency_key() {
    let receiver = Receiver::new([], Answer::Status(204));
    let uri = receiver.start().await;
    let outbox = MemoryOutbox::new();
    let typed = event(1);
    let untyped = Event::new(
        EventId::new("order-o-2-shipped").unwrap(),
        "order o-2",
        7,
        "OrderShipped",
        Bytes::from_static(b"\x00\x01 raw"),
    )
    .unwrap()
    .with_header("X-Trace", "a")
    .unwrap()
    .with_header("x-trace", "b")
    .unwrap();
    assert!(outbox.enqueue(typed.clone()));
    assert!(outbox.enqueue(untyped.clone()));

    let mut relay = Relay::builder(outbox.clone(), publisher(uri.clone(), 3))
        .build()
        .unwrap();
    let round = relay.run_once().await.unwrap();
    assert_eq!((round.claimed, round.published, round.failed), (2, 2, 0));
    assert_eq!(outbox.stats_now().backlog, 0);

    let seen = receiver.seen();
    assert_eq!(seen.len(), 2, "one request per event, nothing retried");
    let find = |e: &Event| {
        seen.iter()
            .find(|s| s.header("idempotency-key") == e.id().as_str())
            .unwrap_or_else(|| panic!("no request keyed {}", e.id()))
            .clone()
    };
    let first = find(&typed);
    assert_eq!(first.path, "/hooks/orders");
    assert_eq!(first.body, "o-1");
    assert_eq!(first.header("surely-aggregate"), "order o-1");
    assert_eq!(first.header("surely-version"), "1");
    assert_eq!(first.header("surely-kind"), "OrderCreated");
    assert_eq!(first.header("content-type"), "text/plain");
    assert_eq!(first.headers.get_all("content-type").iter().count(), 1);

    let second = find(&untyped);
    assert_eq!(second.body, &b"\x00\x01 raw"[..]);
    assert_eq!(second.header("surely-aggregate"), "order o-2");
    assert_eq!(second.header("surely-version"), "7");
    assert_eq!(second.header("surely-kind"), "OrderShipped");
    assert_eq!(second.header("content-type"), "application/octet-stream");
    let traces: Vec<_> = second.headers.get_all("x-trace").iter().collect();
    assert_eq!(traces, ["a", "b"], "repeated headers kept, in order");

    // Called directly, the publisher hands back the response's head and the call's outcome.
    let typed_id = typed.id().clone();
    let mut webhook = publisher(uri, 3);
    let res = webhook.ready().await.unwrap().call(typed).await.unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(res.outcome(), Outcome::Succeeded);
    let call = res.call_outcome().unwrap();
    assert_eq!(call.attempts(), 1);
    assert_eq!(call.idempotency_key().unwrap(), typed_id.as_str());
}

#[tokio::test]
async fn a_500_is_retried_by_the_client_with_the_same_key() {
    let receiver = Receiver::new([Answer::Status(500)], Answer::Status(200));
    let uri = receiver.start().await;
    let mut webhook = publisher(uri, 3);
    let res = webhook.ready().await.unwrap().call(event(1)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.call_outcome().unwrap().attempts(), 2);
    assert_eq!(
        receiver.per_key(),
        HashMap::from([(key(event(1).id()), 2)]),
        "both attempts carried the event id"
    );
}

#[tokio::test]
async fn a_500_is_published_again_by_the_relay_with_the_same_key() {
    let receiver = Receiver::new([Answer::Status(500)], Answer::Status(200));
    let uri = receiver.start().await;
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    // One attempt per call: the relay does the retrying.
    let mut relay = Relay::builder(outbox.clone(), publisher(uri, 1))
        .retry_after(Duration::ZERO)
        .build()
        .unwrap();

    let first = relay.run_once().await.unwrap();
    assert_eq!((first.claimed, first.published, first.failed), (1, 0, 1));
    // A 500 may have committed: unknown, and the same key settles it.
    assert_eq!(
        outbox.last_error(event(1).id()).unwrap(),
        "webhook answered 500 Internal Server Error (unknown after 1 attempt)"
    );

    let second = relay.run_once().await.unwrap();
    assert_eq!((second.claimed, second.published), (1, 1));
    assert_eq!(
        receiver.per_key(),
        HashMap::from([(key(event(1).id()), 2)]),
        "published twice, with one key"
    );
    assert_eq!(outbox.stats_now().backlog, 0);
}

#[tokio::test]
async fn a_4xx_that_keeps_coming_quarantines_the_event() {
    let receiver = Receiver::new([], Answer::Status(400));
    let uri = receiver.start().await;
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    let mut relay = Relay::builder(outbox.clone(), publisher(uri, 3))
        .retry_after(Duration::ZERO)
        .quarantine_after(3)
        .build()
        .unwrap();

    for _ in 0..2 {
        let round = relay.run_once().await.unwrap();
        assert_eq!((round.failed, round.quarantined), (1, 0));
    }
    let third = relay.run_once().await.unwrap();
    assert_eq!(
        (third.published, third.failed, third.quarantined),
        (0, 1, 1)
    );
    assert_eq!(
        relay.run_once().await.unwrap().claimed,
        0,
        "no longer claimed"
    );

    let stats = outbox.stats_now();
    assert_eq!((stats.backlog, stats.quarantined), (0, 1));
    assert_eq!(
        outbox.sweep(Duration::ZERO).await.unwrap(),
        0,
        "never published"
    );
    assert_eq!(
        outbox.last_error(event(1).id()).unwrap(),
        "webhook answered 400 Bad Request (failed after 1 attempt)"
    );
    // A 400 is final: the client sent each publish once, always with the event id.
    assert_eq!(receiver.per_key(), HashMap::from([(key(event(1).id()), 3)]));
}

#[tokio::test]
async fn a_lost_response_is_published_again_with_the_same_key() {
    // Both attempts of the first publish are read, then their connections dropped.
    let receiver = Receiver::new([Answer::Drop, Answer::Drop], Answer::Status(201));
    let uri = receiver.start().await;
    let outbox = MemoryOutbox::new();
    outbox.enqueue(event(1));
    let mut relay = Relay::builder(outbox.clone(), publisher(uri, 2))
        .retry_after(Duration::ZERO)
        .build()
        .unwrap();

    let first = relay.run_once().await.unwrap();
    assert_eq!((first.published, first.failed), (0, 1));
    let error = outbox.last_error(event(1).id()).unwrap();
    assert!(
        error.starts_with(
            "webhook call failed: unknown after 2 attempts (connection closed, sent): "
        ),
        "{error}"
    );

    let second = relay.run_once().await.unwrap();
    assert_eq!(second.published, 1);
    assert_eq!(
        receiver.per_key(),
        HashMap::from([(key(event(1).id()), 3)]),
        "every attempt of every publish carried the event id"
    );
    assert_eq!(outbox.stats_now().backlog, 0);
}

#[tokio::test]
async fn the_error_carries_the_call_outcome() {
    let receiver = Receiver::new([], Answer::Drop);
    let uri = receiver.start().await;
    let mut webhook = publisher(uri, 2);
    let err = webhook
        .ready()
        .await
        .unwrap()
        .call(event(1))
        .await
        .unwrap_err();
    assert!(err.is_transport());
    assert_eq!(err.status(), None);
    let call = err.call_outcome().unwrap();
    assert_eq!((call.outcome(), call.attempts()), (Outcome::Unknown, 2));
    let inner = err
        .transport_error()
        .unwrap()
        .downcast_ref::<surely::Error<hyper_util::client::legacy::Error>>()
        .unwrap();
    assert_eq!(inner.outcome(), Outcome::Unknown);
}

#[tokio::test]
async fn an_event_http_refuses_fails_without_a_request() {
    let receiver = Receiver::new([], Answer::Status(200));
    let uri = receiver.start().await;
    let id = || EventId::new("order-o-9-created").unwrap();
    let base = || Event::new(id(), "order o-9", 1, "OrderCreated", "o-9").unwrap();
    // Refused before they can be enqueued: a control character in the aggregate, a kind that
    // is not a subject token.
    assert!(Event::new(id(), "order\no-9", 1, "OrderCreated", "o-9").is_err());
    assert!(Event::new(id(), "order o-9", 1, "Order\u{7f}Created", "o-9").is_err());
    let refused = [
        base().with_header("x:trace", "a").unwrap(),
        base().with_header("Idempotency-Key", "another").unwrap(),
        base().with_header("surely-version", "2").unwrap(),
        base().with_header("content-length", "1").unwrap(),
    ];
    let mut webhook = publisher(uri, 3);
    for event in refused {
        let err = webhook
            .ready()
            .await
            .unwrap()
            .call(event)
            .await
            .unwrap_err();
        assert!(err.is_invalid_event(), "{err}");
        assert!(err.call_outcome().is_none());
        assert!(
            err.to_string()
                .starts_with("event not sent to the webhook: "),
            "{err}"
        );
    }
    assert!(receiver.seen().is_empty(), "nothing was sent");

    // Through a relay: failed, then quarantined, never a panic.
    let outbox = MemoryOutbox::new();
    outbox.enqueue(base().with_header("x:trace", "a").unwrap());
    let mut relay = Relay::builder(outbox.clone(), webhook)
        .quarantine_after(1)
        .build()
        .unwrap();
    assert_eq!(relay.run_once().await.unwrap().quarantined, 1);
    assert_eq!(outbox.stats_now().quarantined, 1);
    assert!(receiver.seen().is_empty());
}

#[tokio::test]
async fn a_2xx_the_client_cannot_vouch_for_is_an_error() {
    // A transport of its own that hands back a call outcome, as the client stack does.
    let answer = |outcome: Option<Outcome>| {
        let mut webhook = WebhookPublisher::new(
            service_fn(move |req: Request<Full<Bytes>>| async move {
                assert_eq!(
                    req.headers()["idempotency-key"],
                    key(event(1).id()).as_str()
                );
                let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
                if let Some(outcome) = outcome {
                    let call = surely::CallOutcome::new(outcome, surely::StopReason::Unknown, 2);
                    res.extensions_mut().insert(call);
                }
                Ok::<_, std::io::Error>(res)
            }),
            "/hooks/orders".parse().unwrap(),
        );
        async move { webhook.ready().await.unwrap().call(event(1)).await }
    };
    let err = answer(Some(Outcome::Unknown)).await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::OK));
    assert_eq!(
        err.to_string(),
        "webhook answered 200 OK, but the client could not vouch for the call \
         (unknown after 2 attempts)"
    );
    // Without an outcome, the status decides.
    let res = answer(None).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.call_outcome().is_none());
}
